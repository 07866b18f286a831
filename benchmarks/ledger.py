"""Budget ledger under concurrent load: N processes or threads doing reserve + commit pairs.

One command:  python benchmarks/ledger.py [--sizes 2,4,8,16] [--modes processes,threads]
                                           [--pairs 30] [--query-ms 0] [--out DIR]

For each mode and N, N workers share one ledger file whose total fits exactly 3/4 of all
attempted charges, start together, and each runs ``--pairs`` times: reserve(0.01), an optional
simulated query (``--query-ms`` of sleep, no CPU), commit. Reported per run:

* ``budget_fits`` / ``committed``: charges the total allows vs entries in the ledger counting
  towards the budget; ``overspent`` is true if the recorded spend exceeds the total;
* ``duplicates``: entry ids handed to two reserves; ``lost``: acknowledged reserves missing from
  the file plus acknowledged commits whose entry is not ``released``;
* ``errors``: exceptions other than ``BudgetExceededError`` (lock time-outs included), with
  the first few messages;
* ``pairs_per_s``: acknowledged reserve+commit pairs per second of wall time (the ledger's
  query throughput); ``p50_s`` / ``p99_s``: latency of one attempt (reserve, plus commit when
  the reserve succeeded).

The machine's load average before and after each run is recorded: other work on the machine
changes these figures. JSON goes to stdout and ``<out>/ledger.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from dpsql.budget import Budget  # noqa: E402
from dpsql.errors import BudgetExceededError  # noqa: E402
from dpsql.ledger import Ledger  # noqa: E402

COST = Budget(0.01)


def _work(path: str, pairs: int, query_s: float, lock_timeout: float) -> dict[str, Any]:
    led = Ledger(path, lock_timeout=lock_timeout)
    reserved: list[int] = []
    committed: list[int] = []
    lat: list[float] = []
    exceeded = 0
    errors: list[str] = []
    for i in range(pairs):
        t0 = time.perf_counter()
        try:
            e = led.reserve(COST, mechanism="bench", query=f"q{i}", tables=["t"], params={})
            reserved.append(e)
            if query_s:
                time.sleep(query_s)
            led.commit(e)
            committed.append(e)
        except BudgetExceededError:
            exceeded += 1
        except Exception as ex:  # noqa: BLE001 - counted and reported
            errors.append(f"{type(ex).__name__}: {str(ex).splitlines()[0][:200]}")
        lat.append(time.perf_counter() - t0)
    return {"reserved": reserved, "committed": committed, "exceeded": exceeded, "errors": errors, "lat": lat}


def _worker_main(path: str, pairs: int, query_s: float, lock_timeout: float) -> None:
    Ledger(path, lock_timeout=lock_timeout).remaining()  # warm up imports and DuckDB outside the timing
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(_work(path, pairs, query_s, lock_timeout)), flush=True)


def _run(mode: str, n: int, pairs: int, query_s: float, lock_timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ledger.duckdb")
        fits = (n * pairs * 3) // 4
        Ledger.create(path, Budget(round(fits * 0.01, 10)))
        load_before = os.getloadavg()
        if mode == "processes":
            procs = [
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", path, str(pairs), str(query_s), str(lock_timeout)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )
                for _ in range(n)
            ]
            for p in procs:
                assert p.stdout is not None
                line = p.stdout.readline()
                if line.strip() != "ready":
                    raise RuntimeError(p.stderr.read() if p.stderr else line)
            t0 = time.perf_counter()
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                out, err = p.communicate(timeout=3600)
                if p.returncode != 0:
                    raise RuntimeError(err)
                results.append(json.loads(out.strip().splitlines()[-1]))
            wall = time.perf_counter() - t0
        else:
            Ledger(path).remaining()
            results = [None] * n  # type: ignore[list-item]
            barrier = threading.Barrier(n + 1)

            def thread(i: int) -> None:
                barrier.wait()
                results[i] = _work(path, pairs, query_s, lock_timeout)

            threads = [threading.Thread(target=thread, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
        load_after = os.getloadavg()
        led = Ledger.open(path)
        hist = led.history().to_pydict()
        status = dict(zip(hist["entry_id"], hist["status"], strict=True))
        reserved = [e for r in results for e in r["reserved"]]
        committed = [e for r in results for e in r["committed"]]
        errors = [m for r in results for m in r["errors"]]
        lat = sorted(x for r in results for x in r["lat"])
        counting = sum(1 for s in status.values() if s in ("reserved", "released", "failed"))
        lost = sum(1 for e in reserved if e not in status) + sum(1 for e in committed if status.get(e) != "released")
        spent, total = led.spent(), led.total()
        return {
            "mode": mode,
            "n": n,
            "attempts": n * pairs,
            "budget_fits": fits,
            "committed": counting,
            "acknowledged_pairs": len(committed),
            "overspent": spent.exact_epsilon > total.exact_epsilon,
            "duplicates": len(reserved) - len(set(reserved)),
            "lost": lost,
            "errors": len(errors),
            "error_examples": errors[:3],
            "wall_s": round(wall, 3),
            "pairs_per_s": round(len(committed) / wall, 2),
            "p50_s": round(lat[len(lat) // 2], 4),
            "p99_s": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 4),
            "max_s": round(lat[-1], 4),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2,4,8,16")
    ap.add_argument("--modes", default="processes,threads")
    ap.add_argument("--pairs", type=int, default=30, help="reserve+commit attempts per worker")
    ap.add_argument("--query-ms", type=float, default=0.0, help="simulated query time between reserve and commit")
    ap.add_argument("--lock-timeout", type=float, default=10.0, help="the ledger's lock_timeout (default: dpsql's)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    args = ap.parse_args()
    runs = [
        _run(mode, int(n), args.pairs, args.query_ms / 1000, args.lock_timeout)
        for mode in args.modes.split(",")
        for n in args.sizes.split(",")
    ]
    result = {
        "benchmark": "ledger",
        "cpus": os.cpu_count(),
        "pairs_per_worker": args.pairs,
        "query_ms": args.query_ms,
        "lock_timeout_s": args.lock_timeout,
        "runs": runs,
        "all_correct": all(not r["overspent"] and r["duplicates"] == 0 and r["lost"] == 0
                           and r["committed"] == min(r["budget_fits"], r["attempts"]) for r in runs),
    }
    text = json.dumps(result, indent=2)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ledger.json"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
