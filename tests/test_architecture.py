"""Design invariants checked on the source: one-way data flow, one place for DuckDB, one noise
source, no seeds in the public API."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import dpsql

PKG = pathlib.Path(dpsql.__file__).parent


def imports_of(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def modules_under(sub: str) -> list[pathlib.Path]:
    return sorted((PKG / sub).rglob("*.py")) if (PKG / sub).is_dir() else [PKG / f"{sub}.py"]


def forbidden(paths: list[pathlib.Path], prefixes: tuple[str, ...]) -> list[str]:
    bad = []
    for p in paths:
        for imp in imports_of(p):
            if imp.startswith(prefixes):
                bad.append(f"{p.relative_to(PKG)} imports {imp}")
    return bad


def test_plan_is_pure_and_reads_no_data():
    # analysis reads only public metadata: no DuckDB, no numpy, nothing later in the flow
    assert forbidden(
        modules_under("plan"),
        ("duckdb", "numpy", "dpsql.engine", "dpsql.session", "dpsql.mechanisms", "dpsql.ledger", "dpsql.rewrite"),
    ) == []


#: engine modules that only build ASTs (the backend contract and the backends' building
#: blocks): the rewrite layer may use them, never a backend that executes
PURE_ENGINE_MODULES = ("dpsql.engine.base", "dpsql.engine.duckdb_ops")


def test_rewrite_does_not_execute():
    bad = forbidden(modules_under("rewrite"), ("duckdb", "dpsql.engine", "dpsql.session", "dpsql.mechanisms", "dpsql.ledger"))
    assert [b for b in bad if not b.split(" imports ")[1].startswith(PURE_ENGINE_MODULES)] == []


def test_pure_engine_modules_execute_nothing():
    # what the rewrite layer may import from the engine package builds ASTs only
    paths = [PKG / "engine" / f"{m.rsplit('.', 1)[1]}.py" for m in PURE_ENGINE_MODULES]
    assert all(p.exists() for p in paths), paths
    assert forbidden(paths, ("duckdb", "dpsql.engine.duckdb", "dpsql.engine._duckdb", "dpsql.session",
                             "dpsql.mechanisms", "dpsql.ledger", "dpsql.rewrite.bound")) == []


def test_import_checker_can_fail():
    assert forbidden(modules_under("engine"), ("duckdb",)) != []  # the backend itself does


def test_mechanisms_and_accounting_do_not_reach_back():
    bad = forbidden(modules_under("mechanisms"), ("dpsql.session", "dpsql.engine", "dpsql.ledger", "dpsql.cli", "duckdb"))
    # a mechanism builds its bounded relation over the backend's building blocks (the pure contract only)
    assert [b for b in bad if not b.split(" imports ")[1].startswith("dpsql.engine.base")] == []
    assert forbidden(
        modules_under("accounting"),
        ("dpsql.session", "dpsql.engine", "dpsql.ledger", "dpsql.mechanisms", "dpsql.plan", "dpsql.rewrite", "duckdb"),
    ) == []


def test_only_engine_and_ledger_talk_to_duckdb():
    users = []
    for p in PKG.rglob("*.py"):
        if any(i == "duckdb" or i.startswith("duckdb.") for i in imports_of(p)):
            users.append(str(p.relative_to(PKG)))
    engine = [u for u in users if u.startswith("engine/")]
    assert sorted(set(users) - set(engine)) == sorted(["session.py", "ledger/_store.py"]), users
    # inside the engine package: the DuckDB backend only (its building blocks and the backend
    # contract build ASTs and import no database library)
    assert engine == ["engine/duckdb.py"], engine


def test_session_executes_sql_only_through_the_engine():
    src = (PKG / "session.py").read_text()
    # the session may hold a caller's connection, but never runs SQL text on it itself
    assert not re.search(r"\.(execute|sql)\(", src.replace("self._engine.", "")), "SQL executed outside the engine"


def test_no_global_or_seedable_rng_in_releases():
    offenders = []
    for p in PKG.rglob("*.py"):
        if p.name == "testing.py" or p.parent.name == "ledger":
            continue  # test helpers; the ledger's lock-retry jitter touches no data
        text = p.read_text()
        for pat in (r"np\.random\.", r"numpy\.random", r"\bimport random\b", r"default_rng"):
            if re.search(pat, text):
                offenders.append(f"{p.relative_to(PKG)}: {pat}")
    assert offenders == []


def test_public_api_has_no_seed():
    for name in ("__init__", "query", "explain", "query_many", "register"):
        params = inspect.signature(getattr(dpsql.Session, name)).parameters
        assert not any("seed" in p or p == "rng" for p in params), name


def test_every_mechanism_module_states_its_privacy_claim():
    for mod in ("basic", "sparse_histogram", "dawa", "ranges"):
        text = (PKG / "mechanisms" / f"{mod}.py").read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        assert "Privacy claim" in doc or "privacy claim" in doc.lower(), mod
        assert "neighbour" in doc.lower(), mod
