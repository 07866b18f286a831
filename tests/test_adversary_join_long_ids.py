"""One person's long text id must not make the join's people table in Python grow with it times every tuple.

The general join paths (R2T, DP-S4S with several people per tuple, the vector form) compact the sampled tuples'
person ids into user numbers. They did it with ``np.unique(names.astype(str))``: numpy's fixed-width text array
pads EVERY id to the longest one, so one person's id of 60 000 characters (within ``max_text_bytes``) made each of
the other tuples' ids take 240 kB. R2T over 3 000 transfers: 5.4 s of CPU, 25 s wall and 4.9 GB peak memory,
against 0.14 s and 185 MB without that person (two shared cores), so the time (or an out-of-memory failure after the
charge) told whether that person's id was long. Now the ids are compacted in Arrow (unique, sorted, looked up):
work linear in their bytes, and the same user numbers (sorted ids) as before."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from dpsql.mechanisms import s4s_sql


class _Plan:
    def __init__(self, slots: int) -> None:
        self.slots = [None] * slots


class _Cal:
    def __init__(self, slots: int) -> None:
        self.jp = _Plan(slots)


def _rows(ids: list[str], n: int) -> pa.Table:
    """n tuples, each with a sender and a receiver among ``ids`` (one of them a list slot, as a lookup gives)."""
    snd = [ids[i % len(ids)] for i in range(n)]
    rcv = [[ids[(7 * i + 1) % len(ids)], None] for i in range(n)]
    return pa.table({"__w0": pa.array(np.ones(n), pa.float64()), "__u0": pa.array(snd, pa.string()),
                     "__u1": pa.array(rcv, pa.list_(pa.string()))})


def _peak(ids: list[str], n: int) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    part = s4s_sql.Part("__w0", 1, 1.0, 1)
    rows = _rows(ids, n)
    tracemalloc.start()
    try:
        out = s4s_sql._tuples(_Cal(2), rows, part)  # type: ignore[arg-type]
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


def test_one_long_id_costs_its_own_bytes_not_its_length_times_every_tuple() -> None:
    n = 2000
    ids = [f"p{i}" for i in range(500)]
    plain, _ = _peak(ids, n)
    long_ids = ["x" * 60_000] + ids[1:]
    hostile, _ = _peak(long_ids, n)
    # the long id occurs in about 2 x 4 tuples: its own bytes, a few times over, not 60 000 x 4 bytes x 4 000 ids
    assert hostile - plain < 20 * 60_000 * 4, (plain, hostile)


@pytest.mark.parametrize("seed", [0, 1])
def test_user_numbers_follow_the_sorted_ids(seed: int) -> None:
    """The users are numbered in the order of their sorted ids (as before), a function of the sample's content."""
    g = np.random.default_rng(seed)
    ids = [f"t:{int(x)}" for x in g.integers(0, 60, 80)] + ["t:é", "t:z", "~t.k:3:abc"]
    _, (w, ti, ui) = _peak(ids, 300)
    rows = _rows(ids, 300)
    names = {}
    for col in ("__u0", "__u1"):
        vals = rows.column(col).to_pylist()
        for t, v in enumerate(vals):
            for x in (v if isinstance(v, list) else [v]):
                if x is not None:
                    names.setdefault(t, set()).add(x)
    order = sorted({x for s in names.values() for x in s})
    got = {}
    for t, u in zip(ti.tolist(), ui.tolist(), strict=True):
        got.setdefault(t, set()).add(order[u])
    assert got == names and w.size == 300
