"""dpsql: differentially private SQL over DuckDB.

Public names only; see README.md for a tour.
"""

from dpsql import errors
from dpsql.budget import Budget
from dpsql.release import Plan, Release
from dpsql.session import Session

__all__ = ["Session", "Budget", "Release", "Plan", "errors"]
__version__ = "0.1.0"
