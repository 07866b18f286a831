"""dpsql: differentially private SQL over DuckDB.

Public names only; see README.md for a tour. Heavy modules (scipy, sqlglot) load lazily, so
``import dpsql.ledger`` and the CLI's help stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsql import errors
from dpsql.budget import Budget

if TYPE_CHECKING:
    from dpsql.release import Plan, Release, WorkloadRelease
    from dpsql.session import Session

__all__ = ["Session", "Budget", "Release", "WorkloadRelease", "Plan", "errors"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Session":
        from dpsql.session import Session

        return Session
    if name in ("Release", "Plan", "WorkloadRelease"):
        from dpsql import release

        return getattr(release, name)
    raise AttributeError(f"module 'dpsql' has no attribute {name!r}")
