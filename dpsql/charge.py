"""The part of a request after its charge: it reads private data, so what it shows is guarded.

``charged`` wraps execution and release: on any failure the ledger entry is marked failed (the
charge stands) and one generic ExecutionError is raised, whose text never depends on which
failure happened; every run is padded to the owner's ``min_response_time``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dpsql.engine import private_failure, scrub
from dpsql.errors import CHARGED_EXIT_CODE, DPSQLError, ExecutionError, LedgerError, interrupted_by_signal
from dpsql.interrupts import after_commit
from dpsql.ledger import Ledger

_T = TypeVar("_T")
_KEPT = threading.local()  # ``slot``: the Ctrl-C that :func:`record_release` holds for the innermost :func:`keeps_answer`

#: the ledger's failure reason for every run that failed after its charge (never data-dependent)
FAILURE_REASON = "failed after the charge (reason withheld: it could depend on private data)"


def reserve(ledger: Ledger, cost: Any, **entry: Any) -> int:
    """``ledger.reserve``; a ledger failure once the charge is durable (``recorded``: the query
    does not run, the charge stands), or whose COMMIT was sent but not acknowledged (``unacknowledged``:
    it may stand), exits like any failure after the charge."""
    try:
        return ledger.reserve(cost, **entry)
    except LedgerError as e:
        if e.recorded or e.unacknowledged:
            e.exit_code = CHARGED_EXIT_CODE
        raise


def record_release(ledger: Ledger, entry: int, commit: dict[str, Any], answer: Any = None) -> None:
    """``ledger.commit`` of a run that released; a failure to record it leaves the charge standing
    and releases nothing, so it exits like any failure after the charge. A failure once the release
    is recorded (``recorded``: in the ledger's write-ahead log, whose CHECKPOINT failed, e.g. on a
    full disk) is a warning: the answer, paid for and recorded, is returned (the next ledger operation
    writes the record into the file, or says what blocks it, charging nothing). Ctrl-C held back by the ledger
    until the release was committed is held for :func:`keeps_answer`, which raises it with the answer; ``answer``
    (the Release, built before it is recorded) is what :func:`keeps_answer` raises Ctrl-C with when it lands once
    the ledger has recorded the release (``Ledger.last_entry``), before the call returns it."""
    _KEPT.pending = (entry, answer)
    try:
        ledger.commit(entry, **commit)
    except DPSQLError as e:
        if isinstance(e, LedgerError) and e.recorded:
            text = (f"{e.message}; the answer is returned. Keep the write-ahead log next to the ledger: the next dpsql "
                    "operation writes it into the ledger file, or says what blocks it")
            try:
                warnings.warn(text, stacklevel=4)
            except Warning:
                # the program makes warnings errors (python -W error, warnings.simplefilter("error")): raised here, it
                # discarded the answer paid for and recorded as released; it is returned, the warning in its warnings
                kept = getattr(answer, "warnings", None)
                if isinstance(kept, list):
                    kept.append(text)
            return
        e.exit_code = CHARGED_EXIT_CODE
        if "is not returned" not in e.message:  # the ledger's words are about its entry: the answer's fate too
            e.message += "; the answer was charged but is not returned (asking again charges again)"
        if e.hint and "pass a larger lock_timeout" in e.hint:  # not 'retry': this charge stands, and again charges again
            e.hint = ("for later queries on a busy ledger, give a release a longer wait with a larger lock_timeout (it "
                      "waits lock_timeout plus 10 s, or twice lock_timeout if longer)")
        e.args = (e._render(),)
        raise
    except BaseException as e:
        slot = getattr(_KEPT, "slot", None)
        if slot is None or not after_commit(e):  # Ctrl-C that rolled the release back: the entry stays reserved
            raise
        slot.append(e)  # Ctrl-C held back until the release was committed: raised with the answer it paid for


def keeps_answer(run: Callable[..., _T]) -> Callable[..., _T]:
    """``run`` (a request that records its release with :func:`record_release`), such that Ctrl-C held back by the
    ledger while it recorded the release, and raised once the release was committed (the entry reads released, the
    charge stands), does not lose the answer: it is raised once ``run`` has built its Release, which it carries as
    its ``release`` attribute (the CLI saves it as after a failed write). A Ctrl-C that rolled the release back
    (the entry stays reserved) is raised as it comes, without one.

    ``run``'s first argument is the Session: Ctrl-C (or SIGTERM, SIGHUP under the CLI) that cut the request short
    anywhere once its charge was committed -- held back by the ledger until the charge's COMMIT, or landing before or
    after the part :func:`charged` guards -- carries, as :func:`charged` sets it, the entry and its status as the
    ledger has it (``ledger_entry``: ``(N, 'reserved')``, nothing released), from the ledger's note of it
    (``Ledger.last_entry``, in memory)."""

    @functools.wraps(run)
    def kept(*args: Any, **kwargs: Any) -> _T:
        held: list[BaseException] = []
        done: list[Any] = []  # the answer of a kept call inside this one (the Session's method around ``_run``)
        last = getattr(getattr(args[0], "_ledger", None), "last_entry", None) if args else None
        before = last() if last is not None else None
        outer, _KEPT.slot = getattr(_KEPT, "slot", None), held
        outer_done, _KEPT.done = getattr(_KEPT, "done", None), done
        answer: Any = done
        try:
            answer = run(*args, **kwargs)
            if outer_done is not None:
                outer_done.append(answer)
        except BaseException as e:
            if held:
                raise held[0].with_traceback(None)  # noqa: B904 - the Ctrl-C first (what failed after it: its context)
            if isinstance(e, Exception):
                raise
            found = answer if answer is not done else done[-1] if done else None
            now = last() if last is not None else None
            pending = getattr(_KEPT, "pending", None)  # the answer whose release the ledger has recorded (or not yet)
            if found is None and now is not None and now[1] == "released" and pending and pending[0] == now[0]:
                found = pending[1]
            if found is not None and getattr(e, "release", None) is None:  # Ctrl-C once the answer was built: kept
                e.release = found  # type: ignore[attr-defined]
            if getattr(e, "ledger_entry", None) is None and now is not None and now != before:
                e.ledger_entry = now  # type: ignore[attr-defined]  # this request's entry (each reserve has a new id)
            if found is not None or now != before:  # (the frames it was raised through, which read private rows: dropped)
                raise e.with_traceback(None)  # noqa: B904
            raise
        finally:
            _KEPT.slot, _KEPT.done = outer, outer_done
            if outer is None:
                _KEPT.pending = None
        if held:  # (raised anew from here: the frames it was raised through, which read private rows, are dropped)
            held[0].release = answer  # type: ignore[attr-defined]
            raise held[0].with_traceback(None)
        return answer

    return kept


@contextlib.contextmanager
def charged(ledger: Ledger, backend: Any, entry: int, what: str) -> Iterator[None]:
    """Run the part after the charge (it reads private data).

    On any failure the entry is marked failed (it still counts: the charge stands) and one
    generic ExecutionError is raised whose text depends only on ``what`` and the owner's
    settings: never on which failure happened (time-out, out of memory, a full temp
    directory, a solver failure, ...), since that could depend on the data. The ledger's
    failure reason is a constant. The original exception is not chained. In the owner's
    debug mode only, ``debug_detail`` carries its class and scrubbed message.
    Every run is padded by sleeping to the owner's ``min_response_time``, failures included.
    """
    start = time.monotonic()
    settings = backend.settings
    failure: BaseException | None = None
    # With a pad, the engine is held until the run ends: a request of another thread that needs it (a free explain's
    # bind check, another query's) waits for the padded end, not for the end of the read (which it would time)
    held = getattr(backend, "_lock", None) if settings.min_response_time > 0 else None
    entered = False
    try:
        if held is not None:
            entered = held.__enter__() or True
            start = time.monotonic()  # the pad from here: the wait for another run's padded end does not use it up
        yield
    except BaseException as e:
        if not isinstance(e, Exception):  # KeyboardInterrupt / SystemExit: keep them
            failure = e
        elif interrupted_by_signal(e):  # Ctrl-C while DuckDB ran a statement: still a KeyboardInterrupt
            failure = KeyboardInterrupt()
        else:
            detail = None
            if settings.debug:  # a backend without ``_detail`` (the engine's scrubbed message): the class alone
                detail = (scrub(e.debug_detail) if isinstance(e, ExecutionError) and e.debug_detail
                          else getattr(backend, "_detail", lambda e: type(e).__name__)(e))
            err = private_failure(what, detail, settings)
            after = ExecutionError(
                f"{what} failed after its budget was charged; the charge stands. "
                "The reason is withheld: it could depend on private data",
                hint=err.hint,
                debug_detail=err.debug_detail,
            )
            after.exit_code = CHARGED_EXIT_CODE
            failure = after
        withhold(e)
    finally:
        # A signal (Ctrl-C, SIGTERM) that stopped the read leaves the run to sleep to its padded time; so does the
        # first one that lands while the run sleeps (the read had ended): either way the run ends at the padded time,
        # so when it answers an interrupt does not tell whether the read had ended. A second signal ends it at once.
        signalled = failure is not None and not isinstance(failure, Exception)
        while (pad := settings.min_response_time - (time.monotonic() - start)) > 0:
            try:
                time.sleep(pad)
            except BaseException as e:  # Ctrl-C or SIGTERM while padding: the run fails, its entry is marked failed
                failure = e
                if signalled:
                    break
                signalled = True
        if entered and held is not None:
            held.__exit__(None, None, None)
    if failure is not None:
        marked = True
        try:
            ledger.fail(entry, FAILURE_REASON)
        except LedgerError:
            marked = False
        if not isinstance(failure, Exception):  # Ctrl-C, SIGTERM: the caller can say which entry its charge is
            # the same exception wherever the signal landed (in the read, or in the padding once the read had ended):
            # no chained exception, attribute or text of the place it was raised
            withhold(failure)
            failure.args = (failure.code,) if isinstance(failure, SystemExit) and failure.code is not None else ()
            failure.__context__ = failure.__cause__ = None
            failure.ledger_entry = (entry, "failed" if marked else "reserved")  # type: ignore[attr-defined]
        # (without the frames it was raised through: where a signal landed, in the read or in the padding, is not shown)
        raise failure.with_traceback(None) from None


def withhold(e: BaseException) -> None:
    """Drop the text, attributes and frames of a failure that may quote private data (and of
    the exceptions chained to it), so no reference to it can reveal a value later."""
    seen: set[int] = set()
    cur: BaseException | None = e
    stack = [e]
    while stack:
        cur = stack.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        stack += [cur.__context__, cur.__cause__]  # type: ignore[list-item]
        try:
            cur.args = ("<withheld>",)
            cur.__dict__.clear()
            cur.__traceback__ = None
            if isinstance(cur, SystemExit) and not isinstance(cur.code, int | None):  # Python prints a text code
                cur.code = CHARGED_EXIT_CODE
        except (AttributeError, TypeError):  # pragma: no cover - exotic exception types
            pass
