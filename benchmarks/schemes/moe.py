"""Mixture of experts, the experts split over the ranks: the schemes' small CNN with an MoE hidden layer.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/moe.py --steps 30 --out r.json

The model is :func:`common.model`'s CNN (the same convolutions from the same seed) with its
Linear(512, 32) → ReLU block replaced by ``nn.MoE(512, 32, 32, num_experts=4)``: four experts of
that shape (Linear(512, 32) → ReLU → Linear(32, 32)), Switch top-1 routing with capacity factor 1.25,
each image one token. :func:`minidl.parallel.expert_parallel` keeps 4/N experts on each rank and
the rest data-parallel; each rank trains on its slice of every global batch (plain SGD, ``LR``),
with the load-balancing loss added (``AUX``). Rank 0 writes :func:`common.report`'s JSON: the
global batch's cross-entropy at every step, the payload bytes the communicator counted per step
(all-to-alls and the replicated gradients' all-reduce), the seconds per step, and the tokens the
capacity dropped at every step (summed over the ranks).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import nn, optim, parallel  # noqa: E402

EXPERTS, CAPACITY_FACTOR, AUX = 4, 1.25, 0.01


def moe_model() -> nn.Sequential:
    """common.model() with layers 5 and 6 (Linear(512, 32), ReLU) replaced by a 4-expert MoE (drawn next)."""
    layers = list(common.model())
    moe = nn.MoE(512, 32, 32, num_experts=EXPERTS, k=1, capacity_factor=CAPACITY_FACTOR)
    return nn.Sequential(*layers[:5], moe, layers[7])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    world = parallel.init()
    if common.GLOBAL_BATCH % world.size or EXPERTS % world.size:
        raise SystemExit(f"moe.py: run on a number of ranks dividing {common.GLOBAL_BATCH} and {EXPERTS}")
    model = parallel.expert_parallel(moe_model(), world)
    opt = parallel.ExpertParallelOptimizer(optim.SGD(model.parameters(), lr=common.LR), model)
    layer = model.module[5]
    per = common.GLOBAL_BATCH // world.size
    rows = slice(world.rank * per, (world.rank + 1) * per)
    world.reset_traffic()
    losses, dropped, clock = [], [], common.StepClock()
    for x, y in common.batches(args.steps):
        with clock:
            out = model(mdl.tensor(x[rows]))
            task = F.cross_entropy(out, y[rows])
            opt.zero_grad()
            (task + AUX * layer.aux_loss).backward()
            opt.step()
        # the global batch's loss: the mean of the ranks' means (equal slices); bookkeeping, not counted
        losses.append(world.host_allreduce_(np.array([task.item()]))[0] / world.size)
        dropped.append(model.dropped_tokens)
    payload = sum(world.traffic.values()) / args.steps
    if world.rank == 0:
        common.report(args.out, losses, payload, clock.seconds_per_step, dropped_tokens=dropped,
                      ranks=world.size, experts=EXPERTS, capacity_factor=CAPACITY_FACTOR)


if __name__ == "__main__":
    main()
