"""All-reduce time against message size; the ring model fitted to it; predicted scaling to 1024 ranks.

    python benchmarks/bench_allreduce.py                   # starts mpiexec -n 2 itself (MPI, NumPy buffers)
    python benchmarks/bench_allreduce.py --ranks 4 --backend nccl    # on a machine with 4 GPUs

What it does:
1. starts an MPI job (``minidl.parallel.launch``) in which every rank
   all-reduces float32 buffers of 8 B to 64 MiB through ``minidl.parallel``
   (MPI, or NCCL on GPUs); the time of a size is the best of 5 trials of
   many calls, the slowest rank's;
2. fits T(n) = α + 2(N−1)/N · n/β (``RingAllreduce.fit``);
3. measures one training step (forward + backward) of an MLP 784-512-512-10
   in minidl on this machine at two batch sizes, for t_fixed and t_sample;
4. predicts step time and scaling efficiency for N = 1…1024 ranks, strong
   (global batch 1024) and weak (32 per rank) scaling, with the α and β
   measured here, and with an assumed cluster network (α = 25 µs,
   β = 12.5 GB/s: 100 Gb/s InfiniBand) since one machine's shared memory
   is far faster than any network between machines;
5. writes benchmarks/results/<machine>_allreduce.json and
   benchmarks/results/allreduce_scaling.png.
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

from common import best_time, machine_info, save_results  # noqa: E402

SIZES = [2 ** k for k in range(3, 27, 2)]  # bytes: 8 B ... 64 MiB, every factor of 4
CLUSTER = {"alpha": 25e-6, "beta": 12.5e9, "label": "assumed cluster: 100 Gb/s InfiniBand, α = 25 µs"}
MLP = (784, 512, 512, 10)


# ---------------------------------------------------------------- inside the MPI job
def worker(out_path: str, backend: str) -> None:
    from minidl import parallel
    comm = parallel.init(backend)
    xp = np
    if comm.name == "nccl":
        from minidl.backend import cupy_module
        xp = cupy_module()
    times = []
    for nbytes in SIZES:
        buf = xp.zeros(nbytes // 4, dtype=np.float32)  # zeros: repeated sums stay finite

        def call():
            comm.allreduce_(buf)
            comm.synchronize()

        comm.barrier()
        start = time.perf_counter()
        call()
        first = time.perf_counter() - start
        # Ranks must agree on the repetitions (every call is a collective): use the slowest estimate.
        first = max(comm.allgather_object(first))
        reps = int(min(200, max(1, 0.04 / max(first, 1e-7))))
        best = float("inf")
        for _ in range(5):
            comm.barrier()
            start = time.perf_counter()
            for _ in range(reps):
                call()
            best = min(best, (time.perf_counter() - start) / reps)
        times.append(max(comm.allgather_object(best)))
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"ranks": comm.size, "backend": comm.name, "bytes": SIZES, "seconds": times}, f)


# ---------------------------------------------------------------- the driver
def measure_allreduce(ranks: int, backend: str) -> dict:
    from minidl.parallel import launch
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "allreduce.json")
        result = launch.run(ranks, [os.path.abspath(__file__), "--worker", out, "--backend", backend], timeout=300)
        if result.returncode != 0:
            raise SystemExit(f"the MPI job failed:\n{result.stdout}\n{result.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def measure_compute() -> dict:
    """t_fixed and t_sample of one forward + backward of the MLP, from batches of 32 and 256."""
    import minidl as mdl
    from minidl import nn
    from minidl.ops.loss import cross_entropy
    mdl.manual_seed(0)
    layers = []
    for a, b in zip(MLP[:-1], MLP[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    rng = np.random.default_rng(0)
    timings = {}
    for batch in (32, 256):
        x = mdl.tensor(rng.standard_normal((batch, MLP[0])).astype(np.float32))
        y = mdl.tensor(rng.integers(0, MLP[-1], batch))

        def step():
            model.zero_grad()
            cross_entropy(model(x), y).backward()
        timings[batch] = best_time(step, repeat=7, warmup=2)
    t_sample = (timings[256] - timings[32]) / (256 - 32)
    t_fixed = max(timings[32] - 32 * t_sample, 0.0)
    param_bytes = sum(p.array.nbytes for p in model.parameters())
    return {"model": "MLP " + "-".join(map(str, MLP)), "param_bytes": param_bytes, "time_per_sample": t_sample,
            "fixed_time": t_fixed, "step_time_32": timings[32], "step_time_256": timings[256]}


def plot(measured, ring, compute, models, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    n = np.array(measured["bytes"], float)
    ax1.loglog(n, measured["seconds"], "o", label=f"measured, {measured['backend']}, N = {measured['ranks']}")
    grid = np.logspace(np.log10(n[0]), np.log10(n[-1]), 100)
    ax1.loglog(grid, ring.time(grid, measured["ranks"]),
               label=f"fit: α = {ring.alpha * 1e6:.1f} µs, β = {ring.beta / 1e9:.2f} GB/s")
    ax1.axvline(compute["param_bytes"], color="gray", ls=":", label="the MLP's gradient")
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("all-reduce time (s)")
    ax1.set_title("all-reduce time against message size")
    ax1.legend(fontsize=8)
    for (label, model), color in zip(models.items(), ("C0", "C3")):
        strong = model.strong_scaling(1024)
        weak = model.weak_scaling(32)
        ax2.semilogx([r["ranks"] for r in strong], [r["efficiency"] for r in strong], "-o", ms=3, color=color,
                     label=f"strong, B = 1024 ({label})")
        ax2.semilogx([r["ranks"] for r in weak], [r["efficiency"] for r in weak], "--", color=color,
                     label=f"weak, 32 per rank ({label})")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("ranks N")
    ax2.set_ylabel("scaling efficiency")
    ax2.set_title(f"predicted: {compute['model']}, step = compute + all-reduce")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backend", default="mpi", choices=("mpi", "nccl"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.backend)

    from minidl.parallel.cost_model import RingAllreduce, StepModel, format_table
    started = time.perf_counter()
    measured = measure_allreduce(args.ranks, args.backend)
    ring = RingAllreduce.fit(measured["bytes"], measured["seconds"], measured["ranks"])
    print(f"all-reduce on {measured['ranks']} ranks ({measured['backend']}):")
    print(f"{'bytes':>10}  {'measured':>12}  {'model':>12}  {'bus GB/s':>9}")
    for nbytes, t in zip(measured["bytes"], measured["seconds"]):
        bus = ring.bus_bandwidth(nbytes, t, measured["ranks"]) / 1e9
        print(f"{nbytes:>10}  {t * 1e6:>10.1f}µs  {ring.time(nbytes, measured['ranks']) * 1e6:>10.1f}µs  {bus:>9.3f}")
    print(f"fit: α = {ring.alpha * 1e6:.2f} µs, β = {ring.beta / 1e9:.3f} GB/s\n")

    compute = measure_compute()
    print(f"{compute['model']}: {compute['param_bytes'] / 1e6:.2f} MB of gradient, "
          f"t_fixed = {compute['fixed_time'] * 1e3:.2f} ms, t_sample = {compute['time_per_sample'] * 1e6:.1f} µs")
    cluster = RingAllreduce(CLUSTER["alpha"], CLUSTER["beta"])
    models = {"measured α, β": StepModel(ring, compute["param_bytes"], compute["time_per_sample"],
                                         compute["fixed_time"]),
              "assumed cluster": StepModel(cluster, compute["param_bytes"], compute["time_per_sample"],
                                           compute["fixed_time"])}
    predictions = {}
    for label, model in models.items():
        strong, weak = model.strong_scaling(1024), model.weak_scaling(32, critical_batch=2048)
        predictions[label] = {"strong_B1024": strong, "weak_b32": weak,
                              "break_even_batch_N64": model.break_even_batch(64)}
        print(f"strong scaling, global batch 1024 ({label}):")
        print(format_table(strong))
        print(f"weak scaling, 32 per rank ({label}); time_to_train_speedup assumes B_crit = 2048:")
        print(format_table(weak[::2], columns=("ranks", "global_batch", "step_time", "comm_time", "efficiency",
                                               "time_to_train_speedup")))
        print()
    png = os.path.join(HERE, "results", "allreduce_scaling.png")
    os.makedirs(os.path.dirname(png), exist_ok=True)
    plot(measured, ring, compute, models, png)
    path = save_results("allreduce", {"allreduce": measured, "fit": {"alpha": ring.alpha, "beta": ring.beta},
                                      "compute": compute, "cluster_assumption": CLUSTER,
                                      "predictions": predictions, "machine": machine_info()})
    print(f"wrote {path} and {png} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
