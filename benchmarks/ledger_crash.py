"""Crash campaign for the budget ledger: SIGKILL at random points, then a consistency check.

One command:  python benchmarks/ledger_crash.py [--trials 200] [--seed 1] [--max-delay-ms 400]
                                                 [--out DIR]

Each trial starts two worker processes on one ledger file. In a ``create`` trial the file does
not exist yet and both workers race to create it (``Ledger.open(..., create=True)``); in an
``ops`` trial it exists with part of its budget spent. Workers then loop over reserve, commit or
fail, set_total and reads, printing an acknowledgement after each call returns, and pause a
random 0-3 ms at each step of an operation (before queueing, lock taken, file attached, before
COMMIT, before CHECKPOINT, before the marker write, file detached; in a creation: schema,
checkpoint, link into place, marker) so that kills land in every step. The campaign SIGKILLs both workers at independent
random times and then checks, in a fresh process state:

* the ledger is absent only in a ``create`` trial in which no worker acknowledged a creation,
  and otherwise opens without error (no half-created file, no lost-WAL refusal);
* entry ids are unique and contiguous; every acknowledged reserve is present and counts; every
  acknowledged commit is ``released`` and every acknowledged fail ``failed``;
* the recorded spend never exceeds the total, and the ledger still accepts a write.

Output: JSON with the number of trials, the violations (empty when all hold), the step each
kill interrupted, and leftover temporary files (unfinished creations, waiting-queue slots of
killed workers: harmless), to stdout and ``<out>/ledger_crash.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from dpsql.budget import Budget  # noqa: E402
from dpsql.errors import BudgetExceededError, LedgerError  # noqa: E402
from dpsql.ledger import Ledger  # noqa: E402

TOTAL = Budget(2.0, 1e-5)
COST = Budget(0.05, 1e-7)


def _worker(path: str, kind: str, seed: int) -> None:
    from dpsql.ledger import _store

    rng = random.Random(seed)

    def say(msg: str) -> None:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()

    def step(name: str) -> Any:
        def pause(p: str) -> None:
            say(f"P {name}")
            time.sleep(rng.random() * 0.003)

        return pause

    for name in ("before_queue", "before_attach", "after_attach", "before_commit", "before_checkpoint",
                 "before_marker", "after_detach", "create_schema", "create_checkpoint", "create_link",
                 "create_marker"):
        _store._HOOKS[name] = step(name)
    say("start")
    if kind == "create":
        led = Ledger.open(path, TOTAL, create=True)
        say("created")
    else:
        led = Ledger(path)
    while True:
        r = rng.random()
        if r < 0.1:
            led.remaining()
            continue
        if r < 0.15:
            t = led.total()
            led.set_total(Budget(t.epsilon + 0.05, t.delta), reason="crash campaign")
            say("T")
            continue
        try:
            e = led.reserve(COST, mechanism="m", query="q", tables=["t"], params={"seed": seed})
        except BudgetExceededError:
            time.sleep(0.01)
            continue
        say(f"R {e}")
        if rng.random() < 0.8:
            led.commit(e, params_update={"done": True})
            say(f"C {e}")
        else:
            led.fail(e, "simulated failure")
            say(f"F {e}")


def _check(path: str, kind: str, outs: list[str]) -> tuple[list[str], int]:
    acks: dict[str, set[int]] = {"R": set(), "C": set(), "F": set()}
    created = False
    n_acks = 0
    for out in outs:
        for line in out.splitlines():
            if line == "created":
                created = True
            elif line[:2] in ("R ", "C ", "F "):
                acks[line[0]].add(int(line[2:]))
                n_acks += 1
    problems: list[str] = []
    if not os.path.exists(path):
        if kind != "create" or created:
            problems.append("the ledger file is missing although it had been created")
        return problems, n_acks
    try:
        led = Ledger.open(path)
        hist = led.history().to_pydict()
        spent, total = led.spent(), led.total()
    except LedgerError as e:
        return [f"the ledger does not open: {e}"], n_acks
    ids = hist["entry_id"]
    status = dict(zip(ids, hist["status"], strict=True))
    if ids != list(range(1, len(ids) + 1)):
        problems.append(f"entry ids are not unique and contiguous: {ids}")
    for e in acks["R"]:
        if status.get(e) not in ("reserved", "released", "failed"):
            problems.append(f"acknowledged reserve {e} is {status.get(e)!r}")
    for e in acks["C"]:
        if status.get(e) != "released":
            problems.append(f"acknowledged commit {e} is {status.get(e)!r}")
    for e in acks["F"]:
        if status.get(e) != "failed":
            problems.append(f"acknowledged fail {e} is {status.get(e)!r}")
    if spent.exact_epsilon > total.exact_epsilon or spent.exact_delta > total.exact_delta:
        problems.append(f"overspent: {spent} of {total}")
    try:  # still writable
        e = led.reserve(Budget(0.0), mechanism="check", query="", tables=[], params={})
        led.commit(e)
    except LedgerError as ex:
        problems.append(f"the ledger refuses writes after the crash: {ex}")
    return problems, n_acks


def _step(line: str) -> str:
    """The step a worker was in when killed, from its last line of output."""
    done = {"R": "reserve returned", "C": "commit returned", "F": "fail returned", "T": "set_total returned"}
    if line.startswith("P "):
        return line[2:]
    if line == "created":
        return "create returned"
    return done.get(line[:1], line)


def _trial(i: int, rng: random.Random, max_delay: float) -> dict[str, Any]:
    kind = "create" if rng.random() < 0.3 else "ops"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.duckdb")
        if kind == "ops":
            led = Ledger.create(path, TOTAL)
            for _ in range(rng.randrange(0, 20)):
                led.commit(led.reserve(COST, mechanism="m", query="q", tables=["t"], params={}))
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", path, kind, str(rng.getrandbits(32))],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            for _ in range(2)
        ]
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "start":
                raise RuntimeError(p.stderr.read() if p.stderr else line)
        # a creation takes a few ms: kill early in create trials so that kills land inside it
        scale = 0.05 if kind == "create" else max_delay
        for p in procs:
            time.sleep(rng.random() * scale)
            p.send_signal(signal.SIGKILL)
        outs, errs, phases = [], [], []
        for p in procs:
            out, err = p.communicate(timeout=60)
            outs.append(out)
            errs.append(err if p.returncode not in (-signal.SIGKILL,) else "")
            last = [ln for ln in out.splitlines() if ln]
            phases.append(_step(last[-1]) if last else "started, before the first step")
        problems, n_acks = _check(path, kind, outs)
        crashed = [e for e in errs if e.strip()]
        if crashed:
            problems.append("a worker failed before the kill: " + crashed[0].strip().splitlines()[-1])
        leftovers = [f for f in os.listdir(tmp) if ".creating-" in f or ".q-" in f]
    return {"trial": i, "kind": kind, "problems": problems, "acks": n_acks, "phases": phases,
            "leftover_temporary_files": len(leftovers)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-delay-ms", type=float, default=400.0, help="kill within this time after start")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    trials = [_trial(i, rng, args.max_delay_ms / 1000) for i in range(args.trials)]
    phases = collections.Counter(ph for t in trials for ph in t["phases"])
    result = {
        "benchmark": "ledger_crash",
        "trials": len(trials),
        "kills": 2 * len(trials),
        "create_trials": sum(t["kind"] == "create" for t in trials),
        "acknowledged_operations": sum(t["acks"] for t in trials),
        "kill_after_step": dict(sorted(phases.items())),
        "leftover_temporary_files": sum(t["leftover_temporary_files"] for t in trials),
        "violations": [{"trial": t["trial"], "kind": t["kind"], "problems": t["problems"]}
                       for t in trials if t["problems"]],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    result["ok"] = not result["violations"]
    text = json.dumps(result, indent=2)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ledger_crash.json"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
