"""Shared fixtures: small generated datasets and sessions with test noise sources."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.cli import main
from dpsql.testing import seeded_noise, use_noise, zero_noise

# The JVMs of the Spark tests (pyspark's driver, those of child processes, a standalone cluster's master,
# workers and executors: each inherits this environment) compile with the client compiler only and
# collect with the serial collector. Their queries are many, short and each compiled anew, on small
# data: the optimising compiler's threads cost more CPU than they saved (on 2 cores, test_spark.py's
# start-up and first queries took about half the CPU). The JIT tier and the collector change no result
# (Java's arithmetic is the same in every tier). The client compiler alone reserves 48 MB for compiled code, which
# a worker's JVM running many files' query shapes filled ("CodeCache is full. Compiler has been disabled": the
# JVM then interpreted, and once lost its connection): it gets the 240 MB tiered compilation has. An environment
# that sets the variable keeps its own.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m")
# Every JVM pyspark starts for the tests (also the sessions tests build themselves, which keep Spark's defaults
# otherwise) keeps 2000 compiled operator classes, as a session dpsql starts does (docs/spark.md): a worker's
# JVM runs many files' queries, and with Spark's 100 their shapes evicted each other.
os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--conf spark.sql.codegen.cache.maxEntries=2000 pyspark-shell")


def make_events(n_users: int = 60, seed: int = 7, sentinel: str | None = None) -> pa.Table:
    """A small events table: several rows per user, a few URLs and countries, bounded amounts."""
    gen = np.random.default_rng(seed)
    rows = gen.integers(1, 8, n_users)
    user = np.repeat(np.arange(1, n_users + 1), rows)
    n = len(user)
    urls = np.array(["a", "b", "c", "d", "e", "f"])
    url = urls[np.minimum(gen.zipf(1.6, n) - 1, len(urls) - 1)]
    country = np.array(["US", "FR", "DE"])[gen.integers(0, 3, n)]
    amount = np.round(gen.uniform(-5, 120, n), 2)  # some values outside the bounds (0, 100)
    action = np.where(gen.random(n) < 0.8, "view", "share")
    if sentinel is not None:
        url = url.astype(object)
        url[0] = sentinel
    return pa.table(
        {
            "user_id": user.astype(np.int64),
            "url": url.astype(str),
            "country": country,
            "amount": amount,
            "action": action,
            "age": gen.integers(0, 100, n).astype(np.int64),
        }
    )


@pytest.fixture
def events() -> pa.Table:
    return make_events()


@pytest.fixture
def session(events: pa.Table):
    """In-memory ledger, zero noise: goldens see bounded true aggregates."""
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, zero_noise())
    s.register(
        "events",
        events,
        privacy_unit="user_id",
        max_groups_per_unit=2,
        max_rows_per_group=1,
        columns={"amount": {"bounds": (0, 100)}, "country": {"domain": ["US", "FR", "DE", "XX"]}},
    )
    yield s
    s.close()


@pytest.fixture
def noisy_session(events: pa.Table, request: pytest.FixtureRequest):
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3))
    use_noise(s, seeded_noise(request.node.name))
    s.register("events", events, privacy_unit="user_id", max_groups_per_unit=2,
               columns={"amount": {"bounds": (0, 100)}})
    yield s
    s.close()


REPO = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """The environment of a child Python process that imports this checkout of dpsql."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def spawn_python(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` (dedented) in a child Python process with piped stdin/stdout/stderr."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def run_together(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[Any]:
    """Start children that print 'ready' and wait for 'go' on stdin all at once; return the JSON
    each prints on its last line (children still running afterwards are killed)."""
    import json

    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read() if p.stderr else line
        for p in procs:  # release them all at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


# -- the command line: its runner and a fresh copy of examples/ as the working directory ---------------


def run_cli(argv: list[str]) -> int:
    """main(argv) with argparse's SystemExit turned into the exit code."""
    try:
        return main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.fixture
def python_sigint() -> Any:
    """Python's own SIGINT handler for one test, as in a fresh process: a Spark session started by an earlier test
    in the same worker installs its own; tests of dpsql's Ctrl-C handling check it gives back the one it found."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of examples/ (so the example ledger is new), as the working directory."""
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("*.duckdb*"))
    shutil.copytree(Path(__file__).resolve().parents[1] / "sql", tmp_path / "sql")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    return tmp_path


#: The longest test files, longest first (by the seconds summed over their tests in a fresh-clone CI
#: run on the 2-core development machine, 2026-12, as the tests stand now). With ``--dist loadfile
#: --no-loadscope-reorder`` (README) pytest-xdist hands out whole files in collection order; starting the
#: longest first lets the two workers finish together (pytest-xdist's own order, by number of tests,
#: started the one-test cluster file last, and one worker ran it alone for about 80 s). A file missing
#: here only starts later; the order never changes what a test checks.
LONGEST_FIRST = (
    "test_spark_parity_types.py", "test_spark.py", "test_spark_joins.py", "test_adversary_spark_plans.py",
    "test_cli_signal_at_charge.py", "test_adversary_spark_decimal_storage.py", "test_adversary_join_spread.py",
    "test_spark_cluster.py", "test_adversary_sql_surface.py", "test_ledger_postgres_interrupts.py",
    "test_adversary_spark_round.py", "test_cli_job_environment.py", "test_bounding.py", "test_backend_ops.py",
    "test_joins_adversarial.py", "test_hostile_fuzz.py", "test_cli_signal_after_charge.py", "test_privacy_audit.py",
    "test_s4s_truncation.py", "test_spark_replaced_sources.py", "test_spark_recent_features.py",
    "test_adversary_audit_b.py", "test_adversary_dictionary_text.py", "test_adversary_round38.py",
    "test_adversary_scan_statistics.py", "test_adversary_spark_text_hash.py", "test_spark_dates.py",
    "test_adversary_threads.py", "test_neighbour_fuzz.py", "test_adversary_ledger_process.py", "test_ledger_postgres.py",
    "test_many_aggregates.py",
)


#: The test files that start Spark in their own process (read from their text). Under ``--dist loadfile`` (README) they
#: run on one worker, as one unit of work (``pytest_xdist_make_scheduler``): one JVM starts and warms up for all of
#: them instead of one per worker (each worker's JVM compiled Spark's own code and the same query shapes anew). The
#: default run's Spark files hold about a fifth of its CPU, less than a worker's share; with ``--extended`` they are
#: dealt out to two workers by :data:`LONGEST_FIRST`'s order. Which worker runs a file never changes what it checks.
_SPARK_TEXT = re.compile(r"pyspark|SparkSession|tests\._spark|from _spark|import _spark")
SPARK_FILES = tuple(sorted(f.name for f in Path(__file__).parent.glob("test_*.py") if _SPARK_TEXT.search(f.read_text())))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None  # pytest-xdist's own
    from xdist.scheduler import LoadFileScheduling

    groups = 2 if config.getoption("--extended") else 1
    rank = {name: i for i, name in enumerate(f for f in dict.fromkeys((*LONGEST_FIRST, *SPARK_FILES)) if f in SPARK_FILES)}

    class SparkTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            name = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return f"spark-files-{rank[name] % groups}" if name in rank else super()._split_scope(nodeid)

    return SparkTogether(config, log)


#: The extended tests: each is a deeper repeat of a property that a test of the default run also checks, on another
#: input, engine set-up or sweep density; ``--extended`` runs them too (README, Development). The default run (the
#: README's test command, CI) keeps every test of the DuckDB engine's privacy, accounting, SQL and ledger, and on Spark
#: the bounded aggregates of every shape (test_spark.py), the plans' independence of one person (scalar, sparse,
#: workload and join reads), the engine's operations (test_backend_ops.py[spark]) and its lowering and functions.
#: Keys: a test file, or a test id's beginning; values: what the default run checks of the same property.
EXTENDED = {
    "test_adversary_round68b.py::test_answers_are_the_same_on_both_engines":
        "answers at zero noise alike on both engines: test_spark.py (test_bounded_aggregates_are_the_same_on_duckdb_and_spark, "
        "every shape, and test_zero_noise_releases_are_the_same); round 68b's refusals and charges on both stay",
    "test_adversary_round68b.py::test_a_derived_join_key_and_its_null_group_are_the_same_on_both_engines":
        "derived grouped-join keys and their NULL group alike on both engines: "
        "test_spark_join_group_expressions.py::test_zero_noise_releases_of_derived_keys_are_the_same",
    "test_adversary_round65c.py::test_removing_one_person_moves_each_count_by_at_most_one_in_at_most_c_u_groups":
        "counts of people over joins on neighbours over random schemas: test_join_count_people.py removes each "
        "person of the TPC-H schema in turn; round 65c's negative control (two people removed move a count by two) stays",
    "test_adversary_round65b.py::test_on_spark_a_having_that_keeps_no_public_key_of_a_grouped_join_is_refused_for_free":
        "the same refusals for free on DuckDB: test_adversary_round64.py and test_offset_beyond_public_keys.py",
    "test_spark_parity_types.py": "releases bit for bit on both engines: test_spark.py compares the same shapes' bounded "
                                  "aggregates (rows as sets, floats within 1e-9)",
    "test_spark_joins.py": "join releases on both engines: the join reads' plans (test_adversary_spark_plans.py) and the "
                           "join operations (test_backend_ops.py[spark]) run on Spark; the join releases on DuckDB",
    "test_spark_cluster.py": "a standalone cluster: the same plans run on local[2]",
    "test_adversary_spark_decimal_storage.py": "Parquet decimal storage on Spark: test_adversary_round38.py",
    "test_adversary_spark_round.py": "Spark forms of rounding and of huge expressions: test_spark_lowering.py",
    "test_spark_recent_features.py": "the same answer or refusal on both engines for newer SQL: the DuckDB tests of each",
    "test_spark_large_domains.py": "long declared domains on Spark: the DuckDB twin and test_spark.py's public keys",
    "test_spark_replaced_sources.py": "sources replaced between queries: test_adversary_replaced_*.py on DuckDB",
    "test_adversary_spark_replaced_parquet.py": "as test_spark_replaced_sources.py",
    "test_adversary_spark_text_hash.py": "text hashing cost on Spark: test_adversary_spark_like_cost.py",
    "test_adversary_spark.py": "Spark regressions of DuckDB-checked properties: test_spark.py",
    "test_spark_join_text_keys.py": "text join keys on Spark: the DuckDB join key tests (test_join_key_digests.py)",
    "test_spark_dates.py": "dates and timestamps on Spark: test_spark.py's date keys and test_spark_lowering.py",
    "test_spark_doubles.py": "doubles' text on Spark: test_spark_functions.py",
    "test_groupings_spark.py": "ROLLUP/CUBE on Spark: test_groupings.py on DuckDB",
    "test_spark_exact_bins.py": "bins on Spark: test_adversary_subsecond_bins_spark.py",
    "test_spark_nested_caps.py": "caps over nested columns on Spark: test_backend_ops.py[spark]",
    "test_spark_conversions.py": "Spark conversions: test_spark_lowering.py",
    "test_adversary_spark_plans.py::test_private_read_plans_do_not_depend_on_one_person[join-parquet]":
        "the same join read over Arrow ([join-arrow])",
    "test_adversary_spark_plans.py::test_join_plans_alike_when_a_side_crosses_the_broadcast_threshold[parquet]":
        "the same threshold over Arrow ([arrow])",
    "test_adversary_spark_plans.py::test_private_read_plans_do_not_depend_on_one_person[sparse-parquet]":
        "the same sparse read over Arrow ([sparse-arrow])",
    "test_adversary_spark_plans.py::test_private_read_plans_do_not_depend_on_one_person[workload-parquet]":
        "the same workload read over Arrow ([workload-arrow])",
    **{f"test_adversary_join_spread.py::test_text_keys_under_a_collation_match_alike[{shape}-no":
       "a database default collation (nocase, noaccent.nocase) for the first text join shape ([sql0-...]); every shape "
       "under the binary collation and under COLLATE NOCASE in the query"
       for shape in ("sql1-opts1", "SELECT COUNT(*) FROM orders o JOIN lineitem l ON o.o_orderkey = l.l_orderkey-opts2",
                     "SELECT COUNT(*) FROM lineitem l-opts3", "sql4-opts4")},
    "test_cli_signal_at_charge.py::test_ctrl_c_at_every_point_after_the_charge_names_the_entry_as_the_ledger_has_it"
    "[SELECT g": "the COUNT query's sweep of every distinct place (a ROLLUP repeats it per grouping)",
    "test_adversary_round43.py::test_a_lookup_join_reading_the_key_as_a_value_answers_with_one_persons_long_code[sql":
        "the first query of the same test",
    "test_joins_adversarial.py::test_removing_one_person_moves_the_clipped_vector_by_at_most_the_clip_norm[2-":
        "the same check with one join ([1-...])",
    "test_adversary_row_draw.py::test_row_draw_keeps_each_row_with_null_values_at_one_over_rows[one-column]":
        "the same draw over two columns ([two-columns])",
    "test_adversary_round40c.py::test_one_persons_texts_of_one_arrow_hash_are_answered_alike_on_neighbours[False]":
        "the same neighbours with the other setting ([True])",
    "test_spark_join_group_expressions.py::test_a_counted_out_day_range_is_the_same_on_both_engines":
        "the same file's zero-noise releases of derived keys on both engines, and the counted-out ranges on DuckDB "
        "(test_adversary_join_group_expressions.py)",
    "test_hostile_fuzz.py::test_outcomes_do_not_depend_on_one_user[1]":
        "the other half of the same corpus and generated expressions ([0])",
    "test_hostile_fuzz.py::test_outcomes_do_not_depend_on_one_user[2]":
        "the other half of the same generated WHERE conditions, within the allow-list and hostile alike ([0])",
    "test_big_queries.py::test_a_9000_element_in_list_is_answered":
        "long IN lists of constants typed and answered: the 10 000 literals of each kind typed at the cap "
        "(test_adversary_expressions.py::test_an_in_list_of_constants_is_bounded_by_its_own_limit), the lists of 600 "
        "integer, date and decimal keys answered (test_long_in_lists.py), each type name parsed once "
        "(test_type_nodes_are_fresh_and_equal_to_a_parse) and a long list of float constants typed in few nodes",
    "test_hostile_fuzz.py::test_outcomes_do_not_depend_on_one_user_parquet_invalid_utf8[1]":
        "the other half of the same corpus and generated queries over the same Parquet file with invalid UTF-8 ([0])",
    "test_hostile_fuzz.py::test_outcomes_do_not_depend_on_one_user[3]":
        "the generated GROUP BY keys of [1] drawn by the same generator; the corpus's keys ([0]) and the generated "
        "keys of the Parquet file with invalid UTF-8 (test_outcomes_do_not_depend_on_one_user_parquet_invalid_utf8)",
    **{f"test_cli_signal_after_charge.py::{t}": f"the same signal at the same place with {twin}" for t, twin in (
        ("test_a_signal_while_the_answer_is_written_keeps_the_release[out1-SIGTERM]", "SIGINT ([out1-SIGINT]), and "
         "SIGTERM on stdout ([out0-SIGTERM])"),
        ("test_ctrl_c_while_the_ledger_records_the_release_keeps_the_answer[out0-workload]", "the answer written to a "
         "file ([out1-workload]), and on stdout for a query ([out0-query])"),
        ("test_ctrl_c_while_the_ledger_records_the_release_keeps_the_answer[out0-rollup]", "the answer written to a "
         "file ([out1-rollup]), and on stdout for a query ([out0-query])"),
        ("test_a_signal_while_charged_caps_advice_is_written_keeps_it[SIGTERM]", "SIGINT ([SIGINT])"),
        ("test_a_second_signal_while_the_release_is_saved_waits_for_the_save[SIGTERM]", "SIGINT ([SIGINT])"),
        ("test_a_signal_before_the_charge_keeps_nothing[SIGTERM]", "SIGINT ([SIGINT])"))},
    "test_adversary_round47.py::test_arithmetic_over_unsigned_huge_and_scaled_decimal_extremes_is_answered_alike_on_"
    "neighbours[1]": "the other half of the same queries ([0])",
    **{f"test_adversary_dictionary_text.py::test_one_persons_repeated_text_as_a_group_key_answers_on_both_neighbours"
       f"[SELECT note, {q}-nested_]": "the same query over a flat column ([...-]), and the nested column under the query "
       "of three aggregates ([SELECT note, COUNT(uid), COUNT(DISTINCT ...)...-nested_])"
       for q in ("COUNT(*) FROM t GROUP BY note-1", "COUNT(uid) FROM t GROUP BY note-3",
                 "COUNT(DISTINCT uid % 5) FROM t GROUP BY note-3")},
    "test_adversary_collation.py::test_where_is_binary_whatever_the_owner_collation[noaccent.nocase-None]":
        "another database default collation ([nocase-None]) and a column collation ([None-NOCASE])",
    "test_adversary_round46.py::test_parts_release_what_the_condition_read_after_the_join_releases[NOCASE]":
        "the same parts without a collation ([None]); WHERE under NOCASE: test_adversary_collation.py",
    "test_adversary_round43.py::test_a_lookup_join_reading_the_key_as_a_key_answers_with_one_persons_long_code[sql1-":
        "the same test's other queries over the lookup join and on one table",
    "test_adversary_round43.py::test_a_lookup_join_reading_the_key_as_a_key_answers_with_one_persons_long_code[sql3-":
        "the same test's other queries over the lookup join and on one table",
    "test_s4s_vector_fp.py::test_the_largest_key_count_at_delta_1e_7[0.25-":
        "the same bound at another epsilon ([1.0-...])",
    "test_text_keys_over_rows.py::test_the_group_cap_over_rows_spills_under_a_small_memory_limit[3]":
        "the same spill on one thread ([1])",
    "test_ledger_postgres_interrupts.py::test_ctrl_c_at_any_point_of_an_operation_leaves_the_ledger_whole[":
        "(all but [commit]) the commit's sweep, and every operation's on the DuckDB ledger (test_interrupts.py)",
    "test_dawa_privacy.py::test_stage1_log_ratio_within_epsilon1[flat-vs-bump-":
        "the same bound for each configuration on the other flat histogram with one bin raised by one "
        "([zero-vs-e4-...], beside the negative control's pair) and on a step ([step-vs-lower-...])",
    **{f"test_join_neighbour_fuzz.py::test_removing_one_person_keeps_every_truncated_quantity_within_its_bound[{seed}]":
       f"the same check on the seeds {twins} (and the other seeds of both kinds)"
       for seed, twins in ((16, "14 (plain keys)"), (19, "3 and 15 (hostile text keys)"))},
    **{f"test_sources.py::test_property_hostile_source_bytes_never_fail_and_neighbours_agree[{seed}]":
       "the same generated hostile cells on seeds 0 to 2 ([0], [1], [2])" for seed in (3, 4, 5)},
    **{f"test_neighbour_fuzz.py::test_neighbours_salted[{seed}]": f"the same check on seed {twin}, which reaches the "
       f"same mechanism ({mechanism}); every seed's mechanism: test_seeds_cover_every_mechanism"
       for seed, twin, mechanism in ((20261261, 20261254, "gaussian"), (20261280, 20261254, "gaussian"),
                                     (20261218, 20261236, "laplace"), (20261225, 20261236, "laplace"),
                                     (20261276, 20261236, "laplace"), (20261205, 20261215, "sparse histogram"),
                                     (20261206, 20261215, "sparse histogram"), (20261221, 20261215, "sparse histogram"),
                                     (20261208, 20261201, "exponential"), (20261267, 20261201, "exponential"),
                                     (20261210, 20261209, "dawa"), (20261211, 20261209, "dawa"))},
    "test_adversary_dictionary_text.py::test_one_persons_repeated_text_key_with_two_rows_answers_on_both_neighbours"
    "[SELECT note, COUNT(DISTINCT uid % 5) FROM t GROUP BY note-nested_]": "the same query over a flat column ([...-]), "
    "and the nested column under COUNT(uid) ([SELECT note, COUNT(uid) FROM t GROUP BY note-nested_])",
    **{f"test_adversary_dictionary_text.py::test_arrow_view_count_distinct_of_one_persons_repeated_text_answers_on_both_"
       f"neighbours[SELECT uid % 3 AS r, COUNT(DISTINCT (note, uid % 2)) FROM t GROUP BY uid % 3-{k}]":
       f"the same query at k = 1 ([...-1]), and k = {k} on the Arrow view under COUNT(DISTINCT note) and "
       f"COUNT(DISTINCT lower(note)) ([...-{k}])" for k in (2, 3)},
    **{f"test_adversary_scan_statistics.py::test_join_shapes_whose_sizes_one_person_makes_cross_keep_their_plan"
       f"[{shape}-table]": f"the same shape over Parquet ([{shape}-parquet]), the group and path shapes over tables "
       "([group-table], [path-table]) and the three-table joins of test_three_table_join_plans_on_duckdb_tables_do_not_"
       "depend_on_one_person" for shape in ("chain4", "star")},
    **{f"test_adversary_join_spread.py::test_a_key_column_named_like_the_plans_columns_keeps_its_matches[{o}-o_orderkey]":
       "the ordinary key name under the default options ([opts0-o_orderkey]; under r2t and q = 0.5 the chain of "
       "test_text_keys_under_a_collation_match_alike joins on o_orderkey too), and the plan's own names (__spread, "
       "__key0) under every option" for o in ("opts1", "opts2")},
    "test_adversary_join_spread.py::test_numeric_keys_spelled_apart_match_alike[SELECT COUNT(*) FROM a JOIN a a2 ON "
    "a.k = a2.k-int-bigint]": "the same self-join over the same INTEGER keys with NULLs added ([...-int-nulls]); a "
                              "self-join reads table a alone, so the case's BIGINT side is not read",
    "test_adversary_join_spread.py::test_numeric_keys_spelled_apart_match_alike[SELECT SUM(b.v) FROM a JOIN b ON a.k = b.k-":
        "each spelling over the same join under COUNT(*) ([SELECT COUNT(*) FROM a JOIN b ON a.k = b.k-...]), which "
        "checks the same number of joined rows",
    **{f"test_cli_signal_at_charge.py::test_a_signal_between_the_charge_and_the_read_names_the_reserved_entry"
       f"[charged-{sig}": f"{sig} at the other point ([charge_commit-{sig}-...]), and SIGINT at this point "
       "([charged-SIGINT-...])" for sig in ("SIGTERM", "SIGHUP")},
    **{f"test_adversary_round68a.py::test_random_queries_match_duckdb[{seed}]": "the same differential fuzzer's "
       "random queries on the seeds 101 to 106 ([101] ... [106]), and its negative control (a wrong answer is caught)"
       for seed in range(107, 113)},
    **{f"test_join_neighbour_fuzz.py::{t}[30-59]": "the same check on the random instances of the seeds 0 to 29 "
       "([0-29])" for t in ("test_the_general_truncation_paths_move_by_at_most_tau_plus_the_certified_slack",
                            "test_the_cone_program_moves_E_by_one_and_F_by_two_tau_E_plus_one")},
    **{f"test_cli_etl_probe.py::test_an_unbuffered_stdout_cut_short_by_its_reader_is_no_success[{fmt}]":
       "the same cut-short write of the table form ([table]): every format's rows are rendered to bytes first and "
       "written by the same write (dpsql.cli._render_rows)" for fmt in ("csv", "json")},
    **{f"test_cli_encodings.py::test_released_keys_outside_the_locale_encoding_are_written_as_utf8[{fmt}]":
       "the same keys in the table form ([table]): every format's rows are encoded as UTF-8 by the same step and "
       "written by the same write (dpsql.cli._render_rows)" for fmt in ("csv", "json")},
    "test_cli_signals.py::test_a_signal_during_a_ledger_statement_exits_as_a_signal[SIGHUP]":
        "SIGTERM at the same place ([SIGTERM]: the CLI's one handler of both), and SIGHUP's exit at the charge "
        "(test_cli_signal_at_charge.py[charge_commit-SIGHUP-...])",
    **{f"test_adversary_round48.py::test_held_a_decimal_clamped_in_its_type_releases_what_doubles_do_under_negative_"
       f"and_fractional_bounds[opts1-{b}]": "the race of k = 1 under the fractional bounds ([opts1-bounds1]), and k = 3 "
       f"under the same bounds ([None-{b}])" for b in ("bounds0", "bounds2")},
    **{f"test_adversary_scan_statistics.py::test_join_shapes_whose_sizes_one_person_makes_cross_keep_their_plan"
       f"[{shape}-parquet]": f"the same shape over tables ([{shape}-table]), and the chain4 and star shapes over Parquet "
       "([chain4-parquet], [star-parquet])" for shape in ("group", "path")},
    **{f"test_adversary_round72c.py::test_held_{name}": "the same date key sets, free refusals and FIFO sources on "
       "DuckDB: test_adversary_round72a.py; on both engines, the refusals of round 72c's findings and their "
       "negative control" for name in ("date_key_sets_are_the_same_on_both", "free_refusals_are_the_same_on_both",
                                       "the_answers_beside_the_refusals_are_the_same_on_both",
                                       "a_parquet_file_replaced_by_a_fifo_is_refused_for_free_on_both")},
    "test_adversary_round44.py::test_removing_a_person_moves_the_groups_within_the_caps[7-SELECT note, n2,":
        "the ordinary person under the same caps with one key ([7-SELECT note, COUNT(*) ...-capsN]), and the person "
        "of one hash with two keys ([1000000-SELECT note, n2, ...-capsN])",
}


def _extended(item: pytest.Item) -> bool:
    nodeid = item.nodeid.removeprefix("tests/")
    for key in EXTENDED:
        if nodeid.startswith(key) and not nodeid.endswith("[commit]"):
            return True
    return False


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what the collection left (``gc.freeze``): every test module, its parameters and data, and the libraries
    (about 9 000 tests collected by each worker). The collector's full collections then no longer go through them
    while the tests run (about 7% of the CPU of DuckDB test files collected in the whole suite). A frozen object is
    still freed when its last reference goes; only a reference cycle among them stays until the process ends."""
    import gc

    gc.collect()
    gc.freeze()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--extended", action="store_true", default=False,
                     help="also run the tests of EXTENDED (deeper repeats of properties the default run checks: "
                          "README, Development)")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--extended"):
        # the default run (README's test command, CI) leaves out the deeper repeats listed in EXTENDED
        left = [it for it in items if _extended(it)]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [it for it in items if not _extended(it)]
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: every file keeps its own order


def sigint_storm_while_charging(led: Any, workers: list[Any], stop: Any, seed: int, seconds: float = 2.0) -> int:
    """Start ``workers`` (threads), then for ``seconds`` charge and release on ``led`` in the main thread while
    another thread sends it SIGINT every 5-50 ms (about 70 signals in the 2 s by default); set ``stop``, join every
    thread, and return how many KeyboardInterrupts the main thread caught (in its ledger operations or in its own
    loop's steps)."""
    import random
    import signal
    import threading
    import time

    from dpsql.budget import Budget

    main_thread = threading.main_thread().ident
    assert main_thread == threading.get_ident()
    rnd = random.Random(seed)

    def storm() -> None:
        while not stop.wait(rnd.uniform(0.005, 0.05)):
            signal.pthread_kill(main_thread, signal.SIGINT)  # type: ignore[arg-type]

    for w in workers:
        w.start()
    stormer = threading.Thread(target=storm)
    interrupted = 0
    end = time.monotonic() + seconds
    try:
        stormer.start()
        while True:
            try:
                while time.monotonic() < end:
                    try:
                        led.commit(led.reserve(Budget(1.0), mechanism="m", query="main", tables=["t"], params={}))
                    except KeyboardInterrupt:
                        interrupted += 1
                break
            except KeyboardInterrupt:  # in the loop's own steps
                interrupted += 1
    finally:
        while True:
            try:
                stop.set()
                stormer.join()
                time.sleep(0.05)  # a last signal's handler runs here
                break
            except KeyboardInterrupt:
                interrupted += 1
    for w in workers:
        w.join(30)
    return interrupted


def _signal_point_tracer(files: set[str], at_point: Any) -> Any:
    """A tracer (for ``sys.settrace``) that calls ``at_point(frame)`` at each point of the code in ``files`` where
    Python runs a signal's handler (CPython: a function's start, after a call, a loop's jump back)."""
    import dis

    last: dict[int, str] = {}

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            name = dis.opname[frame.f_code.co_code[frame.f_lasti]]
            if name in ("RESUME", "JUMP_BACKWARD") or last.get(id(frame)) in ("CALL", "CALL_FUNCTION_EX"):
                at_point(frame)
            last[id(frame)] = name
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename not in files:
            return None
        frame.f_trace_opcodes = True
        return local

    return tracer


def stepped_signal(n: int, files: set[str], signum: int = 2) -> Any:
    """A tracer (for ``sys.settrace``) that sends the main thread ``signum`` (SIGINT by default) at the ``n``-th signal
    point of the code in ``files`` (:func:`_signal_point_tracer`); its ``seen`` counts those points."""
    import signal

    seen = [0]

    def at_point(frame: Any) -> None:
        seen[0] += 1
        if seen[0] == n:
            signal.raise_signal(signum)  # its handler runs here, as Python would run it at this point

    tracer = _signal_point_tracer(files, at_point)
    tracer.seen = seen
    return tracer


def signal_at_a_new_place(tried: set[Any], files: set[str], phase: Any, signum: int = 2) -> Any:
    """A tracer (for ``sys.settrace``, set in the frame that makes the call to step through) that sends the main thread
    ``signum`` at the first signal point (as :func:`stepped_signal` counts them) whose place is not in ``tried``, and
    adds it there; ``sent[0]`` says whether it did. A place is the point's code position, the call sites of its callers
    in ``files`` (up to the frame that set the tracer) and ``phase()`` (e.g. the number of ledger writes so far): the
    same place again is the same code reached by the same path in the same ledger state, i.e. another iteration of a
    loop (one per column, item or grouping) or another call from the same call site. Stepping until a call runs to
    its end without a signal sends one at every distinct place once."""
    import signal

    sent = [False]
    top = sys._getframe(1)

    def place(frame: Any) -> tuple[Any, ...]:
        sites = []
        while frame is not None and frame is not top:
            if frame.f_code.co_filename in files:
                sites.append((frame.f_code, frame.f_lasti))
            frame = frame.f_back
        return (phase(), *sites)

    def at_point(frame: Any) -> None:
        if not sent[0]:
            key = place(frame)
            if key not in tried:
                tried.add(key)
                sent[0] = True
                signal.raise_signal(signum)  # its handler runs here, as Python would run it at this point

    tracer = _signal_point_tracer(files, at_point)
    tracer.sent = sent
    return tracer


def run_alone(request: pytest.FixtureRequest) -> bool:
    """Run this test again in a fresh interpreter (True: it ran there and passed). Stepping SIGINT through every
    line under ``sys.settrace`` crashed CPython 3.11 (a segmentation fault in the main thread) in a test process
    whose earlier tests had left other threads running Python code (pyspark's accumulator server); the test's
    subject is the ledger, so it runs where no other test has run."""
    if os.environ.get("DPSQL_TEST_ALONE") == request.node.nodeid:
        return False
    env = dict(os.environ, DPSQL_TEST_ALONE=request.node.nodeid)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--extended",  # as selected
                        request.node.nodeid], cwd=str(request.config.rootpath), env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-2000:])
    return True

