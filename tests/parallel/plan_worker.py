"""Run under mpiexec: what the planner predicts, measured. Rank 0 writes OUT.json.

    mpiexec -n N python tests/parallel/plan_worker.py OUT.json

For plain data parallelism and ZeRO 1, 2, 3 (benchmarks/bench_zero_memory.py's MLP, its batch of 16 per rank,
collectives in pieces of 256 KiB) and, on 2 ranks, a 1F1B pipeline of the same MLP in 2 stages: every rank's
step peak measured by ``minidl.memory.track`` (the allocator's peak above the level before the model was built,
over three steps) and what one step (the third) handed its communicator, ``Communicator.traffic``.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))

import bench_zero_memory as bench  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import memory, optim, parallel  # noqa: E402

STEPS = 3


def measure(mode, comm):
    x, y = bench.data(comm.rank)
    with memory.track() as tracked:
        mdl.manual_seed(0)
        if mode == "pipeline":
            pipe = parallel.Pipeline(bench.build_model(), comm, micro_batches=2, schedule="1f1b")
            model, opt = pipe, parallel.PipelineOptimizer(optim.Adam(pipe.stage_groups(
                list(pipe.whole.parameters()) if hasattr(pipe, "whole") and pipe.whole is not None
                else list(pipe.parameters())), lr=1e-3), pipe, None)
        else:
            model, opt = bench.wrap(mode, bench.build_model(), comm)
        for step in range(STEPS):
            if step == STEPS - 1:
                comm.reset_traffic()
            opt.zero_grad()
            if mode == "pipeline":
                model.train_step(mdl.tensor(x), mdl.tensor(y), F.cross_entropy)
            else:
                F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()
        traffic = dict(comm.traffic)
    return {"mode": mode, "rank": comm.rank, "peak": tracked.allocator_peak_bytes, "traffic": traffic}


def main():
    comm = parallel.init()
    modes = list(bench.MODES)
    rows = []
    for mode in modes:
        rows.extend(comm.allgather_object(measure(mode, comm)))
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
