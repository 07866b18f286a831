"""DP SQL as analysts write it for other DP engines, over a census-like table (PUMS-style).

Each query is either answered within its stated accuracy -- the released value is compared with
the true value computed by DuckDB on the raw rows (every person has one row and the data lie
inside the declared bounds, so the bounded truth is the raw truth) -- or refused with a message
that names the fix, spending nothing. Noise is seeded from the query text (fixed seeds); a value
passes when it is within 5 reported 95% half-widths of the truth (Gaussian: 9.8 sigma; Laplace:
15 scales, i.e. failure probability below 1e-6 per value). Quantiles are checked by the rank
statement they publish (``rank_error_95``), widened likewise.

``NEEDS_SQL_COVERAGE_A`` lists the constructs that another change set implements (schema-qualified
names, GROUP BY without an aggregate, VARIANCE / STDDEV, TOP n, RAND(), COUNT(DISTINCT col),
SUM(expression), GROUP BY on the privacy unit, join refusals without false violations): their
expectations are written as the issue states them, marked xfail (not strict) until it is merged.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest
import sqlglot
from sqlglot import exp

import dpsql
from dpsql.errors import ConfigError, PolicyError, QueryError, SQLSyntaxError
from dpsql.plan import ir
from dpsql.plan.analyze import analyze
from dpsql.plan.parse import bracket_identifiers
from dpsql.testing import seeded_noise, use_noise

# -- the data and its registration (one file: no conftest name shared with tests/) -----------------------------

#: the data owner's metadata, as a peer's YAML would state it
PUMS_COLUMNS = {
    "age": {"bounds": (0, 100)},
    "sex": {"domain": [0, 1], "bounds": (0, 1)},
    "educ": {"domain": list(range(1, 17)), "bounds": (1, 16)},
    "race": {"domain": list(range(1, 7))},
    "income": {"bounds": (0, 500000)},
    "married": {"domain": [0, 1], "bounds": (0, 1)},
}


def pums_table(n: int = 1000, seed: int = 20261130) -> pa.Table:
    """age 18..93, sex 0/1, educ 1..16, race 1..6 (skewed), income (skewed, by education), married 0/1; pid unique."""
    gen = np.random.default_rng(seed)
    age = gen.integers(18, 94, n)
    educ = np.clip(np.rint(gen.normal(10, 3, n)), 1, 16).astype(np.int64)
    race = gen.choice(np.arange(1, 7), n, p=[0.6, 0.15, 0.1, 0.08, 0.04, 0.03])
    income = np.clip(np.rint(gen.lognormal(9.5 + 0.08 * educ, 0.9)), 0, 420000)
    married = (gen.random(n) < np.clip((age - 18) / 60, 0.1, 0.7)).astype(np.int64)
    return pa.table({
        "age": age.astype(np.int64), "sex": gen.integers(0, 2, n).astype(np.int64), "educ": educ,
        "race": race.astype(np.int64), "income": income.astype(np.int64), "married": married,
        "pid": np.arange(1, n + 1, dtype=np.int64),
    })


@pytest.fixture(scope="module")
def pums() -> pa.Table:
    return pums_table()


@pytest.fixture(scope="module")
def peer_session(pums: pa.Table) -> Iterator[dpsql.Session]:
    s = dpsql.Session(budget=dpsql.Budget(100000.0, 0.5))
    s.register("pums", pums, privacy_unit="pid", max_rows_per_unit=1, max_groups_per_unit=1, max_rows_per_group=1,
               columns=PUMS_COLUMNS)
    yield s
    s.close()


@pytest.fixture(scope="module")
def truth(pums: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
    """The raw table, as ``pums`` and as ``PUMS.PUMS`` (the peer's schema-qualified name)."""
    con = duckdb.connect()
    con.register("pums_arrow", pums)
    con.execute("CREATE TABLE pums AS SELECT * FROM pums_arrow")
    con.execute("CREATE SCHEMA pums")
    con.execute("CREATE TABLE pums.pums AS SELECT * FROM pums_arrow")
    yield con
    con.close()


EPS, DELTA = 1.0, 1e-5
#: reported 95% half-widths a released value may be off by (see the module docstring)
WIDEN = 5.0


@dataclass(frozen=True)
class Case:
    sql: str
    #: "answer", "refuse", or "answer_or_refuse" (either is right; a refusal must name the fix)
    expect: str = "answer"
    error: type[Exception] = QueryError
    #: a regular expression the refusal's message or hint must match (it names the fix)
    fix: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    epsilon: float = EPS
    #: at most this many violations listed (errors name the real cause, no false extras)
    max_violations: int | None = None


def A(sql: str, **kw: Any) -> Case:
    return Case(sql, "answer", **kw)


def R(sql: str, fix: str, error: type[Exception] = QueryError, **kw: Any) -> Case:
    return Case(sql, "refuse", error=error, fix=fix, **kw)


ANSWERED = [
    # -- counts, the peer engines' bread and butter ------------------------------------------------
    A("SELECT COUNT(*) FROM PUMS"),
    A("SELECT COUNT(*) FROM pums"),
    A("select count(*) from pums"),
    A("SELECT COUNT(*) AS n FROM PUMS"),
    A('SELECT COUNT(*) AS "Count" FROM "pums"'),
    A("SELECT COUNT(*) FROM [PUMS]"),
    A("SELECT COUNT([age]) FROM [PUMS] WHERE [married] = 1"),
    A("SELECT COUNT(age) FROM PUMS"),
    A('SELECT COUNT("age") FROM PUMS'),
    A("SELECT COUNT(pid) FROM PUMS"),
    A("SELECT COUNT(DISTINCT pid) AS people FROM PUMS"),
    A("SELECT COUNT(*) FROM PUMS WHERE age > 30"),
    A("SELECT COUNT(*) FROM (SELECT * FROM PUMS WHERE age > 30) t"),
    A("SELECT COUNT(*) FROM PUMS WHERE age >= 21 AND age < 65"),
    A("SELECT COUNT(*) FROM PUMS WHERE age BETWEEN 30 AND 40 AND (race = 1 OR race = 2)"),
    A("SELECT COUNT(*) FROM PUMS WHERE race IN (1, 2) OR married = 0"),
    A("SELECT COUNT(*) FROM PUMS WHERE NOT married = 1"),
    A("SELECT COUNT(*) FROM PUMS WHERE income > 50000 AND income <= 100000"),
    A("SELECT COUNT(*) FROM PUMS WHERE age IS NOT NULL"),
    A("SELECT COUNT(*) FROM PUMS WHERE educ <> 9"),
    A("SELECT COUNT(*) FROM PUMS WHERE educ != 9 AND sex = 1"),
    A("SELECT COUNT(*) FROM PUMS WHERE CAST(age AS VARCHAR) LIKE '3%'"),
    A("SELECT COUNT(*) FROM PUMS WHERE age % 2 = 0"),
    A("SELECT COUNT(*) FROM PUMS AS P WHERE P.age > 50"),
    A("SELECT COUNT(*) FROM PUMS p WHERE p.sex = 1 AND p.educ >= 13"),
    A("select Count(*) as N from Pums where Married = 1"),
    A("SeLeCt CoUnT(*) FrOm PuMs WhErE SeX = 0"),
    A("/* peer test: count of women */ SELECT COUNT(*) FROM PUMS WHERE sex = 1"),
    A("SELECT COUNT(*) -- all rows\nFROM PUMS\n-- the end"),
    A("SELECT\n  COUNT(*) AS n\nFROM\n  PUMS\nWHERE\n  age > 40\n"),
    A("SELECT COUNT(*) FROM PUMS;"),
    A("SELECT COUNT(*) FROM PUMS WHERE age > 30 GROUP BY ()"),
    A("SELECT COUNT(*) * 2 AS twice FROM PUMS"),
    A("SELECT COUNT(*) FROM PUMS LIMIT 1"),
    A("SELECT COUNT(*) FROM PUMS OFFSET 0 ROWS FETCH NEXT 1 ROWS ONLY"),
    # -- sums and averages over bounded columns ---------------------------------------------------
    A("SELECT SUM(age) FROM PUMS"),
    A("SELECT SUM(income) FROM PUMS"),
    A("SELECT SUM(married) AS married_people FROM PUMS"),
    A("SELECT AVG(age) FROM PUMS"),
    A("SELECT AVG(income) AS avg_income FROM PUMS"),
    A("SELECT AVG(income) FROM PUMS WHERE educ >= 13"),
    A("SELECT AVG(age) FILTER (WHERE sex = 1) FROM PUMS"),  # answered as AVG(CASE WHEN sex = 1 THEN age END)
    A("SELECT AVG(age), SUM(age), COUNT(age) FROM PUMS"),
    A("SELECT COUNT(*) AS n, AVG(age) AS a, SUM(income) FROM PUMS WHERE sex = 1"),
    A("SELECT AVG(married) FROM PUMS WHERE age > 60"),
    A("SELECT ROUND(AVG(age), 1) AS a FROM PUMS"),
    A("SELECT AVG(income) / 1000 AS k FROM PUMS"),
    A("SELECT SUM(age) / COUNT(*) AS mean_age FROM PUMS"),
    A("SELECT AVG(educ) FROM [PUMS] WHERE [race] = 1"),
    # -- GROUP BY over declared (public) keys --------------------------------------------------------
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY sex"),
    A("SELECT sex, COUNT(*) AS n FROM PUMS GROUP BY sex ORDER BY sex"),
    A("SELECT Sex, Count(*) AS n FROM PuMs GROUP BY Sex ORDER BY Sex"),
    A("SELECT sex AS s, AVG(income) AS avg_income FROM PUMS GROUP BY sex ORDER BY avg_income DESC"),
    A("SELECT race, COUNT(*) FROM PUMS GROUP BY race"),
    A("SELECT race, COUNT(*) FROM PUMS WHERE age > 30 AND income > 10000 GROUP BY race ORDER BY race LIMIT 3"),
    A("SELECT educ, COUNT(*) FROM PUMS GROUP BY educ ORDER BY COUNT(*) DESC LIMIT 5"),
    A("SELECT educ, AVG(income) FROM PUMS WHERE educ BETWEEN 9 AND 12 GROUP BY educ"),
    A("SELECT educ, AVG(age) AS a, COUNT(*) AS n FROM PUMS GROUP BY educ ORDER BY educ"),
    A("SELECT married, COUNT(*) AS n FROM PUMS GROUP BY married HAVING COUNT(*) > 100"),
    A("SELECT married, AVG(income) AS inc, AVG(age) AS age FROM PUMS GROUP BY married"),
    A("SELECT sex, race, COUNT(*) FROM PUMS GROUP BY sex, race"),
    A("SELECT sex, married, SUM(income) FROM PUMS GROUP BY sex, married ORDER BY sex, married"),
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY 1"),
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY ALL"),
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY sex ORDER BY 2 DESC LIMIT 1"),
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY sex ORDER BY 2 DESC FETCH FIRST 1 ROWS ONLY"),
    A("SELECT sex, COUNT(*) FROM PUMS GROUP BY sex HAVING AVG(age) > 10"),
    A("SELECT race, AVG(income) AS inc FROM PUMS GROUP BY race HAVING COUNT(*) > 50 ORDER BY inc DESC"),
    A("SELECT p.sex, COUNT(*) FROM PUMS AS p GROUP BY p.sex"),
    A("SELECT [sex], COUNT(*) AS [n] FROM [PUMS] GROUP BY [sex]"),
    A('SELECT "married", COUNT(*) AS "N" FROM "PUMS" GROUP BY "married"'),
    A("SELECT sex, COUNT(*) AS n, CASE WHEN COUNT(*) > 400 THEN 'many' ELSE 'few' END AS size FROM PUMS GROUP BY sex"),
    # -- GROUP BY over keys not declared public (sparse histogram, thresholded) ------------------------
    A("SELECT age, COUNT(*) FROM PUMS GROUP BY age"),
    A("SELECT age, COUNT(*) AS n FROM PUMS WHERE sex = 0 GROUP BY age ORDER BY age"),
    A("SELECT FLOOR(age / 10) * 10 AS decade, COUNT(*) FROM PUMS GROUP BY decade"),
    A("SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END AS grp, COUNT(*) FROM PUMS GROUP BY grp"),
    A("SELECT CASE WHEN income < 20000 THEN 'low' WHEN income < 60000 THEN 'mid' ELSE 'high' END AS band, "
      "COUNT(*) AS n, AVG(age) AS a FROM PUMS GROUP BY band"),
    A("SELECT age > 65 AS senior, COUNT(*) FROM PUMS GROUP BY senior"),
    # -- quantiles (exponential mechanism), MIN / MAX ------------------------------------------------------
    A("SELECT MEDIAN(age) FROM PUMS"),
    A("SELECT COUNT(*), MEDIAN(age) FROM PUMS"),  # two queries in one request (docs/sql.md)
    A("SELECT MEDIAN(income) AS median_income FROM PUMS WHERE married = 1"),
    A("SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY income) AS m FROM PUMS"),
    A("SELECT PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY age) FROM PUMS"),
    A("SELECT QUANTILE(age, 0.25) AS q1, QUANTILE(age, 0.75) AS q3 FROM PUMS"),
    A("SELECT QUANTILE_CONT(income, 0.1) FROM PUMS"),
    A("SELECT MIN(age) AS youngest, MAX(age) AS oldest FROM PUMS"),
    A("SELECT sex, MEDIAN(age) AS m FROM PUMS GROUP BY sex ORDER BY sex"),
    A("SELECT married, MIN(age), MAX(age) FROM PUMS GROUP BY married"),
    A("SELECT [sex], MAX([income]) AS top FROM [PUMS] GROUP BY [sex]"),
    # -- a self-join on the unit (DP-S4S) ----------------------------------------------------------------------
    A("SELECT COUNT(*) FROM PUMS a JOIN PUMS b ON a.pid = b.pid"),
    A("SELECT COUNT(*) FROM PUMS a, PUMS b WHERE a.pid = b.pid"),  # tables listed with commas, equated in WHERE
    A("SELECT COUNT(*) FROM pums JOIN pums b ON pums.pid = b.pid WHERE b.age > 30"),
    A("SELECT COUNT(*) AS n, AVG(b.income) AS a FROM PUMS a JOIN PUMS b ON a.pid = b.pid"),  # one run per base aggregate
]

REFUSED = [
    R("SELECT * FROM PUMS", r"aggregates such as COUNT"),
    R("SELECT age FROM PUMS", r"not in GROUP BY|aggregate"),
    R("SELECT age, income FROM PUMS WHERE age > 90", r"not in GROUP BY|aggregate"),
    R("SELECT SUM(pid) FROM PUMS", r"bounds", PolicyError),
    R("SELECT AVG(pid) FROM PUMS", r"bounds", PolicyError),
    R("SELECT MEDIAN(pid) FROM PUMS", r"bounds", PolicyError),
    R("SELECT MODE(age) FROM PUMS", r"use COUNT, SUM, AVG"),
    R("SELECT STRING_AGG(CAST(sex AS VARCHAR), ',') FROM PUMS", r"use COUNT, SUM, AVG"),
    R("SELECT sex, COUNT(*), MEDIAN(age) FROM PUMS GROUP BY sex", r"separate queries", PolicyError),
    R("SELECT QUANTILE(age, 1.5) FROM PUMS", r"between 0 and 1"),
    R("SELECT QUANTILE(age, [0.25, 0.75]) FROM PUMS", r"QUANTILE\(age, 0.25\), QUANTILE\(age, 0.75\)"),
    R("SELECT PERCENTILE_CONT(0.5) FROM PUMS", r"WITHIN GROUP"),
    R("SELECT COUNT(*) OVER () FROM PUMS", r"window"),
    R("SELECT AVG(age) OVER (PARTITION BY sex) FROM PUMS", r"window"),
    R("SELECT COUNT(*) FROM (SELECT sex, COUNT(*) AS n FROM PUMS GROUP BY sex) t", r"flat|GROUP BY"),
    R("SELECT COUNT(*) FROM PUMS WHERE age > (SELECT AVG(age) FROM PUMS)", r"subquer"),
    R("SELECT COUNT(*) FROM PUMS UNION SELECT COUNT(*) FROM PUMS", r"write UNION ALL"),
    R("SELECT COUNT(*) FROM PUMS; SELECT COUNT(*) FROM PUMS", r"one SELECT statement per query"),
    R("SELECT COUNT(*) FROM census", r"register", PolicyError),
    R("SELECT COUNT(*) FROM PUMS WHERE nosuch = 1", r"unknown column 'nosuch'"),
    R("SELECT COUNT(*) FROM PUMS WHERE sex = '1'", r"without quotes"),
    R("SELECT COUNT(*) FROM PUMS WHERE educ IN ('9', '10')", r"without quotes"),
    R("SELECT COUNT(*) FROM PUMS WHERE RANDOM() < 0.5", r"allow-list"),
    R("SELECT COUNT(*) FROM PUMS GROUP BY CUBE(sex) HAVING sex = 1", r"filter on it in WHERE"),
    R("SELECT sex + race, COUNT(*) FROM PUMS GROUP BY ROLLUP(sex, race)", r"select the grouping column itself"),
    R("SELECT COUNT(*) FROM PUMS LIMIT 1 + 1", r"integer literal"),
    R("SELECT COUNT(*) FROM PUMS WITH (NOLOCK)", r"remove them"),
    R("SELECT COUNT(*) FROM PUMS TABLESAMPLE 10%", r"sampling"),
    R("SELECT DISTINCT COUNT(*) FROM PUMS", r"GROUP BY"),
    R("SELECT COUNT(*) FROM read_csv('pums.csv')", r"register the file"),
    R("SELECT COUNT(*) FROM PUMS a LEFT JOIN PUMS b ON a.pid = b.pid", r"inner JOIN", max_violations=1),
    R("SELECT COUNT(*) FROM PUMS a, PUMS b WHERE a.age < b.age", r"JOIN \.\.\. ON", max_violations=1),
    R("SELECT COUNT(*) FROM PUMS a JOIN PUMS b ON a.age < b.age", r"an inner JOIN's ON needs one",
      max_violations=1),
    R("SELECT a.sex, COUNT(*) FROM PUMS a JOIN PUMS b ON a.pid = b.pid GROUP BY a.sex HAVING SUM(b.pid) > 5",
      r"released only when the SELECT list asks for it", max_violations=1),
    R("SELECT MEDIAN(b.income) FROM PUMS a JOIN PUMS b ON a.pid = b.pid", r"use COUNT, SUM or AVG", max_violations=1),
    R("SELECT COUNT(*) FROM PUMS a JOIN PUMS b ON a.pid = b.pid WHERE b.nosuch > 1", r"unknown column 'nosuch'",
      max_violations=1),
    R("SELECT COUNT(*) FROM PUMS a JOIN census b ON a.pid = b.pid", r"register", max_violations=1),
    R("SELECT b.educ, COUNT(*) FROM PUMS a NATURAL JOIN PUMS b GROUP BY b.educ", r"JOIN \.\.\. ON"),
    R("DROP TABLE PUMS", r"SELECT"),
    R("INSERT INTO PUMS VALUES (1, 1, 1, 1, 1, 1, 1)", r"SELECT"),
    R("SELECT COUNT(*) FROM PUMS WHERE", r"syntax", SQLSyntaxError),
    R("SELECT MEDIAN(age) FROM PUMS", r"mechanism", PolicyError, options={"mechanism": "laplace"}),
    R("SELECT COUNT(*) FROM PUMS", r"max_rows_per_unit", ConfigError, options={"max_groups_per_unit": 1}),
    R("SELECT sex, COUNT(*) FROM PUMS GROUP BY sex", r"max_groups_per_unit", PolicyError, options={"max_groups_per_unit": 5}),
]

#: constructs answered (or refused with the fix) by the SQL-coverage change set A; flip to plain
#: cases once it is merged (they are expected to pass then)
NEEDS_SQL_COVERAGE_A = [
    # schema-qualified names, as the peer's suite writes every query
    A("SELECT COUNT(*) FROM PUMS.PUMS"),
    A("SELECT COUNT(*) AS n FROM PUMS.PUMS WHERE age > 30"),
    A("SELECT sex, COUNT(*) FROM PUMS.PUMS GROUP BY sex"),
    A("SELECT AVG(income) FROM PUMS.PUMS WHERE married = 1"),
    A("SELECT COUNT(*) FROM PUMS.PUMS AS p WHERE p.sex = 1"),
    A("SELECT race, AVG(age) FROM [PUMS].[PUMS] GROUP BY race"),
    A('SELECT COUNT(*) FROM "PUMS"."PUMS"'),
    A("select educ, count(*) from pums.pums group by educ order by educ"),
    A("SELECT MEDIAN(age) FROM PUMS.PUMS"),
    A("SELECT age, COUNT(*) FROM PUMS.PUMS GROUP BY age"),
    A("SELECT COUNT(*) FROM PUMS.PUMS a JOIN PUMS.PUMS b ON a.pid = b.pid"),
    # GROUP BY without an aggregate: the declared domain (free), or the thresholded key set
    A("SELECT educ FROM PUMS GROUP BY educ"),
    A("SELECT educ AS e FROM PUMS GROUP BY educ ORDER BY e"),
    A("SELECT sex, married FROM PUMS GROUP BY sex, married"),
    A("SELECT age FROM PUMS GROUP BY age"),
    A("SELECT race FROM PUMS.PUMS GROUP BY race ORDER BY race"),
    # variance and standard deviation from noisy count, sum and sum of squares
    A("SELECT VARIANCE(age) FROM PUMS"),
    A("SELECT VAR(age) FROM PUMS"),
    A("SELECT STDDEV(income) FROM PUMS"),
    A("SELECT STD(age) FROM PUMS"),
    A("SELECT sex, STDDEV(age) AS sd FROM PUMS GROUP BY sex"),
    A("SELECT VAR_SAMP(age), STDDEV_POP(age) FROM PUMS"),
    # T-SQL TOP n: refused naming LIMIT
    R("SELECT TOP 10 sex, COUNT(*) FROM PUMS GROUP BY sex", r"LIMIT"),
    R("SELECT TOP 1 COUNT(*) FROM PUMS", r"LIMIT"),
    R("SELECT TOP(5) race, COUNT(*) AS n FROM PUMS GROUP BY race ORDER BY n DESC", r"LIMIT"),
    # RAND() in the select list: post-processing, or a refusal naming RAND()
    Case("SELECT RAND() AS r, COUNT(*) FROM PUMS", "answer_or_refuse", fix=r"(?-i:RAND\(\))"),
    Case("SELECT COUNT(*) * RAND() FROM PUMS", "answer_or_refuse", fix=r"(?-i:RAND\(\))"),
    # COUNT(DISTINCT col) on a non-unit column
    A("SELECT COUNT(DISTINCT educ) FROM PUMS"),
    A("SELECT sex, COUNT(DISTINCT race) FROM PUMS GROUP BY sex"),
    # SUM / AVG over expressions of bounded columns, and literal clamps
    A("SELECT SUM(age * 2) FROM PUMS"),
    A("SELECT SUM(CASE WHEN sex = 1 THEN 1 ELSE 0 END) AS women FROM PUMS"),
    A("SELECT AVG(LEAST(GREATEST(income, 0), 100000)) FROM PUMS"),
    A("SELECT SUM(income - 1000) FROM PUMS WHERE educ > 12"),
    A("SELECT AVG(CAST(married AS DOUBLE)) FROM PUMS"),
    A("SELECT sex, AVG(age + educ) FROM PUMS GROUP BY sex"),
    # GROUP BY on the privacy unit: refused (it can never pass the threshold)
    R("SELECT pid, COUNT(*) FROM PUMS GROUP BY pid", r"privacy unit"),
    R("SELECT pid, AVG(income) FROM PUMS.PUMS GROUP BY pid", r"privacy unit"),
    # joins: one true problem, one violation
    R("SELECT COUNT(*) FROM PUMS.PUMS a LEFT JOIN PUMS.PUMS b ON a.pid = b.pid", r"inner JOIN", max_violations=1),
    R("SELECT COUNT(*) FROM PUMS.PUMS a JOIN PUMS.PUMS b ON a.pid = b.pid WHERE b.nosuch > 1", r"unknown column 'nosuch'",
      max_violations=1),
]


def _id(c: Case) -> str:
    return re.sub(r"\s+", " ", c.sql)[:90]


# -- checking answers ---------------------------------------------------------------------------------------------


def _truth_sql(sql: str) -> str:
    """The query without HAVING / ORDER BY / LIMIT (they act on released values): every group's truth."""
    # T-SQL's VAR / STD / STDEV are the sample statistics; DuckDB spells them VAR_SAMP / STDDEV_SAMP
    sql = re.sub(r"\bVAR\(", "VAR_SAMP(", sql, flags=re.IGNORECASE)
    sql = re.sub(r"\bSTDE?V?\(", "STDDEV_SAMP(", sql, flags=re.IGNORECASE)
    stmt = sqlglot.parse_one(bracket_identifiers(sql), read="duckdb")
    for key in ("having", "order", "limit", "offset"):
        stmt.set(key, None)
    return stmt.sql(dialect="duckdb")


def _num(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float, np.integer, np.floating)):
        return float(v)
    return v


def _quantile_ok(con: duckdb.DuckDBPyConnection, plan: ir.QueryPlan, agg: ir.Aggregate, key_vals: dict[str, Any],
                 released: float, info: dict[str, Any]) -> bool:
    """The published rank statement: |alpha A + beta B - c| at the released value is within
    WIDEN-widened rank error of the best grid point's (slack: rows within one grid step)."""
    conds = [plan.where.sql(dialect="duckdb")] if plan.where is not None else []
    for k in plan.keys:
        v = key_vals[k.name]
        conds.append(f"({k.expr.sql(dialect='duckdb')}) IS NOT DISTINCT FROM {exp.convert(v).sql(dialect='duckdb')}")
    q = f"SELECT {agg.column} FROM pums" + (" WHERE " + " AND ".join(conds) if conds else "")
    vals = np.asarray([r[0] for r in con.execute(q).fetchall() if r[0] is not None], dtype=float)
    lo, hi, step, t = info["lo"], info["hi"], info["grid_step"], info["rank_error_95"]
    vals = np.clip(vals, lo, hi)
    grid = np.minimum(lo + step * np.arange(info["candidates"]), hi)
    if agg.kind == ir.MIN:
        al, be, c = 1.0, 0.0, info["rank_target"]
    elif agg.kind == ir.MAX:
        al, be, c = 0.0, 1.0, info["rank_target"]
    else:
        al, be, c = 1.0 - agg.quantile, -agg.quantile, 0.0

    def u(x: float) -> float:
        return abs(al * (vals < x).sum() + be * (vals > x).sum() - c)

    best = min(u(x) for x in grid)
    slack = float((np.abs(vals - released) <= step).sum())
    return u(released) <= best + WIDEN * t + slack


def check_answer(s: dpsql.Session, con: duckdb.DuckDBPyConnection, case: Case) -> None:
    use_noise(s, seeded_noise(case.sql))
    before = s.remaining()
    r = s.query(case.sql, epsilon=case.epsilon, delta=DELTA, options=case.options)
    # charged, or free: a reuse of a stored release, or the declared (public) key domain
    assert s.remaining() != before or r.reused or r.mechanism == "public_domain"
    plan = analyze(case.sql, s.tables)
    names = r.table.column_names
    assert len(names) == len(plan.outputs)
    truth_rows = con.execute(_truth_sql(case.sql)).fetchall()
    key_pos = [i for i, o in enumerate(plan.outputs) if o.source and o.source.startswith("__k")]
    truth_by_key = {tuple(_num(row[i]) for i in key_pos): row for row in truth_rows}
    released = r.table.to_pylist()
    if plan.join is not None:  # DP-S4S states an asymptotic bound (text): the answer is in the right range
        for row in released:
            v, tv = row[names[0]], truth_rows[0][0]
            assert v is not None and abs(v - tv) <= 0.5 * abs(tv) + 50, (v, tv)
        return
    if plan.keys and not plan.public_keys and r.mechanism == "sparse_histogram":
        # released keys all exist (a key is released only above the threshold)
        for row in released:
            assert tuple(_num(row[names[i]]) for i in key_pos) in truth_by_key
    by_source = {a.name: j for j, a in enumerate(plan.aggregates)}
    for ri, row in enumerate(released):
        key = tuple(_num(row[names[i]]) for i in key_pos)
        trow = truth_by_key.get(key)
        key_vals = {plan.outputs[i].source: row[names[i]] for i in key_pos}
        for i, o in enumerate(plan.outputs):
            if not o.source or not o.source.startswith("__a"):
                continue  # a key, or an expression over released values (post-processing)
            agg = plan.aggregate_by_name(o.source)
            got = row[names[i]]
            acc = r.accuracy.get(names[i], {})
            if agg.kind in ir.QUANTILE_KINDS:
                if "components" in r.details:  # beside other aggregates: two queries in one request (docs/sql.md)
                    part = next(c for c in r.details["components"] if c["mechanism"] == "exponential")
                    quantiles = [a.name for a in plan.aggregates if a.kind in ir.QUANTILE_KINDS]
                    info = part["parameters"]["aggregates"][quantiles.index(agg.name)]
                else:
                    info = r.details["aggregates"][by_source[agg.name]]
                if got is not None:
                    assert _quantile_ok(con, plan, agg, {k.name: key_vals.get(k.name) for k in plan.keys}, got, info), \
                        (case.sql, key, got, info)
                continue
            if got is None and agg.kind == ir.AVG:
                continue  # noisy count below 1: no estimate released (NULL), not a wrong value
            want = trow[i] if trow is not None else None
            if want is None:
                if agg.kind in (ir.COUNT_STAR, ir.COUNT_COL, ir.COUNT_UNITS, ir.SUM):
                    want = 0.0  # a declared key with no rows
                else:
                    continue  # AVG of no rows: the release is noise around the midpoint
            per_row = acc.get("per_row_ci95_half_width")
            hw = per_row[ri] if per_row else acc.get("ci95_half_width")
            assert hw is not None and math.isfinite(hw), (case.sql, names[i], acc)
            gran = acc.get("granularity") or 0.0
            assert got is not None and abs(got - float(want)) <= WIDEN * hw + gran, (case.sql, key, got, want, hw)


def check_refusal(s: dpsql.Session, case: Case) -> None:
    before = s.remaining()
    with pytest.raises(case.error) as ei:
        s.query(case.sql, epsilon=case.epsilon, delta=DELTA, options=case.options)
    e = ei.value
    text = f"{e} {getattr(e, 'hint', '') or ''}"
    assert re.search(case.fix, text, re.IGNORECASE), text
    assert s.remaining() == before  # a refusal spends nothing
    if case.max_violations is not None:
        assert len(getattr(e, "violations", []) or []) <= case.max_violations, text


def run_case(s: dpsql.Session, con: duckdb.DuckDBPyConnection, case: Case) -> None:
    if case.expect == "answer":
        check_answer(s, con, case)
    elif case.expect == "refuse":
        check_refusal(s, case)
    else:
        try:
            check_answer(s, con, case)
        except (QueryError, ConfigError) as e:
            assert re.search(case.fix, f"{e} {getattr(e, 'hint', '') or ''}", re.IGNORECASE), str(e)


@pytest.mark.parametrize("case", ANSWERED, ids=_id)
def test_answered_within_stated_accuracy(peer_session: dpsql.Session, truth: duckdb.DuckDBPyConnection, case: Case) -> None:
    run_case(peer_session, truth, case)


@pytest.mark.parametrize("case", REFUSED, ids=_id)
def test_refused_naming_the_fix(peer_session: dpsql.Session, truth: duckdb.DuckDBPyConnection, case: Case) -> None:
    run_case(peer_session, truth, case)


@pytest.mark.parametrize("case", NEEDS_SQL_COVERAGE_A, ids=_id)
def test_sql_coverage_constructs(peer_session: dpsql.Session, truth: duckdb.DuckDBPyConnection, case: Case) -> None:
    run_case(peer_session, truth, case)


# -- the checks themselves can fail ---------------------------------------------------------------------------------


def test_control_a_wrong_value_is_caught(peer_session: dpsql.Session, truth: duckdb.DuckDBPyConnection) -> None:
    """The accuracy check fails on a release compared with the wrong truth (a shifted WHERE)."""
    case = A("SELECT COUNT(*) FROM PUMS WHERE age > 30")
    real = truth.execute
    wrong = "SELECT COUNT(*) FROM PUMS WHERE age > 60"

    class Shifted:
        def execute(self, q: str) -> Any:
            return real(wrong if "age > 30" in q else q)

    with pytest.raises(AssertionError):
        check_answer(peer_session, Shifted(), case)  # type: ignore[arg-type]


def test_control_a_wrong_quantile_is_caught(peer_session: dpsql.Session, truth: duckdb.DuckDBPyConnection) -> None:
    plan = analyze("SELECT MEDIAN(age) FROM PUMS", peer_session.tables)
    info = {"lo": 0.0, "hi": 100.0, "grid_step": 1.0, "candidates": 101, "rank_error_95": 7.6, "rank_target": None}
    true_median = truth.execute("SELECT MEDIAN(age) FROM pums").fetchall()[0][0]
    assert _quantile_ok(truth, plan, plan.aggregates[0], {}, float(round(true_median)), info)
    assert not _quantile_ok(truth, plan, plan.aggregates[0], {}, 20.0, info)


def test_control_a_refusal_without_the_fix_is_caught(peer_session: dpsql.Session) -> None:
    with pytest.raises(AssertionError):
        check_refusal(peer_session, R("SELECT * FROM PUMS", r"use LIMIT"))
    with pytest.raises(AssertionError):  # more violations than the one true problem
        check_refusal(peer_session, R("SELECT *, nosuch FROM PUMS", r"COUNT", max_violations=1))


def test_suite_size() -> None:
    assert len(ANSWERED) + len(REFUSED) + len(NEEDS_SQL_COVERAGE_A) >= 150
    every = ANSWERED + REFUSED + NEEDS_SQL_COVERAGE_A
    assert len({(c.sql, repr(sorted(c.options.items()))) for c in every}) == len(every)  # no case twice
