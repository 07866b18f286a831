"""Objects a forked child inherited from its parent and must never destroy.

DuckDB's state does not survive fork: its worker threads exist only in the parent, so a database instance
destroyed in the child waits for ever to join them (a fork pool's worker whose initializer replaced a module's
Session by its own hung so) or crashes the process (a child ending with ``sys.exit``, or dropping the Session,
died of a segmentation fault). A py4j proxy of a Spark object, collected in the child, tells the parent's JVM
through the parent's socket to forget that object, which the parent still uses. The at-fork hooks of the engines
and of the ledger hand such objects to :func:`keep`: they then live until the child process ends, and are never
freed or finalised there (not at interpreter exit either, where a module's list would be emptied first).
"""

from __future__ import annotations

import ctypes


def keep(obj: object) -> None:
    """Never let ``obj`` be destroyed in this process: one reference no name holds (freed with the process)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
