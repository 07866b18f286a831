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


def test_a_partitioned_directory_is_still_a_ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "host=a" / "port=1" / "user=b" / "ledger.duckdb"
    path.parent.mkdir(parents=True)
    Ledger.create(str(path), dpsql.Budget(1.0, 1e-6)).close()
    assert Ledger.open(str(path)).total() == dpsql.Budget(1.0, 1e-6)


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



def test_arrow_view_types_read_on_spark_as_on_duckdb() -> None:
    """pyarrow reads the text of Parquet files written by arrow-rs writers (tpchgen-cli's TPC-H tables, Polars,
    DataFusion) as ``string_view``; the Spark engine refused such a table at registration, DuckDB read it."""
    from _spark import comparable_session, require_spark

    require_spark()
    import pyarrow as pa

    n = 800
    t = pa.table({"u": pa.array([i % 400 for i in range(n)], pa.int64()),
                  "seg": pa.array(["AUTOMOBILE", "BUILDING", None, "ü é"][i % 4] for i in range(n)).cast(pa.string_view()),
                  "raw": pa.array([bytes([i % 3]) for i in range(n)], pa.binary_view()),
                  "tags": pa.array([["a", "b"][: i % 3] for i in range(n)], pa.list_(pa.string_view())),
                  "s": pa.array([{"x": str(i % 2)} for i in range(n)], pa.struct([("x", pa.string_view())]))})
    out = []
    for kind in ("spark", "duckdb"):
        s = comparable_session(kind)
        try:
            s.register("t", t, privacy_unit="u", max_groups_per_unit=2, max_rows_per_group=2,
                       columns={"seg": {"domain": ["AUTOMOBILE", "BUILDING", "ü é"]}})
            r = s.query("SELECT seg, COUNT(*) AS n FROM t WHERE tags IS NOT NULL AND s IS NOT NULL AND raw IS NOT NULL "
                        "GROUP BY seg ORDER BY seg", epsilon=8, delta=1e-4)
            out.append((r.mechanism, r.table))
        finally:
            s.close()
    assert out[0][1].num_rows > 0 and out[0][0] == out[1][0]
    assert out[0][1].equals(out[1][1]) and out[0][1].schema == out[1][1].schema, (out[0][1], out[1][1])


def test_caps_advice_that_fails_after_its_charge_is_not_called_a_range_workload(
        events: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """suggest_caps's failure after the charge (a Spark statement time-out, say) read 'the range workload failed'."""
    from dpsql.errors import ExecutionError

    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-6))
    s.register("events", events, privacy_unit="user_id")

    def failing(*a: object, **k: object) -> None:
        raise TimeoutError("statement time-out")

    monkeypatch.setattr("dpsql.session.backends.fetch_bounded", failing)
    with pytest.raises(ExecutionError) as e:
        s.suggest_caps("events", epsilon=0.5)
    assert str(e.value).startswith("the caps advice failed after its budget was charged"), str(e.value)
    assert "range workload" not in str(e.value)
    s.close()


def test_an_unreachable_postgres_ledger_is_said_before_spark_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong password, URL or server of a PostgreSQL ledger was said only once the Spark engine had started (a JVM,
    22 s on this machine; a cluster's registration, longer) and the tables were registered."""
    pytest.importorskip("psycopg")
    from dpsql.errors import LedgerError

    started: list[object] = []

    def backend(*a: object) -> None:
        started.append(a)
        raise AssertionError("the engine was started")

    monkeypatch.setattr("dpsql.session.make_backend", backend)
    url = f"postgresql://dpsql:{SECRET}@127.0.0.1:1/dpsql"  # port 1: nothing listens, the connection is refused
    with pytest.raises(LedgerError, match="cannot connect to the PostgreSQL ledger") as e:
        dpsql.Session(url, engine={"kind": "spark", "master": "local[2]"}, lock_timeout=2)
    assert started == [] and SECRET not in str(e.value)


def test_a_parquet_float16_column_is_named_on_spark(tmp_path: Path) -> None:
    """A Parquet FLOAT16 column (pyarrow's float16), which DuckDB reads as FLOAT and Spark's reader does not read,
    was refused on Spark as 'cannot read table source ... (AnalysisException)', naming neither the column nor the fix."""
    from _spark import require_spark

    require_spark()
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "half.parquet"
    pq.write_table(pa.table({"u": pa.array([1, 2], pa.int64()), "h": pa.array([1.0, 2.0], pa.float16())}), path)
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), engine="spark")
    try:
        with pytest.raises(ConfigError) as e:
            s.register("t", str(path), privacy_unit="u")
        assert "'h'" in str(e.value) and "FLOAT16" in str(e.value) and "DuckDB engine" in str(e.value), str(e.value)
        assert s.tables == {}
    finally:
        s.close()
