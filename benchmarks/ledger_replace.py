"""Replacement campaign for the budget ledger: the file replaced by a copy of itself while workers charge it.

One command:  python benchmarks/ledger_replace.py [--trials 20] [--seed 1] [--workers 3] [--out DIR]
                                                   [--unchecked]

Each trial creates a ledger with a total of 1.0 and starts ``--workers`` processes that reserve charges
of 0.05 (each tagged with a unique query text) until refused, with ``lock_timeout=0.05`` so that a worker
whose wait in the queue runs out goes straight for the flock of whatever file the path names; one operation
in three pauses 0.1 s after attaching the file and before its COMMIT (longer than the others wait). Meanwhile
a replacer takes a consistent copy of the ledger (under its flock, as a backup tool that locks would) and,
0-2 ms later, puts it in place with ``os.replace`` without the lock (a restore, a sync tool). After the
workers stop, the check:

* every reserve that returned an entry id (its query would read and release) is in the ledger that the
  path now holds, with its cost, or the ledger is refused (a ``LedgerError``: the loss is detected);
* what the ledger records never exceeds its total.

``--unchecked`` turns off the check that the path still names the file an operation locked (the negative
control: violations are expected). Output: JSON with the trials, the violations and the outcome counts, to
stdout and ``<out>/ledger_replace.json``.
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, sys
from dpsql.budget import Budget
from dpsql.errors import BudgetExceededError, DPSQLError
from dpsql.ledger import Ledger, _store
if sys.argv[3] == "1":
    _store._names = lambda *a: True
import random, time
for step in ("after_attach", "before_commit"):  # now and then 0.1 s inside the operation (longer than the others wait in the queue)
    _store._HOOKS[step] = lambda p: time.sleep(random.choice((0.0, 0.0, 0.1)))
led = Ledger(sys.argv[1], lock_timeout=0.05)
acked, errors, refused = [], [], 0
for i in range(40):
    tag = f"{sys.argv[2]}-{i}"
    try:
        e = led.reserve(Budget(0.05, 0.0), mechanism="m", query=tag, tables=["t"], params={})
        acked.append([e, tag])
    except BudgetExceededError:
        refused += 1
        if refused >= 3:
            break
    except DPSQLError as e:
        errors.append(type(e).__name__ + ": " + str(e).split(";")[0][:160])
print(json.dumps({"acked": acked, "errors": errors}), flush=True)
"""


def _replacer(path: Path, rng: random.Random, stop_at: float) -> int:
    n = 0
    while time.monotonic() < stop_at:
        copy = path.with_name(f"copy-{n}.duckdb")
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            shutil.copyfile(path, copy)
        finally:
            os.close(fd)
        time.sleep(rng.uniform(0.0, 0.002))
        os.replace(copy, path)
        n += 1
        time.sleep(rng.uniform(0.0, 0.03))
    return n


def _check(path: Path, acked: list[tuple[int, str]]) -> tuple[str, list[str]]:
    from dpsql.budget import Budget
    from dpsql.errors import LedgerError
    from dpsql.ledger import Ledger

    try:
        led = Ledger.open(path)
        h = led.history().to_pydict()
        total = led.total()
    except LedgerError:
        return "refused", []
    rows = {(e, q): eps for e, q, eps in zip(h["entry_id"], h["query"], h["epsilon"], strict=True)}
    bad = [f"acknowledged reserve {e} ({q}) is not in the ledger" for e, q in acked if (e, q) not in rows]
    recorded = sum(Budget(e, 0.0).exact_epsilon for e in h["epsilon"])  # the decimals the ledger compares
    if recorded > total.exact_epsilon:
        bad.append(f"recorded {float(recorded)} exceeds the total {total}")
    return "accepted", bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "out"))
    ap.add_argument("--unchecked", action="store_true")
    args = ap.parse_args(argv)
    from dpsql.budget import Budget
    from dpsql.ledger import Ledger

    rng = random.Random(args.seed)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    violations: list[str] = []
    outcomes: collections.Counter[str] = collections.Counter()
    errors: collections.Counter[str] = collections.Counter()
    for trial in range(args.trials):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "ledger.duckdb"
            Ledger.create(path, Budget(1.0, 0.0))
            procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER), str(path), f"w{w}",
                                       "1" if args.unchecked else "0"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                     for w in range(args.workers)]
            _replacer(path, rng, time.monotonic() + rng.uniform(0.5, 2.0))
            acked: list[tuple[int, str]] = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                if p.returncode != 0:
                    violations.append(f"trial {trial}: a worker failed: {err[-300:]}")
                    continue
                got = json.loads(out.strip().splitlines()[-1])
                acked += [(int(e), str(q)) for e, q in got["acked"]]
                errors.update(e.replace(str(path), "LEDGER")[:90] for e in got["errors"])
            outcome, bad = _check(path, acked)
            outcomes[outcome] += 1
            violations += [f"trial {trial}: {b}" for b in bad]
    result = {"trials": args.trials, "seed": args.seed, "unchecked": args.unchecked, "outcomes": dict(outcomes),
              "violations": violations, "worker_errors": dict(errors.most_common(8))}
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ledger_replace.json").write_text(text + "\n")
    return 1 if violations and not args.unchecked else 0


if __name__ == "__main__":
    sys.exit(main())
