"""A throw-away PostgreSQL server for the ledger tests: a temp data directory, loopback only, a
random port, run by an unprivileged user (``initdb`` refuses root: as root the server runs as
``nobody``). ``start()`` returns None with the reason when PostgreSQL or psycopg is missing."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Server:
    url: str  # postgresql://dpsql@127.0.0.1:PORT/postgres
    port: int
    datadir: str
    bindir: str
    user: str | None

    def database(self, name: str) -> str:
        """A fresh database; returns its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}"')
            con.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + "/" + name

    def restart(self) -> None:
        """A fast restart (the server ends every connection, as at a fail-over or an upgrade)."""
        _run(self, [os.path.join(self.bindir, "pg_ctl"), "-D", self.datadir, "-m", "fast", "-w", "-l",
                   os.path.join(os.path.dirname(self.datadir), "log"), "restart"])

    def stop(self) -> None:
        _run(self, [os.path.join(self.bindir, "pg_ctl"), "-D", self.datadir, "-m", "immediate", "stop"], check=False)
        shutil.rmtree(os.path.dirname(self.datadir), ignore_errors=True)


def _bindir() -> str | None:
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(cands[-1]) if cands else None


def _run(s: Server, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if s.user is not None:
        cmd = ["runuser", "-u", s.user, "--", *cmd]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)


def start() -> tuple[Server | None, str]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None, "psycopg is not installed (pip install 'dpsql[postgres]')"
    bindir = _bindir()
    if bindir is None:
        return None, "PostgreSQL is not installed (apt-get install postgresql); .ci/run installs it"
    user = None
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return None, "running as root without runuser: cannot start PostgreSQL as an unprivileged user"
        user = "nobody"
    root = tempfile.mkdtemp(prefix="dpsql-pg-")
    datadir = os.path.join(root, "data")
    os.chmod(root, 0o777)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    s = Server(f"postgresql://dpsql@127.0.0.1:{port}/postgres", port, datadir, bindir, user)
    try:
        _run(s, [os.path.join(bindir, "initdb"), "-D", datadir, "-U", "dpsql", "-A", "trust", "--no-sync"])
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=60"
        _run(s, [os.path.join(bindir, "pg_ctl"), "-D", datadir, "-o", opts, "-l", os.path.join(root, "log"), "-w",
                 "start"])
    except (subprocess.SubprocessError, OSError) as e:
        shutil.rmtree(root, ignore_errors=True)
        return None, f"could not start PostgreSQL: {type(e).__name__}"
    return s, ""


def running_bouncer(s: Server) -> Iterator[str]:
    """A module fixture's body: pgbouncer in transaction mode (two server sessions shared by all its
    clients) in front of ``s``; yields its URL with the path left for a database name (``.../``);
    skipped where pgbouncer is not installed (a failure under ``DPSQL_REQUIRE_EXTRAS=1``)."""
    import pytest

    exe = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None)
    if exe is None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            pytest.fail("pgbouncer must be installed here (apt-get install pgbouncer); .ci/run installs it")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    root = tempfile.mkdtemp(prefix="dpsql-pgb-")
    os.chmod(root, 0o777)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ini = os.path.join(root, "pgbouncer.ini")
    with open(ini, "w") as f:
        f.write(f"[databases]\n* = host=127.0.0.1 port={s.port}\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
                f"listen_port = {port}\nauth_type = trust\nauth_file = {root}/users.txt\npool_mode = transaction\n"
                f"default_pool_size = 2\nunix_socket_dir =\nlogfile = {root}/log\npidfile = {root}/pid\n")
    with open(os.path.join(root, "users.txt"), "w") as f:
        f.write('"dpsql" ""\n')
    for name in os.listdir(root):
        os.chmod(os.path.join(root, name), 0o666)
    _run(s, [exe, "-d", ini])
    try:
        yield f"postgresql://dpsql@127.0.0.1:{port}/"
    finally:
        try:
            with open(os.path.join(root, "pid")) as f:
                os.kill(int(f.read().strip()), 15)
        except (OSError, ValueError):
            pass
        shutil.rmtree(root, ignore_errors=True)


def running_server() -> Iterator[Server]:
    """A module fixture's body: a started server, stopped afterwards; skipped where none can start
    (a failure instead under ``DPSQL_REQUIRE_EXTRAS=1``, as in CI)."""
    import pytest

    s, why = start()
    if s is None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"the PostgreSQL ledger tests must run here: {why}")
        pytest.skip(why)
    try:
        yield s
    finally:
        s.stop()
