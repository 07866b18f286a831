"""A differential fuzzer of join queries: dpsql at zero noise against plain DuckDB on the same rows.

The schema (fixed; its rows drawn per seed) has two sources of people and two public lookups:

* ``persons`` (unit ``id``, one row each; ``rg`` references ``regions.rg``), ``events`` (its own unit ``uid``, at
  most 3 rows each, caps declared 3; ``cc`` -> ``countries.code``, ``rg`` -> ``regions.rg``);
* ``orders`` (reaching people through ``pid`` -> ``persons.id``, at most 3 per person, declared; ``cc`` ->
  ``countries.code``), ``lines`` (reaching them through ``oid`` -> ``orders.oid``, at most 2 per order);
* ``countries`` and ``regions``, public (a NULL zone, a region no row names; dangling and NULL keys in the rows).

Every declared cap holds on the data, so no cap binds and the documented answers are computable by DuckDB:

* lookup joins (one private table with public lookups on their declared keys, inner or LEFT, ON filters): the
  one-table answer over the joined rows, exact at zero noise (SUM / AVG clamped to the declared bounds, a declared
  domain's every key released, plus NULL for a LEFT-joined lookup's column; a lookup column without a domain under an
  inner join: its public values after the WHERE's conditions on that table alone, NULL included);
* grouped joins of several private tables (per-person clipping, one person per tuple): counts exact, sums within the
  release's granularity, over the public key set (declared domains filtered by the WHERE's conditions on the key
  alone; a public table's values; a CASE of literals; ``month`` of a declared date range filtered by the conditions
  on that date alone); tuples whose key is outside the set are not counted;
* scalar joins of several private tables (DP-S4S: its choice among thresholds is random beyond the zeroed noise):
  a COUNT in range only.

HAVING / ORDER BY / LIMIT over the released rows are compared as SQL computes them over the released table. Each
query also checks that nothing fails after its charge, that an error is a ``dpsql.errors`` class without "bug" or an
internal name in its text, and (``neighbours``) that removing one person changes neither a refusal nor the released
key set. Findings are returned, never raised (``run``)."""

from __future__ import annotations

import datetime as dt
import functools
import math
import random
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.errors import DPSQLError
from dpsql.testing import use_noise, zero_noise

SEG = ["a", "b", "c"]
ST = ["open", "done", "void"]
KIND = ["k1", "k2", "k3"]
CAT = ["x", "y"]
ZONE = ["EU", "AM", "AS"]
D0, D1 = dt.date(2024, 1, 1), dt.date(2024, 12, 31)
V_B, AMT_B, PRICE_B, AGE_B = (-10.0, 10.0), (0.0, 100.0), (0.0, 50.0), (0, 100)


def data(seed: int, n: int = 30) -> dict[str, pa.Table]:
    r = random.Random(seed)

    def maybe(v: Any, p: float = 0.08) -> Any:
        return None if r.random() < p else v

    def day() -> Any:
        return maybe(D0 + dt.timedelta(days=r.randint(-20, 380)))  # a few days outside the declared range

    countries = pa.table({"code": ["FR", "DE", "US", "JP", "BR", None][: r.randint(4, 6)]})
    zones = [r.choice([*ZONE, "AF", None]) for _ in range(countries.num_rows)]
    zones[0] = "EU"
    countries = countries.append_column("zone", pa.array(zones, pa.string()))
    countries = countries.append_column("pop", pa.array([maybe(r.randint(1, 90)) for _ in range(countries.num_rows)], pa.int64()))
    regions = pa.table({"rg": ["n", "s", "e", "w"], "rname": ["North", "South", r.choice(["East", None]), "West"]})
    ccs = ["FR", "DE", "US", "JP", "BR", "XX", None]
    rgs = ["n", "s", "e", "w", "zz", None]
    persons = {"id": list(range(n)), "age": [maybe(r.randint(-5, 110)) for _ in range(n)],
               "seg": [maybe(r.choice([*SEG, "zz"])) for _ in range(n)], "rg": [r.choice(rgs) for _ in range(n)],
               "vip": [maybe(r.random() < 0.4) for _ in range(n)]}
    orders: dict[str, list[Any]] = {k: [] for k in ("oid", "pid", "cc", "amt", "st", "day", "qty")}
    lines: dict[str, list[Any]] = {k: [] for k in ("lid", "oid", "price", "cat")}
    events: dict[str, list[Any]] = {k: [] for k in ("uid", "cc", "rg", "v", "kind", "day")}
    for p in range(n):
        for _ in range(r.choice([0, 1, 1, 2, 3])):
            oid = len(orders["oid"]) + 500
            orders["oid"].append(oid)
            orders["pid"].append(p)
            orders["cc"].append(r.choice(ccs))
            orders["amt"].append(maybe(round(r.uniform(-10, 120), 2)))
            orders["st"].append(maybe(r.choice([*ST, "lost"])))
            orders["day"].append(day())
            orders["qty"].append(maybe(r.randint(1, 5)))
            for _ in range(r.choice([0, 1, 2])):
                lines["lid"].append(len(lines["lid"]))
                lines["oid"].append(oid)
                lines["price"].append(maybe(round(r.uniform(0, 60), 1)))
                lines["cat"].append(maybe(r.choice([*CAT, "q"])))
        for _ in range(r.choice([0, 1, 2, 3])):
            events["uid"].append(p)
            events["cc"].append(r.choice(ccs))
            events["rg"].append(r.choice(rgs))
            events["v"].append(maybe(round(r.uniform(-12, 12), 2)))
            events["kind"].append(maybe(r.choice([*KIND, "k9"])))
            events["day"].append(day())
    if r.random() < 0.5:  # an order reaching nobody, a line of no order
        orders["oid"].append(9999)
        orders["pid"].append(None)
        for k in ("cc", "amt", "st", "day", "qty"):
            orders[k].append(orders[k][0] if orders[k] else None)
    return {
        "countries": countries, "regions": regions,
        "persons": pa.table({"id": pa.array(persons["id"], pa.int64()), "age": pa.array(persons["age"], pa.int32()),
                             "seg": pa.array(persons["seg"], pa.string()), "rg": pa.array(persons["rg"], pa.string()),
                             "vip": pa.array(persons["vip"], pa.bool_())}),
        "orders": pa.table({"oid": pa.array(orders["oid"], pa.int64()), "pid": pa.array(orders["pid"], pa.int64()),
                            "cc": pa.array(orders["cc"], pa.string()), "amt": pa.array(orders["amt"], pa.float64()),
                            "st": pa.array(orders["st"], pa.string()), "day": pa.array(orders["day"], pa.date32()),
                            "qty": pa.array(orders["qty"], pa.int32())}),
        "lines": pa.table({"lid": pa.array(lines["lid"], pa.int64()), "oid": pa.array(lines["oid"], pa.int64()),
                           "price": pa.array(lines["price"], pa.float64()), "cat": pa.array(lines["cat"], pa.string())}),
        "events": pa.table({"uid": pa.array(events["uid"], pa.int64()), "cc": pa.array(events["cc"], pa.string()),
                            "rg": pa.array(events["rg"], pa.string()), "v": pa.array(events["v"], pa.float64()),
                            "kind": pa.array(events["kind"], pa.string()), "day": pa.array(events["day"], pa.date32())}),
    }


def without(tables: dict[str, pa.Table], person: int) -> dict[str, pa.Table]:
    """The neighbour: ``person`` removed with every row that reaches them (orders, their lines; events)."""
    t = dict(tables)
    t["persons"] = tables["persons"].filter(pa.compute.not_equal(tables["persons"]["id"], person))
    gone = set(o for o, p in zip(tables["orders"]["oid"].to_pylist(), tables["orders"]["pid"].to_pylist()) if p == person)
    t["orders"] = tables["orders"].filter(pa.array([p != person for p in tables["orders"]["pid"].to_pylist()]))
    t["lines"] = tables["lines"].filter(pa.array([o not in gone for o in tables["lines"]["oid"].to_pylist()]))
    t["events"] = tables["events"].filter(pa.array([u != person for u in tables["events"]["uid"].to_pylist()]))
    return t


CAPS3 = {"max_groups_per_unit": 3, "max_rows_per_group": 3, "max_rows_per_unit": 3}
DAYS = {"bounds": (D0, D1), "bin_width": "1 day"}


def session(t: dict[str, pa.Table]) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e12, 0.9))
    use_noise(s, zero_noise())
    s.register("countries", t["countries"], public=True, columns={"zone": {"domain": ZONE}})
    s.register("regions", t["regions"], public=True)
    s.register("persons", t["persons"], privacy_unit="id", max_groups_per_unit=3, references={"rg": "regions.rg"},
               columns={"age": {"bounds": AGE_B}, "seg": {"domain": SEG}})
    s.register("orders", t["orders"], references={"pid": "persons.id", "cc": "countries.code"}, degree_bounds={"pid": 3},
               columns={"amt": {"bounds": AMT_B}, "st": {"domain": ST}, "day": DAYS, "qty": {"bounds": (1, 5)}}, **CAPS3)
    s.register("lines", t["lines"], references={"oid": "orders.oid"}, degree_bounds={"oid": 2},
               columns={"price": {"bounds": PRICE_B}, "cat": {"domain": CAT}})
    s.register("events", t["events"], privacy_unit="uid", references={"cc": "countries.code", "rg": "regions.rg"},
               columns={"v": {"bounds": V_B}, "kind": {"domain": KIND}, "day": DAYS}, **CAPS3)
    return s


def reference(t: dict[str, pa.Table]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET error_on_division_by_zero = false")
    for name, tab in t.items():
        con.register(name, tab)
    return con


# ---------------------------------------------------------------- queries

NUM = {"e": ["e.v"], "o": ["o.amt", "o.qty"], "p": ["p.age"], "l": ["l.price"], "c": ["c.pop"], "r": []}
TXT = {"e": ["e.kind"], "o": ["o.st"], "p": ["p.seg"], "l": ["l.cat"], "c": ["c.zone"], "r": ["r.rname"]}
DAY = {"e": ["e.day"], "o": ["o.day"]}
BOUNDS = {"e.v": V_B, "o.amt": AMT_B, "l.price": PRICE_B, "p.age": AGE_B, "o.qty": (1, 5)}
DOMAIN = {"e.kind": KIND, "o.st": ST, "p.seg": SEG, "l.cat": CAT, "c.zone": ZONE}
TXT_VALUES = [*SEG, *ST, *KIND, *CAT, *ZONE, "zz", "North", "East", "k9", "", "FR", "DE", "US", "XX"]


class Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)

    def pick(self, *xs: Any) -> Any:
        return self.r.choice(xs)

    def pred(self, al: list[str], depth: int = 0) -> str:
        r = self.r
        nums = [c for a in al for c in NUM.get(a, [])]
        txts = [c for a in al for c in TXT.get(a, [])] + [f"{a}.cc" for a in al if a in ("o", "e") and self.r.random() < 0.3]
        days = [c for a in al for c in DAY.get(a, [])]
        k = r.randint(0, 9 if depth < 2 else 5)
        if k == 0 and nums:
            return f"{self.pick(*nums)} {self.pick('<', '>=', '=', '<>')} {r.randint(-5, 60)}"
        if k == 1 and txts:
            c = self.pick(*txts)
            vals = ", ".join(f"'{self.pick(*TXT_VALUES)}'" for _ in range(r.randint(1, 3)))
            return f"{c} {self.pick('IN', 'NOT IN', 'IN')} ({vals})"
        if k == 2 and txts:
            return f"{self.pick(*txts)} {self.pick('=', '<>', '>')} '{self.pick(*TXT_VALUES)}'"
        if k == 3 and days:
            d = D0 + dt.timedelta(days=r.randint(-10, 370))
            return f"{self.pick(*days)} {self.pick('<', '>=', '<>')} DATE '{d.isoformat()}'"
        if k == 4:
            return f"{self.pick(*(nums + txts + days))} IS {self.pick('NULL', 'NOT NULL')}"
        if k == 5 and nums:
            lo = r.randint(-5, 40)
            return f"{self.pick(*nums)} BETWEEN {lo} AND {lo + r.randint(0, 30)}"
        if k == 6:
            return f"({self.pred(al, depth + 1)} {self.pick('AND', 'OR')} {self.pred(al, depth + 1)})"
        if k == 7:
            return f"NOT ({self.pred(al, depth + 1)})"
        if k == 8 and "p" in al:
            return self.pick("p.vip", "NOT p.vip", "p.vip IS NOT TRUE")
        if k == 9 and txts:
            if self.r.random() < 0.5:  # a condition on one column through a function (a key's set is narrowed by it)
                c = self.pick(*txts)
                f = self.pick(f"lower({c})", f"upper({c})", f"length({c})", f"COALESCE({c}, 'none')", f"{c} || 'x'",
                              f"left({c}, 1)", f"TRY_CAST({c} AS INTEGER)", f"CASE WHEN {c} IS NULL THEN 'none' ELSE 'some' END")
                v = self.pick("'OPEN'", "'open'", "'none'", "'some'", "'e'", "'EUx'", "3", "2", "'k1x'", "NULL")
                if "length" in f or "INTEGER" in f:
                    v = str(self.r.randint(0, 5))
                return f"{f} {self.pick('=', '<>', '>', 'IS NOT DISTINCT FROM')} {v}"
            return f"{self.pick(*txts)} {self.pick('LIKE', 'NOT LIKE')} '{self.pick('%1', 'E%', '_', '%o%', 'a%')}'"
        return f"{self.pick(*(nums + txts + days))} IS NOT NULL"


@dataclass
class Agg:
    sql: str
    ref: str  # DuckDB's, clamped as dpsql clamps
    kind: str  # count / sum / avg


def clamp(col: str) -> str:
    lo, hi = BOUNDS[col]
    return f"CASE WHEN {col} IS NOT NULL THEN LEAST(GREATEST({col}, {lo}), {hi}) END"


@dataclass
class Query:
    sql: str
    shape: str  # lookup / left / grouped / s4s
    aggs: list[Agg]
    keys: list[str] = field(default_factory=list)  # the GROUP BY expressions (their output names k0, k1, ...)
    from_: str = ""  # FROM ... JOIN ... (the reference's, a LEFT JOIN's ON as written)
    where: str = ""
    tables: dict[str, str] = field(default_factory=dict)  # alias -> table
    left: set[str] = field(default_factory=set)  # LEFT-joined aliases
    having: int | None = None  # HAVING a0 > n (a0 a count)
    order: str = ""  # "" / "ASC" / "DESC" (by the keys)
    limit: int | None = None
    epsilon: float = 2.0
    delta: float = 1e-5
    options: dict[str, Any] | None = None


def aggs_for(g: Gen, al: list[str], shape: str) -> list[Agg]:
    r = g.r
    out: list[Agg] = []
    sums = [c for a in al for c in NUM.get(a, []) if c in BOUNDS and c != "p.age"]
    if shape == "s4s":
        return [Agg("COUNT(*)", "COUNT(*)", "count")]
    for _ in range(r.randint(1, 3)):
        k = r.randint(0, 7)
        if k <= 2 or not sums:
            out.append(Agg("COUNT(*)", "COUNT(*)", "count"))
        elif k == 3:
            c = g.pick(*sums, *[t for a in al for t in TXT.get(a, [])])
            out.append(Agg(f"COUNT({c})", f"COUNT({c})", "count"))
        elif k in (4, 5):
            c = g.pick(*sums)
            out.append(Agg(f"SUM({c})", f"SUM({clamp(c)})", "sum"))
        elif k == 6 and shape in ("lookup", "left"):
            c = g.pick(*sums)
            out.append(Agg(f"AVG({c})", f"AVG({clamp(c)})", "avg"))
        elif k == 6:  # expressions whose bounds interval arithmetic derives; an explicit clamp (DuckDB's: NULL is lo)
            c = g.pick(*sums)
            lo, hi = BOUNDS[c]
            txt = g.pick(*[t for a in al for t in TXT.get(a, [])])
            e = g.pick((f"SUM({c} * 2)", f"SUM({clamp(c)} * 2)", "sum"),
                       (f"SUM({c} - {hi})", f"SUM({clamp(c)} - {hi})", "sum"),
                       (f"SUM(CASE WHEN {txt} = 'open' THEN 1.0 ELSE 0.0 END)", f"SUM(CASE WHEN {txt} = 'open' THEN 1.0 ELSE 0.0 END)", "sum"),
                       (f"SUM(LEAST(GREATEST({c}, {lo}), {hi}))", f"SUM(LEAST(GREATEST({c}, {lo}), {hi}))", "sum"),
                       (f"AVG(LEAST(GREATEST({c}, {lo}), {hi}))", f"AVG(LEAST(GREATEST({c}, {lo}), {hi}))", "xavg"))
            out.append(Agg(*e))
        elif k == 7 and shape in ("lookup", "left"):
            if r.random() < 0.5:
                u = "e.uid" if "e" in al else "o.pid"
                out.append(Agg(f"COUNT(DISTINCT {u})", f"COUNT(DISTINCT {u})", "count"))
            else:
                p = g.pred(al, 1)
                out.append(Agg(f"COUNT(*) FILTER (WHERE {p})", f"COUNT(*) FILTER (WHERE {p})", "count"))
        else:
            out.append(Agg("COUNT(*)", "COUNT(*)", "count"))
    if out[0].kind != "count":
        out.insert(0, Agg("COUNT(*)", "COUNT(*)", "count"))
    for a in list(out):  # an AVG is the released SUM over the released COUNT: both are selected, and compared
        if a.kind == "avg":
            c = a.sql[4:-1]
            out += [Agg(f"SUM({c})", f"SUM({clamp(c)})", "sum"), Agg(f"COUNT({c})", f"COUNT({c})", "count")]
    seen: set[str] = set()
    return [a for a in out if not (a.sql in seen or seen.add(a.sql))]  # type: ignore[func-returns-value]


CASE_KEY = {"e": "CASE WHEN e.v > 0 THEN 'pos' ELSE 'neg' END", "o": "CASE WHEN o.amt > 50 THEN 'big' WHEN o.amt > 10 THEN 'mid' END"}


def query(g: Gen) -> Query:
    r = g.r
    shape = g.pick("lookup", "lookup", "left", "left", "grouped", "grouped", "grouped", "s4s")
    tables: dict[str, str] = {}
    left: set[str] = set()
    if shape in ("lookup", "left"):
        base = g.pick("e", "e", "o")
        tables[base] = {"e": "events", "o": "orders"}[base]
        joins = []
        kw = "LEFT JOIN" if shape == "left" else "JOIN"
        lk = g.pick(["c"], ["r"], ["c", "r"]) if base == "e" else ["c"]
        for a in lk:
            tables[a] = {"c": "countries", "r": "regions"}[a]
            on = f"{base}.cc = c.code" if a == "c" else f"{base}.rg = r.rg"
            if shape == "left" and r.random() < 0.4:
                on += f" AND {g.pred([a] if r.random() < 0.6 else [a, base], 1)}"
            if shape == "left":
                left.add(a)
            joins.append(f" {kw} {tables[a]} {a} ON {on}")
        from_ = f"{tables[base]} {base}" + "".join(joins)
        al = list(tables)
        keyspool = [*TXT[base], *[c for a in lk for c in TXT[a]]]
        if shape == "lookup":
            keyspool += [CASE_KEY[base], f"month({base}.day)"] + ([f"{base}.cc"] if r.random() < 0.3 else [])
        else:
            keyspool = [k for k in keyspool if k in DOMAIN]
    else:
        base = "o"
        tables = {"o": "orders", "p": "persons"}
        parts = ["orders o", "JOIN persons p ON o.pid = p.id"]
        if r.random() < 0.5:
            tables["c"] = "countries"
            parts.append("JOIN countries c ON o.cc = c.code")
        if r.random() < 0.4:
            tables["l"] = "lines"
            parts.append("JOIN lines l ON l.oid = o.oid")
        if r.random() < 0.3:
            tables["r"] = "regions"
            parts.append("JOIN regions r ON p.rg = r.rg")
        if r.random() < 0.3:  # another written order: the bounded query's order comes from the catalog
            parts = ["persons p", "JOIN orders o ON o.pid = p.id", *parts[2:]]
        on_extra = []
        if r.random() < 0.25:  # an inner ON's other conditions filter as WHERE's
            j = r.randrange(1, len(parts))
            alias = parts[j].split(" ON ")[0].split()[-1]
            cond = g.pred([alias] if r.random() < 0.7 else list(tables), 1)
            parts[j] += f" AND {cond}"
            if r.random() < 0.4:  # the whole ON in parentheses
                head, on = parts[j].split(" ON ", 1)
                parts[j] = f"{head} ON ({on})"
            on_extra.append(cond)
        if "l" in tables and not on_extra and r.random() < 0.4:  # (an ON's filter beside a USING is refused)
            parts = [x.replace("JOIN lines l ON l.oid = o.oid", "JOIN lines l USING (oid)") for x in parts]
        comma = r.random() < 0.2 and not on_extra and all(" USING " not in x for x in parts)
        from_ = " ".join(parts)
        al = list(tables)
        keyspool = [c for a in al for c in TXT[a]] + [CASE_KEY["o"], "month(o.day)", "year(o.day)"]
        if "c" in tables:
            keyspool.append("c.code")
    where = g.pred(al) if r.random() < 0.75 else ""
    if where and r.random() < 0.4:
        where = f"{where} AND {g.pred(al)}"
    if shape in ("lookup", "left"):
        on_extra, comma = [], False
    if shape == "lookup" and "c" in tables and r.random() < 0.2:
        keyspool.append("c.code")
    keys: list[str] = []
    if shape != "s4s" and r.random() < 0.85:
        keys = [g.pick(*keyspool)]
        if r.random() < 0.25:
            k2 = g.pick(*keyspool)
            if k2 != keys[0]:
                keys.append(k2)
    aggs = aggs_for(g, al, shape)
    if shape == "grouped" and "l" not in tables and r.random() < 0.15:  # the people with a joined tuple
        # (one owner per tuple; with lines a person's tuples can pass the owner's 3 rows, a cap that binds)
        aggs = [Agg("COUNT(DISTINCT o.pid)", "COUNT(DISTINCT o.pid)", "count")]
        keys = [k for k in keys if k in DOMAIN or k in ("r.rname", "c.code")][:1]
    sel = ", ".join([*(f"{k} AS k{j}" for j, k in enumerate(keys)), *(f"{a.sql} AS a{j}" for j, a in enumerate(aggs))])
    wsql = where
    if keys and keys[0] in DOMAIN and r.random() < 0.2:  # a condition on the key through its alias (docs/sql.md)
        v = g.pick(*DOMAIN[keys[0]], "zz")
        wsql = f"{wsql} AND k0 <> '{v}'" if wsql else f"k0 <> '{v}'"
        where = f"{where} AND {keys[0]} <> '{v}'" if where else f"{keys[0]} <> '{v}'"
    if " AND " in wsql and r.random() < 0.4:  # one conjunction however it is grouped
        wsql = f"({wsql})"
    if comma:  # tables listed with commas: the ON equalities move to WHERE
        tabs = ", ".join(x.split(" ON ")[0].replace("JOIN ", "") for x in from_.split(" JOIN "))
        ons = " AND ".join(x.split(" ON ")[1] for x in from_.split(" JOIN ")[1:])
        sql = f"SELECT {sel} FROM {tabs} WHERE {ons}" + (f" AND {wsql}" if wsql else "")
    else:
        sql = f"SELECT {sel} FROM {from_}" + (f" WHERE {wsql}" if wsql else "")
    q = Query(sql, shape, aggs, keys, from_, where, tables, left)
    q.on_extra = on_extra  # type: ignore[attr-defined]
    if keys:
        sql += " GROUP BY " + ", ".join(g.pick(k, str(j + 1)) for j, k in enumerate(keys))
        hv = []
        if r.random() < 0.3:
            q.having = r.randint(0, 6)
            hv.append(f"{aggs[0].sql} > {q.having}")
        if r.random() < 0.15 and keys[0] in DOMAIN:  # a HAVING on a key alone
            q.having_key = g.pick(*DOMAIN[keys[0]], "zz")  # type: ignore[attr-defined]
            hv.append(f"{g.pick(keys[0], 'k0')} <> '{q.having_key}'")  # type: ignore[attr-defined]
        if hv:
            sql += " HAVING " + " AND ".join(hv)
        if not hv and r.random() < 0.15:  # a QUALIFY on the keys' order over the released rows
            q.qualify = r.randint(1, 4)  # type: ignore[attr-defined]
            sql += f" QUALIFY ROW_NUMBER() OVER (ORDER BY {', '.join(f'k{j}' for j in range(len(keys)))}) <= {q.qualify}"  # type: ignore[attr-defined]
        elif r.random() < 0.4:
            q.order = g.pick("ASC", "DESC")
            sql += " ORDER BY " + ", ".join(f"{g.pick(f'k{j}', str(j + 1))} {q.order}" for j in range(len(keys)))
            if r.random() < 0.6:
                q.limit = r.randint(1, 4)
                sql += f" LIMIT {q.limit}"
                if r.random() < 0.3:
                    q.offset = r.randint(1, 5)  # type: ignore[attr-defined]
                    sql += f" OFFSET {q.offset}"  # type: ignore[attr-defined]
    if shape in ("grouped", "lookup") and from_ in sql and r.random() < 0.2:
        # through a view of the join (a CTE merged into the query, docs/sql.md): its columns renamed a_col
        body = sql.replace(from_, "\x00")
        used = sorted(set(re.findall(r"\b([opclre])\.(\w+)\b", body)))
        body = re.sub(r"\b([opclre])\.(\w+)\b", r"\1_\2", body).replace("\x00", "v")
        cols = ", ".join(f"{a}.{c} AS {a}_{c}" for a, c in used) or "*"
        sql = f"WITH v AS (SELECT {cols} FROM {from_}) {body}"
    q.sql = sql
    if shape == "lookup" and not keys and r.random() < 0.3:
        q.delta = 0.0
    if shape == "grouped" and not keys:
        q.shape = shape = "s4s"
        q.aggs = [Agg("COUNT(*)", "COUNT(*)", "count")]
        q.sql = f"SELECT COUNT(*) AS a0 FROM {from_}" + (f" WHERE {where}" if where else "")
    if shape == "s4s":
        q.epsilon = 5.0
    return q


# ---------------------------------------------------------------- the reference


def to_reference(sql: str) -> str:
    tree = sqlglot.parse_one(sql, read="duckdb")
    tree = tree.transform(lambda n: exp.TryCast(this=n.this, to=n.to) if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast) else n)
    return tree.sql(dialect="duckdb")


def conjuncts(where: str) -> list[exp.Expression]:
    if not where:
        return []

    def split(e: exp.Expression) -> list[exp.Expression]:
        if isinstance(e, exp.Paren):
            return split(e.this)
        return [c for part in e.flatten() for c in split(part)] if isinstance(e, exp.And) else [e]

    return split(sqlglot.parse_one(where, read="duckdb"))


def cols_of(e: exp.Expression) -> set[str]:
    return {f"{c.table}.{c.name}" for c in e.find_all(exp.Column)}


def key_values(con: duckdb.DuckDBPyConnection, q: Query, key: str) -> list[Any] | None:
    """The key's public key set, as docs/sql.md defines it; None: no public key set (the one-table sparse route)."""
    conj = conjuncts(q.where) + [c for o in getattr(q, "on_extra", []) for c in conjuncts(o)]
    if key in DOMAIN:
        vals: list[Any] = list(DOMAIN[key])
        if key.split(".")[0] in q.left:  # a LEFT-joined lookup's column: its domain plus NULL
            vals.append(None)
        kept = [c.sql("duckdb") for c in conj if cols_of(c) == {key}]
        if kept:
            cond = to_reference(" AND ".join(f"({c})" for c in kept).replace(key, "kk.v"))
            vals = [v for (v,) in con.execute(f"SELECT v FROM (SELECT unnest(?::VARCHAR[]) AS v) kk WHERE {cond}", [vals]).fetchall()]
        return vals
    if key == "r.rname":
        if "r" in q.left:
            return None
        kept = [c.sql("duckdb") for c in conj if {x.split(".")[0] for x in cols_of(c)} == {"r"}]
        w = (" WHERE " + " AND ".join(f"({c})" for c in kept)) if kept else ""
        return [v for (v,) in con.execute(to_reference(f"SELECT DISTINCT r.rname FROM regions r{w}")).fetchall()]
    if key == "c.code":  # the public values, after the conditions on countries alone or on the column the ON equates
        base = "o" if "o" in q.tables else "e"
        kept = [c.sql("duckdb").replace(f"{base}.cc", "c.code") for c in conj
                if {x.split(".")[0] for x in cols_of(c)} == {"c"} or cols_of(c) == {f"{base}.cc"}]
        w = (" WHERE " + " AND ".join(f"({c})" for c in kept)) if kept else ""
        return [v for (v,) in con.execute(to_reference(f"SELECT DISTINCT c.code FROM countries c{w}")).fetchall()]
    if key.startswith("year("):
        col = key[5:-1]
        kept = [c.sql("duckdb") for c in conj if cols_of(c) == {col}]
        cond = " AND ".join(f"({c})" for c in kept).replace(col, "kk.d") if kept else "TRUE"
        if kept and con.execute(f"SELECT COALESCE(({cond}), FALSE) FROM (SELECT NULL::DATE AS d) kk").fetchone()[0]:
            cond = "TRUE"  # the conditions hold at NULL: the set is not narrowed
        return [y for (y,) in con.execute(
            f"SELECT DISTINCT year(kk.d) FROM (SELECT unnest(range(DATE '{D0}', DATE '{D1}' + 1, INTERVAL 1 DAY))::DATE AS d) kk "
            f"WHERE {cond}").fetchall()]
    if key.startswith("CASE"):
        return ["pos", "neg"] if "e.v" in key else ["big", "mid", None]
    if key.startswith("month("):
        col = key[6:-1]
        kept = [c.sql("duckdb") for c in conj if cols_of(c) == {col}]
        cond = " AND ".join(f"({c})" for c in kept).replace(col, "kk.d") if kept else "TRUE"
        if kept and con.execute(f"SELECT COALESCE(({cond}), FALSE) FROM (SELECT NULL::DATE AS d) kk").fetchone()[0]:
            cond = "TRUE"  # the conditions hold at NULL: the set is not narrowed
        return [m for (m,) in con.execute(
            f"SELECT DISTINCT month(kk.d) FROM (SELECT unnest(range(DATE '{D0}', DATE '{D1}' + 1, INTERVAL 1 DAY))::DATE AS d) kk "
            f"WHERE {cond}").fetchall()]
    return None


def reference_rows(con: duckdb.DuckDBPyConnection, q: Query, mechanism: str = "") -> list[tuple[Any, ...]] | None:
    w = f" WHERE {q.where}" if q.where else ""
    one_table = mechanism not in ("clipped_gaussian", "dp_s4s", "r2t")
    if one_table and "o" in q.tables and "p" not in q.tables:
        # the one-table path drops rows whose unit is NULL; the join mechanisms count them in full (docs/sql.md)
        w = f" WHERE ({q.where}) AND o.pid IS NOT NULL" if q.where else " WHERE o.pid IS NOT NULL"
    if not q.keys:
        sel = ", ".join([*(f"COALESCE({a.ref}, 0)" if a.kind == "sum" else a.ref for a in q.aggs), *avg_counts(q)])
        return con.execute(to_reference(f"SELECT {sel} FROM {q.from_}{w}")).fetchall()
    sets = [key_values(con, q, k) for k in q.keys]
    if any(s is None for s in sets):
        return None
    ks = ", ".join(f"{k} AS k{j}" for j, k in enumerate(q.keys))
    sel = ", ".join([*(f"{a.ref} AS a{j}" for j, a in enumerate(q.aggs)), *avg_counts(q)])
    inner = to_reference(f"SELECT {ks}, {sel} FROM {q.from_}{w} GROUP BY ALL")
    got = {tuple(row[: len(q.keys)]): row[len(q.keys):] for row in con.execute(inner).fetchall()}
    combos: list[tuple[Any, ...]] = [()]
    for s in sets:
        combos = [(*c, v) for c in combos for v in s]  # type: ignore[union-attr]
    rows = []
    for c in combos:
        vals = got.get(c)
        rows.append((*c, *(
            (0 if a.kind in ("count", "sum") else None) if vals is None or (vals[j] is None and a.kind != "avg") else vals[j]
            for j, a in enumerate(q.aggs)), *(vals[len(q.aggs):] if vals is not None else [0] * len(avg_counts(q)))))
    return rows


def sparse_rows(con: duckdb.DuckDBPyConnection, q: Query, rows: list[dict[str, Any]], gc: float, gs: float) -> str | None:
    """The sparse histogram's released rows against DuckDB's groups (the one-table path: rows reaching nobody dropped)."""
    w = f" WHERE ({q.where})" if q.where else " WHERE TRUE"
    if "o" in q.tables and "p" not in q.tables:
        w += " AND o.pid IS NOT NULL"
    nk = len(q.keys)
    ks = ", ".join(f"{k} AS k{j}" for j, k in enumerate(q.keys))
    sel = ", ".join([*(f"{a.ref} AS a{j}" for j, a in enumerate(q.aggs)), *avg_counts(q)])
    got = {tuple(row[:nk]): row for row in con.execute(to_reference(f"SELECT {ks}, {sel} FROM {q.from_}{w} GROUP BY ALL")).fetchall()}
    for r in rows:
        k = tuple(r[f"k{j}"] for j in range(nk))
        if k not in got:
            return f"key {k!r} released, which no row holds"
        for j, a in enumerate(q.aggs):
            if a.kind in ("count", "sum") and not close(r[f"a{j}"], got[k][nk + j] or 0, a.kind, gc, gs):
                return f"key {k!r} a{j} ({a.sql}): dpsql {r[f'a{j}']} DuckDB {got[k][nk + j]}"
    return None


def avg_counts(q: Query) -> list[str]:
    """Each AVG's count of values (its tolerance: the released sum's granularity over that count)."""
    return [f"COUNT({a.sql[4:-1]})" if a.kind == "avg" else "COUNT(*)" for a in q.aggs if a.kind in ("avg", "xavg")]


# ---------------------------------------------------------------- comparison


@dataclass
class Outcome:
    ran: int = 0
    answered: int = 0
    refused: int = 0
    compared: int = 0
    neighbours: int = 0
    findings: list[str] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    refused_queries: list[tuple[str, str]] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)


INTERNAL = re.compile(r"__|\bbug\b|Traceback|sqlglot|duckdb\.|_dp_|\bsalt\b|\bhash\(", re.I)


def nkey(v: Any) -> Any:
    return (v is None, str(type(v)), v if v is not None else 0)


def granularity(rel: Any) -> tuple[float, float]:
    """The released counts' and sums' granularity (one-table: the accuracy's; joins: each run's parameters)."""
    gc = gs = 0.0
    for acc in (rel.accuracy or {}).values():
        if isinstance(acc, dict) and acc.get("granularity") and "AVG" not in str(acc.get("note", "")):
            gs = max(gs, float(acc["granularity"]))
    for a in (rel.details or {}).get("aggregates", []) or []:
        par = a.get("parameters") or {}
        gr = float(par.get("granularity") or 0)
        if not gr and par.get("sigma") is None:  # the key count known at run time only: the grid is at most 2 sigma
            sig = max((float(v.get("sigma") or 0) for v in (rel.accuracy or {}).values() if isinstance(v, dict)
                      and v.get("aggregate") == a.get("aggregate")), default=math.inf)  # (not selected: unknown)
            gr = 0.0 if sig < 16 or (sig == math.inf and str(a.get("aggregate", "")).startswith("COUNT")) else 2 * sig
        if str(a.get("aggregate", "")).startswith("COUNT"):
            gc = max(gc, gr)
        gs = max(gs, gr)
    return gc, gs


def close(got: Any, want: Any, kind: str, gc: float, gs: float, n: int = 1) -> bool:
    if kind == "avg":  # the join mechanisms': the released SUM over the released COUNT (NULL where it is at most 0)
        if want is None or got is None:
            return got is None and want is None
        return abs(float(got) - float(want)) <= 1e-9 * max(1.0, abs(float(want)))
    if kind == "xavg":  # an explicit clamp's AVG: its SUM over COUNT(*), each rounded to its grid
        if want is None or got is None:
            return got is None and want is None
        return abs(float(got) - float(want)) <= 1.01 * (0.01 + gs / max(n, 1)) + 1e-6 * abs(float(want))
    if kind == "avg1":  # the one-table path's: midpoint + the centred sum (on the sums' grid) / the count, rounded
        if want is None or got is None:
            return got is None and want is None
        return abs(float(got) - float(want)) <= 1.01 * (0.01 + gs / max(n, 1)) + 1e-9 * abs(float(want))
    if got is None or want is None:
        return False
    tol = gc if kind == "count" else 1.01 * max(gs, 0.01)
    return abs(float(got) - float(want)) <= tol + 1e-9 * abs(float(want))


def compare(q: Query, rows: list[dict[str, Any]], want: list[tuple[Any, ...]], gc: float, gs: float,
            joinmech: bool = True) -> str | None:
    nk = len(q.keys)
    if q.shape == "s4s":
        got, true = rows[0]["a0"], want[0][0]
        # (its choice among thresholds draws other randomness than the zeroed Gaussian: only its range is checked)
        return None if got is not None and 0 <= got <= max(3 * true, 100) else f"DP-S4S count {got} against {true}"
    def ns(w: tuple[Any, ...], j: int) -> int:
        """The count of an AVG's values (the hidden columns after the aggregates)."""
        avgs = [i for i, a in enumerate(q.aggs) if a.kind in ("avg", "xavg")]
        return int(w[nk + len(q.aggs) + avgs.index(j)] or 0) if j in avgs else 1

    def released_avg(r: dict[str, Any], j: int) -> Any:
        c = q.aggs[j].sql[4:-1]
        js = next(i for i, a in enumerate(q.aggs) if a.sql == f"SUM({c})")
        jc = next(i for i, a in enumerate(q.aggs) if a.sql == f"COUNT({c})")
        sm, n = r[f"a{js}"], r[f"a{jc}"]
        return None if sm is None or n is None or n <= 0 else sm / n

    if not nk:
        for j, a in enumerate(q.aggs):
            w = released_avg(rows[0], j) if a.kind == "avg" and joinmech else want[0][j]
            kind = "avg1" if a.kind == "avg" and not joinmech else a.kind
            if not close(rows[0][f"a{j}"], w, kind, gc, gs, ns(want[0], j)):
                return f"a{j} ({a.sql}): dpsql {rows[0][f'a{j}']} DuckDB {want[0][j]}"
        return None
    if q.having is not None:
        want = [w for w in want if w[nk] > q.having]
    if getattr(q, "having_key", None) is not None:
        want = [w for w in want if w[0] is not None and w[0] != q.having_key]  # type: ignore[attr-defined]
    if getattr(q, "qualify", None):
        want = sorted(want, key=lambda w: tuple((x is None, x if x is not None else 0) for x in w[:nk]))[: q.qualify]  # type: ignore[attr-defined]
    if q.order:
        def cmp(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:  # NULLS LAST either way (DuckDB's default)
            for x, y in zip(a[:nk], b[:nk]):
                if x == y:
                    continue
                if x is None or y is None:
                    return 1 if x is None else -1
                return (-1 if x < y else 1) * (-1 if q.order == "DESC" else 1)
            return 0

        want = sorted(want, key=functools.cmp_to_key(cmp))
        if q.limit is not None:
            off = getattr(q, "offset", 0) or 0
            want = want[off: off + q.limit]
        gotk = [tuple(r[f"k{j}"] for j in range(nk)) for r in rows]
        if gotk != [tuple(w[:nk]) for w in want]:
            return f"rows {gotk} against DuckDB's {[tuple(w[:nk]) for w in want]}"
    got = {tuple(r[f"k{j}"] for j in range(nk)): r for r in rows}
    wd = {tuple(w[:nk]): w for w in want}
    if set(got) != set(wd):
        return f"keys {sorted(got, key=lambda k: tuple(map(nkey, k)))} against {sorted(wd, key=lambda k: tuple(map(nkey, k)))}"
    for k, w in wd.items():
        for j, a in enumerate(q.aggs):
            wj = released_avg(got[k], j) if a.kind == "avg" and joinmech else w[nk + j]
            kind = "avg1" if a.kind == "avg" and not joinmech else a.kind
            if not close(got[k][f"a{j}"], wj, kind, gc, gs, ns(w, j)):
                return f"key {k!r} a{j} ({a.sql}): dpsql {got[k][f'a{j}']} DuckDB {w[nk + j]} (granularity {gc}, {gs})"
    return None


def attempt(s: dpsql.Session, q: Query) -> tuple[str, Any]:
    before = s.history().num_rows
    try:
        rel = s.query(q.sql, epsilon=q.epsilon, delta=q.delta, options=q.options)
    except DPSQLError as e:
        charged = s.history().num_rows > before
        return ("charged-error" if charged else "refused"), e
    except Exception as e:  # noqa: BLE001
        return "crash", e
    return "answered", rel


def run_query(s: dpsql.Session, con: duckdb.DuckDBPyConnection, q: Query, out: Outcome,
              nb: tuple[dpsql.Session, int] | None = None) -> None:
    out.ran += 1
    kind, res = attempt(s, q)
    if kind == "crash":
        out.findings.append(f"NON-DPSQL {type(res).__name__}: {res}\n  {q.sql}")
        return
    if kind == "charged-error":
        out.findings.append(f"FAILED AFTER CHARGE {type(res).__name__}: {res}\n  {q.sql}")
        return
    if nb is not None:
        out.neighbours += 1
        nkind, nres = attempt(nb[0], q)
        if kind != nkind:
            out.findings.append(f"NEIGHBOUR (without person {nb[1]}): {kind} / {nkind} {nres if nkind != 'answered' else ''}\n  {q.sql}")
        elif kind == "refused" and (type(res), str(res)) != (type(nres), str(nres)):
            out.findings.append(f"NEIGHBOUR REFUSAL differs: {res} / {nres}\n  {q.sql}")
        elif kind == "answered" and q.keys and q.having is None and q.limit is None and q.shape != "s4s" \
                and not getattr(q, "qualify", None):
            mine = {tuple(r[f"k{j}"] for j in range(len(q.keys))) for r in res.to_pylist()}
            theirs = {tuple(r[f"k{j}"] for j in range(len(q.keys))) for r in nres.to_pylist()}
            if mine != theirs and not res.mechanism.startswith("sparse"):
                out.findings.append(f"NEIGHBOUR KEYS differ: {mine ^ theirs}\n  {q.sql}")
    if kind == "refused":
        msg = str(res)
        if type(res).__name__ == "ExecutionError" or INTERNAL.search(msg.split("\nhint")[0]):
            out.findings.append(f"MESSAGE {type(res).__name__}: {msg}\n  {q.sql}")
            return
        out.refused += 1
        first = re.sub(r"'[^']*'|\d+(\.\d+)?", "_", msg.split("\n")[0])[:100]
        out.refusals[first] = out.refusals.get(first, 0) + 1
        out.refused_queries.append((q.sql, msg))
        return
    rel = res
    out.answered += 1
    rows = rel.to_pylist()
    if not rows and (q.having is None):
        out.empty.append(q.sql)
    try:
        want = reference_rows(con, q, rel.mechanism)
    except duckdb.Error as e:
        out.refusals["(reference failed) " + str(e)[:60]] = out.refusals.get("(reference failed) " + str(e)[:60], 0) + 1
        return
    if want is None:
        if rel.mechanism == "sparse_histogram":  # keys above a noisy threshold: each released row is exact
            bad = sparse_rows(con, q, rows, *granularity(rel))
            out.compared += 1
            if bad:
                out.findings.append(f"WRONG ANSWER [{rel.mechanism}] {bad}\n  {q.sql}")
        return
    out.compared += 1
    gc, gs = granularity(rel)
    bad = compare(q, rows, want, gc, gs, rel.mechanism in ("clipped_gaussian", "dp_s4s", "r2t"))
    if bad:
        out.findings.append(f"WRONG ANSWER [{rel.mechanism}] {bad}\n  {q.sql}")


def run(n: int, seed: int, persons: int = 30, neighbours: float = 0.0) -> Outcome:
    t = data(seed, persons)
    s = session(t)
    con = reference(t)
    g = Gen(seed)
    out = Outcome()
    nb: tuple[dpsql.Session, int] | None = None
    if neighbours:
        victim = random.Random(seed).randrange(persons)
        nb = (session(without(t, victim)), victim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(n):
            q = query(g)
            run_query(s, con, q, out, nb if nb and g.r.random() < neighbours else None)
    s.close()
    if nb:
        nb[0].close()
    con.close()
    return out


if __name__ == "__main__":  # pragma: no cover
    import sys

    tot = Outcome()
    for sd in range(int(sys.argv[2]), int(sys.argv[2]) + int(sys.argv[3]) if len(sys.argv) > 3 else int(sys.argv[2]) + 1):
        res = run(int(sys.argv[1]), sd, neighbours=0.3)
        for k in ("ran", "answered", "refused", "compared", "neighbours"):
            setattr(tot, k, getattr(tot, k) + getattr(res, k))
        for k, v in res.refusals.items():
            tot.refusals[k] = tot.refusals.get(k, 0) + v
        tot.findings += res.findings
        tot.empty += res.empty
        tot.refused_queries += res.refused_queries
    print(f"ran {tot.ran} answered {tot.answered} refused {tot.refused} compared {tot.compared} neighbours {tot.neighbours}")
    for k, v in sorted(tot.refusals.items(), key=lambda kv: -kv[1]):
        print(f"  {v:4d} {k}")
    for f in tot.findings:
        print(f)
    for e in tot.empty:
        print("CHARGED, NO ROW:", e)
    if len(sys.argv) > 4:
        for q, e in tot.refused_queries:
            print("REFUSED", q, "\n   ", e.replace("\n", "\n    "))
