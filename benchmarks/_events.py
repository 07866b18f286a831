"""Generated events data for benchmarks: heavy-tailed rows per user, Zipf URLs, ~50 countries.

Synthetic, deterministic (fixed seed), cached under ``benchmarks/out/data/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def events_path(n_rows: int, n_users: int = 200_000, seed: int = 1) -> str:
    """Path of a generated events Parquet with about ``n_rows`` rows (created on first use)."""
    d = os.path.join(OUT, "data")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"events_{n_rows}_{n_users}_{seed}.parquet")
    if os.path.exists(path):
        return path
    gen = np.random.default_rng(seed)
    # heavy-tailed activity: Pareto weights, scaled to n_rows in total
    w = gen.pareto(1.2, n_users) + 0.05
    rows = np.maximum(1, np.floor(w / w.sum() * n_rows)).astype(np.int64)
    if n_rows > 20_000_000:  # written in slices of users: text columns of 100M rows do not fit in memory
        _write_slices(path, _event_slices(gen, rows))
        return path
    user = np.repeat(np.arange(n_users, dtype=np.int64), rows)
    n = len(user)
    home = gen.integers(0, 50, n_users)
    country = (np.char.add("C", home.astype(str)))[user]
    url = np.minimum(gen.zipf(1.3, n), 10_000_000)
    tmp = path + ".tmp"
    pq.write_table(
        pa.table(
            {
                "user_id": user,
                "url": pa.array(np.char.add("u", url.astype(str))),
                "country": pa.array(country),
                "likes": gen.poisson(1.5, n).astype(np.int64),
                "action": pa.array(np.where(gen.random(n) < 0.9, "view", "share")),
            }
        ),
        tmp,
        row_group_size=1 << 20,
    )
    os.replace(tmp, path)
    return path


def _event_slices(gen: np.random.Generator, rows: np.ndarray) -> Iterator[pa.Table]:
    """The events of :func:`events_path` for large ``n_rows``, the same distributions, generated a
    slice of users at a time (text built by Arrow, not numpy)."""
    import pyarrow.compute as pc

    n_users = len(rows)
    home = gen.integers(0, 50, n_users)
    step = max(1, n_users // 64)
    for lo in range(0, n_users, step):
        hi = min(n_users, lo + step)
        user = np.repeat(np.arange(lo, hi, dtype=np.int64), rows[lo:hi])
        n = len(user)
        url = np.minimum(gen.zipf(1.3, n), 10_000_000)
        yield pa.table({
            "user_id": user,
            "url": pc.binary_join_element_wise("u", pc.cast(pa.array(url), pa.string()), ""),
            "country": pc.binary_join_element_wise("C", pc.cast(pa.array(home[user]), pa.string()), ""),
            "likes": gen.poisson(1.5, n).astype(np.int64),
            "action": pa.array(np.where(gen.random(n) < 0.9, "view", "share")),
        })


def _write_slices(path: str, tables: Iterator[pa.Table]) -> None:
    """Write the tables one after another into one Parquet file (row groups of 1M rows),
    under a temporary name first."""
    tmp = path + ".tmp"
    writer = None
    for t in tables:
        if writer is None:
            writer = pq.ParquetWriter(tmp, t.schema)
        writer.write_table(t, row_group_size=1 << 20)
    assert writer is not None
    writer.close()
    os.replace(tmp, path)


def spread_path(n_rows: int = 10_000_000, n_users: int = 500_000, n_urls: int = 100_000, seed: int = 2) -> str:
    """Path of a generated spread-out events Parquet: ``n_rows`` rows, users and URLs uniform, so
    almost every (user, url) pair is distinct (about ``n_rows`` pairs); created on first use."""
    d = os.path.join(OUT, "data")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"spread_{n_rows}_{n_users}_{n_urls}_{seed}.parquet")
    if os.path.exists(path):
        return path
    gen = np.random.default_rng(seed)

    def slices() -> Iterator[pa.Table]:
        chunk = 1 << 21
        for start in range(0, n_rows, chunk):
            n = min(chunk, n_rows - start)
            url = gen.integers(0, n_urls, n)
            yield pa.table({
                "user_id": gen.integers(0, n_users, n, dtype=np.int64),
                "url": pa.array(np.char.add("u", url.astype(str))),
                "country": pa.array(np.char.add("C", gen.integers(0, 50, n).astype(str))),
                "likes": gen.poisson(1.5, n).astype(np.int64),
            })

    _write_slices(path, slices())
    return path
