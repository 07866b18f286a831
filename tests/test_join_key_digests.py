"""Text and BLOB join keys carried as their salted digest (``dpsql.rewrite.joins.key_digests``).

A key read only as a key (equi-join conditions, user slots, Delta caps, declared keys) is projected by each input
as the digest of the per-query secret salt and its text; person ids are spelled from that digest wherever a text
unit is met. The digest is a function of the key (equal keys, one digest; under the binary collation, as every
join reads text), so every match, partition and person is the same: with zero noise, a join over text keys
releases what the same join releases over the keys relabelled as integers (one integer per distinct text), and
'a', 'A', 'a ', NFC and NFD spellings, a NUL byte and a 5 000-character id stay different people. A key that is
also read as a value keeps its text, and the ids of its people are the same digests (one person, one id in every
slot). Negative controls: merging two customers' ids changes the releases, and the digests are in the bounded
SQL exactly where the rule says.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import dpsql
from dpsql.budget import Budget
from dpsql.plan.analyze import analyze
from dpsql.rewrite.joins import key_digests
from dpsql.testing import use_noise, zero_noise

IDS = ["a", "A", "a ", " a", "\u00e9", "e\u0301", "ss", "\u00df", "x\x00y", "x", "P" * 5000, "", "\u0130", "i\u0307",
       *[f"c{i}" for i in range(30)]]


def _tables(ids: list[Any], merge: bool = False, nulls: bool = False) -> dict[str, pa.Table]:
    """customer (unit ``id``, segment ``seg``) <- orders (``oid``, ``cid``, ``amt``) <- item (``oid``), and
    customer <- visit (``cid``). Customers have up to 5 orders (their bound: a choice among orders would follow
    the keys' order, which a relabelling changes) and up to 10 visits, orders up to 3 items, against bounds of 2:
    those caps bind over rows that are interchangeable (each carries its key only). With ``merge`` the second
    customer's orders and visits reference the first (a negative control); with ``nulls`` three more orders
    reference nobody (a NULL key). ``customer.len`` and ``orders.clen`` hold the number of characters of the text
    ids (``IDS``; DuckDB's ``length`` counts code points, as Python's ``len``), whatever ``ids`` spells them as:
    what a query over integer keys reads in the place of ``length(c.id)``."""
    n = len(ids)
    cid, oid, amt = [], [], []
    for i in range(n):
        for j in range(1 + (i * 7) % 5):
            cid.append(ids[0] if merge and i == 1 else ids[i])
            oid.append(f"{i}-{j}")
            amt.append(float(i % 4))
    clen: list[Any] = [len(IDS[ids.index(c)]) for c in cid]
    if nulls:
        cid, clen = cid + [None] * 3, clen + [None] * 3
        oid, amt = oid + [f"n-{j}" for j in range(3)], amt + [1.0, 2.0, 3.0]
    items = [o for k, o in enumerate(oid) for _ in range(1 + k % 3)]
    if isinstance(ids[0], int):  # the integer relabelling of the order keys too
        codes = {o: k for k, o in enumerate(oid)}
        oid, items = [codes[o] for o in oid], [codes[o] for o in items]
    return {"customer": pa.table({"id": ids, "seg": [f"s{i % 3}" for i in range(n)], "len": [len(IDS[i]) for i in range(n)]}),
            "orders": pa.table({"oid": oid, "cid": pa.array(cid, pa.int64() if isinstance(ids[0], int) else pa.string()),
                                "amt": amt, "clen": pa.array(clen, pa.int64())}),
            "item": pa.table({"oid": items}), "visit": pa.table({"cid": cid + cid})}


def _session(tables: dict[str, pa.Table], domain: bool = False) -> dpsql.Session:
    """With ``domain``, orders.cid declares the first six customers' ids as its domain (a GROUP BY key)."""
    s = dpsql.Session(budget=Budget(1e6, 0.9))
    use_noise(s, zero_noise(5))
    s.register("customer", tables["customer"], privacy_unit="id", columns={"seg": {"domain": ["s0", "s1", "s2"]}})
    cid = {"cid": {"domain": tables["customer"].column("id").to_pylist()[:6]}} if domain else {}
    s.register("orders", tables["orders"], references={"cid": "customer.id"}, degree_bounds={"cid": 5},
               columns={"amt": {"bounds": (0, 3)}, **cid})
    s.register("item", tables["item"], references={"oid": "orders.oid"}, degree_bounds={"oid": 2})
    s.register("visit", tables["visit"], references={"cid": "customer.id"}, degree_bounds={"cid": 2})
    return s


J = "FROM customer c JOIN orders o ON c.id = o.cid"
QUERIES = [
    ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid", {"q": 1.0}),
    ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid", {"mechanism": "r2t"}),
    ("SELECT COUNT(*) FROM customer c JOIN visit v ON c.id = v.cid", {"q": 1.0}),
    ("SELECT SUM(o.amt) FROM customer c JOIN orders o ON c.id = o.cid JOIN visit v ON c.id = v.cid", {"q": 1.0}),
    ("SELECT COUNT(*) FROM orders o JOIN item i ON o.oid = i.oid", {"q": 1.0}),
    ("SELECT COUNT(*) FROM item", {"q": 1.0}),  # a looked-up chain: item -> orders -> customer
    ("SELECT c.seg, COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid GROUP BY c.seg", None),
    ("SELECT COUNT(o.cid) FROM customer c JOIN orders o ON c.id = o.cid", {"q": 1.0}),  # whether the key is NULL
    ("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid WHERE c.id = o.cid OR o.amt > 1", {"q": 1.0}),
    ("SELECT SUM(o.amt) FROM customer c JOIN orders o ON c.id = o.cid WHERE c.id = o.cid OR o.amt > 1", {"mechanism": "r2t"}),
    # conditions across inputs whose parts over one input read the key (computed by that input's projection,
    # ``joins.hoisted``): ``{a}`` and ``{x}`` are the first and tenth ids ('a' and 'x', or 0 and 9)
    (f"SELECT COUNT(*) {J} WHERE (c.id <> {{a}} OR o.amt > 1)", {"q": 1.0}),
    (f"SELECT SUM(o.amt) {J} WHERE (c.id IN ({{a}}, {{x}}) OR o.amt < 1) AND o.amt <> 2", {"mechanism": "r2t"}),
    (f"SELECT c.seg, COUNT(*) {J} WHERE (c.id <> {{x}} OR o.amt > 1) GROUP BY c.seg", None),
    # a part that is NULL for one customer ('a'): NOT (NULL AND TRUE) drops their orders of amount below 2
    (f"SELECT COUNT(*) {J} WHERE NOT (NULLIF(c.id, {{a}}) <> {{x}} AND o.amt < 2)", {"q": 1.0}),
    (f"SELECT COUNT(*) {J} JOIN visit v ON c.id = v.cid WHERE (c.id = {{x}}) = (o.amt > 1 AND v.cid IS NOT NULL)",
     {"mechanism": "r2t"}),
    (f"SELECT SUM(o.amt) {J} WHERE CASE WHEN c.id IN ({{a}}, {{x}}) THEN o.amt > 1 ELSE o.cid IS NOT NULL END",
     {"mechanism": "r2t"}),
]
#: the queries of the hoisted parts above, by their index in QUERIES
HOISTED = range(10, 16)


def _sql(sql: str, ids: list[Any]) -> str:
    """``sql`` with ``{a}`` and ``{x}`` spelled as literals of the keys' type."""
    return sql.format(**{k: repr(ids[i]) if isinstance(ids[i], int) else f"'{ids[i]}'" for k, i in (("a", 0), ("x", 9))})


def _releases(tables: dict[str, pa.Table], queries: list[tuple[str, Any]] | None = None) -> list[Any]:
    s = _session(tables)
    ids = tables["customer"].column("id").to_pylist()
    try:
        out = []
        for sql, opts in queries if queries is not None else QUERIES:
            sql = _sql(sql, ids)
            delta = 1e-6 if "GROUP BY" in sql else 0.0
            out.append(s.query(sql, epsilon=1.0, delta=delta, options=opts).table.to_pylist())
        return out
    finally:
        s.close()


@pytest.fixture(scope="module")
def text_releases() -> list[Any]:
    return _releases(_tables(IDS))


def test_text_keys_release_what_integer_keys_release(text_releases: list[Any]) -> None:
    assert len(set(IDS)) == len(IDS)
    relabelled = _releases(_tables(list(range(len(IDS)))))
    for (sql, opts), t, i in zip(QUERIES, text_releases, relabelled, strict=True):
        assert t == i, (sql, opts)


def test_control_merging_two_customers_changes_the_releases(text_releases: list[Any]) -> None:
    merged = _releases(_tables(IDS, merge=True))
    assert merged != text_releases


def _digested(sql: str) -> frozenset[str]:
    s = _session(_tables(IDS))
    try:
        jp = analyze(sql, dict(s.tables)).join
        assert jp is not None
        slots = [f"{sl.alias}__{sl.column}" for sl in jp.slots]
        return key_digests(jp, (), [], slots)
    finally:
        s.close()


def test_the_keys_read_only_as_keys_are_the_digested_ones() -> None:
    assert _digested("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid") == {"c__id", "o__cid"}
    assert _digested("SELECT COUNT(*) FROM orders o JOIN item i ON o.oid = i.oid") >= {"o__oid", "i__oid"}
    # COUNT(col) reads whether the key is NULL, as its digest tells
    assert _digested("SELECT COUNT(o.cid) FROM customer c JOIN orders o ON c.id = o.cid") == {"c__id", "o__cid"}
    # compared with another input's key: the comparison reads both digests
    assert _digested("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid WHERE c.id = o.cid OR o.amt > 1") == {
        "c__id", "o__cid"}
    # read as a value too: neither side of the equi-join is digested
    assert not _digested("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid WHERE c.id < o.cid OR o.amt > 1") & {
        "c__id", "o__cid"}


def test_the_bounded_sql_carries_the_digest_of_a_key_only() -> None:
    s = _session(_tables(IDS))
    try:
        sql = "SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid"
        bounded = " ".join(s.explain(sql, epsilon=1.0).bounded_sql.split())
        assert "MD5_NUMBER('<per-query secret salt>' || CAST(o__cid COLLATE \"binary\" AS TEXT)) AS o__cid" in bounded
        value = " ".join(s.explain("SELECT COUNT(*) FROM customer c JOIN orders o ON c.id = o.cid "
                                   "WHERE c.id < o.cid OR o.amt > 1", epsilon=1.0).bounded_sql.split())
        assert "AS TEXT)) AS o__cid" not in value
    finally:
        s.close()


def _edge_releases(text: bool, wheres: tuple[str, ...] = ("", " WHERE NOT e1.src IN (e2.dst, e2.dst)",
                                                          " WHERE e1.src IN (e2.dst, e2.dst)"),
                   nulls: bool = False) -> list[Any]:
    """Paths of two edges over 30 nodes (text ids, or the same ids relabelled as integers), in shapes where the
    middle node's keys are digested and the end nodes' are read as values too (``IN`` of another input's key: their
    ids then spelled from the digest in the query), or digested (``wheres``): one person, one id, in every slot. With ``nulls`` one edge in 8 has a NULL
    ``dst``."""
    import numpy as np

    g = np.random.default_rng(3)
    src, dst = g.integers(0, 30, 400), g.integers(0, 30, 400)
    src, dst = src[src != dst], dst[src != dst]
    names = IDS[:6] + [f"n{i}" for i in range(24)]
    spell0 = (lambda v: [names[int(i)] for i in v]) if text else (lambda v: [int(i) for i in v])

    def spell(v: Any) -> list[Any]:
        out = spell0(v)
        return [None if nulls and v is dst and k % 8 == 0 else x for k, x in enumerate(out)]

    s = dpsql.Session(budget=Budget(1e9, 0.9))
    use_noise(s, zero_noise(2))
    s.register("node", pa.table({"id": spell(range(30))}), privacy_unit="id")
    s.register("edge", pa.table({"src": spell(src), "dst": spell(dst)}), references={"src": "node.id", "dst": "node.id"},
               degree_bounds={"src": 8, "dst": 8})
    try:
        out = []
        for where in wheres:
            for opts in ({"q": 1.0}, {"mechanism": "r2t"}):
                sql = "SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src" + where
                out.append(s.query(sql, epsilon=5.0, delta=1e-6, options=opts).table.to_pylist())
        return out
    finally:
        s.close()


@pytest.fixture(scope="module")
def edge_text() -> list[Any]:
    return _edge_releases(True)


def test_one_person_has_one_id_in_digested_and_read_slots(edge_text: list[Any]) -> None:
    text = edge_text
    assert text == _edge_releases(False)
    assert len({repr(r) for r in text}) >= 3  # the shapes release different counts (none vacuous)


def test_control_a_person_spelled_two_ways_changes_the_releases(edge_text: list[Any],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above sees a split: ids read from a column spelled apart from the digested ones (one person
    two users to the truncation) release other counts."""
    from sqlglot import exp

    import dpsql.rewrite.joins as rj

    honest = edge_text
    spelled = rj._person_text

    def split(*args: Any, digested: bool = False) -> exp.Expression:
        e = spelled(*args, digested=digested)
        return e if digested else exp.DPipe(this=exp.Literal.string("x"), expression=e, safe=True)

    monkeypatch.setattr(rj, "_person_text", split)
    assert _edge_releases(True) != honest


def test_a_condition_across_inputs_reads_the_key_through_one_inputs_parts() -> None:
    """The parts of a condition after the join that read the key through one input alone are computed by that
    input's projection, so the key is read only as a key; a part across inputs still reads it as a value."""
    for k in HOISTED:
        assert _digested(_sql(QUERIES[k][0], IDS)) >= {"c__id", "o__cid"}, QUERIES[k][0]
    assert not _digested(f"SELECT COUNT(*) {J} WHERE (concat(c.id, o.cid) <> 'x' OR o.amt > 1)") & {"c__id", "o__cid"}
    s = _session(_tables(IDS))
    try:
        bounded = " ".join(s.explain(f"SELECT COUNT(*) {J} WHERE (c.id <> 'a' OR o.amt > 1)", epsilon=1.0).bounded_sql.split())
    finally:
        s.close()
    assert "AS TEXT)) AS c__id" in bounded and "AS TEXT)) AS o__cid" in bounded
    assert "\"c__id\" COLLATE \"binary\" <> 'a' AS c____cond0" in bounded


def test_the_conditions_parts_filter_and_keep_sqls_three_valued_logic(text_releases: list[Any]) -> None:
    """Non-vacuous: each condition drops some tuples (its release differs from the unfiltered one), and the part
    that is NULL for customer 'a' drops their order (NULL, not FALSE: NOT (FALSE AND TRUE) would keep it)."""
    plain = {"COUNT": text_releases[0], "SUM": _releases(_tables(IDS), [(f"SELECT SUM(o.amt) {J}", {"mechanism": "r2t"})])[0],
             "seg": text_releases[6]}
    for k in HOISTED:
        sql = QUERIES[k][0]
        key = "seg" if "GROUP BY" in sql else "SUM" if "SUM" in sql else "COUNT"
        assert text_releases[k] != plain[key], sql
    two_valued = _releases(_tables(IDS), [(f"SELECT COUNT(*) {J} WHERE NOT (COALESCE(NULLIF(c.id, {{a}}) <> {{x}}, FALSE) "
                                           "AND o.amt < 2)", {"q": 1.0})])[0]
    assert two_valued != text_releases[13]


def test_control_a_part_read_as_two_valued_changes_the_releases(text_releases: list[Any],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison with integer keys sees a part whose NULL is read as FALSE: the releases change."""
    from sqlglot import exp

    import dpsql.rewrite.joins as rj

    honest = rj.hoisted

    def two_valued(*args: Any) -> Any:
        h = honest(*args)
        parts = {a: [(n, exp.func("coalesce", e, exp.false())) for n, e in ps] for a, ps in h.parts.items()}
        return rj.Hoisted(h.plan, parts, h.top)

    monkeypatch.setattr(rj, "hoisted", two_valued)
    k = 13
    assert _releases(_tables(IDS), [QUERIES[k]]) != [text_releases[k]]


def test_a_part_over_a_left_joined_lookup_stays_in_the_condition() -> None:
    """A LEFT-joined lookup's columns are NULL where no row matched, where its part need not be NULL
    (``c.code IS NULL`` is TRUE there): such a part is not computed by the lookup's projection."""
    from dpsql.rewrite.joins import hoisted

    s = dpsql.Session(budget=Budget(1e6, 0.9))
    use_noise(s, zero_noise(0))
    s.register("countries", pa.table({"code": ["FR"], "region": ["EU"]}), public=True)
    s.register("events", pa.table({"uid": [1, 2], "cc": ["FR", "DE"], "day": [1, 20]}), privacy_unit="uid",
               references={"cc": "countries.code"})
    try:
        left = "SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code WHERE (c.code IS NULL OR e.day > 30)"
        inner = "SELECT COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code WHERE (e.cc <> 'FR' OR c.region = 'EU')"
        plans = [analyze(q, dict(s.tables)).join for q in (left, inner)]
        assert plans[0] is not None and plans[1] is not None
        assert not hoisted(plans[0], ()).parts
        assert [n for n, _ in hoisted(plans[1], ()).parts["e"]] == ["e____cond0"]
        assert s.query(left, epsilon=1.0).table.to_pylist() == [{"COUNT(*)": 1}]  # the unmatched DE event
        assert s.query(inner, epsilon=1.0).table.to_pylist() == [{"COUNT(*)": 2}]
    finally:
        s.close()


GROUPED = [
    (f"SELECT o.cid, COUNT(*) {J} GROUP BY o.cid", None),
    (f"SELECT o.cid, SUM(o.amt) {J} WHERE (c.id <> {{x}} OR o.amt > 1) GROUP BY o.cid", {"q": 1.0}),
    (f"SELECT o.cid AS k, c.seg, COUNT(*) {J} GROUP BY o.cid, c.seg", {"mechanism": "dp_s4s_vector", "q": 0.5}),
]


def _grouped(ids: list[Any]) -> list[Any]:
    """The releases of ``GROUPED``, each key spelled as its index in ``ids``."""
    s = _session(_tables(ids), domain=True)
    try:
        out = []
        for sql, opts in GROUPED:
            rows = s.query(_sql(sql, ids), epsilon=1.0, delta=1e-6, options=opts).table.to_pylist()
            out.append(sorted(repr({c: ids.index(v) if c in ("cid", "k") and v is not None else v for c, v in r.items()})
                              for r in rows))
        return out
    finally:
        s.close()


def test_a_grouped_join_key_is_matched_to_its_key_set_by_its_digest() -> None:
    """GROUP BY a text join key with a public key set: the key is carried as its digest and matched to the digest
    of its key set's text (the released key is the key set's text): the releases of the keys relabelled as
    integers, the six-person domain's 'a', 'A', 'a ', ' a', NFC and NFD spellings distinct groups."""
    text = _grouped(IDS)
    assert text == _grouped(list(range(len(IDS))))
    assert all(len(r) >= 6 for r in text)
    s = _session(_tables(IDS), domain=True)
    try:
        bounded = " ".join(s.explain(GROUPED[0][0], epsilon=1.0, delta=1e-6).bounded_sql.split())
    finally:
        s.close()
    assert "AS TEXT)) AS o__cid" in bounded and "AS TEXT)) AS c__id" in bounded


def test_control_a_key_set_digested_under_another_salt_matches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql.rewrite.join_groups as jg

    honest = jg.KeyDigest
    monkeypatch.setattr(jg, "KeyDigest", lambda salt, ops: honest(salt + "?", ops))
    assert _grouped(IDS) != _grouped(list(range(len(IDS))))


#: conditions across inputs whose parts over one input read the key and are not BOOLEAN (``joins.hoisted``: the
#: largest part of fixed width): ``{len_c}`` is ``length(c.id)`` over text keys and ``c.len`` (the same numbers)
#: over integer keys, ``{a}`` the first id; the orders include three whose key is NULL
NOT_BOOLEAN = [
    (f"SELECT COUNT(*) {J} WHERE {{len_c}} > o.amt", {"q": 1.0}),
    (f"SELECT SUM(o.amt) {J} WHERE {{len_c}} + o.amt > 3", {"mechanism": "r2t"}),
    # a part that is NULL for one customer ('a', whose length 1 is above the amounts 0 of its orders)
    (f"SELECT c.seg, COUNT(*) {J} WHERE (CASE WHEN c.id = {{a}} THEN NULL ELSE {{len_c}} END) > o.amt GROUP BY c.seg",
     None),
    (f"SELECT COUNT(*) {J} WHERE CAST({{len_c}} AS DOUBLE) / 2 - o.amt BETWEEN 0 AND 1", {"mechanism": "r2t"}),
    (f"SELECT COUNT(*) {J} WHERE CAST({{len_c}} AS DECIMAL(10, 2)) * 1.5 > o.amt + 2", {"q": 1.0}),
    (f"SELECT COUNT(*) {J} WHERE CASE WHEN o.amt > 1 THEN {{len_c}} > 1 ELSE {{len_c}} < 2 END", {"q": 1.0}),
]


def _not_boolean(ids: list[Any], queries: list[tuple[str, Any]] | None = None) -> list[Any]:
    text = isinstance(ids[0], str)
    spelled = [(sql.replace("{len_c}", "length(c.id)" if text else "c.len").replace("{len_o}", "length(o.cid)" if text
                                                                                      else "o.clen"), opts)
               for sql, opts in (queries if queries is not None else NOT_BOOLEAN)]
    # (the values only: a released column is named by the expression as written)
    return [[tuple(r.values()) for r in rows] for rows in _releases(_tables(ids, nulls=True), spelled)]


def test_parts_that_are_not_boolean_release_what_integer_keys_release() -> None:
    """The part ``length(c.id)`` (BIGINT, DOUBLE or DECIMAL around it; NULL for one customer) is a column of the
    customer's projection and the key is digested: the releases of the same numbers read from a column beside
    integer keys; each condition filters (a release differs from the unfiltered one)."""
    for sql, _ in NOT_BOOLEAN:
        assert _digested(_sql(sql.replace("{len_c}", "length(c.id)"), IDS)) >= {"c__id", "o__cid"}, sql
    text = _not_boolean(IDS)
    assert text == _not_boolean(list(range(len(IDS))))
    plain = [tuple(r.values()) for r in _releases(_tables(IDS, nulls=True), [(f"SELECT COUNT(*) {J}", {"q": 1.0})])[0]]
    assert text[0] != plain and text[3] != plain and text[4] != plain and text[5] != plain


def test_control_a_part_computed_from_another_text_changes_the_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison sees a part computed from other values than the join reads: ``length`` of the id with a
    character more."""
    from sqlglot import exp

    import dpsql.rewrite.joins as rj

    honest = rj.hoisted

    def longer(*args: Any) -> Any:
        h = honest(*args)
        parts = {a: [(n, e.transform(lambda x: exp.DPipe(this=x.copy(), expression=exp.Literal.string("?"), safe=True)
                                     if isinstance(x, exp.Column) else x)) for n, e in ps] for a, ps in h.parts.items()}
        return rj.Hoisted(h.plan, parts, h.top)

    monkeypatch.setattr(rj, "hoisted", longer)
    for queries in (NOT_BOOLEAN[:1], SUMMED[:1]):  # a condition's part, an aggregate's argument
        assert _not_boolean(IDS, queries) != _not_boolean(list(range(len(IDS))), queries)


def test_a_part_of_fixed_width_over_a_nocase_column_compares_as_before() -> None:
    """A part computed by the projection reads the key under the binary collation, as the condition after the join
    read it: a column declared COLLATE NOCASE releases what a plain column does ('Z' and 'z' two people), although
    the owner's own join merges them."""
    from test_review_join_groups import _merged_join_size, _people_session

    sql = ("SELECT COUNT(*) AS n FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey "
           "WHERE (CASE WHEN c.c_custkey = 'z' THEN 1 ELSE 30 END) > o.o_totalprice")
    merged = sql.replace("= 'z'", "IN ('z', 'Z')")  # the control: the part as NOCASE would read it
    out = []
    for column in (True, False):
        s, con = _people_session(None, column_collation=column)
        assert _merged_join_size(con) == 32 * 3 + (6 if column else 0)
        try:
            out.append([s.query(q, epsilon=4.0, delta=1e-7, options=o).table.to_pylist()
                        for q in (sql, merged) for o in ({"mechanism": "dp_s4s", "q": 1.0}, {"mechanism": "r2t"})])
            bounded = " ".join(s.explain(sql, epsilon=4.0, delta=1e-7, options={"mechanism": "r2t"}).bounded_sql.split())
            assert "AS TEXT)) AS c__c_custkey" in bounded
        finally:
            s.close()
    assert out[0] == out[1]
    assert out[0][:2] != out[0][2:]


#: value aggregates whose argument reads the key: its largest parts of fixed width over one input (``length(o.cid)``)
#: computed by that input's projection (``joins.hoisted``); ``{len_o}`` is ``length(o.cid)`` or ``o.clen``
SUMMED = [
    (f"SELECT SUM(LEAST(GREATEST({{len_o}}, 0), 10)) {J}", {"q": 1.0}),
    (f"SELECT SUM(LEAST(GREATEST({{len_o}}, 0), 10)) {J}", {"mechanism": "r2t"}),
    (f"SELECT c.seg, SUM(LEAST(GREATEST({{len_c}} - o.amt, 0), 5)) {J} GROUP BY c.seg", None),
    (f"SELECT COUNT(*), SUM(LEAST(GREATEST({{len_o}}, 0), 10)) {J}", {"q": 1.0}),
    # a part that is NULL for one customer, and AVG (a SUM and a COUNT)
    (f"SELECT SUM(LEAST(GREATEST(CASE WHEN c.id = {{a}} THEN NULL ELSE {{len_c}} END, 0), 5)) {J}", {"mechanism": "r2t"}),
    (f"SELECT AVG(LEAST(GREATEST({{len_o}}, 0), 10)) {J}", {"q": 1.0}),
]


def test_value_aggregates_over_the_key_release_what_integer_keys_release() -> None:
    """SUM's and COUNT's argument read the key through a column of the input's projection, and the key is digested:
    the releases of the same numbers read from a column beside integer keys (non-vacuous: not all alike)."""
    for sql, _ in SUMMED:
        spelled = _sql(sql.replace("{len_c}", "length(c.id)").replace("{len_o}", "length(o.cid)"), IDS)
        assert _digested(spelled) >= {"c__id", "o__cid"}, sql
    text = _not_boolean(IDS, SUMMED)
    assert text == _not_boolean(list(range(len(IDS))), SUMMED)
    assert len({repr(r) for r in text}) >= 5


#: keys compared with another input's keys (``joins.key_comparisons``): equal, unequal, (not) distinct, in a larger
#: condition; one edge in 8 has a NULL end
COMPARED = (" WHERE e1.src <> e2.dst", " WHERE e1.src IS DISTINCT FROM e2.dst",
            " WHERE (e1.src IS NOT DISTINCT FROM e2.dst OR e1.src = {a})", " WHERE NOT (e1.src = e2.dst AND e2.dst <> {a})")


def test_keys_compared_with_other_inputs_keys_compare_their_digests() -> None:
    """The comparison reads both keys' digests (the bounded SQL carries no text of them), and releases what the
    same comparison of integer keys does, NULL ends included (``<>`` and ``IS DISTINCT FROM`` release apart)."""
    a = {True: "'a'", False: "0"}
    text = _edge_releases(True, tuple(w.format(a=a[True]) for w in COMPARED), nulls=True)
    assert text == _edge_releases(False, tuple(w.format(a=a[False]) for w in COMPARED), nulls=True)
    assert text[0:2] != text[2:4]  # (each shape twice: DP-S4S, R2T)
    assert len({repr(r) for r in text}) >= 3
    e = dpsql.Session(budget=Budget(1e6, 0.9))
    e.register("node", pa.table({"id": ["a", "b"]}), privacy_unit="id")
    e.register("edge", pa.table({"src": ["a"], "dst": ["b"]}), references={"src": "node.id", "dst": "node.id"},
               degree_bounds={"src": 8, "dst": 8})
    try:
        for w in COMPARED:  # (the comparison as the whole condition, or a part of it)
            jp = analyze("SELECT COUNT(*) FROM edge e1 JOIN edge e2 ON e1.dst = e2.src" + w.format(a="'a'"), dict(e.tables)).join
            assert jp is not None
            assert key_digests(jp, ()) >= {"e1__src", "e2__dst"}, w
    finally:
        e.close()
    s = _session(_tables(IDS))
    try:
        for sql in (f"SELECT COUNT(*) {J} WHERE (c.id <> o.cid OR o.amt > 1)", f"SELECT COUNT(*) {J} JOIN visit v "
                    "ON c.id = v.cid WHERE o.cid IS DISTINCT FROM v.cid OR o.amt > 1"):
            bounded = " ".join(s.explain(sql, epsilon=1.0).bounded_sql.split())
            assert "AS TEXT)) AS o__cid" in bounded and "AS TEXT)) AS c__id" in bounded, sql
    finally:
        s.close()


def _lookup_releases(text: bool) -> list[Any]:
    """A lookup join (events -> codes, LEFT and inner) whose statement counts the private key distinct: codes spelled
    as ``IDS`` (text) or as their indexes; a third of the events reference no code, some none at all (NULL)."""
    spell = (lambda i: IDS[i]) if text else (lambda i: i)
    n = len(IDS)
    cc = [None if k % 11 == 0 else spell(k % n) for k in range(400)]
    s = dpsql.Session(budget=Budget(1e6, 0.9))
    use_noise(s, zero_noise(4))
    s.register("codes", pa.table({"code": [spell(i) for i in range(0, n, 3) if i % 2 == 0 or i < 20],
                                  "region": [f"r{i % 3}" for i in range(0, n, 3) if i % 2 == 0 or i < 20]}),
               public=True, columns={"region": {"domain": ["r0", "r1", "r2"]}})
    s.register("events", pa.table({"uid": [k % 97 for k in range(400)], "cc": cc}), privacy_unit="uid",
               references={"cc": "codes.code"})
    try:
        out = []
        for sql in ("SELECT c.region, COUNT(DISTINCT e.cc) AS n FROM events e LEFT JOIN codes c ON e.cc = c.code "
                    "GROUP BY c.region",
                    "SELECT c.region, COUNT(DISTINCT e.cc) AS n FROM events e JOIN codes c ON e.cc = c.code GROUP BY c.region",
                    "SELECT COUNT(DISTINCT e.cc) AS n FROM events e LEFT JOIN codes c ON e.cc = c.code WHERE c.region <> 'r1'"):
            out.append(sorted(map(repr, s.query(sql, epsilon=1.0, delta=1e-6).table.to_pylist())))
            if text:  # the key is carried as the text of its digest
                assert "HEX(e__cc) AS e__cc" in " ".join(s.explain(sql, epsilon=1.0, delta=1e-6).bounded_sql.split())
        return out
    finally:
        s.close()


def test_a_key_a_lookup_joins_statement_counts_is_carried_as_its_digests_text() -> None:
    """``COUNT(DISTINCT e.cc)`` of a lookup join reads the key as the text of its digest
    (``dpsql.mechanisms.lookup.counted_only``): the releases of the same keys relabelled as integers."""
    text = _lookup_releases(True)
    assert text == _lookup_releases(False)
    assert text[0] != text[1] and all(text)


def test_control_a_comparison_of_digests_under_two_salts_changes_the_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above sees digests that do not compare the texts: one side's key (``e2.dst``) digested under
    another salt than the other's, so that ``e1.src <> e2.dst`` holds for equal texts."""
    import dpsql.rewrite.joins as rj

    honest = rj.KeyDigest.of

    def of(self: Any, value: Any, sql_type: str) -> Any:
        if any(c.name == "e2__dst" for c in value.find_all(exp.Column)):
            return honest(rj.KeyDigest(self.salt + "?", self.ops), value, sql_type)
        return honest(self, value, sql_type)

    from sqlglot import exp

    where = COMPARED[:1]
    monkeypatch.setattr(rj.KeyDigest, "of", of)
    assert _edge_releases(True, where, nulls=True) != _edge_releases(False, where, nulls=True)


def _grouped_key_releases(lookup: bool, moved: bool = False) -> list[Any]:
    """``GROUP BY`` the private text key: over a LEFT lookup join (every event once in the joined relation, its key
    as it is), or over the events alone. Keys ``IDS``, the 5 000-character one held by 40 people (so released: its
    text is read back for that group), each person's rows over two keys (the group cap C_u = 1 chooses one by the
    keyed hash of (person, key)). With ``moved``, one person's rows of the long key hold another key."""
    n = len(IDS)
    uid = [u for u in range(400) for _ in range(3)]
    cc = [IDS[10] if u < 40 and j < 2 else IDS[(u + 7 * j) % n] for u in range(400) for j in range(3)]
    if moved:
        cc = [IDS[3] if (u, c) == (0, IDS[10]) else c for u, c in zip(uid, cc)]
    s = dpsql.Session(budget=Budget(1e6, 0.9))
    use_noise(s, zero_noise(6))
    s.register("codes", pa.table({"code": IDS[::3], "region": [f"r{i % 3}" for i in range(len(IDS[::3]))]}),
               public=True, columns={"region": {"domain": ["r0", "r1", "r2"]}})
    s.register("events", pa.table({"uid": uid, "cc": cc, "day": [k % 40 for k in range(len(uid))]}),
               privacy_unit="uid", references={"cc": "codes.code"})
    frm = "FROM events e LEFT JOIN codes c ON e.cc = c.code" if lookup else "FROM events e"
    try:
        out = []
        for sql in (f"SELECT e.cc AS k, COUNT(*) AS n {frm} GROUP BY e.cc",
                    f"SELECT e.cc AS k, COUNT(*) AS n, SUM(LEAST(GREATEST(e.day, 0), 40)) AS s {frm} GROUP BY e.cc"):
            out.append(sorted(map(repr, s.query(sql, epsilon=8.0, delta=1e-6).table.to_pylist())))
            if lookup:  # the joined relation read where it is read, never one relation computed and held
                bounded = s.explain(sql, epsilon=8.0, delta=1e-6).bounded_sql
                assert "\"__dpsql_lookup\" AS (" not in bounded and bounded.count("AS __dpsql_lookup") >= 2
        return out
    finally:
        s.close()


def test_a_lookup_join_grouped_by_the_private_key_releases_what_the_table_alone_releases() -> None:
    """``GROUP BY e.cc`` of a LEFT lookup join reads its joined relation at each of its reads (not one materialised
    relation holding every joined row's key: ``tests/test_adversary_round43.py``), each read the same rows (the
    lookup's kept row chosen by its content and the salt): the releases of the events alone, the long key's text
    read back for its released group."""
    joined = _grouped_key_releases(True)
    assert joined == _grouped_key_releases(False)
    assert all(any(repr(IDS[10]) in r for r in out) for out in joined)


def test_control_moving_one_persons_rows_changes_the_grouped_releases() -> None:
    assert _grouped_key_releases(True, moved=True) != _grouped_key_releases(False)
