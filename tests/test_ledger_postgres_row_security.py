"""A PostgreSQL ledger whose tables have row-level security enabled is refused.

With row-level security (``ALTER TABLE ledger_entries ENABLE ROW LEVEL SECURITY`` and a policy), a role that
is not the tables' owner reads only the rows its policies let through: the charges it cannot see were left out
of the spent budget (and a hidden newer row of ``ledger_totals`` made an older total the ledger's). Such a role
saw budget that was spent, and charged it again: the ledger let the charges exceed the total. Every
transaction now checks that no table of the ledger has row security enabled, and refuses the ledger (nothing
read, nothing charged) naming the tables and the fix.

A server is started by the fixture itself (``tests/_postgres.py``); without PostgreSQL or psycopg the tests
skip with the reason (a failure under ``DPSQL_REQUIRE_EXTRAS=1``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from _postgres import Server

import dpsql
from dpsql.errors import BudgetExceededError, LedgerError


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    from _postgres import running_server

    yield from running_server()


def _open(url: str, budget: dpsql.Budget | None = None, **kw: object) -> dpsql.ledger.Ledger:
    from dpsql.ledger import open_ledger

    return open_ledger(url, budget, **kw)  # type: ignore[arg-type]


def _entries(url: str) -> list[float]:
    """The epsilons of every entry, read by the tables' owner (whom row security does not restrict)."""
    import psycopg

    with psycopg.connect(url) as con:
        return [r[0] for r in con.execute("SELECT epsilon FROM ledger_entries ORDER BY entry_id").fetchall()]


def _charge(url: str, epsilon: float) -> None:
    """Open the ledger at ``url`` and charge ``epsilon`` (the analyst's side)."""
    led = _open(url)
    try:
        e = led.reserve(dpsql.Budget(epsilon, 0.0), mechanism="basic", query="q", tables=["t"], params={})
        led.commit(e)
    finally:
        led.close()


def _ledger_with_a_failed_charge(server: Server, *, row_security: bool) -> tuple[str, str]:
    """A ledger of total 1.0 where the owner's role spent 0.9 (a failed run: it counts) and then 0.05 (released),
    and a role 'analyst' with the rights dpsql needs; with ``row_security``, a policy lets the analyst read every
    entry but the failed ones. Returns the owner's and the analyst's URLs."""
    import psycopg

    name = "l_" + uuid.uuid4().hex[:12]
    url = server.database(name)
    owner = _open(url, dpsql.Budget(1.0, 0.0), create=True)
    try:
        e = owner.reserve(dpsql.Budget(0.9, 0.0), mechanism="basic", query="q1", tables=["t"], params={})
        owner.fail(e, "failed after the charge")
        e = owner.reserve(dpsql.Budget(0.05, 0.0), mechanism="basic", query="q2", tables=["t"], params={})
        owner.commit(e)
    finally:
        owner.close()
    role = "analyst_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'CREATE ROLE "{role}" LOGIN')
        con.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO "{role}"')
        if row_security:
            con.execute("ALTER TABLE ledger_entries ENABLE ROW LEVEL SECURITY")
            con.execute(f'CREATE POLICY not_failed ON ledger_entries TO "{role}" USING (status <> \'failed\') '
                        "WITH CHECK (true)")
    return url, url.replace("://dpsql@", f"://{role}@", 1)


def test_a_ledger_under_row_level_security_is_refused(server: Server) -> None:
    url, analyst_url = _ledger_with_a_failed_charge(server, row_security=True)
    with pytest.raises(LedgerError, match="row-level security is enabled on the ledger's table[(]s[)] ledger_entries"):
        _charge(analyst_url, 0.9)
    with pytest.raises(LedgerError, match="row-level security"):
        _open(analyst_url).remaining()  # a read is refused too: it would show budget that is spent
    assert _entries(url) == [0.9, 0.05]  # the analyst's charge was not made (the owner's role bypasses the policy)


def test_a_hidden_total_is_refused(server: Server) -> None:
    """A policy on ledger_totals that hides the newest total (lowered from 10 to 1) made the older one the ledger's."""
    import psycopg

    url = server.database("l_" + uuid.uuid4().hex[:12])
    owner = _open(url, dpsql.Budget(10.0, 0.0), create=True)
    owner.set_total(dpsql.Budget(1.0, 0.0), reason="lowered")
    owner.close()
    role = "analyst_" + uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f'CREATE ROLE "{role}" LOGIN')
        con.execute(f'GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO "{role}"')
        con.execute("ALTER TABLE ledger_totals ENABLE ROW LEVEL SECURITY")
        con.execute(f'CREATE POLICY first_only ON ledger_totals TO "{role}" USING (change_id = 1)')
    with pytest.raises(LedgerError, match="row-level security.*ledger_totals"):
        _charge(url.replace("://dpsql@", f"://{role}@", 1), 2.0)
    assert _entries(url) == []


def test_the_same_ledger_without_row_security_refuses_the_overspend(server: Server) -> None:
    # negative control: the same roles and rights, no row security: the analyst sees 0.95 spent, 0.9 does not fit
    url, analyst_url = _ledger_with_a_failed_charge(server, row_security=False)
    led = _open(analyst_url)
    try:
        assert led.remaining() == dpsql.Budget(0.05, 0.0)
        with pytest.raises(BudgetExceededError):
            led.reserve(dpsql.Budget(0.9, 0.0), mechanism="basic", query="q3", tables=["t"], params={})
        e = led.reserve(dpsql.Budget(0.05, 0.0), mechanism="basic", query="q4", tables=["t"], params={})
        led.commit(e)
    finally:
        led.close()


def _enable_row_security(url: str) -> bool:
    """The owner enables row security on ledger_entries with the policy that hides failed charges from the analyst
    (waiting at most half a second for the table's lock); False if the lock was not granted."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute("SET lock_timeout = '500ms'")
        role = con.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'analyst_%' ORDER BY oid DESC LIMIT 1"
                           ).fetchone()
        assert role is not None
        try:
            with con.transaction():
                con.execute("ALTER TABLE ledger_entries ENABLE ROW LEVEL SECURITY")
                con.execute(f'CREATE POLICY not_failed ON ledger_entries TO "{role[0]}" USING (status <> \'failed\')')
        except psycopg.errors.LockNotAvailable:
            return False
    return True


@pytest.mark.parametrize("when", ["before", "after"])
def test_row_security_turned_on_during_a_read_is_not_missed(server: Server, monkeypatch: pytest.MonkeyPatch,
                                                            when: str) -> None:
    """A read (remaining, history) runs under one snapshot, taken by its first statement, before the check: row
    security turned on after that snapshot (before the check: the check read the catalog as of the snapshot; after
    it: no lock held the ledger's tables) still filtered the rows read next, by the catalog's newest state. The
    analyst was shown 0.95 left where 0.05 is. Now the check locks the ledger's tables and asks the server whether
    row security is active for the role now: refused, or the lock holds the change off until the read ends."""
    from dpsql.ledger._postgres import PostgresLedger

    url, analyst_url = _ledger_with_a_failed_charge(server, row_security=False)
    original = PostgresLedger._check_ledger
    done: list[bool] = []

    def check(self: PostgresLedger, con: object, unchanged: str) -> object:
        if when == "before" and not done:
            done.append(_enable_row_security(url))
        out = original(self, con, unchanged)
        if when == "after" and not done:
            done.append(_enable_row_security(url))
        return out

    led = _open(analyst_url)
    try:
        monkeypatch.setattr(PostgresLedger, "_check_ledger", check)
        try:
            left = led.remaining()
        except LedgerError as e:
            assert "row-level security" in e.message and when == "before", e.message
        else:
            # the owner's change waited for the lock the read holds, and was not made meanwhile
            assert left == dpsql.Budget(0.05, 0.0) and when == "after" and done == [False], (left, done)
    finally:
        led.close()


def test_a_read_without_row_security_change_is_answered(server: Server) -> None:
    # negative control for the test above: with nothing changed meanwhile, the analyst's read is the true remainder
    _url, analyst_url = _ledger_with_a_failed_charge(server, row_security=False)
    led = _open(analyst_url)
    try:
        assert led.remaining() == dpsql.Budget(0.05, 0.0)
        assert len(led.history()) == 2
    finally:
        led.close()


def test_row_security_elsewhere_or_forced_without_being_enabled_is_no_refusal(server: Server) -> None:
    """Only the ledger's own tables count: another table of its schema under row security, and FORCE ROW LEVEL
    SECURITY on a ledger table whose row security is not enabled (which restricts nobody), leave the ledger usable."""
    import psycopg

    url, analyst_url = _ledger_with_a_failed_charge(server, row_security=False)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("CREATE TABLE other_data (x int)")
        con.execute("ALTER TABLE other_data ENABLE ROW LEVEL SECURITY")
        con.execute("ALTER TABLE ledger_entries FORCE ROW LEVEL SECURITY")
    led = _open(analyst_url)
    try:
        assert led.remaining() == dpsql.Budget(0.05, 0.0)
        led.commit(led.reserve(dpsql.Budget(0.05, 0.0), mechanism="basic", query="q", tables=["t"], params={}))
    finally:
        led.close()
    # negative control: enabling it on the ledger's table is refused
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("ALTER TABLE ledger_entries ENABLE ROW LEVEL SECURITY")
    with pytest.raises(LedgerError, match="row-level security"):
        _open(analyst_url).remaining()


def test_a_view_standing_in_for_a_ledger_table_is_refused(server: Server) -> None:
    """A view of a ledger table's name over the real table (``CREATE VIEW ledger_entries AS SELECT * FROM entries
    WHERE status <> 'failed'``: simple, so dpsql's INSERT and UPDATE go through it, and LOCK TABLE locks it) filters
    the charges as a row security policy does, and was read as the ledger: the failed charge of 0.9 was not counted
    and 0.9 was charged again over a total of 1. A ledger table that is no table is refused."""
    import psycopg

    url, analyst_url = _ledger_with_a_failed_charge(server, row_security=False)
    with psycopg.connect(url, autocommit=True) as con:
        con.execute("ALTER TABLE ledger_entries RENAME TO entries")
        con.execute("CREATE VIEW ledger_entries AS SELECT * FROM entries WHERE status <> 'failed'")
        con.execute("GRANT SELECT, INSERT, UPDATE ON ledger_entries TO PUBLIC")
    with pytest.raises(LedgerError, match="not a table"):
        _charge(analyst_url, 0.9)
    with psycopg.connect(url) as con:
        assert [r[0] for r in con.execute("SELECT epsilon FROM entries ORDER BY entry_id").fetchall()] == [0.9, 0.05]
