"""Ctrl-C (SIGINT) held back in the main thread while dpsql takes and gives back what other threads and processes
wait for (a ledger's queue slot and lock, a Session's count of requests in flight); and SIGTERM and SIGHUP when the
program's handler for them is Python's (the CLI's raises, as Ctrl-C's does). Held back, "Ctrl-C" below means any of
them."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class HeldInterrupt:
    """Ctrl-C held back in the main thread while a ledger operation (``Ledger._txn``) or a Session's count of requests
    (``CatalogLock``) runs there: its handler (the KeyboardInterrupt, or the program's own) runs where it waits (:func:`interruption_point`: the queue,
    the lock, another program's DuckDB lock; :func:`interruptible`: a PostgreSQL ledger's wait for its lock or the server) or once it has given
    back all it took. Python runs a signal's handler
    between any two steps of the main thread, so a KeyboardInterrupt came between taking a queue slot and the
    ``try`` that gives it back (the waiter behind it then waited out its lock_timeout, and a release it held up
    failed after its charge), or after the thread was marked as inside an operation (every later operation of the
    thread refused), and it cut DuckDB's ledger statements short. SIGTERM and SIGHUP are held back alike when their
    handler is a Python function (the CLI's, which raises; a signal stays after the COMMIT of a release just as Ctrl-C
    does), each given back exactly afterwards. Other threads never run a signal's handler; a handler that is not a
    Python function (the default, which ends the program on SIGTERM, ignored, or None) is left alone."""

    def __init__(self) -> None:
        self.old: Any = None
        self.caught: list[tuple[int, Any]] = []
        self.nested = False
        self.open = False  # inside an :func:`interruptible` wait: Ctrl-C runs the program's handler there
        self.stands = False  # the operation's change is committed (:func:`change_stands`)
        self.passed: dict[int, Any] | None = None  # once given back: a holding handler still installed passes on

    def __enter__(self) -> HeldInterrupt:
        global HELD, NESTED
        if threading.current_thread() is not threading.main_thread():
            return self
        if HELD is not None:  # inside another's hold (a signal handler's operation): its Ctrl-C is the outer one's
            self.nested, NESTED = True, NESTED + 1
            return self
        olds = {sig: signal.getsignal(sig) for sig in _SIGNALS}
        olds = {sig: old for sig, old in olds.items() if callable(old)}  # not ignored, the default, nor set elsewhere
        if not olds:
            return self
        try:
            for sig in olds:
                signal.signal(sig, self._hold)  # (it runs pending signals' handlers once it has installed it)
            self.old, HELD = olds, self  # held from here: no handler runs that could raise
        except BaseException as e:
            # another signal's handler raised (a SIGALRM time-out's TimeoutError is an OSError, a SIGTERM not held
            # yet its KeyboardInterrupt): no __exit__ comes
            installed = any(signal.getsignal(sig) == self._hold for sig in olds)
            self.__exit__()
            for sig, old in olds.items():
                if signal.getsignal(sig) == self._hold:
                    signal.signal(sig, old)
            if isinstance(e, (ValueError, OSError)) and not installed:  # e.g. not the main interpreter
                return self
            raise
        return self

    def _hold(self, signum: int, frame: Any) -> None:
        if self.passed is not None and signum in self.passed:  # (left installed: another signal raised meanwhile)
            self.passed[signum](signum, frame)
            return
        if self.open and not NESTED and self.old and signum in self.old:
            self.old[signum](signum, frame)  # (its KeyboardInterrupt, raised inside the wait, which gives back what it took)
            return
        self.caught.append((signum, frame))

    def deliver(self, handlers: dict[int, Any]) -> None:
        """Run the handler in ``handlers`` of each signal held back so far (raising its KeyboardInterrupt); once the
        operation's change is committed, what it raises says so (:func:`after_commit`)."""
        while True:  # (a signal without a handler here stays held back: __exit__ gives it back to its disposition)
            first = next((i for i, (signum, _) in enumerate(self.caught) if signum in handlers), None)
            if first is None:
                return
            signum, frame = self.caught.pop(first)
            try:
                handlers[signum](signum, frame)
            except BaseException as e:
                self._mark(e)
                raise

    def _mark(self, e: BaseException) -> None:
        if self.stands:
            try:
                e.dpsql_after_commit = True  # type: ignore[attr-defined]
            except AttributeError:  # pragma: no cover - an exception type without attributes
                pass

    def __exit__(self, *exc: object) -> None:
        global HELD, NESTED
        if self.nested:
            self.nested, NESTED = False, NESTED - 1
        olds, self.old = self.old, None
        if olds is None:
            return
        if HELD is self:
            HELD = None
        handlers: dict[int, Any] = {}
        try:
            for sig, old in olds.items():
                now = signal.getsignal(sig)
                if now == self._hold:  # not replaced meanwhile (by another signal's handler)
                    signal.signal(sig, old)
                    handlers[sig] = old
                elif callable(now):  # the program's handler now: the signal held back goes to it
                    handlers[sig] = now
                else:  # ignored now, the default (it ends the program), or not set from Python: left to it
                    caught = [c for c in self.caught if c[0] == sig]
                    self.caught = [c for c in self.caught if c[0] != sig]
                    if caught and now == signal.SIG_DFL:
                        signal.raise_signal(sig)
        except BaseException as e:  # a signal given back already came again meanwhile: its handler raised here
            self._mark(e)
            raise
        finally:
            self.passed = olds
        self.deliver(handlers)


_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
HELD: HeldInterrupt | None = None  # the main thread's, while it holds Ctrl-C back
NESTED = 0  # operations of the main thread inside HELD's (a signal handler's): Ctrl-C is not raised in them


def interruption_point() -> None:
    """Where an operation holding Ctrl-C back waits, with all it took so far given back if this raises: Ctrl-C held back in the main
    thread is raised here (a wait for a lock is not held up)."""
    held = HELD
    if held is not None and held.caught and not NESTED and threading.current_thread() is threading.main_thread():
        handlers = {}
        for sig, old in (held.old or {}).items():
            now = signal.getsignal(sig)  # the program's, if one of its handlers replaced the holding one
            if now == held._hold or callable(now):
                handlers[sig] = old if now == held._hold else now
        held.deliver(handlers)


@contextmanager
def interruptible() -> Iterator[None]:
    """A wait of an operation holding Ctrl-C back that cannot poll for it: a blocking call into a driver that gives back
    what it took when a signal's handler raises inside it (psycopg cancels the statement on the server, e.g. one
    waiting for the PostgreSQL ledger's lock). Ctrl-C held back so far is raised at its start, and one that comes
    during it runs the program's handler there; around it, Ctrl-C stays held back. The caller gives back what the
    operation took if this raises, as at an :func:`interruption_point`."""
    held = HELD
    if held is None or held.open or NESTED or threading.current_thread() is not threading.main_thread():
        yield
        return
    held.open = True  # first: a Ctrl-C that comes from here on runs the handler, none waits out the wait held back
    try:
        interruption_point()
        yield
    finally:
        held.open = False


def change_stands() -> None:
    """Called by an operation holding Ctrl-C back once its COMMIT returned: its change stands whatever comes next, and
    a Ctrl-C held back that is raised from here on (once it has given back all it took) carries that
    (:func:`after_commit`), so that its caller can still hand over what the change paid for (a release's answer)."""
    held = HELD
    if held is not None and not NESTED and threading.current_thread() is threading.main_thread():
        held.stands = True


def after_commit(e: BaseException) -> bool:
    """Whether ``e`` was raised by Ctrl-C held back during a ledger operation whose change was committed already."""
    return getattr(e, "dpsql_after_commit", False) is True


def _after_fork() -> None:
    """A child forked (by another thread) while the main thread held Ctrl-C back: nothing in the child gives it back, so
    it starts with the program's own handler and no hold (Ctrl-C held back in the parent stays the parent's)."""
    global HELD, NESTED
    held, HELD, NESTED = HELD, None, 0
    if held is not None and held.old is not None:
        try:
            for sig, old in held.old.items():
                if signal.getsignal(sig) == held._hold:
                    signal.signal(sig, old)
        except (ValueError, OSError):  # pragma: no cover - the child's forking thread is its main thread
            pass


os.register_at_fork(after_in_child=_after_fork)
