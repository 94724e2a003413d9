"""Spatial parallelism on the schemes' CNN: every 8 × 8 digit cut into strips of rows, one per rank.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/spatial.py --steps 30 --out result.json

Both 3 × 3 convolutions run on this rank's 8/N rows after a halo exchange of one row with each neighbour;
the strips are all-gathered before Flatten → Linear, which run whole on every rank; the convolutions'
weight gradients are all-reduced (each strip holds a part of them). Every rank trains on the whole global
batch, so the loss is one process's. The report adds the bytes the cost model predicts for rank 0
(``cost_model.spatial_step_payloads``) next to those its communicator counted.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import optim, parallel  # noqa: E402
from minidl.parallel import cost_model  # noqa: E402
from minidl.parallel.spatial import SpatialParallel  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    comm = parallel.init()
    model = SpatialParallel(common.model(), comm)
    opt = optim.SGD(model.parameters(), lr=common.LR)   # every gradient is whole on every rank: no wrapper
    clock, losses = common.StepClock(), []
    comm.reset_traffic()
    for x, y in common.batches(args.steps):
        with clock:
            opt.zero_grad()
            loss = F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y))
            loss.backward()
            opt.step()
        losses.append(loss.item())
    counted = {op: n / args.steps for op, n in comm.traffic.items()}
    convs = [(1, 8, 1, 8 * 1 * 9 + 8, False), (8, 8, 1, 8 * 8 * 9 + 8, True)]
    predicted = cost_model.spatial_step_payloads(comm.rank, comm.size, common.GLOBAL_BATCH, convs,
                                                 gathered_map=(8, 8, 8))
    if comm.rank == 0:
        common.report(args.out, losses, sum(counted.values()), clock.seconds_per_step, scheme="spatial",
                      ranks=comm.size, payloads_per_step=counted, predicted_payloads_per_step=predicted)


if __name__ == "__main__":
    main()
