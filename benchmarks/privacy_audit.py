"""Privacy audit at large N: the routes with one draw per release, which the test file can only
run at small N (tests/test_privacy_audit.py holds the audits, their neighbours and events).

One command:  python benchmarks/privacy_audit.py [--scale 1.0] [--only NAME ...] [--out DIR]

Per route: N releases on each neighbour, ε_lb at the charged δ from Clopper–Pearson intervals with
failure probability <= 1e-6 (union bound over each audit's events), the charged (ε, δ) and, where
the docs give it, the exact event probability. ``--scale`` multiplies every N. JSON goes to stdout
and ``<out>/privacy_audit.json``. Timings are wall seconds per audit (machine shared: noisy).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import test_privacy_audit as audits  # noqa: E402

#: name -> (function, positional args, N at scale 1)
AUDITS: dict[str, tuple[Any, tuple[Any, ...], int]] = {
    "s4s_scalar_q1_eps4": (audits.audit_s4s_scalar, (1.0, "bench-s4s-q1"), 2000),
    "s4s_scalar_q1_eps1": (lambda f, s, n: audits.audit_s4s_scalar(f, s, n, eps=1.0), (1.0, "bench-s4s-q1e1"), 2000),
    "s4s_scalar_default_q": (lambda f, s, n: audits.audit_s4s_scalar(f, s, n, eps=1.0, q=1 / 16),
                             (1.0, "bench-s4s-q16"), 1000),
    "suggest_caps": (audits.audit_suggest_caps, (1.0, "bench-caps"), 600),
    "dawa": (audits.audit_dawa, (1.0, "bench-dawa"), 2000),
    "join_group_by": (lambda f, s, n: audits.audit_join_group_by(f, s, runs=n), (1.0, "bench-join"), 20),
    "sparse_gaussian": (lambda f, s, n: audits.audit_sparse_gaussian(f, s, runs=n), (1.0, "bench-sg"), 60),
    "sparse_mixed": (lambda f, s, n: audits.audit_sparse_mixed(f, s, runs=n), (1.0, "bench-sm"), 60),
}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item"):
        return _jsonable(v.item())
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(AUDITS))
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out"))
    args = ap.parse_args()
    results: dict[str, Any] = {}
    for name, (fn, fargs, n) in AUDITS.items():
        if args.only and name not in args.only:
            continue
        runs = max(1, int(round(n * args.scale)))
        t0 = time.time()
        res = fn(*fargs, runs)
        res["seconds"] = round(time.time() - t0, 1)
        res["runs"] = runs
        res["violation"] = bool(res["eps_lb"] > res["cost"][0])
        results[name] = _jsonable(res)
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "privacy_audit.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
