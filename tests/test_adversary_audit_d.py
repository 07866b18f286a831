"""Range workloads, synopsis reuse, caps advice, quantiles, variances and declared key domains: corners found
by comparing what an analyst observes on neighbouring datasets and on public metadata at its limits.

What held (no test needed beyond the existing ones): DAWA workloads (1-D, 2-D, dates), histograms, reuse,
quantiles, variances and caps advice answer alike (status, error class and text, schema, warnings, ledger
rows, CLI exit codes and streams) when one person's rows hold NaN, +-inf, -0.0, values at the type limits,
dates at years 1 and 9999, 5 MB texts, invalid UTF-8, or values on and just outside the declared bounds.

Findings kept here (all before any charge, none a function of one person's rows): a declared UBIGINT/HUGEINT key
domain beyond BIGINT raised a bare OverflowError when listed; a HUGEINT domain value of 39 digits made every query
listing it fail with a wrong hint; a synopsis released under one CSV encoding was reused under another (other rows);
a reused synopsis did not say what it estimates; refusals whose hint named a fix that spends budget for nothing
(a quantile told to release a histogram that cannot answer it) or that does not exist (explain --workload,
suggest_caps group_by advised a CAST); a range count with an output expression told no synopsis covers it.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

# -- declared key domains beyond BIGINT ------------------------------------------------------------


def _wide_keys(tmp_path: Path) -> dpsql.Session:
    lines = "".join(f"{i},{i % 2},{i % 2}\n" for i in range(10))
    (tmp_path / "t.csv").write_text("uid,u,h\n" + lines)
    s = dpsql.Session(budget=Budget(10.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"uid": {"type": "BIGINT"}, "u": {"type": "UBIGINT", "domain": [0, 1, 2**64 - 1]},
                        "h": {"type": "HUGEINT", "domain": [0, 1, 2**100]}})
    return s


@pytest.mark.parametrize("sql", ["SELECT u FROM t GROUP BY u", "SELECT DISTINCT u FROM t", "SELECT h FROM t GROUP BY h",
                                 "SELECT u, h FROM t GROUP BY u, h"])
def test_a_declared_domain_beyond_bigint_is_listed_free(tmp_path: Path, sql: str) -> None:
    """A UBIGINT or HUGEINT key domain holding a value beyond BIGINT (2^64 - 1, 2^100) raised a bare
    OverflowError from explain and query (the CLI's exit 1) when the domain was listed."""
    s = _wide_keys(tmp_path)
    s.explain(sql, epsilon=1)
    r = s.query(sql, epsilon=1)
    rows = r.table.to_pylist()
    if "u" in r.table.column_names:
        assert r.table.schema.field("u").type == pa.uint64()
        assert {row["u"] for row in rows} == {0, 1, 2**64 - 1}
    if "h" in r.table.column_names:
        assert {int(row["h"]) for row in rows} == {0, 1, 2**100}
    assert r.cost == Budget(0.0, 0.0)


def test_control_a_domain_within_bigint_keeps_its_type(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("uid,u\n" + "".join(f"{i},{i % 2}\n" for i in range(10)))
    s = dpsql.Session(budget=Budget(10.0, 0.5))
    s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"uid": {"type": "BIGINT"}, "u": {"type": "UBIGINT", "domain": [0, 1, 2]}})
    r = s.query("SELECT u FROM t GROUP BY u", epsilon=1)
    assert r.table.schema.field("u").type == pa.uint64() and r.table.column("u").to_pylist() == [0, 1, 2]


# -- caps advice over a column dpsql cannot group by -----------------------------------------------


def _typed_columns(tmp_path: Path) -> dpsql.Session:
    import datetime as dt

    t = pa.table({"uid": list(range(6)), "tz": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * 6,
                                                         pa.timestamp("us", tz="UTC")),
                  "l": pa.array([[1.0]] * 6, pa.list_(pa.float64())), "g": ["a", "b"] * 3})
    pq.write_table(t, tmp_path / "t.parquet")
    s = dpsql.Session(budget=Budget(10.0, 0.5))
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=1)
    return s


@pytest.mark.parametrize("column", ["tz", "l"])
def test_caps_advice_by_a_column_it_cannot_group_says_so_with_a_fix_it_takes(tmp_path: Path, column: str) -> None:
    """suggest_caps(group_by=...) takes a column name; over a TIMESTAMPTZ column the refusal said 'the query does not
    type-check' and advised 'group by CAST(tz AS VARCHAR)', which group_by cannot be given."""
    s = _typed_columns(tmp_path)
    with pytest.raises(DPSQLError) as e:
        s.suggest_caps("t", epsilon=1, group_by=column)
    text = str(e.value)
    assert "group_by" in text and f"'{column}'" in text and "CAST(" not in text and "query" not in text
    assert s.history().num_rows == 0


def test_control_caps_advice_by_a_text_column_is_answered(tmp_path: Path) -> None:
    s = _typed_columns(tmp_path)
    assert s.suggest_caps("t", epsilon=1, group_by="g").details["group_by"] == "g"


def test_caps_advice_by_a_uhugeint_column_counts_its_groups() -> None:
    """suggest_caps(group_by=<UHUGEINT>) was refused as a key dpsql does not group by: its values beyond 2^127 cannot
    be released as numbers, but caps advice releases no key, only how many groups each person has."""
    import duckdb

    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i // 2 AS uid, CASE WHEN i % 2 = 0 THEN 340282366920938463463374607431768211455"
                "::UHUGEINT ELSE 340282366920938463463374607431768211454::UHUGEINT END AS u FROM range(400) r(i)")
    s = dpsql.Session(budget=Budget(10.0, 0.5), connection=con)
    use_noise(s, zero_noise(1))
    s.register("t", "t", privacy_unit="uid")
    out = s.suggest_caps("t", epsilon=1, group_by="u").table.to_pylist()
    groups = {r["from"]: r["people"] for r in out if r["contribution"].startswith("groups")}
    assert groups[2] == 200 and groups[1] == 0  # 200 people of two groups each: 2^128 - 1 and 2^128 - 2 stay apart
    s.close()


# -- the command line explains a range workload --------------------------------------------------


def test_the_command_line_explains_a_workload_file_free(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dpsql explain -f w.sql` of a workload file was refused with the hint to use --workload, which explain did
    not accept (a usage error): a workload could not be explained from the command line before its charge."""
    import json

    from conftest import run_cli as run

    cfg = ["--config", "examples/dpsql.toml"]
    (workdir / "w.sql").write_text("SELECT COUNT(*) FROM events WHERE age BETWEEN 18 AND 30;\n"
                                   "SELECT COUNT(*) FROM events WHERE age BETWEEN 31 AND 60;\n")
    assert run([*cfg, "explain", "-f", "w.sql", "--epsilon", "0.5"]) == 2
    assert "--workload" in capsys.readouterr().err
    assert run([*cfg, "explain", "-f", "w.sql", "--workload", "--epsilon", "0.5", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mechanism"] == "dawa" and plan["parameters"]["queries"] == 2
    assert run([*cfg, "budget", "--history", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == []
    assert run([*cfg, "query", "-f", "w.sql", "--workload", "--epsilon", "0.5", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["mechanism"] == "dawa"


@pytest.mark.parametrize("q", ["np32", "0.5", 0.5])
def test_caps_advice_reads_any_real_quantile_as_epsilon_is_read(tmp_path: Path, q: object) -> None:
    """quantile=numpy.float32(0.5) was refused as 'quantile must be in (0, 1), got np.float32(0.5)'."""
    import numpy as np

    s = _typed_columns(tmp_path)
    r = s.suggest_caps("t", epsilon=1, quantile=np.float32(0.5) if q == "np32" else q)  # type: ignore[arg-type]
    assert r.details["quantile"] == 0.5 and isinstance(r.details["quantile"], float)


@pytest.mark.parametrize("q", [0, 1, True, "1_0", "x", float("nan"), None, [0.5]])
def test_control_caps_advice_refuses_a_quantile_outside_the_open_interval(tmp_path: Path, q: object) -> None:
    s = _typed_columns(tmp_path)
    with pytest.raises(DPSQLError, match="quantile must be a number"):
        s.suggest_caps("t", epsilon=1, quantile=q)  # type: ignore[arg-type]
    assert s.history().num_rows == 0


# -- a stored synopsis and the CSV encoding it was read under -----------------------------------


@pytest.mark.parametrize("version", [None, "2026-12-01"])
def test_a_synopsis_read_under_one_csv_encoding_is_not_reused_under_another(tmp_path: Path, version: str | None) -> None:
    """The engine setting csv_encoding decides which rows a CSV source has (under 'utf-8' a line that is not UTF-8 is
    skipped, under 'latin-1' it is read), but the synopsis key did not name it: a histogram released under 'latin-1'
    answered, for free, the same histogram asked under 'utf-8', which reads other rows."""
    lines = b"".join(f"{i},{i % 10},a\n".encode() for i in range(40)) + b"99,5,\xe9t\xe9\n"
    (tmp_path / "t.csv").write_bytes(b"uid,age,name\n" + lines)
    ledger = str(tmp_path / "l.duckdb")
    sql = "SELECT age, COUNT(*) FROM t GROUP BY age"
    mechanisms = []
    for i, encoding in enumerate(("latin-1", "utf-8", "latin-1")):
        with dpsql.Session(ledger, Budget(10.0, 0.5), create=i == 0, engine={"csv_encoding": encoding}) as s:
            s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1, version=version,
                       columns={"uid": {"type": "BIGINT"}, "age": {"type": "BIGINT", "bounds": (0, 9), "bins": 10}})
            mechanisms.append(s.query(sql, epsilon=1).mechanism)
    assert mechanisms == ["dawa", "dawa", "dawa (reused synopsis)"]


# -- the fix a quantile's reuse refusal names ----------------------------------------------------


def _ordered(tmp_path: Path) -> dpsql.Session:
    t = pa.table({"uid": list(range(40)), "v": [float(i % 20) for i in range(40)], "x": [float(i) for i in range(40)],
                  "c": ["a", "b"] * 20})
    pq.write_table(t, tmp_path / "t.parquet")
    s = dpsql.Session(budget=Budget(50.0, 0.5))
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"v": {"bounds": (0, 20), "bins": 20}, "x": {"bounds": (0, 40)}, "c": {"domain": ["a", "b"]}})
    return s


@pytest.mark.parametrize("sql", ["SELECT MEDIAN(x) FROM t", "SELECT c, MEDIAN(v) AS m FROM t GROUP BY c"])
def test_a_quantile_no_histogram_answers_is_not_told_to_release_one(tmp_path: Path, sql: str) -> None:
    """reuse='synopsis' on a quantile no stored histogram can answer (a column without bins, a grouped quantile) was
    told to 'release the histogram first (SELECT col, COUNT(*) FROM t GROUP BY col)': doing so spent budget and the
    same refusal followed."""
    s = _ordered(tmp_path)
    with pytest.raises(DPSQLError) as e:
        s.query(sql, epsilon=1, options={"reuse": "synopsis"})
    assert "release the histogram" not in e.value.hint and "no stored histogram answers" in e.value.hint


@pytest.mark.parametrize("where", ["", " WHERE c = 'a'"])
def test_control_following_the_named_histogram_makes_the_quantile_free(tmp_path: Path, where: str) -> None:
    s = _ordered(tmp_path)
    sql = f"SELECT MEDIAN(v) FROM t{where}"
    with pytest.raises(DPSQLError) as e:
        s.query(sql, epsilon=1, options={"reuse": "synopsis"})
    assert "SELECT v, COUNT(*) FROM t " in e.value.hint and ("WHERE ..." in e.value.hint) == bool(where)
    s.query(f"SELECT v, COUNT(*) FROM t{where} GROUP BY v", epsilon=1)
    assert s.query(sql, epsilon=1, options={"reuse": "synopsis"}).reused


# -- what a reused synopsis estimates ----------------------------------------------------------------


def test_a_range_count_read_from_a_histogram_synopsis_says_what_it_estimates(tmp_path: Path) -> None:
    """A release read from a stored synopsis had no details['estimates'] and its note said 'same table, column(s),
    WHERE and cap', also where the synopsis was a histogram's, bounded per bin (k rows per person and bin, C_u bins),
    answering a range count (whose own rule keeps L rows per person)."""
    s = _ordered(tmp_path)
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=3, max_groups_per_unit=2,
               max_rows_per_group=1, version="v1", columns={"v": {"bounds": (0, 20), "bins": 20}})
    s.query("SELECT v, COUNT(*) FROM t GROUP BY v", epsilon=1)
    r = s.query("SELECT COUNT(*) FROM t WHERE v < 10", epsilon=1, options={"reuse": "synopsis"})
    assert r.reused and "1 row(s) per person in each group and 2 group(s) per person" in r.details["estimates"]
    assert not any("and cap" in n for n in r.notes)
    s.query_many(["SELECT COUNT(*) FROM t WHERE v < 5"], epsilon=1)
    w = s.query_many(["SELECT COUNT(*) FROM t WHERE v < 5", "SELECT COUNT(*) FROM t WHERE v >= 5"], epsilon=1)
    assert w.reused and "range counts over at most 3 row(s) per person" in w.details["estimates"]
    h = s.query("SELECT floor(v / 2) * 2 AS v2, COUNT(*) FROM t GROUP BY v2", epsilon=1)
    assert h.reused and "2 group(s) per person" in h.details["estimates"]


def test_a_hugeint_domain_value_beyond_38_digits_is_refused_at_registration(tmp_path: Path) -> None:
    """Such a value (2^127 - 1) was registered, then every query listing the domain was refused as 'the query's outputs,
    HAVING or ORDER BY cannot be evaluated on the declared key values' with a hint about casts the query did not have."""
    (tmp_path / "t.csv").write_text("uid,h\n" + "".join(f"{i},{i % 2}\n" for i in range(10)))
    s = dpsql.Session(budget=Budget(10.0, 0.5))
    with pytest.raises(dpsql.errors.ConfigError, match="more than 38 digits"):
        s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1,
                   columns={"uid": {"type": "BIGINT"}, "h": {"type": "HUGEINT", "domain": [0, 2**127 - 1]}})
    s.register("t", str(tmp_path / "t.csv"), privacy_unit="uid", max_rows_per_unit=1,
               columns={"uid": {"type": "BIGINT"}, "h": {"type": "HUGEINT", "domain": [0, 1, 10**38 - 1, -(10**38 - 1)]}})
    for sql in ("SELECT h FROM t GROUP BY h", "SELECT h, COUNT(*) AS n FROM t GROUP BY h"):
        assert {int(v) for v in s.query(sql, epsilon=1).table.column("h").to_pylist()} == {0, 1, 10**38 - 1, -(10**38 - 1)}


def test_caps_advice_on_a_public_table_says_it_holds_no_person(tmp_path: Path) -> None:
    """It said the table 'has no privacy unit column and reaches none through a foreign key', as if one were missing."""
    s = _typed_columns(tmp_path)
    s.register("countries", pa.table({"code": ["a", "b"]}), public=True)
    with pytest.raises(dpsql.errors.PolicyError, match="declared public: it holds no person"):
        s.suggest_caps("countries", epsilon=1)
    assert s.history().num_rows == 0


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) * 2 AS n FROM t WHERE v < 10", "SELECT COUNT(*) AS n FROM t WHERE v < 10 HAVING n > 3",
                                 "SELECT COUNT(*) FROM t WHERE v < 10 LIMIT 1"])
def test_a_range_count_that_is_not_plain_is_not_told_no_synopsis_covers_it(tmp_path: Path, sql: str) -> None:
    """With a synopsis of the range stored, reuse='synopsis' on the same count with an output expression, HAVING or
    LIMIT was refused as 'no stored DAWA synopsis covers this query', which sends the analyst to release one again."""
    s = _ordered(tmp_path)
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid", max_rows_per_unit=1, version="v1",
               columns={"v": {"bounds": (0, 20), "bins": 20}})
    s.query_many(["SELECT COUNT(*) FROM t WHERE v < 5"], epsilon=1)
    assert s.query("SELECT COUNT(*) AS n FROM t WHERE v < 10", epsilon=1, options={"reuse": "synopsis"}).reused
    with pytest.raises(dpsql.errors.PolicyError) as e:
        s.query(sql, epsilon=1, options={"reuse": "synopsis"})
    assert "plain range count" in str(e.value) and "asks more than the count" in str(e.value) and "no stored DAWA synopsis covers" not in str(e.value)
    assert [r["status"] for r in s.history().to_pylist()] == ["released", "reused"]


def test_the_command_line_names_the_group_by_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import run_cli as run

    _typed_columns(tmp_path).close()
    assert run(["init", "--epsilon", "10", "--ledger", str(tmp_path / "l.duckdb")]) == 0
    common = ["--ledger", str(tmp_path / "l.duckdb"), "--table", f"t={tmp_path / 't.parquet'}", "--privacy-unit", "t=uid"]
    for col in ("tz", "nope"):
        capsys.readouterr()
        assert run([*common, "suggest-caps", "t", "--epsilon", "1", "--group-by", col]) == 2
        err = capsys.readouterr().err
        assert f"--group-by '{col}'" in err and "group_by" not in err, err
