"""Session fixtures shared by test files: a fresh session per test, and one per file for refusal-only tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def fresh_and_refusing(build: Callable[[], Any], fresh: str, refusing: str) -> tuple[Any, Any]:
    """Two fixtures over ``build()`` (a new Session): ``fresh``, a session per test, closed after it; ``refusing``, one
    session per file for the tests that only ask what it refuses: a refusal charges and records nothing (each such
    test checks so), so every one of them sees the session as new; a test that releases anything takes ``fresh``."""

    @pytest.fixture(name=fresh)
    def _fresh() -> Iterator[Any]:
        s = build()
        yield s
        s.close()

    @pytest.fixture(name=refusing, scope="module")
    def _refusing() -> Iterator[Any]:
        s = build()
        yield s
        s.close()

    return _fresh, _refusing
