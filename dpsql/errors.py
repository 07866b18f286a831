"""The dpsql exception tree.

Every error says what failed, why in differential-privacy terms, and how to fix it.
No message may contain a private cell value: DuckDB messages (which can quote cells)
are kept on ``ExecutionError.debug_detail`` and shown only with ``--debug``.

    DPSQLError
    ├── QueryError(ValueError)      the SQL is the problem; raised before data is read
    │   ├── SQLSyntaxError          line, column, highlighted fragment
    │   ├── UnsupportedQueryError   valid SQL outside the DP subset; lists every violation
    │   └── PolicyError             needs metadata the catalog lacks
    ├── ConfigError(ValueError)     bad config, table spec or budget
    │   └── InputUnavailableError   an input file is missing or unreadable (may succeed once it is there)
    ├── BudgetExceededError         requested, remaining
    ├── LedgerError                 missing, not lockable, wrong schema version, corrupt
    │   └── LedgerBusyError         held by other operations past the lock time-out (may succeed later)
    └── ExecutionError              DuckDB failed on generated SQL
    (QueryTypeError is both a QueryError and an ExecutionError: DuckDB's binder refused it)

CLI exit codes: ``exit_code`` of each class (``NO_INPUT_EXIT_CODE``, 66, for InputUnavailableError;
``BUSY_EXIT_CODE``, 75, for LedgerBusyError); a failure after the charge (the charge stands), whatever its
class, exits ``CHARGED_EXIT_CODE`` (5), so that a script can tell whether budget was spent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def interrupted_by_signal(e: BaseException) -> bool:
    """Whether ``e`` is what DuckDB's Python client raises in place of the exception of a signal handler
    that ran during a statement (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's SystemExit): a plain
    ``RuntimeError('Query interrupted')``, or, when the handler ran while DuckDB scanned an object dpsql
    registered (an Arrow source), an InvalidInputException of exactly the shape below (matched whole, so
    that no message quoting a cell can take it). The statement time-out's ``interrupt()`` raises DuckDB's
    own ``InterruptException``, which is neither."""
    import re

    if type(e) is RuntimeError:
        return e.args == ("Query interrupted",)
    return type(e).__name__ == "InvalidInputException" and len(e.args) == 1 and isinstance(e.args[0], str) and bool(
        re.fullmatch(r"Invalid Input Error: [a-z ]+ of the object registered as '_dpsql_\w+' failed: KeyboardInterrupt: ",
                     e.args[0]))


#: CLI exit code of a failure after the charge: the query's budget was spent (its charge stands), and no answer
#: was delivered in full (a Session sets it on the error, whatever its class; the CLI also for its own failures)
CHARGED_EXIT_CODE = 5

#: CLI exit code of an input file that is missing or cannot be read (sysexits' EX_NOINPUT): a table's source, the
#: config, the -f SQL file; nothing was charged, and a scheduler may retry once the file is there
NO_INPUT_EXIT_CODE = 66

#: CLI exit code of a ledger held by other operations for longer than the command waits (sysexits' EX_TEMPFAIL):
#: nothing was changed, and the same command may succeed later
BUSY_EXIT_CODE = 75


def nearest_names(unknown: Any, allowed: Any) -> str:
    """``"; did you mean 'memory_limit' for 'memory_limt'?"`` for each unknown key or setting name that is close
    to an allowed one (names the owner typed: a config key, a column spec key, an engine setting), else ''."""
    import difflib

    allowed = [str(a) for a in allowed]
    guesses = [f"'{m[0]}' for '{u}'" for u in unknown
               if (m := difflib.get_close_matches(str(u).lower(), allowed, n=1, cutoff=0.6))]
    return f"; did you mean {', '.join(guesses)}?" if guesses else ""


class DPSQLError(Exception):
    """Base class of every error dpsql raises on purpose."""

    #: CLI exit code for this family of errors.
    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


@dataclass(frozen=True)
class Violation:
    """One problem found in a query, with its position (1-based; 0 if unknown)."""

    message: str
    line: int = 0
    col: int = 0
    fragment: str = ""

    def __str__(self) -> str:
        where = f" (line {self.line}, col {self.col})" if self.line else ""
        frag = f": {self.fragment}" if self.fragment else ""
        return f"{self.message}{frag}{where}"


class QueryError(DPSQLError, ValueError):
    """The SQL is the problem. Raised before any private row is read; costs nothing."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        violations: list[Violation] | None = None,
    ) -> None:
        self.violations = list(violations or [])
        if self.violations and len(self.violations) > 1:
            message = message + "\n" + "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(message, hint=hint)


class SQLSyntaxError(QueryError):
    """The text is not valid SQL."""

    def __init__(
        self, message: str, *, line: int = 0, col: int = 0, fragment: str = "", hint: str | None = None
    ) -> None:
        self.line = line
        self.col = col
        self.fragment = fragment
        super().__init__(message, hint=hint, violations=[Violation(message, line, col, fragment)])


class UnsupportedQueryError(QueryError):
    """Valid SQL outside the differentially private subset. Lists every violation."""


class PolicyError(QueryError):
    """The query needs metadata the catalog lacks (bounds, privacy unit, foreign key)."""


class ConfigError(DPSQLError, ValueError):
    """Bad configuration, table specification, or privacy parameters."""

    exit_code = 2

    #: the query options refused because the query does not read them (a request of several queries, such as a
    #: ROLLUP, passes each option to the queries that read it: ``dpsql.groupings``)
    inapplicable: frozenset[str] = frozenset()


class InputUnavailableError(ConfigError):
    """An input file is missing or cannot be read (not there yet, permission denied, replaced or removed while the
    command ran): a table's source file (or no file matches its glob), the config file, the SQL file of -f. Nothing
    was charged; unlike the other ConfigErrors, running again may succeed once the file is in place, so the CLI
    exits ``NO_INPUT_EXIT_CODE`` (66). A file that is there but holds the wrong thing (not Parquet, not UTF-8, a
    directory) is a plain ConfigError."""

    exit_code = NO_INPUT_EXIT_CODE


class BudgetExceededError(DPSQLError):
    """The request does not fit in the remaining budget. Nothing was charged."""

    exit_code = 3

    def __init__(self, message: str, *, requested: Any = None, remaining: Any = None, hint: str | None = None):
        self.requested = requested
        self.remaining = remaining
        super().__init__(message, hint=hint)


class LedgerError(DPSQLError):
    """The budget ledger is missing, cannot be locked, is of the wrong schema version, or is corrupt (held by others: LedgerBusyError).

    ``recorded`` is True when the failure came after the change was committed (a reserve's charge
    then stands). A Session sets ``exit_code`` to ``CHARGED_EXIT_CODE`` when the failure leaves a charge
    standing with nothing released, so that the CLI's exit code tells 'charged, then failed'.
    ``unacknowledged`` is True when the change's COMMIT was sent but not acknowledged (it may stand):
    a reserve then exits as charged too."""

    exit_code = 4
    recorded = False
    unacknowledged = False


class LedgerBusyError(LedgerError):
    """The ledger was held by other operations (other dpsql commands, threads, or a program that has the file open)
    for longer than this operation waits (``lock_timeout``): nothing was changed, and running it again later may
    succeed, so the CLI exits ``BUSY_EXIT_CODE`` (75), apart from a missing or damaged ledger (4). A release that
    could not be recorded for that reason came after its charge: it exits as charged (5), as every such failure."""

    exit_code = BUSY_EXIT_CODE


class ExecutionError(DPSQLError):
    """DuckDB failed on SQL that dpsql generated. The message carries no cell values."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, debug_detail: str | None = None):
        self.debug_detail = debug_detail
        super().__init__(message, hint=hint)


class QueryTypeError(QueryError, ExecutionError):
    """DuckDB refused the query while binding it (types, functions), before any row was read.

    Costs nothing. It is a QueryError (the SQL is the problem) and, for callers that catch
    what DuckDB reports, also an ExecutionError.
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None, debug_detail: str | None = None):
        super().__init__(message, hint=hint)
        self.debug_detail = debug_detail


__all__ = [
    "CHARGED_EXIT_CODE",
    "NO_INPUT_EXIT_CODE",
    "BUSY_EXIT_CODE",
    "DPSQLError",
    "Violation",
    "QueryError",
    "SQLSyntaxError",
    "UnsupportedQueryError",
    "PolicyError",
    "ConfigError",
    "InputUnavailableError",
    "BudgetExceededError",
    "LedgerError",
    "LedgerBusyError",
    "ExecutionError",
    "QueryTypeError",
]
