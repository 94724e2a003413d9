"""Run under mpiexec: every scenario of scenarios.py, data-parallel; each rank saves its final parameters.

    mpiexec -n 4 python tests/parallel/dp_worker.py OUT_DIR [--device cuda] [--backend nccl]

Writes OUT_DIR/rank<r>.npz (``<scenario>/<i>``: parameter i after the run) and
OUT_DIR/rank<r>.json (per-scenario facts: the ZeRO memory report, sync stats).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import scenarios  # noqa: E402

from minidl import backend, parallel  # noqa: E402
from minidl.data import DataLoader  # noqa: E402


def run(name, comm, device):
    kind, dtype, batch, loop = scenarios.SCENARIOS[name]
    model = scenarios.make_model(seed=comm.rank, dtype=dtype)  # a different start on every rank
    if device != "cpu":
        model.to(device)
    facts = {}
    dp = parallel.DataParallel(model, comm, bucket_bytes=256 if "small_buckets" in name else 25 * 2**20,
                               overlap=name.startswith("overlap"))
    if loop == "zero":
        cls, options = scenarios.OPTIMIZERS[kind]
        inner = parallel.ZeroRedundancyOptimizer(dp.parameters(), cls, comm, **options)
    else:
        inner = scenarios.make_optimizer(kind, dp.parameters())
    opt = parallel.DistributedOptimizer(inner, dp)
    if loop.startswith("trainer"):
        from minidl.train import Trainer
        x, y = scenarios.make_dataset(batch, dtype)
        loader = parallel.shard_loader(DataLoader((x, y), batch_size=batch, shuffle=True, seed=5), comm)
        clip = 0.5 if loop == "trainer_clip" else None
        Trainer(dp, opt, loader, progress=False, max_grad_norm=clip).fit(epochs=4, max_steps=scenarios.STEPS)
    else:
        xs, ys = scenarios.make_batches(batch, dtype)
        comm.reset_traffic()  # what the steps hand the communicator (ZeRO-1: against the cost model)
        for step in range(scenarios.STEPS):
            x = backend.to_device(parallel.shard(xs[step], comm.rank, comm.size), device)
            y = parallel.shard(ys[step], comm.rank, comm.size)
            opt.zero_grad()
            scenarios.loss_of(dp, x, y).backward(create_graph=kind == "adahessian")
            opt.step()
    facts["sync"] = {k: float(v) for k, v in dp.last_sync.items()}
    facts["traffic"] = dict(comm.traffic)
    if loop == "zero":
        facts["memory"] = inner.memory_report()
        full = inner.consolidated_state_dict()
        facts["consolidated_positions"] = sorted(int(k) for k in full["state"])
        facts["consolidated"] = {f"{pos}/{key}": np.asarray(value).tolist()
                                 for pos, state in full["state"].items() for key, value in state.items()
                                 if hasattr(value, "shape")}
    return [backend.to_numpy(p.array) for p in dp.parameters()], facts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    comm = parallel.init(args.backend, device=args.device)
    if args.device.startswith("cuda"):
        args.device = comm.device
    arrays, facts = {}, {}
    for name in args.only or scenarios.SCENARIOS:
        params, facts[name] = run(name, comm, args.device)
        for i, p in enumerate(params):
            arrays[f"{name}/{i}"] = p
    facts["world"] = {"rank": comm.rank, "size": comm.size, "backend": comm.name}
    np.savez(os.path.join(args.out, f"rank{comm.rank}.npz"), **arrays)
    with open(os.path.join(args.out, f"rank{comm.rank}.json"), "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main()
