"""What a rank holds between steps and at the peak of a step: plain data parallelism and ZeRO 1, 2, 3.

Run under MPI (each rank measures itself; rank 0 writes the table):

    mpiexec -n 4 python benchmarks/bench_zero_memory.py [--save] [--json out.json] [--bucket-bytes B] [--no-overlap]

The meter is Python's :mod:`tracemalloc`, which sees every NumPy buffer the process allocates
(parameters, gradients, buckets, optimizer state, activations, the collectives' receive buffers).
Bytes are counted from the level before the model is built, so they are the model's own: for each
mode, after ``--steps − 1`` warm-up steps (Adam's m and v exist by then),

    held  = bytes held between steps (after ``opt.step()``, the step's gradients still held)
    peak  = the highest level during one more step (zero_grad, forward, backward, step)

both divided by Ψ, the model's parameter count, beside the paper's formula (fp32 Adam: p = g = 4,
K = 8 bytes per parameter; docs/parallelism.md):

    DP (p + g + K)Ψ     ZeRO-1 (p + g)Ψ + KΨ/N     ZeRO-2 pΨ + (g + K)Ψ/N     ZeRO-3 (p + g + K)Ψ/N

and the step-peak bound of each (:func:`peak_bound`). The model is the MLP
256 → 512 → 512 → 256 → 10 (528,138 parameters; its 512×512 layer is half of them), float32,
a batch of 16 samples per rank.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tracemalloc

import numpy as np

MODES = ("dp", "zero1", "zero2", "zero3")
P, G, K = 4, 4, 8   # bytes per parameter: float32 weights and gradients, Adam's m and v
BATCH = 16            # samples per rank; rank r's are data(r)
BUCKET_BYTES = 2**18  # what one collective call moves: an eighth of this 2 MB model (25 MB would be all of it)


def build_model(dtype="float32"):
    from minidl import nn
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)).to(dtype=np.dtype(dtype))


def data(rank: int, batch: int = BATCH, dtype="float32"):
    """Rank ``rank``'s slice of every step's batch: (inputs, labels)."""
    rng = np.random.default_rng(rank)
    return rng.normal(size=(batch, 256)).astype(dtype), rng.integers(0, 10, size=batch)


def formula(mode: str, ranks: int) -> float:
    """The paper's bytes per parameter per rank (docs/parallelism.md), fp32 Adam."""
    return {"dp": P + G + K, "zero1": P + G + K / ranks, "zero2": P + (G + K) / ranks,
            "zero3": (P + G + K) / ranks}[mode]


def peak_bound(mode: str, ranks: int, largest_unit_fraction: float) -> float:
    """The step peak a rank may reach, in bytes per parameter.

    Data parallelism: its (p + g + K) plus one bucket of gradients in flight (g/2: the reduction
    runs in buckets during the backward; no full flat copy of the gradients). ZeRO: 1.25 × the
    formula (a quarter over it for what a step holds briefly: shards in flight, activations) plus
    the largest gathered unit's whole weights and gradients, (p + g) × its share of the parameters.
    """
    if mode == "dp":
        return P + G + K + G / 2
    return 1.25 * formula(mode, ranks) + (P + G) * largest_unit_fraction


def wrap(mode: str, model, comm, lr: float = 1e-3, bucket_bytes: int = BUCKET_BYTES, overlap: bool = True):
    """(the model to call, the optimizer to step) for ``mode``: data parallelism reduces its buckets during the
    backward (``overlap``); every collective moves at most ``bucket_bytes`` at a time."""
    from minidl import optim, parallel
    from minidl.parallel.zero import ZeroRedundancyOptimizer
    if mode == "dp":
        dp = parallel.DataParallel(model, comm, bucket_bytes=bucket_bytes, overlap=overlap)
        return dp, parallel.DistributedOptimizer(optim.Adam(dp.parameters(), lr=lr), dp)
    if mode == "zero1":
        dp = parallel.DataParallel(model, comm, bucket_bytes=bucket_bytes, overlap=overlap)
        zero = ZeroRedundancyOptimizer(dp.parameters(), optim.Adam, comm, bucket_bytes=bucket_bytes, lr=lr)
        return dp, parallel.DistributedOptimizer(zero, dp)
    sharded = parallel.ShardedDataParallel(model, comm, stage=2 if mode == "zero2" else 3, bucket_bytes=bucket_bytes)
    return sharded, parallel.DistributedOptimizer(optim.Adam(sharded.parameters(), lr=lr), sharded)


def measure(mode: str, comm, steps: int = 3, batch: int = BATCH, weights_to=None, dtype="float32",
            bucket_bytes: int = BUCKET_BYTES, overlap: bool = True) -> dict:
    """This rank's held and step-peak bytes for ``mode`` (see the module docstring); ``weights_to``: a path
    where rank 0 saves the whole weights after the steps (``np.savez``, in ``parameters()`` order)."""
    import minidl as mdl
    import minidl.functional as F
    x, y = data(comm.rank, batch, dtype)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        mdl.manual_seed(0)
        model, opt = wrap(mode, build_model(dtype), comm, bucket_bytes=bucket_bytes, overlap=overlap)
        params = sum(p.numel() for p in build_model().parameters())
        # the largest gathered unit: ZeRO-3's largest layer (weight and bias), the 512×512 one here
        largest = max(sum(p.numel() for p in layer.parameters()) for layer in build_model())

        def step():
            opt.zero_grad()
            loss = F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y))
            loss.backward()
            opt.step()

        for _ in range(steps - 1):
            step()
        held = tracemalloc.get_traced_memory()[0] - base   # the gradients of the last step still held
        tracemalloc.reset_peak()
        step()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    if weights_to is not None:  # the whole weights after the steps (a collective at stage 3), from rank 0
        if hasattr(model, "gather_parameters"):
            model.gather_parameters()
        if comm.rank == 0:
            np.savez(weights_to, *[p.array for p in model.module.parameters()])
    return {"mode": mode, "rank": comm.rank, "ranks": comm.size, "parameters": params,
            "held_per_parameter": held / params, "peak_per_parameter": peak / params,
            "formula_per_parameter": formula(mode, comm.size),
            "bound_per_parameter": peak_bound(mode, comm.size, largest / params)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write every rank's rows here (rank 0)")
    parser.add_argument("--save", action="store_true",
                        help="write benchmarks/results/<machine>_zero_memory_<N>ranks.json")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--weights", help="a folder where rank 0 saves each mode's whole weights after the steps")
    parser.add_argument("--bucket-bytes", type=int, default=BUCKET_BYTES)
    parser.add_argument("--no-overlap", action="store_true", help="data parallelism reduces after the backward")
    parser.add_argument("--dtype", default="float32", help="float64 checks the weights (the bytes are then twice "
                                                           "the float32 formulas')")
    args = parser.parse_args(argv)
    from minidl import parallel
    comm = parallel.init()
    rows = []
    for mode in args.modes.split(","):
        weights_to = None if args.weights is None else os.path.join(args.weights, f"{mode}.npz")
        mine = measure(mode, comm, steps=args.steps, weights_to=weights_to, dtype=args.dtype,
                       bucket_bytes=args.bucket_bytes, overlap=not args.no_overlap)
        rows.extend(comm.allgather_object(mine))
    if comm.rank == 0:
        when = "after" if args.no_overlap else "during"
        print(f"{comm.size} ranks, bytes per parameter (tracemalloc; Ψ = {rows[0]['parameters']:,}; collectives of at "
              f"most {args.bucket_bytes:,} B; data parallelism {when} the backward)")
        print(f"{'mode':>6} {'formula':>8} {'held (max rank)':>16} {'peak (max rank)':>16} {'peak (rank 0)':>14} "
              f"{'bound':>6}")
        for mode in args.modes.split(","):
            mine = [r for r in rows if r["mode"] == mode]
            print(f"{mode:>6} {mine[0]['formula_per_parameter']:8.2f} "
                  f"{max(r['held_per_parameter'] for r in mine):16.2f} "
                  f"{max(r['peak_per_parameter'] for r in mine):16.2f} {mine[0]['peak_per_parameter']:14.2f} "
                  f"{mine[0]['bound_per_parameter']:6.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        if args.save:
            from common import save_results
            print("saved", save_results(f"zero_memory_{comm.size}ranks", {
                "meter": "tracemalloc", "bucket_bytes": args.bucket_bytes, "overlap": not args.no_overlap,
                "dtype": args.dtype, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
