"""Randomised neighbour checks of join queries (``tests/test_join_neighbour_fuzz.py``).

Generated schemas: person tables (one whose referenced key is not its unit, one referencing another
person table), 1-3 tables of rows reaching people through foreign keys (to person tables and to each
other, one or two references each, some with a privacy unit of their own), a public table with
duplicated keys; generated data with NULL, dangling and duplicated keys and one hostile person per
person table (several rows, extreme values, many rows on their own and on other people's keys);
generated queries (2-4 inputs, self-joins, several ON equalities, COUNT / SUM / clamped SUM, WHERE
on any input, GROUP BY declared or public keys, mechanism options).

The neighbour is built here from the declarations alone (``reach_all``): a row reaches its own unit,
every person its references name, and every person reached from every row its references match
(duplicated keys: all of them), so removing a person removes every row that reaches them. The
checks compare the truncated quantities at fixed thresholds and a fixed keyed sample."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

import dpsql
from dpsql.budget import Budget
from dpsql.engine.duckdb_ops import SaltedDuckDBOps
from dpsql.mechanisms import _s4s_socp as socp
from dpsql.mechanisms import _s4s_truncation as trunc
from dpsql.mechanisms import s4s as core
from dpsql.mechanisms.s4s_sql import JoinCalibration, _tuples
from dpsql.mechanisms.s4s_vector import KAPPA, VectorCalibration, _Slots, clipped_totals, vector_taus
from dpsql.plan.joins import flat
from dpsql.rewrite.join_groups import clipped_groups, sampled_groups
from dpsql.rewrite.joins import join_relation, parts_of, sampled_tuples, truncated_sums
from dpsql.testing import use_noise, zero_noise

GDOM = ["x", "y", "z"]


@dataclass
class Table:
    name: str
    unit: str | None = None
    refs: dict[str, str] = field(default_factory=dict)  # fk -> "table.col"
    degree: dict[str, int] = field(default_factory=dict)
    keycol: str | None = None  # column referenced by others
    public: bool = False
    max_rows_per_unit: int | None = None
    cols: list[str] = field(default_factory=list)
    vbounds: tuple[float, float] = (0.0, 10.0)
    allow: bool = False


def gen_schema(g: np.random.Generator) -> dict[str, Table]:
    T: dict[str, Table] = {}
    T["pub"] = Table("pub", public=True, keycol="id", cols=["id", "name"])
    T["pa"] = Table("pa", unit="id", keycol="id", cols=["id", "v", "g"], max_rows_per_unit=int(g.integers(1, 4)))
    persons = ["pa"]
    if g.random() < 0.5:
        T["pb"] = Table("pb", unit="id", keycol="id", cols=["id", "v", "g"], max_rows_per_unit=int(g.integers(1, 3)))
        persons.append("pb")
        if g.random() < 0.4:  # a person table referencing another one
            T["pa"].refs["rep"] = "pb.id"
            T["pa"].cols.append("rep")
            if g.random() < 0.8:
                T["pa"].degree["rep"] = int(g.integers(1, 4))
    if g.random() < 0.5:  # a person table whose referenced key is not its unit
        T["pk"] = Table("pk", unit="u", keycol="k", cols=["k", "u", "v", "g"], max_rows_per_unit=int(g.integers(1, 3)))
        persons.append("pk")
        if g.random() < 0.3:
            targets_extra = ["pk.u"]
        else:
            targets_extra = []
    else:
        targets_extra = []
    targets = [f"{p}.{T[p].keycol}" for p in persons] + targets_extra
    n_child = int(g.integers(1, 4))
    for i in range(n_child):
        t = Table(f"c{i}", keycol="k", cols=["k", "v", "g"])
        nfk = 1 if g.random() < 0.6 else 2
        choices = list(targets)
        for fk_i in range(nfk):
            tgt = choices[int(g.integers(0, len(choices)))]
            fk = f"f{fk_i}"
            t.refs[fk] = tgt
            t.cols.append(fk)
            if g.random() < 0.95:
                t.degree[fk] = int(g.integers(1, 4))
        if g.random() < 0.6:
            t.refs["p"] = "pub.id"
            t.cols.append("p")
            if g.random() < 0.6:
                t.degree["p"] = int(g.integers(2, 40))
        if g.random() < 0.15:
            t.unit = "own"
            t.cols.append("own")
            t.max_rows_per_unit = int(g.integers(1, 3))
        if g.random() < 0.3:
            t.vbounds = (-5.0, 10.0)
        t.allow = bool(g.random() < 0.8)
        T[t.name] = t
        targets.append(f"{t.name}.k")
    for p in persons:
        T[p].allow = bool(g.random() < 0.85)
    return T


def persons_of(T: dict[str, Table]) -> list[str]:
    return [n for n, t in T.items() if t.unit]


HOSTILE_V = [1e308, -1e308, float("nan"), float("inf"), -float("inf"), 1e6, -1e6, 0.0, -0.0]


def gen_data(T: dict[str, Table], g: np.random.Generator, n: int = 12) -> dict[str, dict[str, list[Any]]]:
    """Column lists per table. Person 0 of every person table is hostile."""
    D: dict[str, dict[str, list[Any]]] = {}
    keys: dict[str, list[Any]] = {}

    def vcol(m: int, hostile: list[bool]) -> list[Any]:
        out = []
        for h in hostile[:m]:
            if h and g.random() < 0.5:
                out.append(HOSTILE_V[int(g.integers(0, len(HOSTILE_V)))])
            elif g.random() < 0.05:
                out.append(None)
            else:
                out.append(float(np.round(g.uniform(-8, 14), 2)))
        return out

    def gcol(m: int) -> list[Any]:
        return [None if g.random() < 0.05 else ("w" if g.random() < 0.08 else GDOM[int(g.integers(0, 3))]) for _ in range(m)]

    pubn = int(g.integers(2, 5))
    pid = list(range(pubn)) + ([int(g.integers(0, pubn))] if g.random() < 0.3 else [])
    D["pub"] = {"id": pid, "name": [f"n{i}" for i in range(len(pid))]}
    keys["pub.id"] = pid
    order = sorted(T, key=lambda n: (0 if n in ("pb", "pk") else 1 if n == "pa" else 2, n))
    for name in order:
        t = T[name]
        if t.public:
            continue
        cols: dict[str, list[Any]] = {}
        if name in ("pa", "pb"):
            ids: list[Any] = []
            for p in range(n):
                reps = int(g.integers(1, 4)) if p == 0 else (2 if g.random() < 0.15 else 1)
                ids += [p] * reps
            ids += [None] if g.random() < 0.3 else []
            cols["id"] = ids
        elif name == "pk":
            ks: list[Any] = []
            us: list[Any] = []
            for p in range(n):
                m = int(g.integers(2, 6)) if p == 0 else int(g.integers(1, 3))
                for _ in range(m):
                    ks.append(len(ks) + 100)
                    us.append(p)
            for _ in range(int(g.integers(0, 4))):  # duplicated keys, across people
                i, j = g.integers(0, len(ks), 2)
                ks[int(i)] = ks[int(j)]
            if g.random() < 0.3:
                ks.append(ks[0])
                us.append(None)
            cols["k"], cols["u"] = ks, us
        else:
            m = int(g.integers(5, 30))
            cols["k"] = [1000 * (int(name[1:]) + 1) + i for i in range(m)]
            for _ in range(int(g.integers(0, 3))):
                i, j = g.integers(0, m, 2)
                cols["k"][int(i)] = cols["k"][int(j)]
        m = len(next(iter(cols.values())))
        hostile = [False] * m
        if name in ("pa", "pb"):
            hostile = [x == 0 for x in cols["id"]]
        elif name == "pk":
            hostile = [x == 0 for x in cols["u"]]
        for fk, tgt in t.refs.items():
            pool = keys[tgt]
            vals: list[Any] = []
            for _ in range(m):
                r = g.random()
                if r < 0.06:
                    vals.append(None)
                elif r < 0.1:
                    vals.append(99999)  # dangling
                else:
                    vals.append(pool[int(g.integers(0, len(pool)))] if pool else None)
            cols[fk] = vals
        if t.unit == "own":
            cols["own"] = [None if g.random() < 0.05 else int(g.integers(0, n)) for _ in range(m)]
        if name not in ("pa", "pb", "pk") and t.refs:
            # hostile fan-out: rows pointing at the hostile person's keys (first fk), others' keys (second fk)
            fks = list(t.refs)
            tgt0 = t.refs[fks[0]]
            hot = _hostile_keys(tgt0, D, T)
            extra = int(g.integers(3, 20)) if hot else 0
            hot_fk = fks[0] if len(fks) == 1 or g.random() < 0.5 else fks[1]
            hot = _hostile_keys(t.refs[hot_fk], D, T) or hot
            for _ in range(extra):
                cols["k"].append(1000 * (int(name[1:]) + 1) + len(cols["k"]))
                for fk in fks:
                    if fk == hot_fk:
                        cols[fk].append(hot[int(g.integers(0, len(hot)))])
                        continue
                    pool = keys[t.refs[fk]]
                    cols[fk].append(pool[int(g.integers(0, len(pool)))] if pool else None)
                if t.unit == "own":
                    cols["own"].append(0)
                hostile.append(True)
            m = len(cols["k"])
        cols["v"] = vcol(m, hostile + [True] * (m - len(hostile)))
        cols["g"] = gcol(m)
        if "p" in t.refs:
            pass
        D[name] = cols
        keys[f"{name}.{t.keycol}"] = [x for x in cols[t.keycol] if x is not None]
        if name == "pk":
            keys["pk.u"] = [x for x in cols["u"] if x is not None]
    return D


def _hostile_keys(tgt: str, D: dict[str, dict[str, list[Any]]], T: dict[str, Table]) -> list[Any]:
    tn, _, tc = tgt.partition(".")
    if tn not in D:
        return []
    cols = D[tn]
    if tn in ("pa", "pb"):
        return [0]
    if tn == "pk":
        return [k for k, u in zip(cols["k"], cols["u"]) if u == 0]
    # a child: its rows that (first fk) point at hostile keys: take the last rows (the hostile fan-out)
    return cols[tc][-5:]


SPELL = ["a", "A", "a ", "", " a", "\u00e4", "a\u0308", "n", "v1:n", "#", "~x", "pa:0", "0", "00", "1", "-0"]


def spell(v: Any) -> Any:
    if v is None:
        return None
    return SPELL[v] if 0 <= v < len(SPELL) else f"s{v}"


def to_arrow(T: dict[str, Table], D: dict[str, dict[str, list[Any]]], text: bool = False) -> dict[str, pa.Table]:
    """Arrow tables; with ``text`` every key, reference and unit (but the public table's) is VARCHAR,
    spelled through ``SPELL`` (distinct values stay distinct; 'a', 'A', 'a ' are three people)."""
    out = {}
    if text:
        D = {tn: {c: ([spell(x) for x in vals] if c not in ("v", "g", "name", "p") and tn != "pub" else vals)
                  for c, vals in cols.items()} for tn, cols in D.items()}
    for name, cols in D.items():
        arrs = {}
        for c, vals in cols.items():
            if c in ("v",):
                arrs[c] = pa.array(vals, pa.float64())
            elif c in ("g", "name") or (text and name != "pub" and c != "p"):
                arrs[c] = pa.array(vals, pa.string())
            else:
                arrs[c] = pa.array(vals, pa.int64())
        out[name] = pa.table(arrs)
    return out


# ---- reach and neighbours (independent of dpsql) ------------------------------------------------------------
def reach_all(T: dict[str, Table], D: dict[str, dict[str, list[Any]]]) -> dict[str, list[frozenset[tuple[str, Any]]]]:
    memo: dict[tuple[str, int], frozenset[tuple[str, Any]]] = {}
    index: dict[tuple[str, str], dict[Any, list[int]]] = {}

    def rows_with(tn: str, col: str, v: Any) -> list[int]:
        key = (tn, col)
        if key not in index:
            idx: dict[Any, list[int]] = {}
            for i, x in enumerate(D[tn][col]):
                if x is not None:
                    idx.setdefault(x, []).append(i)
            index[key] = idx
        return index[key].get(v, [])

    def reach(tn: str, i: int) -> frozenset[tuple[str, Any]]:
        if (tn, i) in memo:
            return memo[(tn, i)]
        t = T[tn]
        out: set[tuple[str, Any]] = set()
        if not t.public:
            if t.unit and D[tn][t.unit][i] is not None:
                out.add((tn, D[tn][t.unit][i]))
            for fk, tgt in t.refs.items():
                t2n, _, c = tgt.partition(".")
                if T[t2n].public:
                    continue
                v = D[tn][fk][i]
                if v is None:
                    continue
                if T[t2n].unit == c:
                    out.add((t2n, v))
                for j in rows_with(t2n, c, v):
                    out |= reach(t2n, j)
        memo[(tn, i)] = frozenset(out)
        return memo[(tn, i)]

    return {tn: [reach(tn, i) for i in range(len(next(iter(D[tn].values()))))] for tn in D}


def without(T: dict[str, Table], D: dict[str, dict[str, list[Any]]], victim: tuple[str, Any],
            R: dict[str, list[frozenset[tuple[str, Any]]]] | None = None) -> dict[str, dict[str, list[Any]]]:
    R = R or reach_all(T, D)
    out = {}
    for tn, cols in D.items():
        keep = [victim not in r for r in R[tn]]
        out[tn] = {c: [x for x, k in zip(vals, keep) if k] for c, vals in cols.items()}
    return out


def register(s: Any, T: dict[str, Table], A: dict[str, pa.Table]) -> None:
    for name, t in T.items():
        kw: dict[str, Any] = {}
        if t.public:
            kw["public"] = True
        else:
            if t.unit:
                kw["privacy_unit"] = t.unit
                if t.max_rows_per_unit:
                    kw["max_rows_per_unit"] = t.max_rows_per_unit
            if t.refs:
                kw["references"] = dict(t.refs)
            if t.degree:
                kw["degree_bounds"] = dict(t.degree)
            kw["columns"] = {"v": {"bounds": t.vbounds}, "g": {"domain": list(GDOM)}}
            kw["allow_conditional_sampling"] = t.allow
        s.register(name, A[name], **kw)


def edges(T: dict[str, Table]) -> list[tuple[str, str, str, str]]:
    """(table a, col a, table b, col b) join candidates: fk edges and shared-target equalities."""
    out = []
    for tn, t in T.items():
        for fk, tgt in t.refs.items():
            t2, _, c = tgt.partition(".")
            out.append((tn, fk, t2, c))
    # two fks with the same target
    fks = [(tn, fk, tgt) for tn, t in T.items() for fk, tgt in t.refs.items()]
    for i, (a, fa, ta) in enumerate(fks):
        for b, fb, tb in fks[i:]:
            if ta == tb and (a, fa) != (b, fb):
                out.append((a, fa, b, fb))
    # self-joins on a unit / key
    for tn, t in T.items():
        if t.unit:
            out.append((tn, t.unit, tn, t.unit))
        for fk in t.refs:
            out.append((tn, fk, tn, fk))
    return out


def gen_query(T: dict[str, Table], g: np.random.Generator) -> tuple[str, dict[str, Any], bool]:
    E = edges(T)
    private = [n for n, t in T.items() if not t.public]
    start = private[int(g.integers(0, len(private)))]
    inputs = [("t0", start)]
    ons: list[list[str]] = [[]]
    n_inputs = int(g.choice([1, 2, 2, 3, 3, 4]))
    for _ in range(n_inputs - 1):
        cand = []
        for (ta, ca, tb, cb) in E:
            for al, tn in inputs:
                if tn == ta:
                    cand.append((al, ca, tb, cb))
                if tn == tb:
                    cand.append((al, cb, ta, ca))
        if not cand:
            break
        fkc = [c for c in cand if any(c[2] == ta and c[3] == ca or (T[c[2]].refs.get(c[3]) is not None) for ta, ca in [(c[2], c[3])]) and
               ((c[3] in T[c[2]].refs) != (c[1] in T[dict(inputs)[c[0]]].refs))]
        pool = fkc if fkc and g.random() < 0.7 else cand
        al, c_old, t_new, c_new = pool[int(g.integers(0, len(pool)))]
        new = f"t{len(inputs)}"
        conds = [f"{al}.{c_old} = {new}.{c_new}"]
        # sometimes a second equality with another input on a shared target
        if g.random() < 0.5:
            for (ta, ca, tb, cb) in E + [(e[2], e[3], e[0], e[1]) for e in E]:
                if tb == t_new and cb != c_new and len(conds) < 3:
                    for al2, tn2 in inputs:
                        if tn2 == ta and al2 != al:
                            conds.append(f"{al2}.{ca} = {new}.{cb}")
                            break
        inputs.append((new, t_new))
        ons.append(conds)
    frm = f"{inputs[0][1]} AS {inputs[0][0]}" + "".join(
        f" JOIN {tn} AS {al} ON {' AND '.join(c)}" for (al, tn), c in zip(inputs[1:], ons[1:]))
    priv_in = [(al, tn) for al, tn in inputs if not T[tn].public]
    if not priv_in:
        priv_in = inputs
    # aggregate
    al, tn = priv_in[int(g.integers(0, len(priv_in)))]
    has_v = "v" in T[tn].cols
    r = g.random()
    if r < 0.4 or not has_v:
        agg = "COUNT(*)"
    elif r < 0.5:
        agg = f"COUNT({al}.v)"
    elif r < 0.8:
        agg = f"SUM({al}.v)"
    else:
        lo, hi = [(-3, 4), (0, 2), (1, 3), (-2, -1), (0, 0)][int(g.integers(0, 5))]
        agg = f"SUM(LEAST(GREATEST({al}.v, {lo}), {hi}))"
    # where
    where = []
    for _ in range(int(g.choice([0, 0, 1, 2]))):
        al, tn = priv_in[int(g.integers(0, len(priv_in)))]
        c = g.random()
        if c < 0.3 and "v" in T[tn].cols:
            where.append(f"{al}.v > {round(float(g.uniform(-5, 10)), 1)}")
        elif c < 0.55 and "g" in T[tn].cols:
            where.append(f"{al}.g = '{['x', 'y', 'z', 'w'][int(g.integers(0, 4))]}'")
        elif c < 0.75 and len(priv_in) > 1:
            al2, tn2 = priv_in[int(g.integers(0, len(priv_in)))]
            if "v" in T[tn].cols and "v" in T[tn2].cols and al2 != al:
                where.append(f"{al}.v < {al2}.v")
        else:
            cols = [c for c in T[tn].cols if c not in ("v", "g")]
            col = cols[int(g.integers(0, len(cols)))] if cols else None
            if col:
                where.append(f"{al}.{col} IS NOT NULL")
    # group by
    group = []
    grouped = g.random() < 0.45
    if grouped:
        opts = [f"{al}.g" for al, tn in inputs if "g" in T[tn].cols]
        opts += [f"{al}.name" for al, tn in inputs if T[tn].public]
        if opts:
            group = [opts[int(g.integers(0, len(opts)))]]
            if g.random() < 0.2 and len(opts) > 1:
                other = opts[int(g.integers(0, len(opts)))]
                if other not in group:
                    group.append(other)
    sel = ", ".join(group + [agg])
    sql = f"SELECT {sel} FROM {frm}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if group:
        sql += " GROUP BY " + ", ".join(group)
    # options
    if group:
        o = [{}, {"mechanism": "dp_s4s", "q": 0.5}, {"mechanism": "r2t"}, {"clip_norm": 1.5}, {"mechanism": "dp_s4s"}][
            int(g.integers(0, 5))]
    else:
        o = [{}, {"mechanism": "r2t"}, {"mechanism": "dp_s4s", "q": 0.5}, {"mechanism": "dp_s4s", "q": 1.0},
             {"mechanism": "dp_s4s", "q": 0.25, "tau_base": 2}][int(g.integers(0, 5))]
    return sql, dict(o), bool(group)


SALT = "fuzzsalt"


def session(T: dict[str, Table], D: dict[str, dict[str, list[Any]]], text: bool = False) -> dpsql.Session:
    s = dpsql.Session(budget=Budget(1e6, 0.5))
    order = sorted(T, key=lambda n: (0 if T[n].public else 1 if n in ("pb", "pk") else 2 if n == "pa" else 3, n))
    register(s, {n: T[n] for n in order}, to_arrow(T, D, text))
    return s


def outcome(s: dpsql.Session, sql: str, opts: dict[str, Any], eps: float, delta: float) -> tuple[Any, ...]:
    import os
    import tempfile

    from _neighbour import captured_warnings

    fd = tempfile.TemporaryFile()
    saved = os.dup(1), os.dup(2)
    os.dup2(fd.fileno(), 1)
    os.dup2(fd.fileno(), 2)
    try:
        with captured_warnings() as ws:  # none of earlier garbage's warnings (tests/_neighbour.py)
            o = _outcome(s, sql, opts, eps, delta)
    finally:
        for fdn, sv in ((1, saved[0]), (2, saved[1])):
            os.dup2(sv, fdn)
            os.close(sv)
    fd.seek(0)
    printed = fd.read()
    return o + (tuple(sorted({f"{w.category.__name__}:{w.message}" for w in ws})), printed)


def _outcome(s: dpsql.Session, sql: str, opts: dict[str, Any], eps: float, delta: float) -> tuple[Any, ...]:
    use_noise(s, zero_noise(7))
    try:
        plan = s.explain(sql, epsilon=eps, delta=delta, options=opts)
    except Exception as e:  # noqa: BLE001
        return ("explain-error", type(e).__name__, str(e))
    try:
        r = s.query(sql, epsilon=eps, delta=delta, options=opts)
    except Exception as e:  # noqa: BLE001
        return ("query-error", type(e).__name__, str(e), repr(plan.cost))
    keys = [c for c in r.table.column_names][:-1]
    ktab = r.table.select(keys).to_pylist() if keys else []
    hist = s.history().to_pylist()[-1]
    ledger = repr(Budget(hist["epsilon"], hist["delta"]))
    return ("ok", repr(plan.cost), repr(r.cost) if ledger == repr(r.cost) else f"ledger {ledger} vs {r.cost!r}", r.mechanism,
            repr(ktab), hist["status"],
            r.table.num_rows, sorted(r.details.keys()))


def internals(s: dpsql.Session, sql: str, opts: dict[str, Any], eps: float, delta: float) -> dict[str, Any] | None:
    try:
        r = s._route(sql, eps, delta, opts)
    except Exception:  # noqa: BLE001
        return None
    cal = r.calibration
    ops = SaltedDuckDBOps()
    cat = dict(s.tables)
    out: dict[str, Any] = {}
    if isinstance(cal, JoinCalibration):
        jp, pb = cal.jp, cal.people
        delta_i = cal.max_tuples
        taus = sorted({1.0, 2.0, 3.0, float(delta_i), 1e9})
        out["kind"] = "scalar-fast" if cal.fast else "scalar-general"
        out["delta"] = delta_i
        out["enforced"] = pb.enforced
        out["q"] = cal.q
        out["taus"] = taus
        if cal.fast:
            q = truncated_sums(jp, cat, pb.owner, taus + [0.0], salt=SALT, q=cal.q, ops=ops, caps=cal.caps)
            row = s._engine.fetch_arrow(q).to_pylist()[0]
            out["parts"] = [(p.units, [int(row[f"__f{k}_{i}"]) for i in range(len(taus) + 1)]) for k, p in enumerate(cal.parts)]
            out["owners"] = per_owner(s, jp, pb, cal.caps)
            out["owner_table"] = pb.owner.person_table
        else:
            q = sampled_tuples(jp, cat, salt=SALT, q=cal.q, ops=ops, caps=cal.caps)
            rows = s._engine.fetch_arrow(q)
            out["parts"] = []
            out["multisets"] = []
            for p in cal.parts:
                w, ti, ui = _tuples(cal, rows, p)
                jt = core.validate_join_tuples(w, ti, ui)
                prep = trunc.prepare(jt.weights, jt.tuple_idx, jt.user_idx, jt.n_users)
                vals = [trunc.truncate(prep, t, pb.per_tuple).value for t in taus]
                out["parts"].append((1, vals))
            out["tuples"] = tuple_multiset(rows, jp, cal.parts)
    elif isinstance(cal, VectorCalibration):
        jp, pb = cal.jp, cal.people
        out["delta"] = cal.max_tuples
        out["enforced"] = pb.enforced
        out["q"] = cal.q
        if cal.path == "clip":
            out["kind"] = "vector-clip"
            out["clip"] = cal.clip
            parts = parts_of(jp)
            M = max(p.scale for p in parts)
            caps = pb.caps
            res = []
            for c in (cal.clip, float(cal.max_tuples) * M):
                t = s._engine.fetch_arrow(clipped_groups(jp, cat, pb.owner, c, salt=SALT, ops=ops, caps=caps))
                keys = t.select([k.name for k in jp.keys]).to_pylist()
                res.append((c, keys, [n * 2.0 ** -e for n, e in clipped_totals(t, c, parts)]))
            out["clipped"] = res
            out["owners"] = per_owner(s, jp, pb, caps)
            out["owner_table"] = pb.owner.person_table
        else:
            out["kind"] = "vector-s4s"
            caps = pb.caps if pb.enforced else ()
            rows = s._engine.fetch_arrow(sampled_groups(jp, cat, salt=SALT, q=cal.q, ops=ops, caps=caps))
            dom = rows.filter(pc.is_null(rows.column("__tuple")))
            d = dom.num_rows
            out["keys"] = dom.select([k.name for k in jp.keys] + ["__gid"]).sort_by("__gid").to_pylist()
            tup = rows.filter(pc.is_valid(rows.column("__tuple")))
            taus = vector_taus(cal.max_tuples)
            out["taus"] = list(taus)
            per = []
            for part in cal.parts:
                w, ti, ui = _tuples(_Slots(jp), tup, part)
                w = np.clip(w, 0.0, 1.0)
                gid = np.asarray(tup.column("__gid").to_numpy(zero_copy_only=False), dtype=np.int64)
                n_users = int(ui.max()) + 1 if ui.size else 0
                inst = socp.Instance(w, gid, ti, ui, n_users, d, one_person=pb.enforced)
                trs = [socp.truncate(inst, t) for t in taus] if d else []
                per.append([(np.asarray(tr.values), tr.excess, tr.gap) for tr in trs])
            out["vec"] = per
    else:
        return None
    return out


def per_owner(s: dpsql.Session, jp: Any, pb: Any, caps: Any) -> dict[Any, tuple[int, ...]]:
    """Per owner (and key): the exact sums of the weights and the tuple count, at q = 1."""
    parts = parts_of(jp)
    extra = [exp.alias_(exp.column(flat(pb.owner.alias, pb.owner.column)), "__owner")]
    extra += [exp.alias_(k.expr.copy(), f"__x{i}") for i, k in enumerate(jp.keys)]
    rel = join_relation(jp, dict(s.tables), salt=SALT, ops=SaltedDuckDBOps(), caps=caps, parts=parts, extra=extra,
                        with_tid=False)
    keys = ["__owner"] + [f"__x{i}" for i in range(len(jp.keys))]
    q = exp.select(*[exp.column(k) for k in keys], *[exp.alias_(exp.cast(exp.func("sum", exp.column(p.name)), "VARCHAR"), p.name)
                                                       for p in parts], exp.alias_(exp.func("count", exp.Star()), "__n")
                   ).from_(rel.subquery("__r")).group_by(*[exp.column(k) for k in keys])
    out = {}
    for r in s._engine.fetch_arrow(q).to_pylist():
        out[tuple(r[k] for k in keys)] = tuple(r[p.name] for p in parts) + (r["__n"],)
    return out


def tuple_multiset(rows: pa.Table, jp: Any, parts: Any) -> collections.Counter:
    ws = [rows.column(p.name).to_pylist() for p in parts]
    users = []
    for k in range(len(jp.slots)):
        users.append(rows.column(f"__u{k}").to_pylist())
    c: collections.Counter = collections.Counter()
    for i in range(rows.num_rows):
        us: set[str] = set()
        for col in users:
            u = col[i]
            if isinstance(u, list):
                us |= {x for x in u if x is not None}
            elif u is not None:
                us.add(u)
        c[(tuple(w[i] for w in ws), frozenset(us))] += 1
    return c


def digested_id(victim_id: str) -> str:
    """How a join's tuples name a person whose unit is text: ``<table>:`` and the salted digest of the text
    (``dpsql.rewrite.joins.key_digests``; DuckDB's ``MD5_NUMBER`` under the fixed ``SALT``, in hexadecimal)."""
    table, value = victim_id.split(":", 1)
    digest = duckdb.execute("SELECT HEX(MD5_NUMBER(? || ?))", [SALT, value]).fetchall()[0][0]
    return f"{table}:{digest}"


def compare(a: dict[str, Any], b: dict[str, Any], victim_id: str, tuple_id: str | None = None) -> list[str]:
    """a: D, b: D minus the victim (``victim_id`` as the owners' totals spell it; ``tuple_id`` as the sampled
    tuples name them, by default the same). Problems found."""
    tuple_id = victim_id if tuple_id is None else tuple_id
    bad: list[str] = []
    kind = a["kind"]
    if "owners" in a:
        vt, vv = victim_id.split(":", 1)
        exp_b = {k: v for k, v in a["owners"].items() if not (vt == a["owner_table"] and k[0] is not None and str(k[0]) == vv)}
        if exp_b != b["owners"]:
            diff = {k: (exp_b.get(k), b["owners"].get(k)) for k in set(exp_b) | set(b["owners"]) if exp_b.get(k) != b["owners"].get(k)}
            bad.append(f"{kind}: per-owner totals of D' != D's less the victim: {dict(list(diff.items())[:4])}")
    if kind.startswith("scalar"):
        taus = a["taus"]
        for (units, va), (_, vb) in zip(a["parts"], b["parts"]):
            for i, t in enumerate(taus):
                lim = t * units if kind == "scalar-fast" else t + trunc.gap_bound(t) + 1e-9 * t
                if abs(va[i] - vb[i]) > lim + (0 if kind == "scalar-fast" else 1e-9):
                    bad.append(f"{kind}: tau={t} moved {va[i]} -> {vb[i]} (limit {lim})")
            if kind == "scalar-fast":
                if va[-1] != vb[-1]:
                    bad.append(f"scalar-fast: unowned weight moved {va[-1]} -> {vb[-1]}")
                if a["enforced"] and a["q"] == 1.0:
                    d = a["delta"]
                    idx_d, idx_inf = taus.index(float(d)), taus.index(1e9)
                    for lab, v in (("D", va), ("D'", vb)):
                        if v[idx_inf] != v[idx_d]:
                            bad.append(f"enforced Delta={d} exceeded on {lab}: f(inf)={v[idx_inf]} f(Delta)={v[idx_d]}")
        if kind == "scalar-general":
            ca, cb = a["tuples"], b["tuples"]
            exp_b = collections.Counter({k: v for k, v in ca.items() if tuple_id not in k[1]})
            if exp_b != cb:
                extra = cb - exp_b
                missing = exp_b - cb
                bad.append(f"scalar-general: tuples of D' != tuples of D less the victim's: extra {dict(list(extra.items())[:3])} "
                           f"missing {dict(list(missing.items())[:3])}")
    elif kind == "vector-clip":
        for (c, ka, va), (_, kb, vb) in zip(a["clipped"], b["clipped"]):
            if ka != kb:
                bad.append("vector-clip: key sets differ")
                continue
            n = float(np.linalg.norm(np.array(va) - np.array(vb)))
            if n > c * (1 + 2**-30) * (1 + 1e-12):
                bad.append(f"vector-clip: C={c} moved by {n}")
    elif kind == "vector-s4s":
        if a["keys"] != b["keys"]:
            bad.append("vector-s4s: key sets differ")
            return bad
        for pa_, pb_ in zip(a["vec"], b["vec"]):
            for t, (fa, ea, ga), (fb, eb, gb) in zip(a["taus"], pa_, pb_):
                if abs(ea - eb) > 1 + ga + gb + 1e-9:
                    bad.append(f"vector-s4s: tau={t} E moved {ea} -> {eb}")
                n = float(np.linalg.norm(fa - fb))
                lim = 2 * t * KAPPA * (min(ea, eb) + 1 + max(ga, gb)) * (1 + 1e-9)
                if n > lim:
                    bad.append(f"vector-s4s: tau={t} F moved {n} > {lim} (E {ea}, {eb})")
                if a["enforced"] and t == a["taus"][-1] and a["q"] == 1.0 and (ea > 1e-9 or eb > 1e-9):
                    bad.append(f"vector-s4s: enforced Delta but E>0 at tau=Delta: {ea}, {eb}")
    return bad


def victims(T: dict[str, Table], D: dict[str, dict[str, list[Any]]], g: np.random.Generator) -> list[tuple[str, Any]]:
    """Per person table: the hostile person 0 and one other person."""
    out = []
    for p in persons_of(T):
        col = T[p].unit
        assert col is not None
        vals = sorted({x for x in D[p][col] if x is not None})
        if 0 in vals:
            out.append((p, 0))
        others = [v for v in vals if v != 0]
        if others:
            out.append((p, others[int(g.integers(0, len(others)))]))
    return out


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    queries: int = 0
    checked: collections.Counter = field(default_factory=collections.Counter)
    outcomes: int = 0


def run_seed(seed: int, n_queries: int, *, outcomes: bool, text: bool | None = None, report: Report | None = None) -> Report:
    """One generated schema and dataset, ``n_queries`` generated queries, each checked against the
    neighbours of ``victims`` at fixed thresholds (``internals``/``compare``) and, with ``outcomes``, for
    equal observables (``outcome``) on every other query."""
    rep = report or Report()
    g = np.random.default_rng(seed)
    text = bool(seed % 2) if text is None else text
    T = gen_schema(g)
    D = gen_data(T, g)
    R = reach_all(T, D)
    sD = session(T, D, text)
    neigh = {v: session(T, without(T, D, v, R), text) for v in victims(T, D, g)}
    try:
        for qi in range(n_queries):
            sql, opts, grouped = gen_query(T, g)
            if g.random() < 0.15:
                fks = [(tn, fk) for tn, t in T.items() for fk in t.degree if f" {tn} AS " in f" {sql.split(' FROM ')[1]}"]
                if fks:
                    tn, fk = fks[int(g.integers(0, len(fks)))]
                    opts = {**opts, "degree_caps": {f"{tn}.{fk}": 1}}
            delta = 1e-6 if grouped or g.random() < 0.3 else 0.0
            rep.queries += 1
            a = internals(sD, sql, opts, 1.0, delta)
            o_d = outcome(sD, sql, opts, 1.0, delta) if outcomes and qi % 2 == 0 else None
            if o_d is not None and o_d[0] == "ok" and not (o_d[1] == o_d[2]):
                rep.problems.append(f"{seed}/{qi} {sql} {opts}: the charge {o_d[2]} is not explain's {o_d[1]}")
            for v, sP in neigh.items():
                where = f"{seed}/{qi} victim {v} {sql} {opts} delta={delta}"
                if a is not None:
                    b = internals(sP, sql, opts, 1.0, delta)
                    if b is None:
                        rep.problems.append(f"{where}: routed on D only")
                        continue
                    rep.checked[a["kind"]] += 1
                    vid = f"{v[0]}:{spell(v[1]) if text else v[1]}"
                    rep.problems += [f"{where}: {p}" for p in compare(a, b, vid, digested_id(vid) if text else vid)]
                if o_d is not None:
                    rep.outcomes += 1
                    o_p = outcome(sP, sql, opts, 1.0, delta)
                    if o_d != o_p:
                        rep.problems.append(f"{where}: observables differ: {o_d} vs {o_p}")
    finally:
        sD.close()
        for sP in neigh.values():
            sP.close()
    return rep
