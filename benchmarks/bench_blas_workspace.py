"""Matrix products in a fresh process, with and without minidl's one product at import that maps the BLAS's
packing workspace (``minidl.backend.map_blas_workspace``).

OpenBLAS packs a product's operands into a workspace whose pages the operating system backs only when a
product first writes there, and its kernels prefetch a little past the block they packed: a prefetch into
a page not backed yet costs a page-table walk every time (see the function's docstring). Each round starts
two fresh processes at one BLAS thread, one with NumPy alone and one that imports minidl first, and times
the same products there in the same order (each the best of 5 × 20 calls, on the thread's CPU clock); rounds
alternate which process starts first. A time is the median over rounds, and so is the ratio.

    python benchmarks/bench_blas_workspace.py [--rounds 5] [--save]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from common import save_results

HERE = os.path.dirname(os.path.abspath(__file__))
# (M, K, N) of the products in benchmarks/programs, forward and backward, and two larger ones
SHAPES = [(512, 256, 64), (512, 64, 192), (512, 64, 256), (256, 512, 64), (768, 128, 512), (768, 512, 128),
          (2048, 256, 256), (18432, 288, 64)]
CHILD = """
import json, sys, time
import numpy as np
if sys.argv[1] == "minidl":
    import minidl  # noqa: F401  (maps the workspace at import)
rng = np.random.default_rng(0)
times = []
for m, k, n in json.loads(sys.argv[2]):
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    a @ b
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(20):
            a @ b
        best = min(best, (time.thread_time() - start) / 20)
    times.append(best * 1e3)
print(json.dumps(times))
"""


def run(mode: str) -> list[float]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", CHILD, mode, json.dumps(SHAPES)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.split("\n")[-2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_blas_workspace.json")
    args = parser.parse_args()
    rounds = {"numpy": [], "minidl": []}
    for r in range(args.rounds):
        for mode in (("numpy", "minidl") if r % 2 == 0 else ("minidl", "numpy")):
            rounds[mode].append(run(mode))
    rows = []
    print(f"{'(M, K, N)':>18}  {'NumPy alone ms':>14}  {'after import minidl ms':>22}  ratio")
    for i, shape in enumerate(SHAPES):
        cold = statistics.median(times[i] for times in rounds["numpy"])
        mapped = statistics.median(times[i] for times in rounds["minidl"])
        ratio = statistics.median(a[i] / b[i] for a, b in zip(rounds["numpy"], rounds["minidl"]))
        rows.append({"shape": shape, "numpy_ms": cold, "minidl_ms": mapped, "ratio": ratio})
        print(f"{str(tuple(shape)):>18}  {cold:14.3f}  {mapped:22.3f}  {ratio:5.2f}")
    if args.save:
        print("saved", save_results("blas_workspace", {"rounds": args.rounds, "rows": rows}))


if __name__ == "__main__":
    main()
