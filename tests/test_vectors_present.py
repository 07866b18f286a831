"""The reference vectors are committed and their loader fails, never skips, when one is missing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _vectors import COMMITTED, VECTOR_FILES, load_vectors


@pytest.mark.parametrize("name", VECTOR_FILES)
def test_every_vector_file_is_committed_and_parses(name: str) -> None:
    path = COMMITTED / name
    assert path.is_file(), f"{path} is missing from the repository"
    assert isinstance(json.loads(path.read_text()), dict)


def test_a_missing_vector_file_fails_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSQL_SPEC_VECTORS", str(tmp_path))  # an empty directory
    with pytest.raises(pytest.fail.Exception, match="missing"):
        load_vectors("dawa.json")
    (tmp_path / "dawa.json").write_text("{not json")
    with pytest.raises(pytest.fail.Exception, match="cannot be read"):
        load_vectors("dawa.json")
    with pytest.raises(pytest.fail.Exception, match="unknown vector file"):
        load_vectors("nonexistent.json")


def test_no_test_skips_or_reads_vectors_on_its_own() -> None:
    """Every test that reads a vector file goes through the one loader (which fails when it is missing)."""
    here = Path(__file__).parent
    offenders = []
    for f in sorted(here.glob("test_*.py")):
        text = f.read_text()
        if re.search(r"DPSQL_SPEC_VECTORS|spec vectors not found|[\"']vectors[\"']", text) and f.name != Path(__file__).name:
            offenders.append(f.name)
    assert offenders == []
