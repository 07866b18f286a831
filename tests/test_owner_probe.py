"""The data owner's registration and configuration: mistakes are clear ConfigErrors at registration,
naming the problem and the fix, before any ledger or charge (each case read from public metadata only)."""

from __future__ import annotations

import os
import warnings

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import dpsql
from dpsql.config import load_config
from dpsql.errors import ConfigError

T = pa.table({"uid": [1, 2, 3], "v": [1.0, 2.0, 3.0], "g": ["a", "b", "a"]})


def _session(**kw):
    return dpsql.Session(None, dpsql.Budget(1, 1e-6), **kw)


@pytest.mark.parametrize("bounds", ["05", "19", b"05"])
def test_bounds_given_as_one_text_are_refused_not_read_digit_by_digit(bounds):
    # "05" was read as the pair (0, 5): each character one bound
    with _session() as s, pytest.raises(ConfigError, match="pair") as e:
        s.register("t", T, privacy_unit="uid", columns={"v": {"bounds": bounds}})
    assert "t" not in s.tables and "bounds" in str(e.value)


@pytest.mark.parametrize("bounds", [{"lo": 0, "hi": 1}, {0: 0, 1: 1}, 5, None.__class__])
def test_bounds_of_another_shape_are_a_config_error(bounds):
    # a mapping raised a bare KeyError (the CLI: "unexpected KeyError")
    with _session() as s, pytest.raises(ConfigError, match=r"pair \(lo, hi\)"):
        s.register("t", T, privacy_unit="uid", columns={"v": {"bounds": bounds}})


def test_bounds_table_in_the_config_is_a_config_error(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1\ncreate_if_missing = true\n'
                   '[tables.e]\nsource = "e.parquet"\nprivacy_unit = "uid"\n[tables.e.columns.v]\nbounds = {lo = 0, hi = 1}\n')
    pq.write_table(T, tmp_path / "e.parquet")
    with pytest.raises(ConfigError, match=r"pair \(lo, hi\)"):
        dpsql.Session.from_config(cfg)
    assert not (tmp_path / "l.duckdb").exists()


def test_domain_with_a_list_value_is_a_config_error():
    with _session() as s, pytest.raises(ConfigError, match="domain"):
        s.register("t", T, privacy_unit="uid", columns={"g": {"domain": [["a"], "b"]}})


def test_domain_duplicates_are_named():
    with _session() as s, pytest.raises(ConfigError, match=r"duplicate values.*'k7'"):
        s.register("t", T, privacy_unit="uid", columns={"g": {"domain": [f"k{i}" for i in range(1000)] + ["k7"]}})
    with _session() as s, pytest.raises(ConfigError, match=r"duplicate.*1.*True"):  # equal in Python: one key
        s.register("t", T, privacy_unit="uid", columns={"uid": {"domain": [1, 2, True]}})
    with _session() as s, pytest.raises(ConfigError, match=r"duplicate values: 2\n"):
        s.register("t", T, privacy_unit="uid", columns={"uid": {"domain": [1, 2, 2]}})


@pytest.mark.parametrize(("body", "wrong", "meant"), [
    ('[ledger]\npath = "l.duckdb"\nepsilon = 1\ncreate_if_mising = true\n', "create_if_mising", "create_if_missing"),
    ('[ledgr]\npath = "l.duckdb"\n', "ledgr", "ledger"),
    ('[ledger]\npath = "l.duckdb"\n[engine]\nmemory_limt = "1GB"\n', "memory_limt", "memory_limit"),
    ('[ledger]\npath = "l.duckdb"\nepsilon = 1\n[tables.e]\nsource = "e.parquet"\nprivacy_unti = "uid"\n', "privacy_unti",
     "privacy_unit"),
])
def test_unknown_config_key_names_the_nearest_valid_one(tmp_path, body, wrong, meant):
    cfg = tmp_path / "c.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError, match=f"did you mean '{meant}' for '{wrong}'"):
        load_config(cfg)


def test_unknown_column_spec_key_names_the_nearest_valid_one():
    with _session() as s, pytest.raises(ConfigError, match="did you mean 'bounds' for 'bound'"):
        s.register("t", T, privacy_unit="uid", columns={"v": {"bound": (0, 1)}})


def test_unknown_engine_setting_names_the_nearest_valid_one():
    with pytest.raises(ConfigError, match="did you mean 'memory_limit' for 'memory_limt'"):
        dpsql.Session(None, dpsql.Budget(1, 0), engine={"memory_limt": "1GB"})


@pytest.mark.parametrize(("name", "said"), [("", "an empty name"), ("a\x00b", "a NUL character")])
def test_arrow_column_with_an_empty_name_or_a_nul_is_named(name, said):
    t = pa.table({"uid": [1, 2], name: [1.0, 2.0]})
    with _session() as s, pytest.raises(ConfigError, match=said) as e:
        s.register("t", t, privacy_unit="uid")
    assert "exists, is readable" not in str(e.value)


def test_a_duckdb_database_file_as_source_says_how_to_register_its_tables(tmp_path):
    db = tmp_path / "x.duckdb"
    duckdb.connect(str(db)).close()
    with _session() as s, pytest.raises(ConfigError, match=r"connection=duckdb\.connect"):
        s.register("t", str(db), privacy_unit="uid")


def test_a_missing_table_of_the_connection_is_named():
    con = duckdb.connect()
    with _session(connection=con) as s, pytest.raises(ConfigError, match="no table 'nope'") as e:
        s.register("t", "nope", privacy_unit="uid")
    assert "file exists" not in str(e.value)


def test_a_hive_partition_column_is_said_to_be_unread(tmp_path):
    for g in ("a", "b"):
        os.makedirs(tmp_path / f"g={g}")
        pq.write_table(T.drop(["g"]), tmp_path / f"g={g}" / "part.parquet")
    with _session() as s, pytest.raises(ConfigError, match="partition") as e:
        s.register("t", str(tmp_path / "*" / "*.parquet"), privacy_unit="uid", columns={"g": {"domain": ["a", "b"]}})
    assert "'g'" in str(e.value)


def test_a_missing_column_outside_a_partition_path_is_not_called_a_partition(tmp_path):
    os.makedirs(tmp_path / "g=a")
    pq.write_table(T.drop(["g"]), tmp_path / "g=a" / "part.parquet")
    with _session() as s, pytest.raises(ConfigError, match="declared column 'w' does not exist") as e:
        s.register("t", str(tmp_path / "*" / "*.parquet"), privacy_unit="uid", columns={"w": {"bounds": (0, 1)}})
    assert "partition" not in str(e.value)


def test_a_config_reference_to_a_table_it_does_not_register_is_refused_at_load(tmp_path):
    # it loaded, `dpsql tables` listed it, and every query of the table was refused (the CLI can add no table)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ledger]\npath = "l.duckdb"\nepsilon = 1\ncreate_if_missing = true\n'
                   '[tables.users]\nsource = "u.parquet"\nprivacy_unit = "uid"\n'
                   '[tables.orders]\nsource = "u.parquet"\nreferences = {uid = "user.uid"}\n')
    with pytest.raises(ConfigError, match=r"registers no table 'user'.*did you mean 'users'"):
        load_config(cfg)
    assert not (tmp_path / "l.duckdb").exists()


def test_a_parquet_file_with_a_repeated_column_name_is_named(tmp_path):
    t = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["uid", "uid"])
    pq.write_table(t, tmp_path / "dup.parquet")
    with _session() as s, pytest.raises(ConfigError, match="two columns are named 'uid' and 'uid'"):
        s.register("t", str(tmp_path / "dup.parquet"), privacy_unit="uid")


def test_columns_only_later_files_of_a_glob_hold_are_said_unread(tmp_path):
    pq.write_table(pa.table({"uid": [1], "x": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"uid": [2], "x": [2], "y": [1.0]}), tmp_path / "b.parquet")
    with _session() as s, pytest.warns(UserWarning, match=r"'y' of .*b\.parquet.*not read"):
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid")
    assert "y" not in s.tables["t"].schema


def test_a_double_star_glob_is_said_to_match_one_directory_level(tmp_path):
    os.makedirs(tmp_path / "a" / "b")
    pq.write_table(T, tmp_path / "a" / "b" / "x.parquet")
    with _session() as s, pytest.raises(ConfigError, match=r"'\*\*' matches one directory level"):
        s.register("t", str(tmp_path / "**" / "*.parquet"), privacy_unit="uid")
    pq.write_table(T, tmp_path / "a" / "y.parquet")  # a match at one level: read, with a warning
    with _session() as s, pytest.warns(UserWarning, match=r"'\*\*' matches one directory level"):
        s.register("t", str(tmp_path / "**" / "*.parquet"), privacy_unit="uid")
    assert len(s.tables["t"].files) == 1


def test_a_csv_with_another_delimiter_is_said_to_be_read_with_commas(tmp_path):
    (tmp_path / "semi.csv").write_text("uid;x\n1;2\n")
    with _session() as s, pytest.raises(ConfigError, match="comma") as e:
        s.register("t", str(tmp_path / "semi.csv"), privacy_unit="uid")
    assert "';'" in str(e.value)


def test_a_duckdb_relation_as_source_says_how_to_register_it():
    # the hint was a dataset's ("source.to_table()"), which on a relation creates a table and needs its name
    con = duckdb.connect()
    with _session(connection=con) as s, pytest.raises(ConfigError, match=r"to_arrow_table\(\)") as e:
        s.register("t", con.sql("SELECT 1 AS uid"), privacy_unit="uid")
    assert "dataset" not in str(e.value)


@pytest.mark.parametrize(("col", "spec"), [
    ("v", {"bounds": (0, 100), "bins": 10, "bin_width": 7}),  # bins won: bins of 10, the width of 7 dropped
    ("d", {"bounds": ("2024-01-01", "2024-12-31"), "bins": 10, "bin_width": "1 day"}),  # here the width won
])
def test_bins_and_bin_width_together_are_refused(col, spec):
    t = T.append_column("d", pa.array([None, None, None], pa.date32()))
    with _session() as s, pytest.raises(ConfigError, match="bins or bin_width, not both"):
        s.register("t", t, privacy_unit="uid", columns={col: spec})


def test_one_file_of_people_registered_under_two_names_is_warned_of(tmp_path):
    # README: one human in both is two persons to dpsql, and a join of the two protects them at twice the bound
    pq.write_table(T, tmp_path / "people.parquet")
    with _session() as s:
        s.register("a", str(tmp_path / "people.parquet"), privacy_unit="uid")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            s.register("a", str(tmp_path / "people.parquet"), privacy_unit="uid")  # registered again: no warning
        with pytest.warns(UserWarning, match=r"table 'b' reads .*people\.parquet.* as table 'a'"):
            s.register("b", str(tmp_path / "*.parquet"), privacy_unit="uid")
        with pytest.warns(UserWarning, match=r"public table 'p' reads .* as table 'a'.*released as they are"):
            s.register("p", str(tmp_path / "people.parquet"), public=True)
        with warnings.catch_warnings():  # a registration refused (a unit column it lacks) warns of nothing
            warnings.simplefilter("error")
            with pytest.raises(ConfigError, match="privacy unit column 'nope' does not exist"):
                s.register("d", str(tmp_path / "people.parquet"), privacy_unit="nope")
    pq.write_table(T, tmp_path / "countries.parquet")
    with _session() as s, warnings.catch_warnings():
        warnings.simplefilter("error")
        s.register("c1", str(tmp_path / "countries.parquet"), public=True)
        s.register("c2", str(tmp_path / "countries.parquet"), public=True)  # two public names: nothing to protect


def test_the_command_line_says_how_to_read_a_duckdb_database_file(tmp_path, capsys):
    from dpsql.cli import main

    db = tmp_path / "x.duckdb"
    duckdb.connect(str(db)).close()
    assert main(["tables", "--table", f"e={db}", "--privacy-unit", "e=uid"]) == 2
    err = capsys.readouterr().err
    assert "COPY" in err and "Session(" not in err


def test_registering_on_a_closed_connection_says_it_is_closed():
    con = duckdb.connect()
    con.execute("CREATE TABLE ev AS SELECT 1 AS uid")
    with _session(connection=con) as s:
        con.close()
        with pytest.raises(ConfigError, match="connection given to this Session is closed"):
            s.register("t", "ev", privacy_unit="uid")


@pytest.mark.parametrize("tau", [2.0, "2"])
def test_tau_is_read_as_the_caps_are(tau):
    # max_groups_per_unit took 5.0 and "5", tau refused 2.0 (TOML's float) and "2"
    with _session() as s:
        s.register("t", T, privacy_unit="uid", tau=tau)
        assert s.tables["t"].tau == 2 and type(s.tables["t"].tau) is int


@pytest.mark.parametrize("tau", [2.5, 0, float("inf"), True, "1_0"])
def test_tau_that_is_no_whole_number_is_refused(tau):
    with _session() as s, pytest.raises(ConfigError, match="tau"):
        s.register("t", T, privacy_unit="uid", tau=tau)


def test_a_privacy_unit_of_the_null_type_is_refused():
    # every row's unit is NULL: every row belongs to nobody and is dropped, so every answer is noise alone
    with _session() as s, pytest.raises(ConfigError, match="NULL"):
        s.register("t", pa.table({"uid": pa.nulls(3), "v": [1.0, 2.0, 3.0]}), privacy_unit="uid")


def test_a_new_ledger_with_a_zero_epsilon_total_is_refused(tmp_path):
    # it was created, and could answer no query: a slip for 1.0 or 0.5
    with pytest.raises(ConfigError, match="epsilon=0 allows no query"):
        dpsql.Session(tmp_path / "l.duckdb", dpsql.Budget(0, 0), create=True)
    assert os.listdir(tmp_path) == []
    from dpsql.cli import main

    assert main(["init", "--epsilon", "0", "--delta", "0", "--ledger", str(tmp_path / "l.duckdb")]) == 2
    assert not (tmp_path / "l.duckdb").exists()


def test_a_negative_total_says_zero_is_allowed_where_it_is():
    with pytest.raises(ConfigError, match=r"finite number >= 0, got -1"):
        dpsql.Budget(-1, 0)


def test_a_csv_header_names_the_repeated_column_and_an_empty_file_is_said_empty(tmp_path):
    (tmp_path / "d.csv").write_text("uid,Amount,amount\n1,2,3\n")
    with _session() as s, pytest.raises(ConfigError, match="'Amount' and 'amount'"):
        s.register("t", str(tmp_path / "d.csv"), privacy_unit="uid")
    (tmp_path / "x.csv").write_text("uid,x,x\n1,2,3\n")  # one-letter names: one interned string object
    with _session() as s, pytest.raises(ConfigError, match="'x' and 'x'"):
        s.register("t", str(tmp_path / "x.csv"), privacy_unit="uid")
    (tmp_path / "e.csv").write_text("")
    with _session() as s, pytest.raises(ConfigError, match="is empty"):
        s.register("t", str(tmp_path / "e.csv"), privacy_unit="uid")


def test_session_tables_that_are_one_name_to_sql_are_refused():
    # the second replaced the first without a word (the config file refuses the same)
    tables = {"E": {"source": T, "privacy_unit": "uid"}, "e": {"source": T, "privacy_unit": "uid"}}
    with pytest.raises(ConfigError, match="'E' and 'e'"):
        dpsql.Session(None, dpsql.Budget(1, 1e-6), tables=tables)
