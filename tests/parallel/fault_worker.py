"""Run under mpiexec: a job that goes wrong on one rank.

    mpiexec -n 2 python tests/parallel/fault_worker.py raise      # the last rank raises at step 3
    mpiexec -n 2 python tests/parallel/fault_worker.py mismatch   # the last rank builds a wider model
    mpiexec -n 2 python tests/parallel/fault_worker.py pipeline   # the last stage raises mid-step

In both cases the other ranks would wait forever in a collective if nothing
ended the job; minidl.parallel.init's exception hook must abort it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scenarios  # noqa: E402

from minidl import parallel  # noqa: E402


def pipeline(comm):
    """The last stage raises inside its loss at step 3, while the first waits for its gradient."""
    import minidl as mdl
    import minidl.functional as F
    from minidl import nn

    def loss(out, y):
        if step == 3:
            raise RuntimeError(f"deliberate failure at step {step}")
        return F.cross_entropy(out, mdl.tensor(y))

    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3), nn.Identity())
    pipe = parallel.Pipeline(model, comm, micro_batches=2)
    xs, ys = scenarios.make_batches(12, "float64")
    for step in range(1000):
        pipe.train_step(xs[step % 20].astype("float32"), ys[step % 20], loss)
    print("finished without an abort", flush=True)


def main(mode):
    comm = parallel.init()
    if mode == "pipeline":
        return pipeline(comm)
    last = comm.rank == comm.size - 1
    hidden = 17 if (mode == "mismatch" and last) else 16
    dp = parallel.DataParallel(scenarios.make_model(comm.rank, "float64", hidden=hidden), comm)
    opt = parallel.DistributedOptimizer(scenarios.make_optimizer("sgd", dp.parameters()), dp)
    xs, ys = scenarios.make_batches(12, "float64")
    for step in range(1000):  # far more steps than the test waits for: only an abort ends it early
        if mode == "raise" and last and step == 3:
            raise RuntimeError(f"deliberate failure at step {step}")
        opt.zero_grad()
        scenarios.loss_of(dp, parallel.shard(xs[step % 20], comm.rank, comm.size),
                          parallel.shard(ys[step % 20], comm.rank, comm.size)).backward()
        opt.step()
        if step == 999:
            print("finished without an abort", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
