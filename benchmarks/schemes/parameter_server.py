"""The parameter server on common.py's CNN: synchronous, or asynchronous with bounded staleness.

    mpiexec -n 2 python -m mpi4py benchmarks/schemes/parameter_server.py --steps 30 --out r.json [--staleness 1]
        [--servers 1]

Ranks 0..S−1 are servers (``--servers``, 1 by default), the others workers, each on its slice of every
global batch (on 2 ranks: one server, one worker with the whole batch). Synchronous (no ``--staleness``)
the run is one process's; with ``--staleness τ`` the workers compute on weights up to τ versions old,
by the seeded schedule of :mod:`minidl.parallel.parameter_server`. Rank 0 writes ``common.report``: the
global batch's loss per step, the payload and link bytes per step (see data_parallel.py) and the
seconds per step, with the workers' pulls.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from data_parallel import bytes_per_step  # noqa: E402

from minidl import optim, parallel  # noqa: E402
from minidl.ops.loss import cross_entropy  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--staleness", type=int, default=None, help="τ: asynchronous, weights up to τ versions old")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the asynchronous schedule's seed")
    args = parser.parse_args(argv)
    comm = parallel.init(device="cpu")
    model = parallel.ParameterServer(common.model(), comm, servers=args.servers, staleness=args.staleness,
                                     seed=args.seed)
    opt = parallel.ParameterServerOptimizer(optim.SGD(model.parameters(), lr=common.LR), model)
    comm.reset_traffic()
    clock, losses, pulls = common.StepClock(), [], 0
    for x, y in common.batches(args.steps):
        with clock:
            opt.zero_grad()
            losses.append(model.train_step(x, y, cross_entropy))
            opt.step()
        pulls += model.last_step["pulled"] if model.is_server else 0
    payload, link = bytes_per_step(comm, args.steps)
    if comm.rank == 0:
        common.report(args.out, losses, payload, clock.seconds_per_step, link_bytes_per_step=link,
                      scheme="parameter_server", ranks=comm.size, servers=args.servers,
                      staleness=args.staleness, pulls=pulls)


if __name__ == "__main__":
    main()
