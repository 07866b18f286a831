"""Select-join-aggregate queries and the command line: refusals that must be free, clear and total.

Join plans name each input's column ``<alias>__<column>`` in the flattened join relation and read the
alias back by splitting at the first ``__`` (``dpsql.plan.joins.flat``). An alias ending in ``_`` made
that split ambiguous: ``o_.cid`` became ``o___cid``, read back as the column ``_cid`` of an input ``o``.
A valid join written with such an alias was refused as a cross join, and with a GROUP BY or a SUM it
raised ``KeyError`` or ``StopIteration`` out of ``explain`` and ``query`` (the CLI: "unexpected
StopIteration", exit 1, the code of a failure after a charge, for a query that charged nothing). Such an
alias is now refused by name with the fix, before anything is charged.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli

import dpsql
from dpsql.budget import Budget
from dpsql.errors import ConfigError, UnsupportedQueryError
from dpsql.testing import use_noise, zero_noise


def _session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    n = 60
    s.register("customer", pa.table({"id": np.arange(n), "seg": [f"s{i % 3}" for i in range(n)]}), privacy_unit="id",
               columns={"seg": {"domain": ["s0", "s1", "s2"]}})
    s.register("orders", pa.table({"oid": np.arange(2 * n), "cid": np.arange(2 * n) % n, "amt": np.ones(2 * n)}),
               references={"cid": "customer.id"}, degree_bounds={"cid": 2}, columns={"amt": {"bounds": (0, 1)}})
    return s


QUERIES = [
    "SELECT COUNT(*) FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid",
    "SELECT {c}.seg, COUNT(*) AS n FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid GROUP BY {c}.seg",
    "SELECT SUM({o}.amt) FROM customer {c} JOIN orders {o} ON {c}.id = {o}.cid",
    "SELECT COUNT(*) FROM orders {o} JOIN customer {c} ON {c}.id = {o}.cid WHERE {o}.amt > 0",
]


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize(("c", "o"), [("c_", "o"), ("c", "o_"), ("c__", "o")])
def test_an_alias_ending_in_underscore_is_refused_by_name_for_free(sql: str, c: str, o: str) -> None:
    s = _session()
    q = sql.format(c=c, o=o)
    bad = c if c.endswith("_") else o
    for call in (s.explain, s.query):
        with pytest.raises(UnsupportedQueryError, match=rf"alias '{bad}'") as e:
            call(q, epsilon=1.0, delta=1e-6)
        assert "cross join" not in str(e.value)
    assert s.history().num_rows == 0 and s.remaining() == Budget(100.0, 0.5)
    s.close()


@pytest.mark.parametrize("sql", QUERIES)
def test_the_same_joins_with_plain_aliases_are_answered(sql: str) -> None:
    """Negative control: the aliases without the trailing underscore."""
    s = _session()
    s.query(sql.format(c="c_x", o="o1"), epsilon=1.0, delta=1e-6)
    assert s.history().num_rows == 1
    s.close()


def test_the_command_line_refuses_such_an_alias_as_a_query_error(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"uid": np.arange(40)}), tmp_path / "ev.parquet")
    pq.write_table(pa.table({"oid": np.arange(80), "ouid": np.arange(80) % 40, "y": np.ones(80)}), tmp_path / "ord.parquet")
    base = ["--ledger", str(tmp_path / "l.duckdb")]
    assert run_cli([*base, "init", "--epsilon", "10"]) == 0
    tables = ["--table", f"ev={tmp_path / 'ev.parquet'}", "--privacy-unit", "ev=uid", "--table", f"ord={tmp_path / 'ord.parquet'}",
              "--reference", "ord.ouid=ev.uid", "--degree-bound", "ord.ouid=4", "--bounds", "ord.y=0:1"]
    for sub in ("explain", "query"):
        capsys.readouterr()
        code = run_cli([*base, *tables, sub, "SELECT SUM(o_.y) FROM ev e JOIN ord o_ ON e.uid = o_.ouid",
                        "--epsilon", "1", "--delta", "1e-6"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "alias 'o_'" in err and "StopIteration" not in err
    assert run_cli([*base, "budget"]) == 0
    assert "epsilon=10 " in capsys.readouterr().out.replace("\n", " ") + " "


# -- a Parquet file replaced under a registered table ---------------------------------------------------
#
# The Arrow view reads a Parquet source through a pyarrow dataset made at registration, which keeps each
# file's footer (its row groups, page offsets and sizes). An ETL job that replaces the file (a new day's
# export under the same name) left every later query of a long-lived Session (a service; a CLI command whose
# file is replaced between registration and its read) reading the new bytes with the old footer: the query
# failed after its charge, or released values read from misplaced pages, and whether it failed depended on
# the new file's bytes (the same rows again were read fine, one more person's row failed the query).


def _table(n: int, x_type: pa.DataType = pa.int32(), big: bool = False) -> pa.Table:
    import datetime as dt

    xs = np.arange(n) % 5
    x = pa.array(xs.astype(np.int64) + (np.where(np.arange(n) == 0, 2**40, 0) if big else 0)).cast(x_type)
    # a TIMESTAMP column keeps the source on the Arrow view (DuckDB's own reader reads flat
    # integers, floats and text only)
    return pa.table({"uid": np.arange(n), "x": x, "ts": pa.array([dt.datetime(2024, 1, 1)] * n, pa.timestamp("us"))})


def _replace(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(path.name + ".new")
    pq.write_table(table, tmp)
    tmp.replace(path)


def _parquet_session(path: Path) -> dpsql.Session:
    pq.write_table(_table(100), path)
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid", columns={"x": {"bounds": (0, 10)}})
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 100}]
    return s


@pytest.mark.parametrize("rows", [101, 5000, 99])
def test_a_replaced_parquet_file_with_the_same_schema_is_read_as_it_now_is(tmp_path: Path, rows: int) -> None:
    s = _parquet_session(tmp_path / "t.parquet")
    _replace(tmp_path / "t.parquet", _table(rows))
    out = s.query("SELECT COUNT(*) AS n, SUM(x) AS sx FROM t", epsilon=1.0).table.to_pylist()
    assert out == [{"n": rows, "sx": float(sum(i % 5 for i in range(rows)))}]
    s.close()


@pytest.mark.parametrize("x_type", [pa.int64(), pa.string(), pa.float64()])
@pytest.mark.parametrize("big", [False, True])
def test_a_replaced_parquet_file_with_another_schema_is_refused_before_the_charge(tmp_path: Path, x_type: pa.DataType,
                                                                                 big: bool) -> None:
    """Whatever the rows (one person's 2^40 in a column now BIGINT), the refusal is the same, and free."""
    s = _parquet_session(tmp_path / "t.parquet")
    _replace(tmp_path / "t.parquet", _table(100, x_type, big))
    left = s.remaining()
    for sql in ("SELECT COUNT(*) FROM t", "SELECT SUM(x) FROM t"):
        with pytest.raises(ConfigError, match=r"(?s)table 't'.*changed.*nothing was charged.*register"):
            s.query(sql, epsilon=1.0)
    assert s.remaining() == left and s.history().num_rows == 1
    # registered again, the new schema is read
    s.register("t", str(tmp_path / "t.parquet"), privacy_unit="uid")
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 100}]
    s.close()


def test_an_unchanged_parquet_file_is_read_without_a_new_dataset(tmp_path: Path) -> None:
    """Negative control: the same version is read as before."""
    s = _parquet_session(tmp_path / "t.parquet")
    for _ in range(2):
        assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 100}]
    s.close()


@pytest.mark.parametrize("big", [False, True])
def test_duckdbs_own_reader_refuses_a_widened_column_whatever_the_rows(tmp_path: Path, big: bool) -> None:
    """``invalid_text = "replace"`` reads the files afresh at each query, typed by their footers: an INTEGER
    column now BIGINT made ``x * x`` (rendered total for INTEGER) overflow after the charge exactly where one
    person's value was 2^40."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"uid": np.arange(100), "x": pa.array(np.arange(100) % 5, pa.int32())}), path)
    s = dpsql.Session(budget=Budget(100.0, 0.5), engine={"invalid_text": "replace"})
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid")
    sql = "SELECT COUNT(*) AS n FROM t WHERE x * x > 5"
    assert s.query(sql, epsilon=0.1).table.to_pylist() == [{"n": 40}]
    xs = (np.arange(100) % 5).astype(np.int64)
    _replace(path, pa.table({"uid": np.arange(100), "x": pa.array(np.where(np.arange(100) == 0, 2**40, xs) if big else xs)}))
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*changed.*nothing was charged"):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == left
    # negative control: the same schema again is read as it now is
    _replace(path, pa.table({"uid": np.arange(50), "x": pa.array(np.arange(50) % 5, pa.int32())}))
    assert s.query(sql, epsilon=0.1).table.to_pylist() == [{"n": 20}]
    s.close()


@pytest.mark.parametrize("header", ["uid,y", "uid", "x,uid"])
def test_a_csv_file_whose_header_changed_is_refused_before_the_charge(tmp_path: Path, header: str) -> None:
    """The view selects the registered columns by name: a column renamed or gone failed every query after
    its charge (the header is public metadata, read without a row)."""
    path = tmp_path / "t.csv"
    path.write_text("uid,x\n" + "".join(f"{i},{i % 5}\n" for i in range(100)))
    s = dpsql.Session(budget=Budget(100.0, 0.5))
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid", columns={"x": {"type": "INTEGER", "bounds": (0, 10)}})
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 100}]
    cols = header.split(",")
    new = tmp_path / "t.csv.new"
    new.write_text(header + "\n" + "".join(",".join(str(i if c == "uid" else i % 5) for c in cols) + "\n" for i in range(100)))
    new.replace(path)
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*header changed.*nothing was charged"):
        s.query("SELECT SUM(x) FROM t", epsilon=1.0)
    assert s.remaining() == left
    # negative control: the registered header again, with other rows, is read as it now is
    path.write_text("uid,x\n" + "".join(f"{i},{i % 5}\n" for i in range(50)))
    assert s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.1).table.to_pylist() == [{"n": 50}]
    s.close()
