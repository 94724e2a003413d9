"""Run under mpiexec: local SGD runs of scheme_cases' MLP; rank 0 saves the averaged weights, each rank its
own weights and traffic.

    mpiexec -n 4 python tests/parallel/local_sgd_worker.py OUT_DIR

Runs (16 steps, each rank on its slice of every global batch of 13): H = 1 with SGD; H = 1 with momentum
and the optimizer state averaged; H = 4 and H = 16 with SGD; and H = 1 with SGD driven by the Trainer.
Every rank starts from its own initialization (the construction broadcasts rank 0's).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import scheme_cases as cases  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import parallel  # noqa: E402
from minidl.train import Trainer  # noqa: E402

STEPS = 16
RUNS = {"h1_sgd": (1, "sgd", False), "h1_momentum_state": (1, "momentum", True),
        "h4_sgd": (4, "sgd", False), "h16_sgd": (16, "sgd", False)}


def build(comm, period, kind, average_state):
    model = parallel.LocalSGD(cases.make_model("mlp", seed=comm.rank), comm, period=period)
    return model, parallel.LocalSGDOptimizer(cases.make_optimizer(model.parameters(), kind), model, average_state)


def main(out):
    comm = parallel.init()
    fn = cases.loss_fn("mlp")
    facts = {}
    for name, (period, kind, average_state) in RUNS.items():
        model, opt = build(comm, period, kind, average_state)
        comm.reset_traffic()
        for x, y in cases.batches("mlp", STEPS):
            opt.zero_grad()
            x, y = parallel.shard(x, comm.rank, comm.size), parallel.shard(y, comm.rank, comm.size)
            fn(model(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()
        facts[name] = {"traffic": dict(comm.traffic), "param_bytes": sum(p.array.nbytes for p in model.parameters())}
        np.savez(os.path.join(out, f"{name}_rank{comm.rank}.npz"), *[p.array for p in model.parameters()])
        state = model.consolidated_state_dict()
        if comm.rank == 0:
            np.savez(os.path.join(out, f"{name}.npz"), *[state[k] for k in state])

    model, opt = build(comm, 1, "sgd", False)
    shards = [(parallel.shard(x, comm.rank, comm.size), parallel.shard(y, comm.rank, comm.size))
              for x, y in cases.batches("mlp", STEPS)]
    Trainer(model, opt, shards, loss_fn=fn, metrics=(), progress=False).fit(epochs=1)
    state = model.consolidated_state_dict()
    if comm.rank == 0:
        np.savez(os.path.join(out, "trainer.npz"), *[state[k] for k in state])
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(sys.argv[1])
