"""What the analyst reads of a release (its columns' types, the meta, the command line's outputs) as a function of public
metadata and released values: one key column, one type, whichever mechanism answers. Each test says what was wrong
and what is right now.

* A histogram over an integer column's declared bins (``GROUP BY age``, answered by DAWA) released its keys as BIGINT
  (Arrow int64), where every other route releases the key column's own type (INTEGER: int32 for a sparse histogram's
  keys, ``SELECT age, COUNT(*), SUM(x) ... GROUP BY age``, or a declared domain's). So an output file's schema followed
  the route, and post-processing read the keys differently: ``age * 2000000000`` was 4000000000 over DAWA's BIGINT
  keys, and NULL (INTEGER overflow, made total) over the sparse histogram's. Now DAWA's integer keys have the column's
  type, and ``age * 2000000000`` over the declared bins is refused for free, as over a declared domain.
* An AVG released NULL (its group's noisy count below 1) still had a per-row interval and noise std in the meta
  (``per_row_ci95_half_width``, ``per_row_noise_std``), read from the group's noisy centred sum, which the release
  does not otherwise show (VARIANCE, CORR and the REGR family give such a row none). Now it has none (null in the
  meta), and the command line's summary, which printed ``noise std nan, 95% interval +/- nan (row 1; ...)`` when the
  first row was NULL, names the first row that has an interval.

What held (zero noise, neighbouring datasets: one person added with NULLs, NaN, +-inf, 1e308, a 100 000-character text,
dates of year 1 and 9999, DATE and TIMESTAMP at their infinities and extremes, an empty table; compared through the
Python API and through ``dpsql query`` with ``-o x.parquet``, ``-o x.csv --meta m.json``, ``--format json`` and the
table): the Parquet schema, the CSV header, the meta's keys and ``column_types``, the exit code and the stderr lines
(numbers masked) are the same for both neighbours, differing only where the released values differ (a NULL VARIANCE of
an empty table); grouped joins, lookup joins and DP-S4S alike. Python warnings: none raised by any neighbour. A CSV
source with one hostile line (too many or too few fields, an unterminated quote, a NUL, a 3 MB field, 5 000 fields, a
byte that is not UTF-8, 1e400, nan, odd dates and timestamps: infinity, 2020-02-30, year 0, 294247, BC) is read or
skipped without a failure, a warning or another exit code. Released key types equal DuckDB's for every route tried
(declared domains, keys the WHERE lists, sparse histograms, date_trunc / year / CAST keys, quantiles per key,
public-domain DISTINCT) and for DECIMAL, HUGEINT, UBIGINT, DATE, TIMESTAMP, BOOLEAN and text keys; post-processing
is total (overflow, division by zero: NULL) and its casts are allow-listed; every text form (CSV, JSON, table,
Parquet) writes TIMESTAMP_S / _NS, HUGEINT, DECIMAL(38, 37) and INTERVAL outputs; ``explain --format json`` and every
meta are strict JSON (no NaN or Infinity); AVG, SUM/COUNT, FILTER and CASE spellings count NULL and non-finite
values alike; bounds given as ints, floats or text release the same values and types; duplicate output names are
renamed alike in every form; a ROLLUP that reuses a stored synopsis for one grouping is charged for the other only.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql import cli
from dpsql.errors import QueryTypeError
from dpsql.testing import use_noise, zero_noise


def _people() -> pa.Table:
    n = 120
    return pa.table({"pid": list(range(n)), "age": pa.array([i % 50 for i in range(n)], pa.int32()),
                     "small": pa.array([i % 20 for i in range(n)], pa.int16()),
                     "x": [float(i % 10) for i in range(n)]})


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    use_noise(s, zero_noise(73))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.register("t", _people(), privacy_unit="pid", max_rows_per_unit=1,
                   columns={"age": {"bounds": (0, 50), "bins": 50}, "small": {"bounds": (0, 20), "bins": 20},
                            "x": {"bounds": (0, 10)}})
    return s


@pytest.mark.parametrize("col,typ", [("age", pa.int32()), ("small", pa.int16())])
def test_a_histograms_integer_keys_have_the_columns_type(col: str, typ: pa.DataType) -> None:
    s = _session()
    dawa = s.query(f"SELECT {col}, COUNT(*) AS n FROM t GROUP BY {col}", epsilon=1.0)
    assert dawa.mechanism == "dawa"
    sparse = s.query(f"SELECT {col}, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY {col}", epsilon=1.0, delta=1e-6)
    assert sparse.mechanism == "sparse_histogram"
    assert dawa.table.schema.field(col).type == typ == sparse.table.schema.field(col).type
    assert dawa.meta()["column_types"][0] == str(typ)
    listed = s.query(f"SELECT {col}, COUNT(*) AS n FROM t WHERE {col} IN (1, 2) GROUP BY {col}", epsilon=1.0)
    assert listed.table.schema.field(col).type == typ and listed.table.column(col).to_pylist() == [1, 2]
    rolled = s.query(f"SELECT {col}, COUNT(*) AS n FROM t GROUP BY ROLLUP ({col})", epsilon=1.0)
    assert rolled.table.schema.field(col).type == typ


def test_post_processing_reads_a_histograms_keys_as_the_column_does() -> None:
    s = _session()
    with pytest.raises(QueryTypeError, match="cannot be evaluated on the declared key values; nothing was charged"):
        s.query("SELECT age * 2000000000 AS big, COUNT(*) AS n FROM t GROUP BY age", epsilon=1.0)
    assert s.history().num_rows == 0


def test_keys_a_type_cannot_hold_or_that_are_no_integers_stay_as_before() -> None:
    """Negative control: a histogram over ``floor(age / 10) * 10`` releases doubles (DuckDB's type of that key), and a
    key that fits keeps its value."""
    s = _session()
    r = s.query("SELECT floor(age / 10) * 10 AS decade, COUNT(*) AS n FROM t GROUP BY decade", epsilon=1.0)
    assert r.table.schema.field("decade").type == pa.float64()
    assert r.table.column("decade").to_pylist() == [0.0, 10.0, 20.0, 30.0, 40.0]
    r = s.query("SELECT age, COUNT(*) AS n FROM t GROUP BY age", epsilon=1.0)
    assert r.table.column("age").to_pylist() == list(range(50))


def _avg_session() -> dpsql.Session:
    s = dpsql.Session(budget=dpsql.Budget(1e9, 0.9))
    use_noise(s, zero_noise(73))
    s.register("t", pa.table({"pid": list(range(40)), "g": [i % 3 for i in range(40)], "x": [5.0] * 40}),
               privacy_unit="pid", columns={"g": {"domain": [0, 1, 2, 3]}, "x": {"bounds": (0, 1000)}})
    return s


def test_an_avg_released_null_has_no_interval() -> None:
    r = _avg_session().query("SELECT g, AVG(x) AS a, VARIANCE(x) AS v FROM t GROUP BY g ORDER BY g DESC",
                             epsilon=1.0, delta=1e-6)
    assert r.table.column("g").to_pylist() == [3, 2, 1, 0] and r.table.column("a").to_pylist()[0] is None
    acc = r.meta()["accuracy"]
    assert acc["a"]["per_row_ci95_half_width"][0] is None and acc["a"]["per_row_noise_std"][0] is None
    assert acc["v"]["per_row_ci95_half_width"][0] is None  # as VARIANCE's
    assert all(v is not None and v > 0 for v in acc["a"]["per_row_ci95_half_width"][1:])
    # the summaries are medians over the rows that have an interval
    rows = acc["a"]["per_row_noise_std"][1:]
    assert acc["a"]["noise_std"] == sorted(rows)[1]
    assert math.isfinite(r.accuracy["a"]["ci95_half_width"])


def test_the_command_lines_summary_names_the_first_row_that_has_an_interval(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    pq.write_table(pa.table({"pid": list(range(40)), "g": [i % 3 for i in range(40)], "x": [5.0] * 40}), "t.parquet")
    opened = cli._open_session

    def opening(args: object, **kw: object) -> object:
        s = opened(args, **kw)  # type: ignore[arg-type]
        use_noise(s, zero_noise(73))
        return s

    monkeypatch.setattr(cli, "_open_session", opening)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["init", "--ledger", "l.duckdb", "--epsilon", "100", "--delta", "0.1"]) == 0
    flags = ["--ledger", "l.duckdb", "--table", "t=t.parquet", "--privacy-unit", "t=pid", "--bounds", "t.x=0:1000",
             "--domain", "t.g=0,1,2,3"]
    for agg, words in (("AVG", "a: noise std "), ("VARIANCE", "a: 95% interval +/- ")):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = cli.main([*flags, "query", f"SELECT g, {agg}(x) AS a FROM t GROUP BY g ORDER BY g DESC",
                             "--epsilon", "1", "--delta", "1e-6"])
        assert code == 0, err.getvalue()
        line = next(ln for ln in err.getvalue().splitlines() if ln.startswith("  a:"))
        assert line.startswith(f"  {words}") and "nan" not in line and "(row 2; per row in --meta)" in line
