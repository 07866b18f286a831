"""A real Spark cluster: a standalone master and two workers, each its own local process started
from the installed pyspark (``spark-class ...deploy.master.Master`` / ``...deploy.worker.Worker``).

A client process (one SparkContext per process, so not this one) runs a sparse-histogram query,
a DAWA workload, two join queries (DP-S4S: one owner, several people per tuple) and a GROUP BY
over a join (Algorithm 5's sample over a declared key set) through ``spark://127.0.0.1:<port>``
with zero noise; its bounded aggregates (and the joins' truncated sums and sampled tuples, the
grouped join's key set and sampled tuples) must equal DuckDB's (portable keyed hash) on the same
data, and its zero-noise releases too. Marked slow (about 40 s on 2 cores); CI runs it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_spark import QUERIES, WORKLOAD, assert_same, bounded_rows, events, session

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.3)
    return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or shutil.which("java") is None:
        why = "a Spark cluster needs pyspark and Java 17"
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    assert spec.origin is not None
    home = os.path.dirname(spec.origin)
    spark_class = os.path.join(home, "bin", "spark-class")
    root = tmp_path_factory.mktemp("cluster")
    env = dict(os.environ, SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(root),
               SPARK_WORKER_DIR=str(root / "work"))
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(_free_port())], env=env,
                              stdout=open(root / "master.log", "w"), stderr=subprocess.STDOUT)]
    try:
        assert _wait_port(port, time.monotonic() + 90), "the master did not start"
        for i in range(2):
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                 "--cores", "1", "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir",
                 str(root / f"work{i}")], env=env, stdout=open(root / f"worker{i}.log", "w"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both workers registered with the master
            if (root / "master.log").read_text().count("Registering worker") >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the workers did not register")
        yield master_url
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


CLIENT = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[3])
    from test_spark import QUERIES, WORKLOAD, bounded_rows, register
    import test_spark_joins as J
    import dpsql
    from dpsql.testing import use_noise, zero_noise
    data = json.loads(sys.argv[2])
    s = dpsql.Session(budget=dpsql.Budget(1000.0, 0.5), engine={"kind": "spark", "master": sys.argv[1]})
    use_noise(s, zero_noise(11))
    register(s, data, only=("events", "people"))  # the tables queried here
    out = {"master": s._engine.spark.sparkContext.master,
           "executors": s._engine.spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size(),
           "sparse": bounded_rows(s, QUERIES["sparse_keys"], "cluster salt"),
           "workload": bounded_rows(s, WORKLOAD, "cluster salt"),
           "release": s.query(QUERIES["sparse_keys"], epsilon=1.0, delta=1e-5).table.to_pylist(),
           "dawa": s.query_many(WORKLOAD, epsilon=1.0).table.to_pylist()}
    s.close()
    j = J.make("spark", J.fk_data(), master=sys.argv[1])
    out["joins"] = {n: J.canonical(J.bounded(j, n, "cluster salt")) for n in ("chain_count_sampled", "path2_sampled")}
    out["grouped"] = J.grouped_canonical(J.grouped_bounded(j, "sampled_declared_count", "cluster salt")[1])
    j.close()
    print(json.dumps(out, default=str))
''')


def test_sparse_histogram_and_dawa_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:
    ev = events()
    pq.write_table(ev.slice(0, ev.num_rows // 2), tmp_path / "events-1.parquet")
    pq.write_table(ev.slice(ev.num_rows // 2), tmp_path / "events-2.parquet")
    import numpy as np
    import pyarrow as pa

    gen = np.random.default_rng(3)
    uid = np.repeat(np.arange(400), gen.integers(1, 8, 400))
    pq.write_table(pa.table({"pid": pa.array(uid, pa.int64()), "age": pa.array(gen.integers(0, 100, len(uid)), pa.int64()),
                             "region": pa.array(np.where(gen.random(len(uid)) < 0.5, "north", "south"), pa.string())}),
                   tmp_path / "people.parquet")
    data = {"events": str(tmp_path / "events-*.parquet"), "people": str(tmp_path / "people.parquet")}
    tests_dir = str(Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", CLIENT, cluster, json.dumps(data), tests_dir], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [tests_dir, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["master"] == cluster and got["executors"] >= 3  # the driver and two workers' executors
    duck = session("duckdb", data)
    try:
        assert_same(bounded_rows(duck, QUERIES["sparse_keys"], "cluster salt"), got["sparse"])
        assert_same(bounded_rows(duck, WORKLOAD, "cluster salt"), got["workload"])
        assert_same(duck.query(QUERIES["sparse_keys"], epsilon=1.0, delta=1e-5).table.to_pylist(), got["release"])
        assert_same(duck.query_many(WORKLOAD, epsilon=1.0).table.to_pylist(), got["dawa"])
    finally:
        duck.close()
    # joins: the same truncated sums / sampled tuples (JSON turns tuples into lists)
    import test_spark_joins as J

    dj = J.make("duckdb", J.fk_data())
    try:
        for name, rows in got["joins"].items():
            assert rows and json.loads(json.dumps(J.canonical(J.bounded(dj, name, "cluster salt")))) == rows, name
        # a GROUP BY over a join (Algorithm 5's sample over a declared key set): the same key set and tuples
        grouped = J.grouped_canonical(J.grouped_bounded(dj, "sampled_declared_count", "cluster salt")[1])
        assert grouped[1] and json.loads(json.dumps(grouped)) == got["grouped"]
    finally:
        dj.close()
