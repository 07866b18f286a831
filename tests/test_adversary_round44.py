"""Neighbouring datasets (without and with one person's rows), one query, one observable outcome: text group keys.

The text group keys are carried compact from the rows to the released groups (``bound.compact_key``: a key shorter
than 32 bytes as itself, a longer one as the 32 hex characters of ``md5`` of the per-query secret salt and its
text) through the row caps' windows, the pairs' grouping, the group cap over rows (a hash aggregate per (person,
keyed hash) keeping the smallest and largest compact key, ``bound._groups_by_hash``) and the final grouping; only
the released groups get their texts back, from a second read of the rows holding a long key, joined onto them
(``bound.with_key_texts``). That closes one person's *repeated* long text (``tests/test_adversary_dictionary_text.py``)
and one person's many *distinct* long texts (case 1 below). What held when checked against the tree before the
change and on neighbouring data: zero-noise releases (NULL, '', case, trailing space, NFC/NFD, NUL byte, colliding
and aligned keys; two keys; HAVING, ORDER BY, LIMIT, ROLLUP, GROUPING SETS, COUNT(DISTINCT), SUM, AVG) are the same
where no cap binds; under a shared salt, removing a person whose keys share DuckDB's hash (or an ordinary person)
moves each group by at most k, at most C_u groups and at most L rows
(``test_removing_a_person_moves_the_groups_within_the_caps``); a NOCASE column, a NOCASE/NFC connection collation
release the same rows as a plain column; DuckDB (portable hash) and Spark bound the same rows for text keys with NUL
bytes, emoji, NFD and 500-character keys.

1. Closed: one person's many *distinct* long texts. A Parquet file whose pages are compressed (zstd) holds one
person's 40 000 distinct 4 000-character notes (``"q" * 3990`` and a counter) in 480 kB; decoded they are 160 MB.
Every vector the reader decodes holds 2048 of them (8 MB), so reading them streams (a LIKE over the note answers on
both neighbours), but ``SELECT note, COUNT(*) FROM t GROUP BY note`` kept every distinct text of that person in a
hash table before the group cap: the pairs' ``DISTINCT`` or grouping (k >= 2 with counts), the aggregate per
(person, keyed hash) of ``_groups_by_hash`` (k = 1, C_u >= 2: each hash's smallest and largest text), and the
aggregate that attached each key's text to the pairs (under L or a value aggregate's k: one text per distinct
digest over all rows, before any cap). Under ``memory_limit = 100MB`` and ``max_temp_directory_size = 100MB`` the
query failed after its charge only with that person (C_u = 2 with k = 1 and k = 3; L = 10 under the default caps
failed in some runs, near the limit, and in three of three runs on a loaded machine). With the compact keys every structure before the
group cap holds at most 32 bytes per key, and the texts reach only the released groups (at most C_u of that
person's): all of these answer on both neighbours
(``test_one_persons_many_distinct_texts_as_a_group_key_answer_on_both_neighbours``). A key of 32 bytes or more is
ordered by the group cap as the keyed hash of its digest instead of its text (as uniform, and it depends only on
that person's rows and the salt); so keys crafted to share DuckDB's string hash collide there only below 32 bytes
(the aligned keys of ``_people`` are 32 bytes: they are now ordinary groups, and every one of them is held by other
people too, so that removing their person still moves the release).

2. Closed by construction: a vector of one person's longest texts. With plain (not dictionary) pages, DuckDB's
Parquet reader decodes 2048 rows per vector: 2048 texts of 60 000 characters (under the default ``max_text_bytes``
of 65 536) are 123 MB, more than a 100 MB ``memory_limit`` however the pages are cut (47 kB of zstd file for 6 000
such rows). Every read of the note, ``WHERE note LIKE '%x%'`` included, failed after its charge only with that
person; ``SELECT COUNT(*)`` answered. The engine settings now refuse (free, at the session's creation) a
``memory_limit`` below ``TEXT_VECTORS_PER_THREAD`` vectors of ``max_text_bytes`` texts per thread
(``dpsql.engine.base.text_read_memory``), and lower the default ``threads`` to what the limit holds: under
100 MB and one thread the cap is at most 8 138 bytes, and one person's texts at that cap (as many bytes decoded)
are read on both neighbours (``test_a_vector_of_one_persons_longest_texts_is_refused_at_configuration_or_read``).

What is still open: a text *over* the cap is NULL, but the reader decodes it before the cap is tested (the
residual risk "Decoded size of stored values" of docs/threat_model.md), so one person's 6 000 texts of 60 000
characters still fail a read of the note under 100 MB with the cap at 8 138 bytes (a strict xfail below).

A query reading several text columns at once needs vectors of each: one person's 8 192 rows with four text
columns at the cap failed ``WHERE n0 LIKE '%x%' OR ... n3 LIKE '%x%'`` under 100 MB (two columns answered, within
the bound's margin). The bound now counts the text columns of one source a query reads: the read's threads are
lowered for them, and a query one thread cannot hold is refused before its charge (below, with a control).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.engine import _duckdb_native as native
from dpsql.engine.base import EngineSettings, text_read_memory
from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.testing import use_noise, zero_noise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hash_collisions import aligned_strings, colliding_strings  # noqa: E402

LIMITS = {"memory_limit": "100MB", "max_temp_directory_size": "100MB", "threads": 1}
#: the longest texts a 100 MB limit reads at one thread (a longer cap is refused under it): 8 138 bytes
CAP = 100 * 10**6 // text_read_memory(1, 1)
CAPPED = {**LIMITS, "max_text_bytes": CAP}
ROWS, PEOPLE, PERSON = 20_000, 2_000, 999_999


def _write(path: Path, notes: list[str]) -> None:
    uid = [i % PEOPLE for i in range(ROWS)] + [PERSON] * len(notes)
    text = [f"s{i % 7}" for i in range(ROWS)] + notes
    pq.write_table(pa.table({"uid": pa.array(uid, pa.int64()), "note": pa.array(text)}), path,
                   compression="zstd", use_dictionary=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("round44")
    out = {name: d / f"{name}.parquet" for name in ("without", "distinct", "longest", "at_cap")}
    _write(out["without"], [])
    _write(out["distinct"], ["q" * 3990 + f"{i:010d}" for i in range(40_000)])
    _write(out["longest"], ["q" * 60_000] * 6_000)
    _write(out["at_cap"], ["q" * CAP] * (360_000_000 // CAP))  # the same 360 MB decoded, in texts at the cap
    assert out["distinct"].stat().st_size < 1_000_000 and out["longest"].stat().st_size < 100_000  # small files
    assert out["at_cap"].stat().st_size < 1_000_000
    return out


def _outcome(path: Path, sql: str, caps: dict[str, int], engine: dict[str, Any] = CAPPED) -> str:
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=engine)
    patch = pytest.MonkeyPatch()
    patch.setattr(native, "SETTLE_SECONDS", 0.0)  # read by DuckDB's own reader, as an owner's settled file
    try:
        s.register("t", str(path), privacy_unit="uid", **caps)
        try:
            s.query(sql, epsilon=1.0, delta=1e-6)
            return "answered"
        except dpsql.errors.DPSQLError as e:
            return f"{type(e).__name__}"
    finally:
        s.close()
        patch.undo()


GROUP_BY = "SELECT note, COUNT(*) AS c FROM t GROUP BY note"


@pytest.mark.parametrize(("sql", "caps"), [
    (GROUP_BY, {"max_groups_per_unit": 1, "max_rows_per_group": 1}),
    ("SELECT COUNT(DISTINCT note) AS c FROM t", {"max_groups_per_unit": 2, "max_rows_per_group": 3}),
    ("SELECT COUNT(*) AS c FROM t WHERE note LIKE '%x%'", {"max_rows_per_unit": 10}),
])
def test_one_persons_many_distinct_texts_answer_where_no_text_is_held_per_group(files: dict[str, Path], sql: str,
                                                                                caps: dict[str, int]) -> None:
    """The controls of the case below (which answered before the compact keys too): C_u = 1 ranks the hashes over
    integers first, COUNT(DISTINCT) carries digests, a LIKE streams."""
    assert _outcome(files["without"], sql, caps) == _outcome(files["distinct"], sql, caps) == "answered"


@pytest.mark.parametrize("caps", [{"max_groups_per_unit": 2, "max_rows_per_group": 1},
                                  {"max_groups_per_unit": 2, "max_rows_per_group": 3},
                                  {"max_rows_per_unit": 10}], ids=["cu2_k1", "cu2_k3", "l10"])
def test_one_persons_many_distinct_texts_as_a_group_key_answer_on_both_neighbours(files: dict[str, Path],
                                                                                  caps: dict[str, int]) -> None:
    """Case 1: each failed after its charge with the person (L = 10 in some runs) while every distinct text of
    that person was held before the group cap; the compact keys hold at most 32 bytes per key there, and only the
    released groups get their texts (``bound.compact_key``, ``bound.with_key_texts``)."""
    assert _outcome(files["without"], GROUP_BY, caps) == "answered"
    assert _outcome(files["distinct"], GROUP_BY, caps) == "answered"


LIKE = "SELECT COUNT(*) AS c FROM t WHERE note LIKE '%x%'"


def test_a_vector_of_one_persons_longest_texts_is_refused_at_configuration_or_read(files: dict[str, Path],
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Case 2: under 100 MB at one thread the default cap (65 536 bytes) is refused when the session is created,
    free, naming the three settings and the fix; under the cap the refusal names, one person's 360 MB of texts at
    that cap are read on both neighbours."""
    with pytest.raises(dpsql.errors.ConfigError) as e:
        dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine=LIMITS)
    text = f"{e.value.message} {e.value.hint}"
    assert all(w in text for w in ("memory_limit = '100MB'", "threads = 1", "max_text_bytes = 65536",
                                   "nothing was charged", "raise memory_limit", f"at most {CAP}"))
    caps = {"max_rows_per_unit": 10}
    assert _outcome(files["without"], LIKE, caps) == _outcome(files["at_cap"], LIKE, caps) == "answered"
    # the negative control: the refused settings let through fail after the charge only with that person
    monkeypatch.setattr(EngineSettings, "read_threads", lambda self, *a: 1)
    assert _outcome(files["without"], LIKE, caps, LIMITS) == "answered"
    assert _outcome(files["longest"], LIKE, caps, LIMITS) == "ExecutionError"


@pytest.mark.xfail(strict=True, reason="a text over max_text_bytes is NULL, but DuckDB's reader decodes it first: "
                                       "2048 of 60 000 characters are a 123 MB vector over a 100 MB limit; open")
def test_a_vector_of_one_persons_texts_over_the_cap_is_read_on_both_neighbours(files: dict[str, Path]) -> None:
    caps = {"max_rows_per_unit": 10}
    assert _outcome(files["without"], LIKE, caps) == "answered"
    assert _outcome(files["longest"], LIKE, caps) == "answered"


def _four_columns(tmp_path: Path, length: int) -> dict[str, Path]:
    out = {}
    for name, rows in (("without", 0), ("with", 8192)):
        out[name] = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"uid": pa.array([i % PEOPLE for i in range(ROWS)] + [PERSON] * rows, pa.int64()),
                                 **{f"n{j}": pa.array([f"s{i % 7}" for i in range(ROWS)] + ["q" * length] * rows)
                                    for j in range(4)}}),
                       out[name], compression="zstd", use_dictionary=False)
    return out


FOUR = "SELECT COUNT(*) AS c FROM t WHERE " + " OR ".join(f"n{j} LIKE '%x%'" for j in range(4))


def test_vectors_of_one_persons_longest_texts_in_four_columns_are_read_on_both_neighbours(tmp_path: Path) -> None:
    """The bound counts the text columns a query reads at once: under 100 MB at one thread four columns hold texts
    of a quarter of the one-column cap, and one person's 8 192 rows of such texts in each are read on both
    neighbours; at the one-column cap the query is refused before its charge on both (free)."""
    files = _four_columns(tmp_path, CAP // 4)
    quarter = {**LIMITS, "max_text_bytes": CAP // 4}
    assert _outcome(files["without"], FOUR, {"max_rows_per_unit": 10}, quarter) == "answered"
    assert _outcome(files["with"], FOUR, {"max_rows_per_unit": 10}, quarter) == "answered"
    assert _outcome(files["without"], FOUR, {"max_rows_per_unit": 10}) == "ConfigError"
    assert _outcome(files["with"], FOUR, {"max_rows_per_unit": 10}) == "ConfigError"


def test_control_four_columns_at_the_one_column_cap_fail_only_with_the_person(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: without the per-query bound (the check and the lowered threads off), four columns of
    texts at the one-column cap fail the read after the charge only with that person (the leak the bound closes)."""
    from dpsql.engine.duckdb import DuckDBBackend
    monkeypatch.setattr(DuckDBBackend, "check_text_columns", lambda self, ast: None)
    monkeypatch.setattr(DuckDBBackend, "_threads_for", lambda self, columns: self._threads)
    files = _four_columns(tmp_path, CAP)
    assert _outcome(files["without"], FOUR, {"max_rows_per_unit": 10}) == "answered"
    assert _outcome(files["with"], FOUR, {"max_rows_per_unit": 10}) == "ExecutionError"


def test_a_vector_of_one_persons_longest_texts_leaves_other_columns_readable(files: dict[str, Path]) -> None:
    """The control: a query that does not read the note answers with that person."""
    assert _outcome(files["longest"], "SELECT COUNT(*) AS c FROM t", {"max_rows_per_unit": 10}) == "answered"


# --- what held: neighbouring data under one salt -------------------------------------------------------------------

def _people(path: Path, without: int | None) -> None:
    """150 people with ordinary text keys (case, trailing space, NFC/NFD, NUL byte, '' and NULL among them, and
    some crafted keys), and one person (10**6) holding 30 keys of one DuckDB hash, 20 keys aligned to few hashes
    (32 bytes each: compact keys as their digests, so no longer colliding) and ordinary keys; ``without``: that
    person left out."""
    import random
    rng = random.Random(2)
    crafted = colliding_strings(30) + aligned_strings(20, blocks=4)
    pool: list[str | None] = ["a", "A", "a ", "", None, "\u00e9", "e\u0301", "b\x00c", "zz", *crafted[:6], *crafted[30:]]
    rows: list[tuple[int, str | None, str | None]] = [(rng.randrange(150), rng.choice(pool), rng.choice(["p", "q", None]))
                                                      for _ in range(3000)]
    rows += [(10**6, c, rng.choice(["p", "q", None])) for c in [*crafted, "a", "", None, "zz"] for _ in range(3)]
    rows = [r for r in rows if r[0] != without]
    pq.write_table(pa.table({"uid": pa.array([r[0] for r in rows], pa.int64()), "note": pa.array([r[1] for r in rows], pa.string()),
                             "n2": pa.array([r[2] for r in rows], pa.string())}), path)


def _released(path: Path, sql: str, caps: dict[str, int]) -> dict[Any, int]:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5))
    use_noise(s, zero_noise(5))  # one salt on both neighbours: the same choices for every person both hold
    try:
        s.register("t", str(path), privacy_unit="uid", **caps)
        rows = s.query(sql, epsilon=8.0, delta=1e-3).to_pylist()
        return {tuple(v for k, v in r.items() if k != "c"): r["c"] for r in rows}
    finally:
        s.close()


@pytest.mark.parametrize("caps", [{"max_groups_per_unit": 1, "max_rows_per_group": 1},
                                  {"max_groups_per_unit": 3, "max_rows_per_group": 1},
                                  {"max_groups_per_unit": 2, "max_rows_per_group": 3},
                                  {"max_rows_per_unit": 4},
                                  {"max_groups_per_unit": 2, "max_rows_per_group": 2, "max_rows_per_unit": 3}])
@pytest.mark.parametrize("sql", ["SELECT note, COUNT(*) AS c FROM t GROUP BY note",
                                 "SELECT note, n2, COUNT(*) AS c FROM t GROUP BY note, n2"])
@pytest.mark.parametrize("removed", [10**6, 7])
def test_removing_a_person_moves_the_groups_within_the_caps(tmp_path: Path, caps: dict[str, int], sql: str,
                                                            removed: int) -> None:
    """The person holding keys of one DuckDB hash (or an ordinary person) removed: every group released on both
    sides moves by at most k, at most C_u groups move, by at most L rows in all, and never up."""
    _people(tmp_path / "d.parquet", None)
    _people(tmp_path / "m.parquet", removed)
    a, b = _released(tmp_path / "d.parquet", sql, caps), _released(tmp_path / "m.parquet", sql, caps)
    k, cu, lim = (caps.get("max_rows_per_group", 10**9), caps.get("max_groups_per_unit", 10**9),
                  caps.get("max_rows_per_unit", 10**9))
    moved = {g: a[g] - b[g] for g in set(a) & set(b) if a[g] != b[g]}
    assert len(set(a) & set(b)) >= 10  # the control: most groups are released on both sides
    # the control: removing the person changes the release (with two keys their groups may be too small to release)
    assert moved or a != b or "n2" in sql
    assert all(0 < d <= k for d in moved.values()), moved
    assert len(moved) <= cu and sum(moved.values()) <= min(lim, cu * k), moved


class _UnsharedOps(SaltedDuckDBOps):
    """The plan of a backend that does not materialise a relation read twice (Spark's): the released groups
    joined onto the rows of long keys, then grouped (``bound.with_key_texts``)."""

    materialize_shared = False


@pytest.mark.parametrize("ops", [DuckDBOps(), SaltedDuckDBOps(), PortableDuckDBOps(), _UnsharedOps()], ids=type)
def test_released_long_keys_are_spelled_as_their_texts(ops: Any) -> None:
    """Keys of 31, 32 and 3 000 bytes, NULL beside a long key, a long key beside a short one, 300 people each
    holding every group (so no cap binds): the released keys and counts are the unbounded query's, whichever form
    attaches the texts. The negative control: without the texts attached, the long keys are released as digests."""
    import duckdb
    from test_bounding import keyed, plan_for, spec_for

    from dpsql.rewrite import bound
    from dpsql.rewrite.render import render

    a, b = "a" * 31, "b" * 32
    pairs: list[tuple[str | None, str | None]] = [(a, "x"), (b, "x"), ("c" * 3000, None), (None, b), (b, b),
                                                  ("\u00e9" * 16, "y"), ("short", None)]
    rows = [(u, k1, k2) for u in range(300) for k1, k2 in pairs]
    data = pa.table({"uid": pa.array([r[0] for r in rows], pa.int64()), "k1": pa.array([r[1] for r in rows], pa.string()),
                     "k2": pa.array([r[2] for r in rows], pa.string())})
    plan = plan_for("SELECT k1, k2, COUNT(*) AS c FROM t GROUP BY k1, k2", spec_for("t", data, unit="uid"))
    want = {(k1, k2): 300 for k1, k2 in pairs}

    def run(q: Any) -> dict[Any, Any]:
        con = duckdb.connect()
        try:
            con.register(bound.source_name("t"), data)
            out = keyed(plan, con.sql(render(q)).to_arrow_table())
            return {k: r["__users"] for k, r in out.items()}
        finally:
            con.close()

    caps = bound.Caps(len(pairs), 1)
    assert run(bound.bounded_query(plan, caps, salt="s", unit_column="uid", ops=ops)) == want
    with pytest.MonkeyPatch.context() as m:
        m.setattr(bound, "with_key_texts", lambda final, *a, **k: final)
        digests = run(bound.bounded_query(plan, caps, salt="s", unit_column="uid", ops=ops))
    assert digests != want and sum(digests.values()) == sum(want.values())
