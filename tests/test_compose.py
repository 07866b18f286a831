"""docker-compose.yml: the dpsql service, and under the ``cluster`` profile a Spark standalone master,
scalable workers and the PostgreSQL ledger, wired to each other and to examples/dpsql.cluster.toml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dpsql.config import load_config

yaml = pytest.importorskip("yaml", reason="the compose file test needs PyYAML (the 'test' extra)")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"dpsql", "spark-master", "spark-worker", "postgres"}
    assert "profiles" not in services["dpsql"]  # `docker compose run --rm dpsql` works without the cluster
    for name in ("spark-master", "spark-worker", "postgres"):
        assert services[name]["profiles"] == ["cluster"], name


def test_spark_wiring(compose: dict[str, Any]) -> None:
    s = compose["services"]
    master_cmd = s["spark-master"]["command"]
    assert "org.apache.spark.deploy.master.Master" in master_cmd
    host = master_cmd[master_cmd.index("--host") + 1]
    port = master_cmd[master_cmd.index("--port") + 1]
    assert host == "spark-master"
    worker = s["spark-worker"]
    assert "org.apache.spark.deploy.worker.Worker" in worker["command"]
    assert f"spark://{host}:{port}" in worker["command"]
    assert "spark-master" in worker["depends_on"]
    # scalable: no fixed name, no host port
    assert "container_name" not in worker and "ports" not in worker
    assert worker["deploy"]["replicas"] >= 2
    # the driver's pyspark matches the cluster's Spark; workers read Parquet at the driver's paths
    version = s["spark-master"]["image"].rsplit(":", 1)[1]
    assert s["spark-worker"]["image"] == s["spark-master"]["image"]
    assert s["dpsql"]["build"]["args"]["SPARK_VERSION"] == version
    assert version.startswith("4.")
    for name in ("spark-master", "spark-worker"):
        assert ".:/app" in s[name]["volumes"], name
    # the dpsql container: the repository read-only, its ledger in a volume of its own, not as root
    assert ".:/app:ro" in s["dpsql"]["volumes"] and "dpsql-ledger:/data" in s["dpsql"]["volumes"]
    assert "dpsql-ledger" in compose["volumes"]
    cfg = load_config(ROOT / "examples" / "dpsql.cluster.toml")
    assert cfg.engine.kind == "spark" and cfg.engine.master == f"spark://{host}:{port}"
    assert str(cfg.tables["events"]["source"]).startswith(str(ROOT))  # /app/... in the containers
    dockerfile = (ROOT / s["dpsql"]["build"]["context"] / s["dpsql"]["build"]["dockerfile"]).read_text()
    assert "openjdk-17" in dockerfile and "pyspark==${SPARK_VERSION}" in dockerfile
    assert re.search(r"^FROM python:3\.11\.\d+-slim", dockerfile, re.M) and re.search(r"^USER dpsql$", dockerfile, re.M)
    docker_cfg = load_config(ROOT / "examples" / "dpsql.docker.toml")
    assert docker_cfg.ledger_path == "/data/example_ledger.duckdb"


def test_ledger_wiring(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    env = pg["environment"]
    url = load_config(ROOT / "examples" / "dpsql.cluster.toml").ledger_path
    assert url is not None
    u = urlsplit(url)
    assert u.scheme == "postgresql" and u.hostname == "postgres" and u.port == 5432
    assert (u.username, u.password, u.path.lstrip("/")) == (env["POSTGRES_USER"], env["POSTGRES_PASSWORD"],
                                                             env["POSTGRES_DB"])
    assert "ledger" in compose["volumes"] and any(v.startswith("ledger:") for v in pg["volumes"])
    assert "pg_isready" in pg["healthcheck"]["test"]


def test_dpsql_picks_the_cluster_config_when_the_cluster_is_up(compose: dict[str, Any]) -> None:
    d = compose["services"]["dpsql"]
    script = " ".join(d["entrypoint"])
    assert "examples/dpsql.docker.toml" in script and "examples/dpsql.cluster.toml" in script
    assert re.search(r"getent hosts spark-master", script)
    assert "DPSQL_SPARK_DRIVER_HOST" in script  # executors connect back to the driver's address
    assert d["command"][0] == "query"
    for c in ("dpsql.toml", "dpsql.docker.toml", "dpsql.cluster.toml"):
        assert load_config(ROOT / "examples" / c).tables["events"]
