"""Parenthesised joins' conditions and the free refusal of a lookup join's release that has no row.

* A GROUPING SETS query over a lookup join whose WHERE keeps no row (``WHERE 1 = 0``, ``c.pop > 5 AND c.pop < 3``,
  keys released above a threshold) was charged and released no row: each of its queries read the one-table plan's
  WHERE, which a lookup join keeps in its join plan. The same query grouped once, or over one table, is refused for
  free; each grouping now reads the lookup join's WHERE too.
* A LEFT JOIN whose whole ON is in parentheses (``LEFT JOIN c ON (e.cc = c.code AND c.pop > 30)``) was refused as
  having no column equality: the parenthesised group was read as one condition. The ON is now read conjunct by
  conjunct through parentheses, as the WHERE is, and answered as the same ON without them.
* In a query with JOIN ... USING or a LEFT JOIN, an inner join's ON condition beside its column equality was refused
  saying such conditions "filter beside it" when it read two tables (``AND o.amt > p.age``) or stood in parentheses
  with the equality (``ON ((o.pid = p.id) AND p.age > 3)``): it is now refused naming the cause and the fix (move it
  into WHERE, where it is answered).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _join_oracle_fuzz as fz  # noqa: E402

from dpsql.errors import UnsupportedQueryError  # noqa: E402


@pytest.fixture(scope="module")
def env() -> Any:
    t = fz.data(3)
    s = fz.session(t)
    con = fz.reference(t)
    yield s, con
    s.close()
    con.close()


def ask(s: Any, sql: str, **kw: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return s.query(sql, epsilon=2.0, delta=1e-5, **kw)


def refused_for_free(s: Any, sql: str) -> str:
    before = s.history().num_rows
    with pytest.raises(UnsupportedQueryError) as e:
        ask(s, sql)
    assert s.history().num_rows == before
    return str(e.value)


SETS = "SELECT e.cc, e.rg, COUNT(*) AS n FROM events e JOIN countries c ON e.cc = c.code WHERE {} GROUP BY GROUPING SETS ((e.cc), (e.rg))"


@pytest.mark.parametrize("where", ["1 = 0", "c.pop > 5 AND c.pop < 3"])
def test_grouping_sets_over_a_lookup_join_that_keeps_no_row_are_refused_for_free(env: Any, where: str) -> None:
    s, _ = env
    msg = refused_for_free(s, SETS.format(where))
    assert "nothing was charged" in msg and "query 1 of 2" in msg


def test_grouping_sets_over_a_lookup_join_whose_where_holds_at_null_are_answered(env: Any) -> None:
    # (negative control: under a LEFT JOIN the lookup's column is NULL where no row matched, and NULL meets this WHERE)
    s, _ = env
    sql = SETS.format("(c.pop > 5 OR c.pop IS NULL) AND (c.pop < 3 OR c.pop IS NULL)").replace(" JOIN ", " LEFT JOIN ")
    before = s.history().num_rows
    ask(s, sql)
    assert s.history().num_rows == before + 1


def test_a_left_join_whose_whole_on_is_in_parentheses_is_answered_as_without_them(env: Any) -> None:
    s, con = env
    plain = "SELECT c.zone AS z, COUNT(*) AS n FROM events e LEFT JOIN countries c ON e.cc = c.code AND c.pop > 30 GROUP BY c.zone"
    paren = plain.replace("ON e.cc = c.code AND c.pop > 30", "ON (e.cc = c.code AND (c.pop > 30))")
    got = {r["z"]: r["n"] for r in ask(s, paren).to_pylist()}
    assert got == {r["z"]: r["n"] for r in ask(s, plain).to_pylist()}
    want = dict(con.execute(plain).fetchall())
    assert got == {z: want.get(z, 0) for z in [*fz.ZONE, None]}


USING = "SELECT o.st, COUNT(*) AS n FROM orders o JOIN lines l USING (oid) JOIN persons p ON {}"


@pytest.mark.parametrize(("on", "cond"), [("o.pid = p.id AND o.amt > p.age", "o.amt > p.age"),
                                          ("((o.pid = p.id) AND p.age > 3)", "p.age > 3")])
def test_an_inner_on_filter_beside_using_is_refused_naming_the_fix(env: Any, on: str, cond: str) -> None:
    s, _ = env
    msg = refused_for_free(s, USING.format(on) + " GROUP BY o.st")
    assert "move this condition into WHERE" in msg and cond in msg and "filter beside it" not in msg
    ask(s, USING.format("o.pid = p.id") + f" WHERE {cond} GROUP BY o.st")  # (where it is answered)


def test_the_no_row_refusal_shows_an_or_among_the_conditions_in_its_parentheses(env: Any) -> None:
    # (it showed `c.pop > 5 OR c.pop IS NULL AND c.pop < 3`, a condition that c.pop = 6 meets)
    s, _ = env
    sql = ("SELECT e.cc, COUNT(*) FROM events e LEFT JOIN countries c ON e.cc = c.code "
           "WHERE (c.pop > 5 OR c.pop IS NULL) AND c.pop < 3 GROUP BY e.cc")
    msg = refused_for_free(s, sql)
    assert "WHERE (c.pop > 5 OR c.pop IS NULL) AND c.pop < 3 holds for no value of column 'c.pop'" in msg
    one = refused_for_free(s, "SELECT cc, COUNT(*) FROM events WHERE (v > 5 OR v IS NULL) AND v < 3 AND v < 4 GROUP BY cc")
    assert "WHERE (v > 5 OR v IS NULL) AND v < 3 AND v < 4 holds for no value" in one


def test_a_csv_file_read_empty_that_has_bytes_by_the_check_is_an_input_being_written(tmp_path: Path, monkeypatch: Any) -> None:
    # (a job wrote its first bytes between the header's read, which found none, and the size check: it was refused as
    # an empty CSV file, exit 2, where the same file a moment earlier was an input not there yet, exit 66)
    import gzip
    import io

    import dpsql.engine._duckdb_sources as src
    from dpsql.errors import ConfigError, InputUnavailableError

    written = tmp_path / "part-1.csv"
    written.write_text("id,v\n1,2\n")
    monkeypatch.setattr(src, "open", lambda *a, **k: io.BytesIO(b""), raising=False)  # read before its first bytes
    with pytest.raises(InputUnavailableError):
        src._csv_header(str(written), ",")
    monkeypatch.undo()
    # negative controls: a file holding a byte-order mark only, or a gzip stream of no text, stays empty (exit 2)
    bom, none = tmp_path / "bom.csv", tmp_path / "none.csv.gz"
    bom.write_bytes(b"\xef\xbb\xbf")
    none.write_bytes(gzip.compress(b""))
    for p in (bom, none):
        with pytest.raises(ConfigError) as e:
            src._csv_header(str(p), ",")
        assert not isinstance(e.value, InputUnavailableError)
