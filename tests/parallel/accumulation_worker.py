"""Run under mpiexec: gradient accumulation with the gradients reduced during the backward; rank 0 saves the weights.

    mpiexec -n 2 python tests/parallel/accumulation_worker.py OUT_DIR

Each step is two micro-batches of 7 and 5 samples (uneven on 2 and 4 ranks), each rank taking its slice of
each, one backward per micro-batch, then one sync and an SGD step: plain data parallelism with overlap
(256-byte buckets, several started during each backward) and ZeRO-2 in 600-byte buckets.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mp_scenarios  # noqa: E402
import numpy as np  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import optim, parallel  # noqa: E402
from minidl.ops.loss import cross_entropy  # noqa: E402

MICRO = (7, 5)
STEPS = 3


def batches():
    rng = np.random.default_rng(21)
    return [[(rng.normal(size=(n, 6)), rng.integers(0, 3, size=n)) for n in MICRO] for _ in range(STEPS)]


def train(model, opt, comm=None):
    for micro_batches in batches():
        opt.zero_grad()
        for x, y in micro_batches:
            if comm is not None:
                x, y = parallel.shard(x, comm.rank, comm.size), parallel.shard(y, comm.rank, comm.size)
            cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
        opt.step()


def main(out):
    comm = parallel.init()
    for name in ("overlap", "zero2"):
        model = mp_scenarios.make_sequential(seed=comm.rank)  # every rank from its own start: rank 0's wins
        if name == "overlap":
            wrapped = parallel.DataParallel(model, comm, bucket_bytes=256, overlap=True)
        else:
            wrapped = parallel.ShardedDataParallel(model, comm, stage=2, bucket_bytes=600)
        opt = parallel.DistributedOptimizer(optim.SGD(wrapped.parameters(), lr=0.5), wrapped)
        train(wrapped, opt, comm)
        if comm.rank == 0:
            np.savez(os.path.join(out, f"{name}.npz"), *[p.array for p in model.parameters()])


if __name__ == "__main__":
    main(sys.argv[1])
