"""OpenDP (Polars API) side of benchmarks/peers.py; runs in benchmarks/peers/.venv-opendp.

python run_opendp.py DATA.parquet ROWS REPEAT  ->  JSON on stdout: per query, the wall seconds of
each run (context, calibration, release, collect) and the released rows of the last one as
[key..., value] (value: the count, or for Q3 the sum).

Each query gets its own context with the whole budget (epsilon 1, delta 1e-5), the privacy
unit ``user_id``, at most 1 row per (user, group) and 5 groups per user. OpenDP 0.16's
random group choice (``keep="sample"``) fails on these queries (it builds a struct with two
fields of one name), so the groups are truncated with its deterministic ``keep="first"``.
"""

import json
import sys
import time
import warnings

import opendp.prelude as dp
import polars as pl

warnings.simplefilter("ignore")
dp.enable_features("contrib")

path, n_rows, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
countries = pl.LazyFrame({"country": [f"C{i}" for i in range(50)]})


def context() -> dp.Context:
    return dp.Context.compositor(
        data=pl.scan_parquet(path),
        privacy_unit=dp.unit_of(contributions=1, identifier="user_id"),
        privacy_loss=dp.loss_of(epsilon=1.0, delta=1e-5),
        split_evenly_over=1,
        margins=[dp.polars.Margin(by=["country"], max_length=n_rows, invariant="keys"),
                 dp.polars.Margin(by=[], max_length=n_rows)],
    )


def q1() -> pl.DataFrame:
    q = (context().query().truncate_per_group(1, by=["country"]).truncate_num_groups(5, by=["country"], keep="first")
         .group_by("country").agg(dp.len()).with_keys(countries))
    return q.release().collect().select("country", pl.col("len").cast(pl.Float64))


def q2() -> pl.DataFrame:
    q = (context().query().truncate_per_group(1, by=["url", "country"])
         .truncate_num_groups(5, by=["url", "country"], keep="first").group_by("url", "country").agg(dp.len()))
    return q.release().collect().select("url", "country", pl.col("len").cast(pl.Float64))


def q3() -> pl.DataFrame:
    likes = pl.col("likes").cast(pl.Float64).fill_null(0.0)
    q = (context().query().truncate_per_group(1, by=["country"]).truncate_num_groups(5, by=["country"], keep="first")
         .group_by("country").agg(likes.dp.sum((0.0, 10.0)).alias("s"), likes.dp.mean((0.0, 10.0)).alias("a"))
         .with_keys(countries))
    return q.release().collect().select("country", "s")


out = {}
for name, fn in (("Q1", q1), ("Q2", q2), ("Q3", q3)):
    secs = []
    for _ in range(repeat):
        t = time.perf_counter()
        df = fn()
        secs.append(time.perf_counter() - t)
    out[name] = {"seconds": secs, "rows": [list(r) for r in df.iter_rows()]}
import resource  # noqa: E402

out["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
