"""Data parallelism on common.py's CNN: the baseline every scheme's curve is compared with.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/data_parallel.py --steps 30 --out r.json

Every rank trains its slice of each global batch; ``DataParallel`` all-reduces the gradients, so the run
is one process's on the global batch. Rank 0 writes ``common.report``: the global batch's loss per step,
the payload bytes per step (this rank's ``comm.traffic``, averaged over the ranks: the gradients' P per
step), the link bytes per step (``link_bytes_per_step``: 2(N−1)/N · P) and the seconds per step.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import optim, parallel  # noqa: E402
from minidl.ops.loss import cross_entropy  # noqa: E402
from minidl.parallel import cost_model  # noqa: E402


def bytes_per_step(comm, steps: int) -> tuple[float, float]:
    """(payload, link) bytes per step, each averaged over the ranks: the payload this rank's communicator
    counted (every operation: a send and its receive both count), and what a ring algorithm then sends
    on this rank's link (``cost_model.ring_bytes``: a send once, at its sender), comparable across schemes."""
    payload = sum(comm.traffic.values())
    link = sum(float(cost_model.ring_bytes(op, n, comm.size)) for op, n in comm.traffic.items())
    mine = np.array([payload / steps, link / steps], np.float64)
    total = comm.host_allreduce_(mine)
    return float(total[0]) / comm.size, float(total[1]) / comm.size


def global_loss(comm, loss: float, samples: int, batch: int) -> float:
    """The global batch's mean loss from each rank's mean over its slice (a small host all-reduce)."""
    total = np.array([loss * samples], np.float64)
    return float(comm.host_allreduce_(total)[0]) / batch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    comm = parallel.init(device="cpu")
    model = parallel.DataParallel(common.model(), comm)
    opt = parallel.DistributedOptimizer(optim.SGD(model.parameters(), lr=common.LR), model)
    comm.reset_traffic()
    clock, losses = common.StepClock(), []
    for x, y in common.batches(args.steps):
        with clock:
            xs, ys = parallel.shard(x, comm.rank, comm.size), parallel.shard(y, comm.rank, comm.size)
            opt.zero_grad()
            loss = cross_entropy(model(mdl.tensor(xs)), mdl.tensor(ys))
            loss.backward()
            opt.step()
        losses.append(global_loss(comm, float(loss.item()), len(xs), len(x)))
    payload, link = bytes_per_step(comm, args.steps)
    if comm.rank == 0:
        common.report(args.out, losses, payload, clock.seconds_per_step, link_bytes_per_step=link,
                      scheme="data_parallel", ranks=comm.size)


if __name__ == "__main__":
    main()
