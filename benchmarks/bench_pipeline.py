"""The pipeline bubble, measured: idle fraction of GPipe and 1F1B against (p − 1)/(m + p − 1).

    python benchmarks/bench_pipeline.py                 # starts mpiexec -n 2 itself
    python benchmarks/bench_pipeline.py --ranks 4       # on a machine with 4 free cores

Each rank is one stage of an MLP (two Linear(512, 512) + tanh per stage), trained
on a batch of 256 in m = 1, 2, 4, 8 micro-batches with each schedule. The bubble
of a step is 1 − Σ busy / (p · makespan), from the stages' timelines on one
clock (``Pipeline.gather_timeline``); the median of 5 steps after one warm-up.
The formula assumes equal stages and free messages: the measured bubble is
larger by the time spent sending activations and by any unevenness between
stages (and, with more ranks than cores, by the ranks taking turns on a core).

Writes benchmarks/results/<machine>_pipeline.json and the timelines of m = 4
as benchmarks/results/pipeline_timeline.png.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import save_results  # noqa: E402

WIDTH, BATCH, STEPS = 512, 256, 6
MICRO_BATCHES = (1, 2, 4, 8)


def worker(out_path: str) -> None:
    import minidl as mdl
    import minidl.functional as F
    from minidl import nn, optim, parallel
    from minidl.parallel.pipeline import bubble_fraction

    comm = parallel.init("mpi")
    mdl.manual_seed(0)
    layers = []
    for _ in range(comm.size):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, WIDTH)).astype(np.float32)
    y = rng.integers(0, WIDTH, size=BATCH)
    results = []
    for schedule in ("gpipe", "1f1b"):
        for m in MICRO_BATCHES:
            pipe = parallel.Pipeline(nn.Sequential(*layers), comm, m, schedule=schedule)
            opt = optim.SGD(pipe.parameters(), lr=1e-3)
            bubbles, timelines = [], None
            for step in range(STEPS):
                opt.zero_grad()
                pipe.train_step(x, y, lambda out, t: F.cross_entropy(out, mdl.tensor(t)))
                opt.step()
                timelines = pipe.gather_timeline()
                if step:
                    bubbles.append(bubble_fraction(timelines))
            results.append({"schedule": schedule, "micro_batches": m, "stages": comm.size,
                            "measured_bubble": float(np.median(bubbles)),
                            "formula": (comm.size - 1) / (m + comm.size - 1),
                            "peak_in_flight": comm.allgather_object(pipe.peak_in_flight),
                            "timeline": timelines if m == 4 else None})
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    from minidl.parallel import launch
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "pipeline.json")
        one_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
        result = launch.run(args.ranks, [os.path.abspath(__file__), "--worker", out], timeout=600,
                            env=one_thread)  # one core per stage: a rank's BLAS threads would take its neighbour's
        if result.returncode != 0:
            sys.exit(f"mpiexec failed:\n{result.stdout}\n{result.stderr[-3000:]}")
        with open(out) as f:
            rows = json.load(f)
    print(f"{'schedule':>8} {'m':>3} {'measured':>9} {'(p-1)/(m+p-1)':>14}  peak micro-batches held per stage")
    for row in rows:
        print(f"{row['schedule']:>8} {row['micro_batches']:>3} {row['measured_bubble']:>9.3f} "
              f"{row['formula']:>14.3f}  {row['peak_in_flight']}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minidl.parallel.pipeline import draw_timeline
    shown = [r for r in rows if r["timeline"]]
    fig, axes = plt.subplots(len(shown), 1, figsize=(8, 1.2 + 1.1 * args.ranks * len(shown) / 2))
    for ax, row in zip(np.atleast_1d(axes), shown):
        draw_timeline(row["timeline"], ax=ax, title=f"{row['schedule']}, p = {row['stages']}, m = 4: measured "
                                                    f"bubble {row['measured_bubble']:.0%} (formula "
                                                    f"{row['formula']:.0%})")
        ax.set_xlabel("seconds")
    fig.tight_layout()
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    figure = os.path.join(HERE, "results", "pipeline_timeline.png")
    fig.savefig(figure + ".tmp.png", dpi=110)
    os.replace(figure + ".tmp.png", figure)
    for row in rows:
        row.pop("timeline")
    print("wrote", save_results("pipeline", {"ranks": args.ranks, "rows": rows}), "and", figure)


if __name__ == "__main__":
    main()
