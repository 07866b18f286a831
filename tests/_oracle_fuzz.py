"""A differential fuzzer of one-table queries: dpsql at zero noise against plain DuckDB on the same rows.

The table has one row per person (so no cap binds) and columns of several types; the queries are drawn with a fixed
seed from the documented SQL surface (docs/sql.md, docs/expressions.md). Each query is answered by dpsql and, as the
docs define the answer, by DuckDB itself:

* casts are TRY_CASTs and `//` / `%` by zero are NULL (docs/sql.md, "Where an expression's value differs"): the
  reference renders every cast as TRY_CAST and runs with `error_on_division_by_zero = false`;
* SUM / AVG clamp to the declared bounds: the reference clamps a bare column explicitly;
* a declared domain drops NULL and undeclared keys and releases every declared key (an empty one as 0, AVG as NULL);
* the WHERE's AND-ed conditions that read the key columns only (through parentheses) filter the declared keys, and
  one that reads no column filters none (over declared keys a constant-false WHERE releases noisy zeros);
* SUM over no row is a noisy 0 (SQL: NULL); a released DOUBLE key is canonical (one NaN, 0.0 for -0.0);
* computed outputs over released values are NULL where DuckDB would fail (TRY);
* released values are rounded to the granularity each column's accuracy reports (counts exact).

Shapes: scalar aggregates (also over a plain view, with its columns renamed), GROUP BY one or two declared keys,
post-processing (HAVING on values and keys, QUALIFY, windows, ORDER BY / LIMIT / OFFSET, computed outputs), SELECT
DISTINCT over a declared key, keys without a domain (the sparse histogram: each released key's count exact), keys
the WHERE lists, COUNT(DISTINCT), arithmetic over two released aggregates. The column ``y`` holds NaN, +-inf, -0.0
and extremes (it has no bounds: read in WHERE and keys only).

A query DuckDB itself fails on (an integer overflow dpsql computes in a wider type) is not compared. Findings are
returned, never raised, so a caller can count them (``run``)."""

from __future__ import annotations

import datetime as dt
import math
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

G_DOMAIN = ["a", "b", "c", "dd"]
I_DOMAIN = list(range(-5, 21))
B_BOUNDS = (-100_000, 100_000)  # the data reaches +-1e6: SUM(b) clamps
S_VALUES = ["Hello", "world", "", "x_y%", "Zed", "héllo", " a ", "a,b,c", "100", "2024-03-01", "TRUE"]


def table(n: int = 300, seed: int = 1) -> pa.Table:
    r = random.Random(seed)

    def maybe(v: Any, p: float = 0.1) -> Any:
        return None if r.random() < p else v

    cols: dict[str, list[Any]] = {k: [] for k in ("pid", "i", "b", "x", "d", "g", "s", "day", "flag", "y")}
    hostile = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e308, 5e-324, 2.0**53 + 1]
    for k in range(n):
        cols["pid"].append(k)
        cols["i"].append(maybe(r.randint(-5, 20)))
        cols["b"].append(maybe(r.randint(-(10**6), 10**6)))
        cols["x"].append(maybe(round(r.uniform(-3, 10), 3)))
        cols["d"].append(maybe(Decimal(r.randint(-500, 5000)) / 100))
        cols["g"].append(maybe(r.choice([*G_DOMAIN, "zz"])))  # "zz" is not declared
        cols["s"].append(maybe(r.choice(S_VALUES)))
        cols["day"].append(maybe(dt.date(2024, 1, 1) + dt.timedelta(days=r.randint(0, 365))))
        cols["flag"].append(maybe(r.random() < 0.5))
        cols["y"].append(maybe(r.choice(hostile) if r.random() < 0.3 else round(r.uniform(-100, 100), 2)))
    return pa.table({
        "pid": pa.array(cols["pid"], pa.int64()),
        "i": pa.array(cols["i"], pa.int32()),
        "b": pa.array(cols["b"], pa.int64()),
        "x": pa.array(cols["x"], pa.float64()),
        "d": pa.array(cols["d"], pa.decimal128(10, 2)),
        "g": pa.array(cols["g"], pa.string()),
        "s": pa.array(cols["s"], pa.string()),
        "day": pa.array(cols["day"], pa.date32()),
        "flag": pa.array(cols["flag"], pa.bool_()),
        "y": pa.array(cols["y"], pa.float64()),  # no bounds: NaN, +-inf, -0.0, extremes (read in WHERE and keys)
    })


COLUMNS = {
    "i": {"bounds": (-5, 20), "domain": I_DOMAIN},
    "b": {"bounds": B_BOUNDS},
    "x": {"bounds": (-3.0, 10.0)},
    "d": {"bounds": (-5, 50)},
    "g": {"domain": G_DOMAIN},
    "day": {"bounds": (dt.date(2024, 1, 1), dt.date(2025, 1, 1)), "bin_width": "1 day"},
}


def session(t: pa.Table) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("t", t, privacy_unit="pid", max_rows_per_unit=1, columns=COLUMNS)
    return s


def reference(t: pa.Table) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET error_on_division_by_zero = false")
    con.register("t", t)
    return con


# ---------------------------------------------------------------- expressions


class Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def pick(self, *xs: Any) -> Any:
        return self.r.choice(xs)

    def num(self, depth: int = 0) -> str:
        r = self.r
        if depth >= 2 or r.random() < 0.35:
            return self.pick("i", "b", "x", "d", "i", "x", "y", "y", str(r.randint(-3, 12)), "0", "2.5", "0.75", "length(s)",
                             "year(day)", "month(day)", "day(day)", "date_part('dow', day)", "dayofyear(day)",
                             "quarter(day)", "CAST(flag AS INTEGER)")
        k = r.randint(0, 13)
        a, b = self.num(depth + 1), self.num(depth + 1)
        if k <= 2:
            return f"({a} {self.pick('+', '-', '*')} {b})"
        if k == 3:
            return f"({a} / {self.pick(b, '0', 'i')})"
        if k == 4:
            ia = self.pick("i", "b", "CAST(x AS INTEGER)", "length(s)", "month(day)")
            return f"({ia} {self.pick('//', '%')} {self.pick('i', '0', '3', '-1', 'month(day)', '(i - 5)')})"
        if k == 5:
            return f"CASE WHEN {self.pred(depth + 1)} THEN {a} ELSE {b} END"
        if k == 6:
            return f"COALESCE({a}, {b})"
        if k == 7:
            return f"NULLIF({a}, {self.pick('0', '1', b)})"
        if k == 8:
            return f"CAST({a} AS {self.pick('DOUBLE', 'INTEGER', 'BIGINT', 'DECIMAL(10,2)', 'SMALLINT')})"
        if k == 9:
            return f"{self.pick('abs', 'sign', 'floor', 'ceil', 'round', 'trunc')}({a})"
        if k == 10:
            return f"{self.pick('GREATEST', 'LEAST')}({a}, {b})"
        if k == 11:
            return f"-({a})"
        if k == 12:
            return f"CAST({self.txt(depth + 1)} AS {self.pick('INTEGER', 'DOUBLE', 'DECIMAL(10,2)')})"
        return f"round({a}, {r.randint(-1, 2)})"

    def txt(self, depth: int = 0) -> str:
        r = self.r
        if depth >= 2 or r.random() < 0.4:
            return self.pick("g", "s", "s", "'a'", "'Hello'", "''", "CAST(i AS VARCHAR)", "CAST(day AS VARCHAR)",
                             "CAST(flag AS VARCHAR)", "CAST(d AS VARCHAR)")
        k = r.randint(0, 11)
        a = self.txt(depth + 1)
        if k == 0:
            return f"{self.pick('lower', 'upper', 'trim', 'ltrim', 'rtrim', 'reverse')}({a})"
        if k == 1:
            return f"({a} || {self.txt(depth + 1)})"
        if k == 2:
            return f"substring({a}, {r.randint(-3, 4)}, {r.randint(0, 3)})"
        if k == 3:
            return f"{self.pick('left', 'right')}({a}, {r.randint(-2, 3)})"
        if k == 4:
            return f"replace({a}, '{self.pick('l', 'a', ',', '%')}', '{self.pick('', 'L', 'xx')}')"
        if k == 5:
            return f"split_part({a}, '{self.pick(',', 'l', '-')}', {self.pick(1, 2, -1, 5)})"
        if k == 6:
            return f"COALESCE({a}, '{self.pick('none', 'a')}')"
        if k == 7:
            return f"CASE WHEN {self.pred(depth + 1)} THEN {a} ELSE {self.txt(depth + 1)} END"
        if k == 8:
            return f"concat_ws('-', {a}, {self.txt(depth + 1)})"
        if k == 9:
            return f"{self.pick('dayname', 'monthname')}(day)"
        if k == 10:
            return f"strftime(day, '{self.pick('%Y-%m', '%d/%m', '%j')}')"
        return f"NULLIF({a}, '{self.pick('a', '', 'Hello')}')"

    def pred(self, depth: int = 0) -> str:
        r = self.r
        if depth >= 3:
            k = r.randint(0, 6)
        else:
            k = r.randint(0, 14)
        if k == 0:
            return f"{self.num(depth + 1)} {self.pick('=', '<>', '<', '<=', '>', '>=')} {self.num(depth + 1)}"
        if k == 1:
            return f"{self.txt(depth + 1)} {self.pick('=', '<>', '<', '>=')} {self.txt(depth + 1)}"
        if k == 2:
            n = self.pick(2, 3, 7)  # 7: the salted-digest path
            if r.random() < 0.5:
                vals = ", ".join(str(r.randint(-5, 25)) for _ in range(n))
                return f"{self.pick('i', 'b % 10', 'month(day)', 'CAST(x AS INTEGER)')} {self.pick('IN', 'NOT IN')} ({vals})"
            vals = ", ".join(f"'{self.pick(*S_VALUES, *G_DOMAIN, 'zz')}'" for _ in range(n))
            return f"{self.pick('g', 's', 'lower(s)', 'g || s')} {self.pick('IN', 'NOT IN')} ({vals})"
        if k == 3:
            lo = r.randint(-5, 10)
            return f"{self.num(depth + 1)} {self.pick('BETWEEN', 'NOT BETWEEN')} {lo} AND {lo + r.randint(-2, 10)}"
        if k == 4:
            pat = self.pick("%l%", "H%", "%o", "_", "__%", "x\\_y%", "%,%", "", "%", "a%")
            esc = " ESCAPE '\\'" if "\\" in pat else ""
            return f"{self.txt(depth + 1)} {self.pick('LIKE', 'NOT LIKE', 'ILIKE', 'NOT ILIKE')} '{pat}'{esc}"
        if k == 5:
            col = self.pick("i", "b", "x", "d", "g", "s", "day", "flag", self.num(depth + 1), self.txt(depth + 1))
            return f"{col} IS {self.pick('NULL', 'NOT NULL')}"
        if k == 6:
            d0 = dt.date(2024, 1, 1) + dt.timedelta(days=r.randint(-10, 380))
            return f"day {self.pick('<', '>=', '=', '<>')} {self.pick('DATE ', '')}'{d0.isoformat()}'"
        if k == 7:
            return f"NOT ({self.pred(depth + 1)})"
        if k == 8:
            return f"({self.pred(depth + 1)} {self.pick('AND', 'OR')} {self.pred(depth + 1)})"
        if k == 9:
            return self.pick("flag", "NOT flag", "flag IS TRUE", "flag IS NOT FALSE", "flag = (i > 5)")
        if k == 10:
            return f"{self.pick('contains', 'starts_with', 'ends_with')}({self.txt(depth + 1)}, '{self.pick('l', 'He', 'o', '')}')"
        if k == 11:
            return f"{self.num(depth + 1)} IS {self.pick('', 'NOT ')}DISTINCT FROM {self.num(depth + 1)}"
        if k == 12:
            return f"COALESCE({self.pred(depth + 1)}, {self.pick('TRUE', 'FALSE')})"
        if k == 13:
            return f"CASE WHEN {self.pred(depth + 1)} THEN {self.pred(depth + 1)} ELSE {self.pick('TRUE', 'FALSE', 'NULL')} END"
        d0 = dt.date(2024, 1, 1) + dt.timedelta(days=r.randint(0, 365))
        return f"day - DATE '{d0.isoformat()}' {self.pick('<', '>')} {r.randint(-30, 30)}"


# ---------------------------------------------------------------- queries


@dataclass
class Agg:
    sql: str  # as dpsql sees it
    ref: str  # DuckDB's, clamped as dpsql clamps
    kind: str  # count / sum / avg (sumb / avgb: of b, whose wide bounds round the release to tens)


@dataclass
class Query:
    sql: str
    shape: str
    aggs: list[Agg] = field(default_factory=list)
    key: str | None = None  # a declared-domain key column
    post: str = ""  # HAVING / ORDER / LIMIT over the released table, in the reference's names
    epsilon: float = 1000.0
    delta: float = 0.0
    src: str = "t"  # the FROM: the table, or a plain view of it (merged into the flat query, docs/sql.md)


# DuckDB's LEAST / GREATEST skip a NULL argument (GREATEST(NULL, -1) is -1): the clamp keeps NULL NULL, as dpsql's does
CLAMP = {"b": f"CASE WHEN b IS NOT NULL THEN LEAST(GREATEST(b, {B_BOUNDS[0]}), {B_BOUNDS[1]}) END"}


def agg(g: Gen) -> Agg:
    a = agg0(g)
    if a.kind != "var" and "DISTINCT" not in a.sql and g.r.random() < 0.15:
        p = g.pred(1)
        return Agg(f"{a.sql} FILTER (WHERE {p})", f"{a.ref} FILTER (WHERE {p})", a.kind)
    return a


def agg0(g: Gen) -> Agg:
    k = g.r.randint(0, 9)
    if k <= 1:
        return Agg("COUNT(*)", "COUNT(*)", "count")
    if k == 2:
        c = g.pick("i", "x", "s", "day", "flag", "g")
        return Agg(f"COUNT({c})", f"COUNT({c})", "count")
    if k == 3:
        p = g.pred(1)
        return Agg(f"COUNT(CASE WHEN {p} THEN 1 END)", f"COUNT(CASE WHEN {p} THEN 1 END)", "count")
    col = g.pick("i", "b", "x", "d", "x", "d")
    arg, ref = col, CLAMP.get(col, col)
    if g.r.random() < 0.3 and col != "b":
        p = g.pred(1)
        arg = ref = f"CASE WHEN {p} THEN {col} ELSE 0 END"
    elif g.r.random() < 0.2 and col != "b":
        other = g.pick("i", "x", "d")
        arg = ref = f"({col} {g.pick('+', '-')} {other})"
    if k == 9 and g.r.random() < 0.5 and col != "b":
        f = g.pick("VAR_POP", "VAR_SAMP", "STDDEV_POP", "STDDEV_SAMP", "VARIANCE", "STDDEV")
        return Agg(f"{f}({col})", f"{f}({col})", "var")
    f = g.pick("SUM", "AVG") if k < 9 else "AVG"
    return Agg(f"{f}({arg})", f"{f}({ref})", f.lower() + ("b" if col == "b" else ""))


SHAPES = ["scalar", "scalar", "grouped", "grouped", "grouped", "post", "post", "distinct", "sparse", "twokeys", "listed",
          "cdistinct", "arith"]


def query(g: Gen) -> Query:
    r = g.r
    where = f" WHERE {g.pred()}" if r.random() < 0.85 else ""
    shape = r.choice(SHAPES)
    if shape == "twokeys":
        aggs = [agg(g) for _ in range(r.randint(1, 2))]
        sel = ", ".join(f"{a.sql} AS a{j}" for j, a in enumerate(aggs))
        return Query(f"SELECT g, i, {sel} FROM t{where} GROUP BY g, i", shape, aggs, key="g, i")
    if shape == "listed":
        vals = sorted({g.pick(*S_VALUES, "nope") for _ in range(r.randint(1, 4))})
        lst = ", ".join(f"'{v}'" for v in vals)
        aggs = [agg(g) for _ in range(r.randint(1, 2))]
        sel = ", ".join(f"{a.sql} AS a{j}" for j, a in enumerate(aggs))
        extra = f" AND {g.pred()}" if r.random() < 0.5 else ""
        q = Query(f"SELECT s, {sel} FROM t WHERE s IN ({lst}){extra} GROUP BY s", shape, aggs, key="s")
        q.listed = vals  # type: ignore[attr-defined]
        return q
    if shape == "cdistinct":
        e = g.pick("g", "s", "i", "lower(s)", "i % 4", "month(day)", "flag", "CAST(x AS INTEGER)", "day", "length(s)",
                   "(g, flag)", "ROW(i, s)")
        return Query(f"SELECT COUNT(DISTINCT {e}) AS a0 FROM t{where}", "scalar", [Agg(f"COUNT(DISTINCT {e})",
                     f"COUNT(DISTINCT {e})", "count")])
    if shape == "arith":
        a, b = agg(g), agg(g)
        op = g.pick("+", "-", "*", "/")
        sql = f"SELECT {a.sql} {op} {b.sql} AS a0, {a.sql} AS a1, {b.sql} AS a2 FROM t{where}"
        return Query(sql, "arith", [Agg(f"{a.sql} {op} {b.sql}", "", "avg"), a, b])
    if shape == "scalar":
        aggs = [agg(g) for _ in range(r.randint(1, 3))]
        sel = ", ".join(f"{a.sql} AS a{j}" for j, a in enumerate(aggs))
        src = "t"
        if r.random() < 0.35:
            src = g.pick(f"(SELECT * FROM t WHERE {g.pred(1)}) v", "(SELECT * FROM t) AS v", f"(SELECT t.* FROM t WHERE {g.pred(1)}) v",
                         # names swapped: the view's x is t.d, summed within t.d's bounds (docs/sql.md, CTEs)
                         f"(SELECT x AS d, d AS x, s AS g, g AS s, i, b, day, flag FROM t WHERE {g.pred(1)}) v",
                         "(SELECT x AS d, d AS x, s AS g, g AS s, i, b, day, flag FROM t) v")
        return Query(f"SELECT {sel} FROM {src}{where}", shape, aggs, src=src)
    if shape in ("grouped", "post"):
        key = g.pick("g", "i")
        aggs = [agg(g) for _ in range(r.randint(1, 3))]
        if shape == "post" and not any(a.kind == "count" for a in aggs):
            aggs.insert(0, Agg("COUNT(*)", "COUNT(*)", "count"))
        sel = ", ".join(f"{a.sql} AS a{j}" for j, a in enumerate(aggs))
        keyfilter = ""
        extras_list: list[str] = []
        if r.random() < 0.3:
            keyfilter = f" AND {key} {'<>' if key == 'i' else '<>'} {'3' if key == 'i' else repr('b')}"
        w = (where + keyfilter) if where else (f" WHERE {keyfilter[5:]}" if keyfilter else "")
        sql = f"SELECT {key}, {sel} FROM t{w} GROUP BY {key}"
        post = ""
        if shape == "post":
            ci = next(j for j, a in enumerate(aggs) if a.kind == "count")
            opts = []
            if r.random() < 0.5:
                opts.append(("HAVING", f"a{ci} {g.pick('>', '<=', '>=')} {r.randint(0, 40)}"))
            if r.random() < 0.3:  # a HAVING on the key alone
                kc = f"{key} {g.pick('<>', '>', '<=')} {'7' if key == 'i' else repr('b')}"
                opts = [("HAVING", f"{opts[0][1]} {g.pick('AND', 'OR')} {kc}" if opts else kc)]
            win = g.pick("", f", RANK() OVER (ORDER BY a{ci} DESC) AS rk", f", SUM(a{ci}) OVER () AS tot",
                         f", ROW_NUMBER() OVER (ORDER BY {key}) AS rn",
                         f", a{ci} - LAG(a{ci}, 1, 0) OVER (ORDER BY {key}) AS dl")
            order = f" ORDER BY a{ci} DESC, {key}" if r.random() < 0.7 else f" ORDER BY {key} DESC"
            lim = f" LIMIT {r.randint(1, 6)}" if r.random() < 0.6 else ""
            off = f" OFFSET {r.randint(1, 3)}" if lim and r.random() < 0.4 else ""
            having = " ".join(f"{kw} {c}" for kw, c in opts)
            # dpsql: windows over aggregates are written with the aggregate; the alias works in HAVING/ORDER
            dwin = win
            for j, a in enumerate(aggs):
                dwin = dwin.replace(f"(a{j})", f"({a.sql})").replace(f"BY a{j}", f"BY {a.sql}").replace(f"a{j} -", f"{a.sql} -")
            if r.random() < 0.6:  # computed outputs over the released count and the key (exact at zero noise)
                c = f"a{ci}"
                pool = [f"{c} * 2 + 1", f"{c} / 3", f"{c} // 4", f"{c} % 5", f"{c} // 0", f"{c} % 0", f"{c} / 0",
                        f"CAST({c} AS VARCHAR) || CAST({key} AS VARCHAR)", f"CASE WHEN {c} > 10 THEN 'big' ELSE 'small' END",
                        f"round({c} / 7.0, 2)", f"NULLIF({c}, 0)", f"upper(CAST({key} AS VARCHAR))", f"ln({c})", f"sqrt({c} - 20)",
                        f"{c} * 1.0 / SUM({c}) OVER ()", f"CAST({c} AS TINYINT) * 10", f"{c} - {key}" if key == "i" else f"length({key}) + {c}",
                        f"COALESCE({c} // ({c} - {c}), -1)", f"CAST({c} AS DECIMAL(4,1)) / 3", f"GREATEST({c}, 20)",
                        f"{c} * 9223372036854775807", f"CAST({c} * 100000000 AS INTEGER)", f"{c}::DOUBLE / 0 > 1",
                        f"LEAD({c}, 1, -1) OVER (ORDER BY {key})", f"CUME_DIST() OVER (ORDER BY {c}, {key})",
                        f"NTILE(3) OVER (ORDER BY {key})", f"date_part('year', DATE '2024-01-01') + {c}"]
                ex = [g.pick(*pool) for _ in range(r.randint(1, 2))]
                dex = []
                for e in ex:  # dpsql: a window's input is the aggregate itself, an output may name an alias
                    dex.append(e.replace(f"({c})", f"({aggs[ci].sql})").replace(f"({c},", f"({aggs[ci].sql},") if "OVER" in e else e)
                dextras = "".join(f", {e} AS e{j}" for j, e in enumerate(dex))
                sel = sel + dextras if not dwin else sel
                dwin = dwin + dextras if dwin else dwin
                extras_list = list(ex)
            sql = f"SELECT {key}, {sel}{dwin} FROM t{w} GROUP BY {key}{' ' + having if having else ''}{order}{lim}{off}"
            qual = ""
            if r.random() < 0.25:
                qual = f" QUALIFY {g.pick('RANK()', 'ROW_NUMBER()', 'DENSE_RANK()')} OVER (ORDER BY a{ci} DESC, {key}) <= {r.randint(1, 4)}"
                sql = sql.replace(f"{order}{lim}{off}", f"{qual.replace(f'a{ci} DESC', aggs[ci].sql + ' DESC')}{order}{lim}{off}")
            post = f"{win}\x00{'WHERE ' + opts[0][1] if opts else ''}\x00{qual}{order}{lim}{off}"
        q = Query(sql, shape, aggs, key=key, post=post)
        q.extras = extras_list  # type: ignore[attr-defined]
        q.where = w  # type: ignore[attr-defined]
        q.keep = f"WHERE k.{keyfilter[5:]}" if keyfilter else ""  # type: ignore[attr-defined]
        return q
    if shape == "distinct":
        key = g.pick("g", "i")
        return Query(f"SELECT DISTINCT {key} FROM t{where}", shape, key=key)
    # sparse: keys without a declared domain, Gaussian (delta > 0)
    key = g.pick("s", "month(day)", "flag", "CASE WHEN i < 5 THEN 'lo' ELSE 'hi' END", "lower(s)", "b % 3", "sign(y)",
                 "y > 0", "CAST(y AS INTEGER) IS NULL", "isnan(y)", "round(y / 50)",
                 "COALESCE(g, 'none')", "floor(x)", "length(s)")
    return Query(f"SELECT {key} AS k, COUNT(*) AS n FROM t{where} GROUP BY {key}", shape,
                 [Agg("COUNT(*)", "COUNT(*)", "count")], epsilon=8.0, delta=1e-5)


def to_reference(sql: str) -> str:
    """The query as DuckDB answers it under dpsql's documented semantics: every cast a TRY_CAST."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    tree = tree.transform(lambda n: exp.TryCast(this=n.this, to=n.to) if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast) else n)
    return tree.sql(dialect="duckdb")


# ---------------------------------------------------------------- comparison


@dataclass
class Outcome:
    ran: int = 0
    answered: int = 0
    refused: int = 0
    skipped: int = 0  # DuckDB itself failed
    compared: int = 0
    findings: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    refused_queries: list[tuple[str, str]] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)  # charged releases with no row


def key_conditions(sql: str, keys: set[str]) -> str:
    """The WHERE's AND-ed conditions that read the key columns only: they filter the declared keys (docs/sql.md)."""
    where = sqlglot.parse_one(sql, read="duckdb").args.get("where")
    if where is None:
        return ""
    def conjuncts(e: exp.Expression) -> list[exp.Expression]:
        if isinstance(e, exp.Paren):
            return conjuncts(e.this)
        return [c for part in e.flatten() for c in conjuncts(part)] if isinstance(e, exp.And) else [e]

    conj = conjuncts(where.this)
    # a condition that reads no column filters no key: over declared keys it releases noisy zeros (docs/sql.md)
    kept = [c.sql(dialect="duckdb") for c in conj if set() < {col.name for col in c.find_all(exp.Column)} <= keys]
    return "WHERE " + " AND ".join(f"({c})" for c in kept) if kept else ""


GRAN: dict[str, float] = {}  # the released columns' granularity (their accuracy's), set per query


def close(got: Any, want: Any, kind: str, col: str = "") -> bool:
    if want is None or got is None:
        return got is None and want is None
    got, want = float(got), float(want)
    if math.isnan(want):
        return math.isnan(got)
    if kind == "count":
        return got == want
    tol = 1.01 * GRAN.get(col, 0.01) + 1e-6 * abs(want)
    if kind == "var":  # a function of three released sums, each rounded (a group's few rows magnify it)
        tol = 0.6 + 1e-2 * abs(want)
    return abs(got - want) <= tol


def misleading(sql: str, message: str) -> str | None:
    """A refusal that names a clause the query does not have, or quotes dpsql's own rendering (a collation, a typed
    literal the query did not write)."""
    head = message.split("\n")[0]
    for clause in ("HAVING", "QUALIFY"):
        if head.startswith(clause + " ") and clause not in sql.upper():
            return f"names {clause}"
    if 'COLLATE "binary"' in head and "COLLATE" not in sql.upper():
        return "quotes the rendering"
    return None


def ledger_len(s: dpsql.Session) -> int:
    return s.history().num_rows


def run_query(s: dpsql.Session, con: duckdb.DuckDBPyConnection, q: Query, out: Outcome) -> None:
    out.ran += 1
    before = ledger_len(s)
    try:
        rel = s.query(q.sql, epsilon=q.epsilon, delta=q.delta)
    except DPSQLError as e:
        after = s.history()
        if after.num_rows > before:
            out.findings.append(f"FAILED AFTER CHARGE {type(e).__name__}: {e}\n  {q.sql}")
        elif "bug" in str(e).lower() or type(e).__name__ == "ExecutionError":
            out.findings.append(f"INTERNAL {type(e).__name__}: {e}\n  {q.sql}")
        elif misleading(q.sql, str(e)):
            out.findings.append(f"MESSAGE {misleading(q.sql, str(e))}: {e}\n  {q.sql}")
        else:
            out.refused += 1
            first = str(e).split("\n")[0][:90]
            out.refusals[first] = out.refusals.get(first, 0) + 1
            out.refused_queries.append((q.sql, str(e)))
        return
    except Exception as e:  # noqa: BLE001
        out.findings.append(f"NON-DPSQL {type(e).__name__}: {e}\n  {q.sql}")
        return
    out.answered += 1
    rows = rel.to_pylist()
    GRAN.clear()
    for c, acc in (rel.meta().get("accuracy") or {}).items():
        if isinstance(acc, dict) and acc.get("granularity"):
            GRAN[c] = float(acc["granularity"])
    h = s.history()
    charged = h.num_rows > before and (h.column("epsilon")[-1].as_py() or 0) > 0
    if charged and not rows:  # (mostly a HAVING or a threshold on released values: read them before reporting)
        out.empty.append(q.sql)
    try:
        want = reference_rows(con, q)
    except duckdb.Error as e:
        out.skipped += 1
        out.refusals["(reference failed) " + str(e).split("\n")[0][:60]] = out.refusals.get("(reference failed) " + str(e).split("\n")[0][:60], 0) + 1
        return
    out.compared += 1
    bad = compare(q, rows, want)
    if bad:
        out.findings.append(f"WRONG ANSWER {bad}\n  {q.sql}")


def reference_rows(con: duckdb.DuckDBPyConnection, q: Query) -> Any:
    if q.shape == "arith":
        sel = ", ".join(f"COALESCE({a.ref}, 0) AS a{j}" if a.kind.startswith("sum") else f"{a.ref} AS a{j}"
                        for j, a in enumerate(q.aggs[1:], 1))
        where = q.sql.split(" FROM t", 1)[1]
        (row,) = con.execute(to_reference(f"SELECT {sel} FROM t{where}")).fetchall()
        op = q.aggs[0].sql[len(q.aggs[1].sql) + 1]
        a, b = row
        return [(combine(a, b, op), a, b)]
    if q.shape == "scalar":
        # SUM over no row is released as a noisy 0 (docs/sql.md, "No rows"), where SQL gives NULL
        sel = ", ".join(f"COALESCE({a.ref}, 0) AS a{j}" if a.kind.startswith("sum") else f"{a.ref} AS a{j}"
                        for j, a in enumerate(q.aggs))
        where = q.sql.split(" FROM " + q.src, 1)[1]
        return con.execute(to_reference(f"SELECT {sel} FROM {q.src}{where}")).fetchall()
    if q.shape == "distinct":
        where = q.sql.split(" FROM t", 1)[1]
        keys = ", ".join(repr(v) for v in (G_DOMAIN if q.key == "g" else I_DOMAIN))
        kept = con.execute(to_reference(f"SELECT * FROM (SELECT unnest([{keys}]) AS {q.key}) kk "
                                        f"{key_conditions(q.sql, {str(q.key)})}")).fetchall()
        return ({k for (k,) in con.execute(to_reference(f"SELECT DISTINCT {q.key} FROM t{where}")).fetchall()},
                {k for (k,) in kept})
    if q.shape == "sparse":
        return con.execute(to_reference(q.sql)).fetchall()
    if q.shape == "twokeys":
        sel = ", ".join(f"{a.ref} AS a{j}" for j, a in enumerate(q.aggs))
        where = q.sql.split(" FROM t", 1)[1].rsplit(" GROUP BY", 1)[0]
        inner = to_reference(f"SELECT g, i, {sel} FROM t{where} GROUP BY g, i")
        cols = ", ".join(f"COALESCE(r.a{j}, 0) AS a{j}" if a.kind in ("count", "sum", "sumb") else f"r.a{j} AS a{j}"
                         for j, a in enumerate(q.aggs))
        gk = ", ".join(repr(v) for v in G_DOMAIN)
        ik = ", ".join(repr(v) for v in I_DOMAIN)
        kf = to_reference(f"SELECT * FROM (SELECT * FROM (SELECT unnest([{gk}]) AS g) CROSS JOIN (SELECT unnest([{ik}]) "
                          f"AS i)) kk {key_conditions(q.sql, {'g', 'i'})}")
        return con.execute(f"SELECT k.g, k.i, {cols} FROM ({kf}) k LEFT JOIN ({inner}) r ON k.g = r.g AND k.i = r.i "
                           "ORDER BY k.g, k.i").fetchall()
    key = q.key
    domain = G_DOMAIN if key == "g" else (I_DOMAIN if key == "i" else q.listed)  # type: ignore[attr-defined]
    keys = ", ".join(repr(v) for v in domain)
    w = q.where if hasattr(q, "where") else " WHERE " + q.sql.split(" WHERE ", 1)[1].rsplit(" GROUP BY", 1)[0]
    sel = ", ".join(f"{a.ref} AS a{j}" for j, a in enumerate(q.aggs))
    inner = to_reference(f"SELECT {key}, {sel} FROM t{w} GROUP BY {key}")
    # a key the WHERE's conditions on the key alone exclude is not released (docs/sql.md, GROUP BY and keys)
    keep = ""  # the key filter is one of the WHERE's conditions on the key: key_conditions reads it
    cols = ", ".join(
        f"COALESCE(r.a{j}, 0) AS a{j}" if a.kind in ("count", "sum", "sumb") else f"r.a{j} AS a{j}" for j, a in enumerate(q.aggs)
    )
    kf = to_reference(f"SELECT * FROM (SELECT unnest([{keys}]) AS {key}) kk {key_conditions(q.sql, {key})}")
    released = f"SELECT k.{key} AS {key}, {cols} FROM ({kf}) k LEFT JOIN ({inner}) r ON k.{key} = r.{key} {keep}"
    if q.shape in ("grouped", "listed"):
        return con.execute(released + f" ORDER BY {key}").fetchall()
    win, having, tail = q.post.split("\x00")
    names = ", ".join(f"a{j}" for j in range(len(q.aggs)))
    # computed outputs as dpsql documents them: a value that does not convert (an overflow) is NULL, `//` and `%`
    # by 0 NULL (error_on_division_by_zero = false)
    win += "".join(f", {e} AS e{j}" if " OVER " in e else f", TRY({e}) AS e{j}" for j, e in enumerate(q.extras))  # type: ignore[attr-defined]
    return con.execute(f"SELECT {key}, {names}{win} FROM ({released}) rel {having}{tail}").fetchall()


def combine(a: Any, b: Any, op: str) -> Any:
    if a is None or b is None:
        return None
    a, b = float(a), float(b)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    return a / b


def compare(q: Query, rows: list[dict[str, Any]], want: Any) -> str | None:
    if q.shape in ("scalar", "arith"):
        (w,) = want
        if q.shape == "arith":  # the combination of the two released values, as released
            a1, a2 = rows[0]["a1"], rows[0]["a2"]
            op = q.aggs[0].sql[len(q.aggs[1].sql) + 1]
            w = (combine(a1, a2, op), *w[1:])
            if w[0] is not None and rows[0]["a0"] is not None and math.isinf(w[0]):
                return None if rows[0]["a0"] == w[0] else f"a0: dpsql {rows[0]['a0']} from {a1} {op} {a2}"
        for j, a in enumerate(q.aggs):
            if not close(rows[0][f"a{j}"], w[j], a.kind, f"a{j}"):
                return f"a{j} ({a.sql}): dpsql {rows[0][f'a{j}']} DuckDB {w[j]}"
        return None
    if q.shape == "distinct":  # the declared keys the WHERE's conditions on the key keep (docs/sql.md), free
        got = {next(iter(r.values())) for r in rows}
        domain = set(G_DOMAIN if q.key == "g" else I_DOMAIN)
        if not got <= domain or not (want[0] & domain) <= got or got != want[1]:
            return f"keys {sorted(got, key=str)} against DuckDB's {sorted(want[0], key=str)}, kept {sorted(want[1], key=str)}"
        return None
    if q.shape == "sparse":
        def canon(k: Any) -> Any:  # released DOUBLE keys: one NaN, 0.0 for -0.0 (docs/sql.md)
            return "NaN" if isinstance(k, float) and math.isnan(k) else (0.0 if k == 0 and isinstance(k, float) else k)

        wd: dict[Any, int] = {}
        for k, n in want:
            wd[canon(k)] = wd.get(canon(k), 0) + n
        for r in rows:
            if r["n"] == 0 and canon(r["k"]) not in wd:  # a key the WHERE lists (docs/sql.md), which no row holds
                continue
            if canon(r["k"]) not in wd or wd[canon(r["k"])] != r["n"]:
                return f"key {r['k']!r}: dpsql {r['n']} DuckDB {wd.get(r['k'])}"
        # at zero noise every key at or above the threshold (tau* below 7 at this epsilon and delta) is released
        missing = set(k for k, n in wd.items() if n >= 7) - {canon(r["k"]) for r in rows}
        if missing:
            return f"keys {sorted(missing, key=str)} above the threshold are not released"
        return None
    if q.shape in ("grouped", "listed", "twokeys"):
        nk = 2 if q.shape == "twokeys" else 1
        kc = list(rows[0])[:nk] if rows else []
        got = sorted(rows, key=lambda r: tuple(r[c] for c in kc))
        if [tuple(r.values())[:nk] for r in got] != [tuple(w[:nk]) for w in want]:
            return f"keys {[tuple(r.values())[:nk] for r in got]} against {[tuple(w[:nk]) for w in want]}"
        for r, w in zip(got, want):
            for j, a in enumerate(q.aggs):
                if not close(r[f"a{j}"], w[j + nk], a.kind, f"a{j}"):
                    return f"key {w[:nk]!r} a{j} ({a.sql}): dpsql {r[f'a{j}']} DuckDB {w[j + nk]}"
        return None
    # post-processed: the same rows in the same order (ORDER BY is a total order on the keys)
    if len(rows) != len(want):
        return f"{len(rows)} rows against DuckDB's {len(want)}: {[tuple(r.values()) for r in rows]} / {want}"
    for r, w in zip(rows, want):
        vals = list(r.values())
        if vals[0] != w[0]:
            return f"row order: {[tuple(r.values()) for r in rows]} / {want}"
        for j, a in enumerate(q.aggs):
            if not close(vals[j + 1], w[j + 1], a.kind, f"a{j}"):
                return f"key {w[0]!r} a{j}: dpsql {vals[j + 1]} DuckDB {w[j + 1]}"
        for j in range(len(q.aggs) + 1, len(vals)):
            gv, wv = vals[j], w[j]
            same = gv == wv or (isinstance(gv, (int, float, Decimal)) and isinstance(wv, (int, float, Decimal))
                                and close(gv, wv, "sum", list(r)[j]))
            if not same:
                return f"key {w[0]!r} output {list(r)[j]}: dpsql {gv!r} DuckDB {wv!r}"
    return None


def run(n: int, seed: int, rows: int = 300) -> Outcome:
    t = table(rows, seed)
    s = session(t)
    con = reference(t)
    g = Gen(seed)
    out = Outcome()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n):
            run_query(s, con, query(g), out)
    s.close()
    return out


if __name__ == "__main__":  # pragma: no cover
    import os
    import sys

    if os.environ.get("FUZZ_SHAPES"):
        SHAPES[:] = os.environ["FUZZ_SHAPES"].split(",")
    res = run(int(sys.argv[1]), int(sys.argv[2]))
    print(f"ran {res.ran} answered {res.answered} refused {res.refused} compared {res.compared} skipped {res.skipped}")
    for k, v in sorted(res.refusals.items(), key=lambda kv: -kv[1]):
        print(f"  {v:4d} {k}")
    for f in res.findings:
        print(f)
    for e in res.empty:
        print("CHARGED, NO ROW:", e)
    if len(sys.argv) > 3:
        for q, e in res.refused_queries:
            print("REFUSED", q, "\n   ", e.replace("\n", "\n    "))
