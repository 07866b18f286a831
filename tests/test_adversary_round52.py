"""Failure paths of the Spark engine and the PostgreSQL ledger: a Spark session the caller stopped between two
queries, a spark:// master that does not answer, a damaged file under ignoreCorruptFiles, a PostgreSQL
ledger that cannot be reached named in CLI terms. The tests that start Spark are skipped (with the reason)
without pyspark/Java, as the other Spark tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _spark import require_spark
from conftest import child_env


@pytest.fixture
def needs_spark() -> None:
    require_spark()

def test_a_spark_session_stopped_by_the_caller_is_refused_before_the_charge(tmp_path: Path, needs_spark: None) -> None:
    """The caller stops the SparkSession a Session runs on (``spark.stop()`` stops the process's SparkContext) between
    two queries. Run in this process, on its SparkContext (a worker's next Spark test starts a new one in the same JVM,
    as a caller would after a stop): a process of its own cost a JVM start for the same check."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    import dpsql

    root = str(tmp_path)
    pq.write_table(pa.table({"uid": list(range(50)), "x": [i % 7 for i in range(50)]}), root + "/t.parquet")
    spark = SparkSession.builder.master("local[2]").getOrCreate()  # the process's session, whichever master it runs
    try:
        s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-5), engine="spark", spark=spark, ledger=root + "/l.duckdb",
                          create=True)
        s.register("t", root + "/t.parquet", privacy_unit="uid", max_rows_per_unit=1)
        s.query("SELECT COUNT(*) FROM t", epsilon=0.5)
        before = s.remaining().epsilon
        rows = s.history().num_rows
    finally:
        spark.stop()
    errors: list[Any] = []
    for sql in ("SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t WHERE x > 3"):  # a remembered bind check, a new one
        try:
            s.query(sql, epsilon=0.5)
            errors.append(None)
        except dpsql.errors.DPSQLError as e:
            errors.append([type(e).__name__, str(e)])
    after = s.remaining().epsilon
    try:
        s.register("u", root + "/t.parquet", privacy_unit="uid", max_rows_per_unit=1)
        register = None
    except dpsql.errors.DPSQLError as e:
        register = [type(e).__name__, str(e)]
    new_entries = s.history().num_rows - rows
    s.close()
    try:  # a new Session on the stopped SparkSession
        dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), engine="spark", spark=spark, ledger=root + "/new.duckdb",
                      create=True)
        new_session = None
    except Exception as e:  # noqa: BLE001 - which error it is, is checked below
        new_session = [type(e).__name__, str(e)]
    assert before == pytest.approx(9.5)
    for err in errors:
        assert err is not None and err[0] == "ConfigError", err
        assert "stopped" in err[1] and "nothing was charged" in err[1], err
    assert after == before and new_entries == 0  # no charge for a query that could not run
    assert new_session is not None and new_session[0] == "ConfigError", new_session
    assert "stopped" in new_session[1] and not (tmp_path / "new.duckdb").exists()
    assert register is not None and "stopped" in register[1], register  # not "check the path"


class _Builder:
    def master(self, *_: object) -> _Builder:
        return self

    appName = config = master  # noqa: N815 - pyspark's spelling

    def getOrCreate(self) -> None:  # noqa: N802 - pyspark's spelling
        # what pyspark raised after Spark's registration retries on a spark:// master that does not answer
        raise RuntimeError("An error occurred while calling None.org.apache.spark.sql.classic.SparkSession. "
                           "All masters are unresponsive! Giving up. Failed to connect to /127.0.0.1:9")


class _FakeSparkSession:
    builder = _Builder()

    @staticmethod
    def getActiveSession() -> None:  # noqa: N802 - pyspark's spelling
        return None


def test_a_spark_master_that_does_not_answer_is_a_config_error_naming_the_setting(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsql
    from dpsql.engine import spark as spark_engine
    from dpsql.errors import ConfigError

    monkeypatch.setattr(spark_engine, "_require_pyspark", lambda: _FakeSparkSession)
    ledger = tmp_path / "l.duckdb"
    with pytest.raises(ConfigError) as info:
        dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), engine={"kind": "spark", "master": "spark://127.0.0.1:9"},
                      ledger=str(ledger), create=True)
    text = str(info.value)
    assert "spark://127.0.0.1:9" in text and "nothing was charged" in text and "[engine] master" in text
    assert "unresponsive" not in text  # Spark's own words stay out
    assert not ledger.exists()  # no ledger created for a Session that could not start


@pytest.mark.parametrize("setting", ["spark.sql.files.ignoreCorruptFiles", "spark.sql.files.ignoreMissingFiles"])
def test_a_damaged_file_is_never_skipped_silently_whatever_the_spark_session_says(tmp_path: Path, setting: str,
                                                                                 needs_spark: None) -> None:
    """Spark's ignoreCorruptFiles (from a caller's session, spark-defaults.conf, or set on dpsql's session) skipped
    the rest of a file whose read failed, and the query released an answer over the other files (100 rows of 200)
    where the DuckDB engine, and Spark with its default, fail with the generic error. Both settings are pinned off."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dpsql
    from dpsql.errors import ExecutionError
    from dpsql.testing import use_noise, zero_noise

    for name, start in (("a", 0), ("b", 100)):
        pq.write_table(pa.table({"uid": list(range(start, start + 100)), "x": [1] * 100}), tmp_path / f"{name}.parquet",
                       compression="snappy")
    offset = pq.ParquetFile(tmp_path / "b.parquet").metadata.row_group(0).column(0).data_page_offset
    with open(tmp_path / "b.parquet", "r+b") as f:  # its footer intact (registration reads it), a data page not
        f.seek(offset)
        f.write(b"\xff" * 12)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").getOrCreate()  # the process's session, whichever master it runs
    s = dpsql.Session(budget=dpsql.Budget(100.0, 1e-3), engine="spark", spark=spark)
    try:
        use_noise(s, zero_noise())
        s.register("t", str(tmp_path / "*.parquet"), privacy_unit="uid", max_rows_per_unit=1)
        s._engine.spark.conf.set(setting, "true")  # type: ignore[attr-defined]
        with pytest.raises(ExecutionError, match="charge stands"):
            s.query("SELECT COUNT(*) AS n FROM t", epsilon=1.0)
        assert s._engine.spark.conf.get(setting) == "false"  # type: ignore[attr-defined]
    finally:
        s.close()


@pytest.mark.parametrize("where", ["flag", "variable", "config"])
def test_a_postgres_ledger_that_cannot_be_reached_is_named_in_cli_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str],
                                                                        where: str) -> None:
    """The CLI said 'hint: check the URL' without saying where the URL comes from: --ledger, $DPSQL_LEDGER or
    [ledger] url in the config file. No server needed: nothing listens on port 1."""
    from conftest import run_cli

    url = "postgresql://dpsql:s3cret@127.0.0.1:1/dpsql"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DPSQL_LEDGER", raising=False)
    argv = ["budget", "--history"]
    if where == "flag":
        argv = ["--ledger", url, *argv]
        named = "--ledger"
    elif where == "variable":
        monkeypatch.setenv("DPSQL_LEDGER", url)
        named = "$DPSQL_LEDGER"
    else:
        (tmp_path / "team.toml").write_text(f'[ledger]\nurl = "{url}"\n')
        argv = ["--config", "team.toml", *argv]
        named = "[ledger] url in 'team.toml'"
    assert run_cli(["--lock-timeout", "1", *argv]) == 4
    err = capsys.readouterr().err
    assert "the server refused the connection" in err and "s3cret" not in err, err
    assert f"hint: check the URL ({named})" in err, err


def test_uri_sources_reach_the_engine_instead_of_no_file_matches(tmp_path: Path) -> None:
    """docs/spark.md's sources ('s3a://lake/events/*.parquet', file://) were refused at registration by the catalog's
    local-file check as 'no file matches' (an InputUnavailableError, exit 66: "a retry may find it"), on every engine,
    and a config's URI source was joined to the config's directory. Now file:///PATH is the local PATH, and another
    scheme goes to the engine: the DuckDB engine refuses it by name (this test), Spark reads it (the next test)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import dpsql
    from dpsql.config import table_kwargs
    from dpsql.errors import ConfigError, InputUnavailableError

    pq.write_table(pa.table({"uid": list(range(20)), "x": [1] * 20}), tmp_path / "t.parquet")
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-6))
    try:
        s.register("a", f"file://{tmp_path}/t.parquet", privacy_unit="uid")
        s.register("b", f"file://{tmp_path}/*.parquet", privacy_unit="uid")
        assert s.tables["a"].files == (str(tmp_path / "t.parquet"),) == s.tables["b"].files
        with pytest.raises(ConfigError) as info:
            s.register("c", "s3a://lake/events/*.parquet", privacy_unit="uid")
        assert not isinstance(info.value, InputUnavailableError) and "Spark engine" in str(info.value), info.value
    finally:
        s.close()
    assert table_kwargs("e", {"source": "s3a://lake/events/*.parquet"}, str(tmp_path))["source"] == \
        "s3a://lake/events/*.parquet"


def test_a_uri_source_on_spark_is_read_by_spark(tmp_path: Path, needs_spark: None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import SparkSession

    import dpsql
    from dpsql.errors import ConfigError, InputUnavailableError
    from dpsql.testing import use_noise, zero_noise

    pq.write_table(pa.table({"uid": list(range(20)), "x": [1] * 20}), tmp_path / "t.parquet")
    spark = SparkSession.builder.master("local[2]").getOrCreate()  # the process's session, whichever master it runs
    s = dpsql.Session(budget=dpsql.Budget(10.0, 1e-6), engine="spark", spark=spark)
    try:
        use_noise(s, zero_noise())
        s.register("a", f"file://{tmp_path}/*.parquet", privacy_unit="uid")
        assert s.query("SELECT COUNT(*) AS n FROM a", epsilon=1.0).table.to_pylist() == [{"n": 20}]
        # no S3 file system here: Spark is asked, and its failure is the registration's ConfigError
        with pytest.raises(ConfigError, match="cannot read table source") as info:
            s.register("r", "s3a://lake/events/*.parquet", privacy_unit="uid")
        assert not isinstance(info.value, InputUnavailableError)
    finally:
        s.close()


def test_a_driver_heap_the_machine_cannot_give_is_named_with_memory_limit(tmp_path: Path, needs_spark: None) -> None:
    """A local driver dpsql starts with [engine] memory_limit as its heap: a heap the machine cannot reserve made the
    JVM exit, and pyspark's PySparkRuntimeError reached the caller. It is a ConfigError naming memory_limit."""
    proc = subprocess.run([sys.executable, "-c", "import dpsql\ntry:\n    dpsql.Session(budget=dpsql.Budget(1.0, 1e-6), "
                           "engine={'kind': 'spark', 'memory_limit': '900TB'})\nexcept dpsql.errors.ConfigError as e:\n"
                           "    print('RESULT', str(e).replace(chr(10), ' '))\n"], capture_output=True, text=True,
                          timeout=300, env=child_env())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    assert "memory_limit (900TB" in lines[0] and "nothing was charged" in lines[0], lines[0]
