"""Run under mpiexec: what the planner predicts, measured. Rank 0 writes OUT.json.

    mpiexec -n N python tests/parallel/plan_worker.py OUT.json

For plain data parallelism and ZeRO 1, 2, 3 (benchmarks/bench_zero_memory.py's MLP, its batch of 16 per rank,
collectives in pieces of 256 KiB) and, on 2 ranks, a 1F1B pipeline of the same MLP in 2 stages (2 micro-batches)
and the GPT of GPT_CONFIG split tensor-parallel (a batch of GPT_BATCH sequences): every rank's
step peak measured by ``minidl.memory.track`` (the allocator's peak above the level before the model was built,
over three steps) and what one step (the third) handed its communicator, ``Communicator.traffic``.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmarks"))

import bench_zero_memory as bench  # noqa: E402
import numpy as np  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import memory, optim, parallel  # noqa: E402
from minidl.models.gpt import GPT, GPTConfig, tensor_parallel  # noqa: E402 - before memory.track (see measure)

STEPS = 3
GPT_CONFIG = dict(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
GPT_BATCH = 8


def gpt_batch():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, GPT_CONFIG["vocab_size"], size=(GPT_BATCH, GPT_CONFIG["block_size"] + 1))
    return tokens[:, :-1], tokens[:, 1:]


def measure(mode, comm):
    """One mode's step peak and traffic. Everything is imported above: a first import inside memory.track
    would count the modules' own objects in the step's peak."""
    x, y = gpt_batch() if mode == "tensor" else bench.data(comm.rank)
    with memory.track() as tracked:
        mdl.manual_seed(0)
        if mode == "tensor":
            model = parallel.TensorParallel(tensor_parallel(GPT(GPTConfig(**GPT_CONFIG)), comm))
            opt = parallel.TensorParallelOptimizer(optim.Adam(model.parameters(), lr=1e-3), model)
        elif mode == "pipeline":
            whole = bench.build_model()
            params = list(whole.parameters())
            model = parallel.Pipeline(whole, comm, micro_batches=2, schedule="1f1b", boundaries=[0, 4, 7])
            opt = parallel.PipelineOptimizer(optim.Adam(model.stage_groups(params), lr=1e-3), model, params)
        else:
            model, opt = bench.wrap(mode, bench.build_model(), comm)
        for step in range(STEPS):
            if step == STEPS - 1:
                comm.reset_traffic()
            opt.zero_grad()
            if mode == "pipeline":
                model.train_step(mdl.tensor(x), mdl.tensor(y), F.cross_entropy)
            elif mode == "tensor":
                out = model(x)
                F.cross_entropy(out.reshape(-1, out.shape[-1]), mdl.tensor(y.reshape(-1))).backward()
            else:
                F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()
        traffic = dict(comm.traffic)
    return {"mode": mode, "rank": comm.rank, "peak": tracked.allocator_peak_bytes, "traffic": traffic}


def main():
    comm = parallel.init()
    modes = list(bench.MODES) + (["pipeline", "tensor"] if comm.size == 2 else [])
    rows = []
    for mode in modes:
        rows.extend(comm.allgather_object(measure(mode, comm)))
    if comm.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
