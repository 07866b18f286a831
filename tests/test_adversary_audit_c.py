"""The Spark engine and the PostgreSQL ledger under hostile queries, data and server settings: what the
analyst observes (whether a query succeeds, the error's class and text, the charge, the ledger's rows)
depends on public metadata and released values only, and a failure is a dpsql error.

A PostgreSQL server is started by the module's fixture (``tests/_postgres.py``); skipped without it,
unless ``DPSQL_REQUIRE_EXTRAS=1``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest
from _postgres import Server

import dpsql
from dpsql.errors import ConfigError, LedgerError
from dpsql.testing import use_noise, zero_noise


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    from _postgres import running_server

    yield from running_server()


def _database(server: Server, encoding: str) -> str:
    import psycopg

    name = "enc_" + uuid.uuid4().hex[:10]
    with psycopg.connect(server.url, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    return server.url.rsplit("/", 1)[0] + "/" + name


def _session(url: str) -> dpsql.Session:
    from dpsql.ledger import open_ledger

    open_ledger(url, dpsql.Budget(10.0, 1e-6), create=True).close()
    s = dpsql.Session(ledger=url)
    use_noise(s, zero_noise(1))
    s.register("t", pa.table({"uid": list(range(50)), "s": ["ß"] * 50}), privacy_unit="uid")
    return s


def test_a_ledger_in_a_sql_ascii_database_is_read_as_written(server: Server) -> None:
    # SQL_ASCII (PostgreSQL's "no encoding") made psycopg read every text as bytes: the schema check saw no
    # table in any schema, and every operation of a ledger it had just created was refused as standing in
    # for another schema's ("found in more than one schema ... ()")
    s = _session(_database(server, "SQL_ASCII"))
    try:
        sql = "SELECT COUNT(*) AS n FROM t WHERE s = 'ß' OR s = '😀'"
        assert s.query(sql, epsilon=0.5).table.to_pylist() == [{"n": 50}]
        assert s.remaining() == dpsql.Budget(9.5, 1e-6)
        assert s.history().to_pylist()[-1]["query"] == sql
    finally:
        s.close()


def test_text_a_latin1_ledger_cannot_store_is_a_ledger_error_that_charges_nothing(server: Server) -> None:
    # the analyst's query text is recorded with the charge: a character LATIN1 has not raised Python's own
    # UnicodeEncodeError out of Session.query (the command line's exit 1 with a traceback, not 4)
    s = _session(_database(server, "LATIN1"))
    try:
        assert s.query("SELECT COUNT(*) AS n FROM t WHERE s = 'ß'", epsilon=0.5).table.to_pylist() == [{"n": 50}]
        with pytest.raises(LedgerError, match="encoding cannot store a character") as e:
            s.query("SELECT COUNT(*) AS n FROM t WHERE s = '😀'", epsilon=0.5)
        assert e.value.exit_code == LedgerError.exit_code and "nothing was charged" in str(e.value)
        assert s.remaining() == dpsql.Budget(9.5, 1e-6)
        assert [r["status"] for r in s.history().to_pylist()] == ["released"]
    finally:
        s.close()


@pytest.mark.parametrize("url, secret", [
    ("postgresql://dpsql:hunter2?x@127.0.0.1:1/dpsql", "hunter2"),  # libpq: the password is 'hunter2?x'
    ("postgresql://dpsql:hun#ter2@127.0.0.1:1/dpsql", "ter2"),
    ("postgresql://dpsql@127.0.0.1:1/dpsql?sslmode=disable&password=a#hunter2", "hunter2"),
    ("postgresql://dpsql:hun@ter2@127.0.0.1:1/dpsql", "ter2"),  # libpq: 'hun' (host 'ter2@127.0.0.1'): both hidden
])
def test_a_password_holding_a_question_mark_or_hash_is_never_shown(url: str, secret: str) -> None:
    # Python's URL parser ends the host at '?' or '#', so redact() found no password in the user part (or kept
    # what followed a '#' in ?password=), while libpq reads the URL up to the '@' and connects with it: the
    # password appeared in Ledger.path, every LedgerError (the analyst's command line prints them) and
    # `dpsql budget`
    from psycopg.conninfo import conninfo_to_dict

    from dpsql.ledger._postgres import PostgresLedger, redact

    assert conninfo_to_dict(url)["password"] in ("hun", "hunter2?x", "hun#ter2", "a#hunter2")  # control: libpq's reading
    assert secret not in redact(url) and "***" in redact(url)
    with pytest.raises(LedgerError) as e:
        PostgresLedger.open(url, lock_timeout=1)
    assert secret not in str(e.value) and "hun" not in str(e.value) and "127.0.0.1:1/dpsql" in str(e.value)


def test_a_password_holding_an_unencoded_slash_is_never_shown() -> None:
    # libpq reads postgresql://u:pa/ss@host/db as host 'u', port 'pa' and database 'ss@host/db' (the user forgot
    # to percent-encode '/'): no user part, so nothing was hidden and the message quoted both halves of the password
    from psycopg.conninfo import conninfo_to_dict

    from dpsql.ledger._postgres import PostgresLedger, redact

    url = "postgresql://dpsql:hun/ter2@127.0.0.1:1/dpsql"
    assert "password" not in conninfo_to_dict(url)  # control: libpq's reading has no password
    assert redact(url) == "postgresql://***@127.0.0.1:1/dpsql"
    assert redact("postgresql:///db?host=/tmp&user=a@b") == "postgresql:///db?host=/tmp&user=a@b"  # '@' in the query
    with pytest.raises((LedgerError, ConfigError)) as e:
        PostgresLedger.open(url, lock_timeout=1)
    assert "hun" not in str(e.value) and "ter2" not in str(e.value)


def test_a_declared_domain_beyond_bigint_lists_its_keys_for_free() -> None:
    # SELECT DISTINCT over a UBIGINT or HUGEINT key whose declared (public) domain holds a value of 2^63 or more
    # raised pyarrow's OverflowError out of Session.query (the command line's exit 1), where the same GROUP BY
    # with a COUNT answered; on Spark (a UBIGINT read as DECIMAL(20,0)) it answered too
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, CAST(i % 2 AS UBIGINT) * 18446744073709551615 AS u, "
                "CAST(i % 2 AS HUGEINT) * 10000000000000000000000000000000000000 AS h FROM range(60) r(i)")
    s = dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), connection=con)
    use_noise(s, zero_noise(1))
    s.register("t", "t", privacy_unit="uid", columns={"u": {"domain": [0, 2**64 - 1]}, "h": {"domain": [0, 10**37]}})
    for key, big in (("u", 2**64 - 1), ("h", 10**37)):
        counted = s.query(f"SELECT {key}, COUNT(*) AS n FROM t GROUP BY {key}", epsilon=0.1, delta=1e-7).table
        listed = s.query(f"SELECT DISTINCT {key} FROM t", epsilon=0.1).table
        assert listed.schema.field(key).type == counted.schema.field(key).type
        assert listed.column(key).to_pylist() == counted.column(key).to_pylist() == [0, big]
    assert [r["epsilon"] for r in s.history().to_pylist()] == [0.1, 0.0, 0.1, 0.0]  # the key lists are free
    s.close()


@pytest.mark.parametrize("url", ["postgresql://dpsql:hun/te?r2@127.0.0.1:1/dpsql",
                                 "postgresql://dpsql:hun?te/r2@127.0.0.1:1/dpsql",
                                 "postgresql://dpsql:hun/te?r2@127.0.0.1:1/dpsql?password=ter2"])
def test_a_password_holding_an_unencoded_slash_and_question_mark_is_never_shown(url: str) -> None:
    # with no '@' before the first '/', the '@' was looked for before the first '?' only: a '?' in the password (no
    # key=value between it and the '@', so not a query string's) left both halves of it in the shown URL
    from dpsql.ledger._postgres import redact

    shown = redact(url)
    assert "hun" not in shown and "ter2" not in shown and "127.0.0.1:1/dpsql" in shown, shown
    assert redact("postgresql://h/db?user=a@b&password=x") == "postgresql://h/db?user=a@b&password=***"  # control
