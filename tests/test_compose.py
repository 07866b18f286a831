"""docker-compose.yml: the dpsql service, and under the ``cluster`` profile a Spark standalone master,
scalable workers and the PostgreSQL ledger, wired to each other and to examples/dpsql.cluster.toml."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dpsql.config import load_config

if importlib.util.find_spec("yaml") is None and os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
    raise RuntimeError("the compose file test needs PyYAML (the 'test' extra); DPSQL_REQUIRE_EXTRAS=1: it must run")
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


def _named_volumes(service: dict[str, Any]) -> list[str]:
    return [v.split(":", 1)[0] for v in service.get("volumes", []) if not v.startswith((".", "/"))]


def test_the_file_is_consistent(compose: dict[str, Any]) -> None:
    assert set(compose) <= {"services", "volumes"} | {k for k in compose if k.startswith("x-")}
    services = compose["services"]
    for name, svc in services.items():
        # every named volume is declared; every dependency exists and is started with it
        assert set(_named_volumes(svc)) <= set(compose["volumes"]), name
        for dep in svc.get("depends_on", []):
            assert dep in services, (name, dep)
            assert set(services[dep].get("profiles", [])) <= set(svc.get("profiles", [])), (name, dep)
        assert "image" in svc or "build" in svc, name
    # the dpsql service has no profile, so it may depend on no cluster service (compose would
    # refuse to start it without the profile): it finds the cluster by name at start instead
    assert "depends_on" not in services["dpsql"]
    used = {v for svc in services.values() for v in _named_volumes(svc)}
    assert used == set(compose["volumes"])  # none declared and unused


def test_only_loopback_ports_are_published(compose: dict[str, Any]) -> None:
    services = compose["services"]
    # the ledger and the master's RPC port stay inside the compose network
    assert "ports" not in services["postgres"] and "ports" not in services["dpsql"]
    for name, svc in services.items():
        for p in svc.get("ports", []):
            assert str(p).startswith("127.0.0.1:"), (name, p)
            assert not str(p).endswith(":7077"), (name, p)


def test_the_cluster_config_matches_the_services(compose: dict[str, Any]) -> None:
    s = compose["services"]
    cfg = load_config(ROOT / "examples" / "dpsql.cluster.toml")
    # every host the config names is a service of the cluster profile
    hosts = {urlsplit(cfg.engine.master or "").hostname, urlsplit(cfg.ledger_path or "").hostname}
    assert hosts == {"spark-master", "postgres"}
    assert all(s[h]["profiles"] == ["cluster"] for h in hosts)
    # the worker offers enough memory and cores for one executor of Spark's defaults (1g, 1 core)
    cmd = s["spark-worker"]["command"]
    assert int(cmd[cmd.index("--cores") + 1]) >= 1
    assert re.fullmatch(r"(\d+)g", cmd[cmd.index("--memory") + 1]) and int(cmd[cmd.index("--memory") + 1][:-1]) >= 1
    # the table sources the examples read exist in the repository (mounted at /app in every container)
    for c in ("dpsql.docker.toml", "dpsql.cluster.toml"):
        src = Path(str(load_config(ROOT / "examples" / c).tables["events"]["source"]))
        assert src.is_file() and src.is_relative_to(ROOT), (c, src)
    # the image installs the extras the cluster config needs: the PostgreSQL client and pyspark
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert ".[postgres]" in dockerfile and "pyspark==" in dockerfile


def test_the_default_command_runs_a_query_file_of_the_repository(compose: dict[str, Any]) -> None:
    cmd = compose["services"]["dpsql"]["command"]
    sql_file = cmd[cmd.index("-f") + 1]
    text = (ROOT / sql_file).read_text()
    assert re.search(r"\bFROM\s+events\b", text, re.I)
    assert float(cmd[cmd.index("--epsilon") + 1]) > 0


def _commands(text: str, markdown: bool) -> list[list[str]]:
    """The ``docker compose ...`` commands of a document: in Markdown the code spans (which may
    wrap), in the compose file its comment lines."""
    if markdown:
        found = re.findall(r"`(docker compose [^`]*)`", text) + re.findall(r"^(docker compose [^\n]*)", text, re.M)
    else:
        found = re.findall(r"docker compose [^\n]*", text)
    return [shlex.split(" ".join(m.split("#", 1)[0].split())) for m in found]


@pytest.mark.parametrize("doc", ["README.md", "docs/spark.md", "docker-compose.yml"])
def test_the_documented_commands_name_real_services_and_profiles(compose: dict[str, Any], doc: str) -> None:
    services = compose["services"]
    profiles = {p for svc in services.values() for p in svc.get("profiles", [])}
    cmds = _commands((ROOT / doc).read_text(), doc.endswith(".md"))
    assert any("--profile" in c and "up" in c for c in cmds), doc  # how to start the cluster is documented
    assert any(c[2:5] == ["run", "--rm", "dpsql"] for c in cmds), doc  # and how to run a query
    for c in cmds:
        if "--profile" in c:
            assert c[c.index("--profile") + 1] in profiles, (doc, c)
        if "--scale" in c:
            assert c[c.index("--scale") + 1].split("=")[0] in services, (doc, c)
        if "run" in c:
            assert c[c.index("run") + 2] in services, (doc, c)
