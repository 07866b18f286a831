"""A shared ledger named the way a team names a database: what is not a ``postgresql://`` URL dpsql reads.

A PostgreSQL connection string that is not such a URL (a capitalised or SQLAlchemy-style scheme, a space before
it, one slash, libpq's ``key=value`` form, or a URL under ``[ledger] path`` instead of ``url``) was taken for a
ledger file's path, and its refusal ("no budget ledger at ...", "create it with dpsql init --ledger ...") printed
the password twice, in every place a job's stderr goes. It is refused as what it is, without the text.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dpsql
from dpsql.cli import main
from dpsql.errors import ConfigError, DPSQLError
from dpsql.ledger import Ledger

SECRET = "s3cretPW"

#: ledger names a data team writes for a PostgreSQL ledger that are no URL dpsql reads
NOT_URLS = [
    f"PostgreSQL://dpsql:{SECRET}@db-host:5432/dpsql",
    f"postgresql+psycopg://dpsql:{SECRET}@db-host:5432/dpsql",
    f" postgresql://dpsql:{SECRET}@db-host:5432/dpsql",
    f"postgresql:/dpsql:{SECRET}@db-host:5432/dpsql",
    f"host=db-host port=5432 dbname=dpsql user=dpsql password={SECRET}",
    f"dbname=dpsql password = {SECRET}",
]


@pytest.mark.parametrize("ledger", NOT_URLS)
def test_a_connection_string_that_is_no_url_is_refused_without_its_password(tmp_path: Path, ledger: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for attempt in (lambda: dpsql.Session(ledger), lambda: dpsql.Session(ledger, dpsql.Budget(1.0, 1e-6), create=True),
                    lambda: Ledger.create(ledger, dpsql.Budget(1.0, 1e-6))):
        with pytest.raises(ConfigError) as e:
            attempt()
        text = str(e.value)
        assert SECRET not in text and "not shown" in text and "postgresql://" in text, text
    assert os.listdir(tmp_path) == []  # no ledger file was made under that name


@pytest.mark.parametrize("ledger", NOT_URLS[:2] + NOT_URLS[4:5])
def test_the_cli_refuses_it_from_dpsql_ledger_without_its_password(tmp_path: Path, ledger: str,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPSQL_LEDGER", ledger)
    assert main(["budget"]) == ConfigError.exit_code
    assert "the ledger named by $DPSQL_LEDGER is a PostgreSQL connection string" in capsys.readouterr().err
    monkeypatch.delenv("DPSQL_LEDGER")
    assert main(["--ledger", ledger, "init", "--epsilon", "1", "--delta", "1e-6"]) == ConfigError.exit_code
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "postgresql://" in out.err, out.err
    assert os.listdir(tmp_path) == []


def test_a_url_under_ledger_path_is_refused_naming_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "dpsql.toml"
    cfg.write_text(f'[ledger]\npath = "postgresql://dpsql:{SECRET}@db-host/dpsql"\n')
    assert main(["--config", str(cfg), "budget"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert SECRET not in err and "url = " in err, err
    with pytest.raises(DPSQLError) as e:
        dpsql.Session.from_config(cfg)
    assert SECRET not in str(e.value)

