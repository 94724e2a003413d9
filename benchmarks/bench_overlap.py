"""Data-parallel step time with and without overlap of the all-reduce with backward.

    python benchmarks/bench_overlap.py                  # 2 and 4 ranks (mpiexec, started here)

Each rank trains an MLP 784-1024-1024-1024-10 (about 2.9 M parameters, 11.6 MB of
float32 gradients) on 64 samples per step, with 1 MB buckets, once with
``DataParallel(overlap=False)`` (all-reduce after backward) and once with
``overlap=True`` (each bucket's ``MPI_Iallreduce`` started from the backward
walk as soon as its gradients are final), each setting run twice (off, on,
on, off: the load of a shared machine drifts). The time of a setting is the
median of its 20 steps after warm-ups, the slowest rank's. The final weights of both
runs are compared too: they must be equal.

What the figure means on a CPU: MPI advances a non-blocking collective mostly
inside MPI calls, and NumPy and MPI share each process's one thread, so the
sums travel mostly at the waits; with more ranks than cores, the ranks also
take turns on the cores. Overlap pays where communication has its own engine
(NCCL on a side stream, a network card), not here.

Writes benchmarks/results/<machine>_overlap.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import save_results  # noqa: E402

SIZES, BATCH, WARMUP, STEPS, BUCKET = (784, 1024, 1024, 1024, 10), 64, 2, 10, 2**20


def worker(out_path: str) -> None:
    import minidl as mdl
    import minidl.functional as F
    from minidl import nn, optim, parallel

    comm = parallel.init("mpi")
    rng = np.random.default_rng(comm.rank)
    x = rng.normal(size=(BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], size=BATCH)
    times_of, finals, last = {False: [], True: []}, {}, {}
    for overlap in (False, True, True, False):  # each setting early and late: the machine's load drifts
        mdl.manual_seed(0)
        layers = []
        for a, b in zip(SIZES, SIZES[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        dp = parallel.DataParallel(nn.Sequential(*layers[:-1]), comm, bucket_bytes=BUCKET, overlap=overlap)
        opt = parallel.DistributedOptimizer(optim.SGD(dp.parameters(), lr=1e-3), dp)
        times = times_of[overlap]
        for step in range(WARMUP + STEPS):
            comm.barrier()
            start = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(dp(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()
            elapsed = np.array([time.perf_counter() - start])
            slowest = comm.allgather(elapsed).max()
            if step >= WARMUP:
                times.append(float(slowest))
        finals[overlap] = np.concatenate([p.array.ravel() for p in dp.parameters()])
        last[overlap] = dp.last_sync
    rows = [{"overlap": overlap, "ranks": comm.size, "step_ms": 1e3 * float(np.median(times_of[overlap])),
             "buckets": last[overlap]["buckets"], "started_in_backward": last[overlap].get("started_in_backward", 0)}
            for overlap in (False, True)]
    difference = float(np.abs(finals[False] - finals[True]).max())
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"rows": rows, "max_weight_difference": difference}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from minidl.parallel import launch
    results = []
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "overlap.json")
            one_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
            result = launch.run(ranks, [os.path.abspath(__file__), "--worker", out], timeout=900, env=one_thread)
            if result.returncode != 0:
                sys.exit(f"mpiexec failed:\n{result.stdout}\n{result.stderr[-3000:]}")
            with open(out) as f:
                results.append(json.load(f))
    print(f"{'ranks':>5} {'overlap':>8} {'step ms':>9} {'buckets':>8} {'started in backward':>20}")
    for res in results:
        for row in res["rows"]:
            print(f"{row['ranks']:>5} {str(row['overlap']):>8} {row['step_ms']:>9.1f} {row['buckets']:>8} "
                  f"{row['started_in_backward']:>20}")
        print(f"      largest weight difference, overlap against not: {res['max_weight_difference']:.1e}")
    print("wrote", save_results("overlap", {"runs": results}))


if __name__ == "__main__":
    main()
