"""Bad input that must be refused clearly, for free, naming the fix; and what held.

Finding (fixed): ``suggest_caps(group_by=...)`` accepted a column name in any case (``'Grp'``, ``'GRP'`` for a
column registered as ``Grp``; ``'UID'``) when checking it, then looked the name up as given in the lower-case
schema while building the bounded query: a raw ``KeyError`` (the CLI's ``suggest-caps --group-by Grp``: ``error:
unexpected KeyError``, exit 1), even for a column's own spelling. The name is now read as the schema's column.

Finding (fixed): an ``-o`` or ``--meta`` file name of 232 to 255 bytes (within the file system's longest name) was
refused before the charge as "cannot be written: creating a file in DIR failed (File name too long)", with a hint to
use a directory that exists: its temporary sibling ``.NAME.dpsql-PID-RANDOM`` adds up to 24 bytes to the name. The
temporary name now keeps within the longest name (the name cut, followed by a digest of the whole name), and the
output is written under its own name.

Finding (fixed, wording): a query or explain with ROLLUP, CUBE, GROUPING SETS or UNION ALL on a closed Session said
"query 1 of 2 of the GROUP BY ROLLUP (...), at its share epsilon=0.05, delta=0 of the budget asked: this Session is
closed", as if that query or its share were the problem; it now says "this Session is closed" alone, as every other
request does.

Finding (fixed): a text column of a caller's DuckDB table declared ``COLLATE NOCASE`` is neutralised by rendering the
first operand of a comparison ``COLLATE "binary"``; as any other operand (``note = name``, ``'a' = name``, ``x IN
(name, ...)``, ``'a' BETWEEN name AND ...``, ``GREATEST(note, name)``, ``NULLIF(note, name)``, ``starts_with(note,
name)``, ``CASE note WHEN name ...``) DuckDB refused to combine the two collations, and the query was refused (free)
as "does not type-check against the table's columns (BinderException)", naming neither the problem nor a fix, while
the same comparison written the other way round was answered. Every text operand read from a row is now rendered
under the binary collation, and these compare byte for byte as with the column first.

Finding (fixed, wording): a query on a Session whose caller's DuckDB connection the caller had closed was refused
(free) as "the DuckDB connection cannot run a statement now (ConnectionException)" with the hint "end the
connection's failed transaction (ROLLBACK)", which cannot help; it now says the connection is closed and how to go on.

Finding (fixed): an ordered domain whose bounds are finite but whose span is not (``bounds=(-1e308, 1e308),
bins=10``; in ``dpsql.toml`` or ``--bins t.x=-1e308:1e308:10`` alike) failed registration with a raw
``OverflowError: cannot convert float infinity to integer``; it is now refused naming the bounds and the fix.

Finding (fixed, API misuse): ``Release.meta(remaining)`` (and ``to_dict``, ``to_arrow``) given anything but a Budget
(``r.meta({"epsilon": 1, "delta": 0})``, ``r.meta(5)``) raised ``AttributeError: ... has no attribute 'to_dict'``;
it is now a ConfigError naming the argument and the fix (``r.meta(session.remaining())``). ``Budget + 1`` raised an
AttributeError from inside; it is now Python's TypeError for an unsupported operand.

What held (no change needed): neighbours (without / with one person) answered alike, with zero noise, for DAWA range
workloads and histograms over a DOUBLE column holding NaN, +-inf, NULL, -0.0, the upper bound, +-1e308 and 5e-324,
over DATE columns holding years 1 and 9999 and the extremes of date32, over timestamp[s/ms/us/ns] columns holding the
int64 extremes, and for 2-D workloads over both; strftime with every specifier on the DATE and TIMESTAMP extremes;
the hostile-expression fuzz under eight more seeds (500-800 expressions each) and the neighbour fuzz under 550 more
seeds (salted and engine draws); 130 hand-written casts, date functions, IN lists and mixed timestamp precisions;
post-processing that overflows or fails on released values (NULL, or refused free); every query option and every
registration cap at 0, -1, NaN, inf, text, numpy types and 2^70; budgets of numpy, Decimal, Fraction and text types;
binary comparison under NOCASE, NOACCENT and NFC column collations (keys, LIKE, IN digests, COUNT(DISTINCT)), also
over joins and public lookups; eight concurrent CLI processes on one ledger (never past its total); analyst text
with terminal escapes in ``budget --history`` (escaped).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run_cli

import dpsql
from dpsql.budget import Budget
from dpsql.testing import use_noise, zero_noise


def _caps_session() -> dpsql.Session:
    s = dpsql.Session(budget=Budget(10, 1e-5))
    use_noise(s, zero_noise())
    s.register("t", pa.table({"uid": list(range(100)), "Grp": ["a", "b"] * 50}), privacy_unit="uid")
    return s


@pytest.mark.parametrize("name", ["Grp", "GRP", "grp"])
def test_caps_advice_takes_a_column_name_in_any_case(name: str) -> None:
    with _caps_session() as s:
        r = s.suggest_caps("t", epsilon=1.0, group_by=name)
        assert r.details["suggested"]["max_groups_per_unit"] == 1  # each person holds one key
        params = json.loads(s.history().to_pylist()[-1]["params"])
        assert params["group_by"] == "grp"


def test_control_caps_advice_by_an_unknown_column_is_refused_free() -> None:
    with _caps_session() as s, pytest.raises(dpsql.errors.ConfigError, match="is not a column"):
        s.suggest_caps("t", epsilon=1.0, group_by="nosuch")
    with _caps_session() as s:
        assert s.remaining() == s.total()


def _longest_name(d: Path, stem: str, ext: str) -> str:
    """A file name of exactly the file system's longest name, in bytes (``stem`` repeated, whole characters)."""
    most = os.pathconf(d, "PC_NAME_MAX")
    name = ""
    while len((name + stem + ext).encode()) <= most:
        name += stem
    return name + "x" * (most - len((name + ext).encode())) + ext


@pytest.mark.parametrize("stem", ["a", "\u00e9"])  # two-byte characters: a cut never splits one in the written name
def test_outputs_with_the_longest_file_names_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str], stem: str) -> None:
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"uid": list(range(50))}), tmp_path / "d.parquet")
    assert run_cli(["--ledger", "l.duckdb", "init", "--epsilon", "10", "--delta", "1e-5"]) == 0
    out, meta = _longest_name(tmp_path, stem, ".csv"), _longest_name(tmp_path, stem, ".json")
    assert len(out.encode()) == len(meta.encode()) == os.pathconf(tmp_path, "PC_NAME_MAX")
    capsys.readouterr()
    rc = run_cli(["--ledger", "l.duckdb", "query", "SELECT COUNT(*) AS n FROM t", "--table", "t=d.parquet",
                  "--privacy-unit", "t=uid", "--epsilon", "0.5", "-o", out, "--meta", meta])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / out).read_text().startswith('"n"')
    assert json.loads((tmp_path / meta).read_text())["ledger_id"] == 1
    left = sorted(n for n in os.listdir(tmp_path) if not n.startswith(".l.duckdb."))  # the ledger's own side files
    assert left == sorted(["d.parquet", "l.duckdb", meta, out]), "a temporary file was left behind"


@pytest.mark.parametrize("sql", ["SELECT g, COUNT(*) AS n FROM t GROUP BY ROLLUP (g)",
                                 "SELECT COUNT(*) AS n FROM t UNION ALL SELECT COUNT(*) AS n FROM t",
                                 "SELECT COUNT(*) AS n FROM t"])  # the control: one query
@pytest.mark.parametrize("call", ["query", "explain"])
def test_a_closed_session_says_so_alone_for_queries_of_several_groupings(sql: str, call: str) -> None:
    s = dpsql.Session(budget=Budget(10, 1e-5))
    s.register("t", pa.table({"uid": list(range(10)), "g": ["a", "b"] * 5}), privacy_unit="uid",
               columns={"g": {"domain": ["a", "b"]}})
    s.close()
    with pytest.raises(dpsql.errors.ConfigError) as e:
        getattr(s, call)(sql, epsilon=1.0)
    assert e.value.message == "this Session is closed"


#: (condition, its count over 100 people holding note 'a', name 'A' (NOCASE), other 'B', compared byte for byte)
NOCASE_RIGHT = [("'a' = name", 0), ("note = name", 0), ("note <> name", 100), ("'Z' < name", 0), ("note > name", 100),
                ("upper(note) = name", 100), ("'a' IN (name, other)", 0), ("note IN (name, other)", 0),
                ("'a' IN ('x', 'y', 'z', 'w', 'v', name)", 0), ("NULLIF(note, name) IS NULL", 0),
                ("GREATEST(note, name) = 'a'", 100), ("LEAST(note, name) = 'A'", 100), ("COALESCE(other, name) = 'B'", 100),
                ("CASE note WHEN name THEN true ELSE false END", 0), ("starts_with(note, name)", 0),
                ("'a' BETWEEN name AND name", 0), ("note BETWEEN name AND other", 0), ("'a' IS NOT DISTINCT FROM name", 0),
                ("note IS DISTINCT FROM name", 100)]


@pytest.fixture(scope="module")
def nocase_session() -> dpsql.Session:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid BIGINT, note VARCHAR, name VARCHAR COLLATE NOCASE, other VARCHAR)")
    con.execute("INSERT INTO t SELECT i, 'a', 'A', 'B' FROM range(100) r(i)")
    con.execute("SET default_collation = 'nocase'")
    s = dpsql.Session(budget=Budget(1e6, 0.5), connection=con)
    use_noise(s, zero_noise())
    s.register("t", "t", privacy_unit="uid")
    yield s
    s.close()


@pytest.mark.parametrize(("cond", "count"), NOCASE_RIGHT)
def test_a_nocase_column_as_any_operand_compares_byte_for_byte(nocase_session: dpsql.Session, cond: str, count: int) -> None:
    r = nocase_session.query(f"SELECT COUNT(*) AS n FROM t WHERE {cond}", epsilon=5.0, delta=1e-6)
    assert r.table.column("n").to_pylist() == [count]


@pytest.mark.parametrize("key", ["GREATEST(note, name)", "NULLIF(note, name)", "COALESCE(other, name)"])
def test_a_nocase_column_as_any_operand_of_a_key_is_spelled_as_held(nocase_session: dpsql.Session, key: str) -> None:
    r = nocase_session.query(f"SELECT {key} AS k, COUNT(*) AS n FROM t GROUP BY k", epsilon=5.0, delta=1e-6)
    assert r.table.column("k").to_pylist() == [{"GREATEST(note, name)": "a", "NULLIF(note, name)": "a",
                                                "COALESCE(other, name)": "B"}[key]]


def test_a_closed_callers_connection_is_said_to_be_closed_for_free() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid FROM range(100) r(i)")
    with dpsql.Session(budget=Budget(10, 1e-5), connection=con) as s:
        s.register("t", "t", privacy_unit="uid")
        s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)  # its bind check is remembered
        con.close()
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
        assert "is closed" in e.value.message and "nothing was charged" in e.value.message
        assert "ROLLBACK" not in (e.value.hint or "")
        assert s.remaining() == Budget(9.5, 1e-5)


def test_control_an_aborted_transaction_still_says_rollback() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid FROM range(100) r(i)")
    with dpsql.Session(budget=Budget(10, 1e-5), connection=con) as s:
        s.register("t", "t", privacy_unit="uid")
        con.execute("BEGIN")
        with pytest.raises(duckdb.Error):
            con.execute("SELECT error('x')")
        with pytest.raises(dpsql.errors.ConfigError) as e:
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
        assert "ROLLBACK" in (e.value.hint or "")
        con.execute("ROLLBACK")


@pytest.mark.parametrize("spec", [{"bounds": (-1e308, 1e308), "bins": 10}, {"bounds": (-1.7e308, 1.7e308), "bins": 4},
                                  {"bounds": (-1e308, 1e308), "bin_width": 1e300}])
def test_an_ordered_domain_whose_span_overflows_is_refused_naming_it(spec: dict[str, object]) -> None:
    t = pa.table({"uid": list(range(10)), "x": [float(i) for i in range(10)]})
    with dpsql.Session(budget=Budget(10, 1e-5)) as s, pytest.raises(dpsql.errors.ConfigError) as e:
        s.register("t", t, privacy_unit="uid", columns={"x": spec})
    assert "'t.x'" in e.value.message and "narrower" in (e.value.hint or "")


def test_control_an_ordered_domain_of_a_representable_span_registers() -> None:
    t = pa.table({"uid": list(range(10)), "x": [float(i) for i in range(10)]})
    with dpsql.Session(budget=Budget(10, 1e-5)) as s:
        s.register("t", t, privacy_unit="uid", columns={"x": {"bounds": (-8e307, 8e307), "bins": 10}})


@pytest.mark.parametrize("remaining", [{"epsilon": 1, "delta": 0}, 5, "x"])
@pytest.mark.parametrize("call", ["meta", "to_dict", "to_arrow"])
def test_a_release_meta_given_no_budget_is_refused_naming_it(remaining: object, call: str) -> None:
    with dpsql.Session(budget=Budget(10, 1e-5)) as s:
        s.register("t", pa.table({"uid": list(range(10))}), privacy_unit="uid")
        r = s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        with pytest.raises(dpsql.errors.ConfigError, match="remaining must be a Budget"):
            getattr(r, call)(remaining)
        assert r.meta(s.remaining())["remaining"] == {"epsilon": 9.0, "delta": 1e-5}  # the control
        assert "remaining" not in r.meta()


def test_a_budget_plus_a_number_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="unsupported operand"):
        Budget(1, 0) + 1  # type: ignore[operator]
    assert Budget(1, 0) + Budget(2, 1e-6) == Budget(3, 1e-6)
