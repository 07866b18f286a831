"""The owner's statement time-out bounds a whole request, also a batch of bounded queries.

A join with several aggregates reads one bounded query per base aggregate (``BoundedBatch``), one after
another. Each read had a statement time-out of its own, so a request of m aggregates could run for m times
``statement_timeout`` before it failed or answered: with ``min_response_time`` set, as documented, to the
time-out plus the release time, a batch whose reads together ran past the pad answered later than the pad,
by an amount that depends on the data. The time-out now starts once for the batch: every read after the
first gets what is left of it.
"""

from __future__ import annotations

import statistics
import time

import pytest
import sqlglot

from dpsql.engine import BoundedBatch, DuckDBBackend, EngineSettings, fetch_bounded
from dpsql.errors import ExecutionError

#: a query over no private data whose run time is a few tenths of a second
WORK = sqlglot.parse_one("SELECT COUNT(*) AS n FROM range(12000000) t(i) WHERE hash(i) % 7 = 1", read="duckdb")


def _reads(b: DuckDBBackend) -> list[float]:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        b.fetch_arrow(WORK)
        times.append(time.perf_counter() - t0)
    return times


def _one_read(b: DuckDBBackend) -> float:
    return statistics.median(_reads(b))


def test_a_batch_is_interrupted_once_its_reads_together_reach_the_time_out() -> None:
    free = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=None))
    t = max(_reads(free))  # the slowest of three: a machine under load must not fail the control below
    free.close()
    limit = 4.0 * t
    b = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=limit))
    # negative control: one read (and a batch of one) is well within the time-out
    assert b.fetch_arrow(WORK).column("n")[0].as_py() > 0
    assert len(fetch_bounded(b, BoundedBatch((WORK,)))) == 1
    # twenty reads of about t each: each alone is within the limit, together they are past it
    t0 = time.perf_counter()
    with pytest.raises(ExecutionError):
        fetch_bounded(b, BoundedBatch((WORK,) * 20))
    elapsed = time.perf_counter() - t0
    assert elapsed < limit + 2.0 * t, (elapsed, limit, t)  # interrupted near the limit, not after twenty reads
    b.close()


def test_an_interrupt_that_fires_before_the_statement_starts_is_not_lost() -> None:
    """DuckDB drops an interrupt that arrives while no statement runs, so a time-out firing before the read
    began (a tiny time-out, or what is left of a batch's) let that read run unbounded: with a 0.1 ms time-out a
    read of about a second finished. The timer now interrupts until the read ends, and a read with no time left
    does not start."""
    slow = sqlglot.parse_one("SELECT COUNT(*) AS n FROM range(40000000) t(i) WHERE hash(i) % 7 = 1", read="duckdb")
    free = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=None))
    t = _one_read(free) * 40 / 12  # the slow read takes about this long (the control: well above the bound below)
    free.close()
    b = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=1e-4))
    for _ in range(5):
        t0 = time.perf_counter()
        with pytest.raises(ExecutionError):
            b.fetch_arrow(slow)
        assert time.perf_counter() - t0 < max(0.5, t / 3), (time.perf_counter() - t0, t)
    # nothing left of a batch's time-out: the read does not start
    t0 = time.perf_counter()
    with pytest.raises(ExecutionError):
        b.fetch_arrow(slow, deadline=time.monotonic() - 1.0)
    assert time.perf_counter() - t0 < 0.5
    b.close()
