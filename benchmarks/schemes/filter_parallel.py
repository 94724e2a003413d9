"""Filter-wise parallelism on the schemes' CNN: each convolution's filters split over the ranks.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/filter_parallel.py --steps 30 --out result.json

Conv(1→8) keeps rank r's filters and leaves its output split; Conv(8→8) takes rank r's input channels
and all-reduces its partial sums (Megatron's pairing: one all-reduce forward, none backward, since the
image needs no gradient); the Flatten → Linear head runs whole on every rank. Every rank trains on the
whole global batch, so the loss is one process's. The report adds the bytes the cost model predicts
(``cost_model.filter_parallel_step_payloads``) next to those the communicator counted.
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
from minidl.parallel.filter_parallel import FilterParallel, FilterParallelOptimizer, filter_parallel  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    comm = parallel.init()
    model = FilterParallel(filter_parallel(common.model(), comm))
    opt = FilterParallelOptimizer(optim.SGD(model.parameters(), lr=common.LR), model.module)
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
    layers = [("split", (1, 8, 8), (8, 8, 8), False), ("input_channel", (8, 8, 8), (8, 8, 8), True)]
    predicted = cost_model.filter_parallel_step_payloads(comm.size, common.GLOBAL_BATCH, layers)
    if comm.rank == 0:
        common.report(args.out, losses, sum(counted.values()), clock.seconds_per_step, scheme="filter_parallel",
                      ranks=comm.size, payloads_per_step=counted, predicted_payloads_per_step=predicted)


if __name__ == "__main__":
    main()
