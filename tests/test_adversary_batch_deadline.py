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


def _one_read(b: DuckDBBackend) -> float:
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        b.fetch_arrow(WORK)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_a_batch_is_interrupted_once_its_reads_together_reach_the_time_out() -> None:
    free = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=None))
    t = _one_read(free)
    free.close()
    limit = 3.0 * t
    b = DuckDBBackend(None, EngineSettings(threads=1, statement_timeout=limit))
    # negative control: one read (and a batch of one) is well within the time-out
    assert b.fetch_arrow(WORK).column("n")[0].as_py() > 0
    assert len(fetch_bounded(b, BoundedBatch((WORK,)))) == 1
    # ten reads of about t each: each alone is within the limit, together they are past it
    t0 = time.perf_counter()
    with pytest.raises(ExecutionError):
        fetch_bounded(b, BoundedBatch((WORK,) * 10))
    elapsed = time.perf_counter() - t0
    assert elapsed < limit + 2.0 * t, (elapsed, limit, t)  # interrupted near the limit, not after ten reads
    b.close()
