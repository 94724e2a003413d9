"""Run under mpiexec: parameter-server runs of scheme_cases' problems; rank 0 saves the whole weights and each
rank its traffic.

    mpiexec -n 4 python tests/parallel/ps_worker.py OUT_DIR SERVERS

Runs: synchronous with SGD, momentum and Adam on the MLP (each server keeps its shard's state);
asynchronous with staleness 0, 1 and 3 (seed 5) on the linear regression with plain SGD; and the
synchronous MLP with momentum driven by the Trainer; and a resume of the momentum run from its whole
(consolidated) state. Every rank starts from its own initialization
(the construction broadcasts rank 0's).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import scheme_cases as cases  # noqa: E402

from minidl import parallel  # noqa: E402
from minidl.train import Trainer  # noqa: E402

RUNS = {  # name: (problem, optimizer, staleness)
    "sync_sgd": ("mlp", "sgd", None),
    "sync_momentum": ("mlp", "momentum", None),
    "sync_adam": ("mlp", "adam", None),
    "async_0": ("linreg", "sgd", 0),
    "async_1": ("linreg", "sgd", 1),
    "async_3": ("linreg", "sgd", 3),
}
SEED = 5
RESUMED = 5  # steps after a resume from the synchronous momentum run's whole state


def build(comm, servers, problem, kind, staleness):
    model = cases.make_model(problem, seed=comm.rank)
    ps = parallel.ParameterServer(model, comm, servers=servers, staleness=staleness, seed=SEED)
    return ps, parallel.ParameterServerOptimizer(cases.make_optimizer(ps.parameters(), kind), ps)


def main(out, servers):
    comm = parallel.init()
    facts = {}
    for name, (problem, kind, staleness) in RUNS.items():
        ps, opt = build(comm, servers, problem, kind, staleness)
        comm.reset_traffic()
        pulls, losses = 0, []
        for x, y in cases.batches(problem):
            opt.zero_grad()
            losses.append(ps.train_step(x, y, cases.loss_fn(problem)))
            opt.step()
            pulls += ps.last_step["pulled"]
        traffic = dict(comm.traffic)
        state = ps.consolidated_state_dict()
        facts[name] = {"traffic": traffic, "pulls": int(pulls), "losses": losses,
                       "shard_bytes": [sum(ps._params[i].array.nbytes for i in shard) for shard in ps.shards],
                       "param_bytes": sum(p.array.nbytes for p in ps._params)}
        if comm.rank == 0:
            np.savez(os.path.join(out, f"{name}.npz"), *[state[k] for k in state])
        if name == "sync_momentum":  # the optimizer's state: each server its shard's, whole when consolidated
            facts[name]["own_state"] = sorted(int(k) for k in opt.optimizer.state)
            facts[name]["own_params"] = sorted(ps.shards[comm.rank]) if ps.is_server else []
            whole = opt.consolidated_state_dict()["state"]
            with ps.whole_module() as module:  # every rank sees the servers' weights inside
                facts[name]["whole_module_matches"] = all(
                    np.array_equal(p.array, state[k]) for k, p in module.named_parameters())
            if comm.rank == 0:
                np.savez(os.path.join(out, "momentum_state.npz"), *[whole[k]["b"] for k in sorted(whole)])
            # a resume: a fresh server and workers load the whole state and train RESUMED more steps
            resumed, resumed_opt = build(comm, servers, problem, kind, None)
            resumed.load_state_dict(state)
            resumed_opt.load_state_dict(opt.consolidated_state_dict())
            for x, y in cases.batches(problem, cases.STEPS + RESUMED)[cases.STEPS:]:
                resumed_opt.zero_grad()
                resumed.train_step(x, y, cases.loss_fn(problem))
                resumed_opt.step()
            after = resumed.consolidated_state_dict()
            if comm.rank == 0:
                np.savez(os.path.join(out, "resumed.npz"), *[after[k] for k in after])

    # The Trainer drives the synchronous server through the protocol: the global batch on every rank.
    ps, opt = build(comm, servers, "mlp", "momentum", None)
    trainer = Trainer(ps, opt, cases.batches("mlp"), loss_fn=cases.loss_fn("mlp"), metrics=(), progress=False)
    trainer.fit(epochs=1)
    state = ps.consolidated_state_dict()
    facts["trainer"] = {"losses": [float(v) for v in trainer.steps["loss"]]}
    if comm.rank == 0:
        np.savez(os.path.join(out, "trainer.npz"), *[state[k] for k in state])
    with open(os.path.join(out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
