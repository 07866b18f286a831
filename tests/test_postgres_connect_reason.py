"""A PostgreSQL ledger that cannot be reached says why, in words of dpsql's own (psycopg's message can hold the
password, so it is never quoted): an ETL job tells a server that is down (retry later) from a URL that is wrong."""

from __future__ import annotations

import pytest

from dpsql.errors import LedgerError
from dpsql.ledger._postgres import _connect_reason

pytest.importorskip("psycopg")


@pytest.mark.parametrize("text,want", [
    ('connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused\n\tIs the server '
     "running on that host and accepting TCP/IP connections?", "refused the connection"),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  database "nodb" does not exist',
     "database does not exist"),
    ('connection failed: connection to server at "h", port 5432 failed: FATAL:  role "u" does not exist', "user does not exist"),
    ('connection failed: ... FATAL:  password authentication failed for user "u"', "authentication"),
    ("failed to resolve host 'nohost.invalid': [Errno -2] Name or service not known", "host name"),
    ('connection is bad: invalid sslmode value: "bogus"', "invalid"),
    ("connection timeout expired", "no answer"),
    ("FATAL:  sorry, too many clients already", "retry later"),
    ("FATAL:  the database system is starting up", "retry later"),
    # something other than PostgreSQL answers at that port (an HTTP server, a proxy): not an sslmode question
    ('connection failed: connection to server at "10.0.0.1", port 5432 failed: received invalid response to SSL '
     "negotiation: H", "not a PostgreSQL server"),
    ("something else: secret-password", ""),
])
def test_reasons(text: str, want: str) -> None:
    reason = _connect_reason(text)
    assert want in reason and "secret" not in reason and "nodb" not in reason


def test_a_refused_port_says_so() -> None:
    from dpsql.ledger._postgres import PostgresLedger

    with pytest.raises(LedgerError, match=r"cannot connect .*refused the connection.*nothing was changed") as e:
        PostgresLedger.open("postgresql://u:topsecret@127.0.0.1:1/db", lock_timeout=1)
    assert "topsecret" not in str(e.value)
