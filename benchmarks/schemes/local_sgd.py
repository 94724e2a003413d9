"""Local SGD on common.py's CNN: every rank steps alone on its slice, the weights averaged every H steps.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/local_sgd.py --steps 30 --out r.json [--H 4]

H = 1 is data parallelism's run (plain SGD); a larger H sends 1/H of the bytes and drifts from it.
Rank 0 writes ``common.report``: the global batch's loss per step (each rank's slice at its own weights
of that step, weighted by samples: the ranks differ between averages), the payload and link bytes per
step (see data_parallel.py) and the seconds per step.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from data_parallel import bytes_per_step, global_loss  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import optim, parallel  # noqa: E402
from minidl.ops.loss import cross_entropy  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--H", type=int, default=1, help="steps between two averages of the weights")
    args = parser.parse_args(argv)
    comm = parallel.init(device="cpu")
    model = parallel.LocalSGD(common.model(), comm, period=args.H)
    opt = parallel.LocalSGDOptimizer(optim.SGD(model.parameters(), lr=common.LR), model)
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
                      scheme="local_sgd", ranks=comm.size, H=args.H)


if __name__ == "__main__":
    main()
