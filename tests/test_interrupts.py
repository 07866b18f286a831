"""Ctrl-C held back in the main thread (``dpsql.interrupts.HeldInterrupt``, during a ledger operation or a Session's
count of requests) against the program's other signal handling: a fork by another thread, another signal's handler
that raises, replaces the SIGINT handler, or runs dpsql itself while Ctrl-C is held back."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from dpsql import interrupts

pytestmark = pytest.mark.usefixtures("python_sigint")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_during_a_hold_gets_the_programs_handler_back() -> None:
    """The child inherits the holding handler, and nothing in it ever gives Ctrl-C back: every Ctrl-C of the child was
    swallowed, and the child never held Ctrl-C back in its own ledger operations (it found the parent's hold in place).
    The child starts with the program's own handler and no hold."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    result: dict[str, int] = {}

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # the child: its Ctrl-C must raise KeyboardInterrupt, and a new hold must hold
            code = 1
            try:
                ok = interrupts.HELD is None and signal.getsignal(signal.SIGINT) is signal.default_int_handler
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    for _ in range(1000):
                        pass
                except KeyboardInterrupt:
                    code = 0 if ok else 2
            finally:
                sys.stdout.flush()
                os._exit(code)
        result["status"] = os.waitpid(pid, 0)[1]

    with interrupts.HeldInterrupt():
        t = threading.Thread(target=fork)
        t.start()
        t.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert os.waitstatus_to_exitcode(result["status"]) == 0


@pytest.mark.parametrize("error", [TimeoutError, RuntimeError])
def test_another_signals_exception_while_the_hold_is_installed_leaves_no_hold(monkeypatch: pytest.MonkeyPatch,
                                                                              error: type) -> None:
    """signal.signal() runs the handlers of signals already pending once it has installed the new handler: a SIGALRM
    handler that raises (a time-out) then raised out of HeldInterrupt's __enter__ with the holding handler installed
    and no __exit__ to come, so every later Ctrl-C of the program was swallowed (a TimeoutError, an OSError, was
    taken for signal.signal's own refusal and swallowed too: the program's time-out was lost)."""
    real = signal.signal

    def pending_alarm(signum: int, handler: object) -> object:
        old = real(signum, handler)
        if getattr(handler, "__self__", None).__class__ is interrupts.HeldInterrupt:
            raise error("the program's SIGALRM handler")
        return old

    monkeypatch.setattr(signal, "signal", pending_alarm)
    with pytest.raises(error):
        with interrupts.HeldInterrupt():
            pass
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.HELD is None


@pytest.mark.parametrize("replaced_by", ["handler", "ignore"])
def test_ctrl_c_held_back_goes_to_the_handler_installed_meanwhile(replaced_by: str) -> None:
    """Another signal's handler installs the program's new SIGINT handler while Ctrl-C is held back: the handler stays,
    and a Ctrl-C held back before goes to it (it went to the handler replaced, raising KeyboardInterrupt), or nowhere
    when SIGINT is now ignored."""
    seen: list[int] = []
    new = (lambda signum, frame: seen.append(signum)) if replaced_by == "handler" else signal.SIG_IGN
    try:
        with interrupts.HeldInterrupt():
            signal.raise_signal(signal.SIGINT)  # held back
            signal.signal(signal.SIGINT, new)  # as a SIGUSR1 handler of the program would
        assert signal.getsignal(signal.SIGINT) is new
        assert seen == ([signal.SIGINT] if replaced_by == "handler" else [])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_ctrl_c_held_back_is_not_raised_inside_an_operation_nested_in_a_held_one() -> None:
    """A program's other signal handler (SIGTERM, SIGALRM) that runs dpsql while the main thread holds Ctrl-C back in
    a ledger operation: the nested operation's waits raised the outer one's held Ctrl-C, which then came out of the
    handler at whatever step of the outer operation it interrupted (between taking a queue slot and the try that gives
    it back). It is raised by the outer operation, where it waits or once all is given back."""
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.HeldInterrupt():
            signal.raise_signal(signal.SIGINT)  # held back
            with interrupts.HeldInterrupt():  # the other handler's operation
                interrupts.interruption_point()
                steps.append("nested done")
            steps.append("outer step")
            interrupts.interruption_point()
            steps.append("not reached")
    assert steps == ["nested done", "outer step"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.HELD is None


def test_an_interruptible_wait_raises_ctrl_c_there_and_nowhere_else() -> None:
    """``interruptible`` (a blocking driver call of an operation holding Ctrl-C back, e.g. the PostgreSQL ledger's wait
    for its lock): Ctrl-C held back before it is raised at its start; one that comes during it runs the handler there
    (psycopg then cancels the statement); once it is over, Ctrl-C is held back again. Outside a hold, and in an
    operation nested in a held one (a signal handler's), it changes nothing."""
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.HeldInterrupt():
            signal.raise_signal(signal.SIGINT)  # held back
            steps.append("held")
            with interrupts.interruptible():
                steps.append("not reached")
    with pytest.raises(KeyboardInterrupt):
        with interrupts.HeldInterrupt():
            with interrupts.interruptible():
                steps.append("waits")
                signal.raise_signal(signal.SIGINT)  # raised here
                steps.append("not reached")
    with interrupts.HeldInterrupt() as held:
        with interrupts.interruptible():
            steps.append("done")
        signal.raise_signal(signal.SIGINT)  # held back again
        steps.append("after")
        caught, held.caught = list(held.caught), []
        with interrupts.HeldInterrupt():  # nested: nothing is raised in it
            signal.raise_signal(signal.SIGINT)
            with interrupts.interruptible():
                signal.raise_signal(signal.SIGINT)
                steps.append("nested")
        held.caught = []
    assert len(caught) == 1
    with interrupts.interruptible():  # outside a hold: nothing to do
        steps.append("outside")
    assert steps == ["held", "waits", "done", "after", "nested", "outside"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.HELD is None


def test_ctrl_c_just_before_an_interruptible_wait_opens_is_raised_in_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C that comes after ``interruptible`` raised what was held back before it but before the wait opened (one
    step of the main thread) is raised at the wait's start, not held for the whole wait (a PostgreSQL ledger's lock
    waits up to lock_timeout)."""
    original = interrupts.interruption_point

    def then_ctrl_c() -> None:
        original()
        signal.raise_signal(signal.SIGINT)  # comes right after the check

    monkeypatch.setattr(interrupts, "interruption_point", then_ctrl_c)
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.HeldInterrupt():
            with interrupts.interruptible():
                steps.append("waits")  # not reached: the Ctrl-C is raised before the wait
            steps.append("after the wait")
    assert steps == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and interrupts.HELD is None


class _Term(KeyboardInterrupt):
    """What a program's SIGTERM/SIGHUP handler raises (the CLI's does so)."""


HELD_SIGNALS = ["SIGINT", "SIGTERM"] + (["SIGHUP"] if hasattr(signal, "SIGHUP") else [])


@pytest.mark.parametrize("name", HELD_SIGNALS)
@pytest.mark.parametrize("committed", [False, True])
def test_a_signal_whose_handler_raises_is_held_and_its_handler_given_back(name: str, committed: bool) -> None:
    """SIGTERM and SIGHUP handlers that raise (the CLI's) ran at any step of a ledger operation, as Ctrl-C did before it
    was held back: they are held back likewise, raised once the operation is done (marked as after the COMMIT when its
    change stands), and the program's handler is given back exactly."""
    sig = getattr(signal, name)

    def handler(signum: int, frame: object) -> None:
        raise _Term(signum)

    before = signal.signal(sig, handler)
    steps = []
    try:
        with pytest.raises(_Term) as caught:
            with interrupts.HeldInterrupt():
                signal.raise_signal(sig)  # held back
                for _ in range(1000):
                    pass
                steps.append("ran on")
                if committed:
                    interrupts.change_stands()
        assert steps == ["ran on"] and caught.value.args == (sig,)
        assert interrupts.after_commit(caught.value) is committed
        assert signal.getsignal(sig) is handler and interrupts.HELD is None
        with pytest.raises(_Term):  # and raised at a wait of the operation
            with interrupts.HeldInterrupt():
                signal.raise_signal(sig)
                steps.append("held")
                interrupts.interruption_point()
                steps.append("not reached")
        assert steps == ["ran on", "held"] and signal.getsignal(sig) is handler
    finally:
        signal.signal(sig, before)


@pytest.mark.parametrize("name", [n for n in HELD_SIGNALS if n != "SIGINT"])
@pytest.mark.parametrize("disposition", ["SIG_DFL", "SIG_IGN"])
def test_a_signal_at_its_default_or_ignored_is_left_alone(name: str, disposition: str) -> None:
    """SIGTERM/SIGHUP at the default (a Python program that never set a handler: the signal ends it) or ignored are
    not touched by a hold: the handler stays in place during the operation."""
    sig, kept = getattr(signal, name), getattr(signal, disposition)
    before = signal.signal(sig, kept)
    try:
        with interrupts.HeldInterrupt():
            assert signal.getsignal(sig) is kept
        assert signal.getsignal(sig) is kept
    finally:
        signal.signal(sig, before)


def test_sigterm_at_its_default_still_ends_the_process_during_a_hold() -> None:
    """A Python API user's program with SIGTERM at its default is killed by it mid-operation, as before."""
    code = ("import os, signal, sys\nfrom dpsql import interrupts\nwith interrupts.HeldInterrupt():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n    for _ in range(10**6):\n        pass\n    sys.exit(3)\n")
    import subprocess

    from conftest import child_env

    p = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGTERM, (p.returncode, p.stderr)
