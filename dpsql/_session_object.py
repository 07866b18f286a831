"""How a :class:`dpsql.Session` presents itself as a Python object: its ``repr``, its refusal to be pickled, and
``with`` (closed at the end).

``repr(session)`` names what the caller configured and nothing else: the ledger as the ledger's own ``repr``
(a file's absolute path, ``':memory:'``, or a PostgreSQL URL with its password removed), the engine's kind, the
registered table names (public metadata) and whether the session is closed. It reads nothing from the ledger:
a ``repr`` must not block on the ledger's lock, fail, or open a closed ledger (debuggers and logs call it at any
time); the budget is ``session.total()`` / ``session.remaining()``.
"""

from __future__ import annotations

from typing import Any, Self


class SessionObject:
    """Mixin for :class:`dpsql.Session` (which provides ``_ledger``, ``_engine``, ``_catalog``, ``_closed``)."""

    def __repr__(self) -> str:
        d = self.__dict__
        if "_ledger" not in d:  # construction failed before the ledger was opened
            return f"<dpsql.Session (not opened) at {id(self):#x}>"
        settings = getattr(d.get("_engine"), "settings", None)
        engine = getattr(settings, "kind", None) or type(d.get("_engine")).__name__
        tables = sorted(d.get("_catalog", {}))
        state = ", closed" if d.get("_closed") else ""
        return f"dpsql.Session(ledger={d['_ledger']!r}, engine={engine!r}, tables={tables!r}{state})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:  # its engine, catalog views and in-memory ledger live in this process only
        raise TypeError("a dpsql Session cannot be pickled or sent to another process: open one in each process (dpsql.Session.from_config(...)) on a ledger file, which every process shares")
