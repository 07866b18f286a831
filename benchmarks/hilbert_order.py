"""Benchmark: the Hilbert order of a 2-D range workload's grid (``_dawa_hilbert.grid_order``).

One command:  python benchmarks/hilbert_order.py [--repeat 3]
JSON to stdout and ``benchmarks/out/hilbert_order.json``. For each grid shape, the CPU time (user +
system of this process, median of ``--repeat`` runs, seconds) and the peak of numpy's traced
allocations (MiB) of

* ``cells``: ``grid_order``, which computes the curve position of the real cells only and sorts them;
* ``padded``: the earlier way, listing the whole d x d square (d = the next power of two above the
  longer side) and dropping its padding. Skipped when the square exceeds 2^26 cells: a 2^20 x 1
  grid asked it for 2^40 cells (8 TiB per array).

Both give the same order (checked here on every shape where both run). The load average is
recorded: other work on the machine changes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from dpsql.mechanisms._dawa_hilbert import grid_order, hilbert_order, side_for  # noqa: E402

SHAPES = [(256, 256), (1024, 1024), (4096, 256), (1 << 16, 16), (1 << 20, 1), (1, 1 << 20)]
PADDED_LIMIT = 1 << 26


def padded(shape: tuple[int, int]) -> np.ndarray:
    order = hilbert_order(side_for(shape))
    return order[(order[:, 0] < shape[0]) & (order[:, 1] < shape[1])]


def measure(fn: Callable[[], object], repeat: int) -> tuple[float, float, object]:
    cpu = []
    out: object = None
    for _ in range(repeat):
        c = time.process_time()
        out = fn()
        cpu.append(time.process_time() - c)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(cpu), peak / 2**20, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for shape in SHAPES:
        d = side_for(shape)
        row: dict[str, object] = {"shape": list(shape), "side": d}
        cpu, peak, res = measure(lambda s=shape: grid_order(s)[0], args.repeat)  # type: ignore[misc]
        row.update(cells_cpu_s=round(cpu, 4), cells_peak_mib=round(peak, 1))
        if d * d <= PADDED_LIMIT:
            pcpu, ppeak, pres = measure(lambda s=shape: padded(s), args.repeat)  # type: ignore[misc]
            row.update(padded_cpu_s=round(pcpu, 4), padded_peak_mib=round(ppeak, 1),
                       same_order=bool(np.array_equal(res, pres)),
                       cpu_ratio_cells_over_padded=round(cpu / pcpu, 3) if pcpu > 0 else None)
        else:
            row.update(padded_cpu_s=None, padded_peak_mib=None, padded_cells=d * d)
        rows.append(row)
    out = {"benchmark": "hilbert_order", "loadavg": list(os.getloadavg()), "repeat": args.repeat, "rows": rows}
    text = json.dumps(out, indent=1)
    print(text)
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    with open(os.path.join(HERE, "out", "hilbert_order.json"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
