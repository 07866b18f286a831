"""The one loader of the reference test vectors committed in ``tests/vectors`` (copies of the
spec's ``vectors/``; formulas and provenance in ``tests/vectors/README.md``).

A missing or unreadable vector file FAILS the test that asked for it: the vectors are part of
the repository, so a test that silently skipped them would pass without checking anything.
``DPSQL_SPEC_VECTORS`` may point at another copy (e.g. a newer spec); the same rule applies there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

#: every vector file the tests read; each must be committed under tests/vectors
VECTOR_FILES = (
    "conversions.json",
    "dawa.json",
    "discrete_gaussian.json",
    "dp_s4s.json",
    "gaussian_mechanism.json",
    "sparse_histogram.json",
)

COMMITTED = Path(__file__).parent / "vectors"


def vectors_dir() -> Path:
    return Path(os.environ.get("DPSQL_SPEC_VECTORS") or COMMITTED)


def load_vectors(name: str) -> Any:
    """The parsed JSON of vector file ``name``; fails the calling test if it is missing."""
    if name not in VECTOR_FILES:
        pytest.fail(f"unknown vector file {name!r}: add it to tests/vectors and to VECTOR_FILES in tests/_vectors.py")
    path = vectors_dir() / name
    if not path.is_file():
        pytest.fail(
            f"reference vector file {path} is missing: it is committed in tests/vectors "
            "(copy it from the spec's vectors/ directory, or unset DPSQL_SPEC_VECTORS)"
        )
    try:
        with path.open() as fh:
            return json.load(fh)
    except (OSError, ValueError) as e:
        pytest.fail(f"reference vector file {path} cannot be read as JSON: {e}")
