"""Activation memory of a GPT's blocks under each strategy, against step time, in one run.

A GPT (minidl/models/gpt.py; 4 blocks, n_embd 128, 4 heads, float32) takes
one training step on a batch of B sequences of T tokens: forward through
the blocks, a mean-square loss, backward. Each block runs

- plainly (every activation kept);
- checkpointed whole (``checkpoint(block, x, T)``: its input kept, all of
  it recomputed during backward);
- checkpointed selectively (``policy="matmul,attention"``: the outputs of
  the Linear products and of attention kept, the norms, GELU, additions
  and reshapes recomputed);
- plainly under ``save_as("bfloat16")`` and ``save_as("int8")`` (every
  saved array stored in 16 or 8 bits).

Memory, both from ``minidl.memory.track``: the peak bytes saved for backward (the arrays
the graph's nodes hold) and the allocator's peak (tracemalloc: gradients and temporaries too).
Time: the process's CPU time of a step (BLAS on one thread), the best of
``--repeat`` steps, all strategies interleaved so that a change in the
machine's load hits each alike; "recompute" is the time above the plain step.

    python benchmarks/bench_memory_strategies.py [--batch 8] [--seq 128] [--repeat 5] [--save]
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: CPU time is the work itself

import argparse  # noqa: E402
import contextlib  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import machine_info, save_results  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import memory  # noqa: E402
from minidl.checkpoint import checkpoint, save_as  # noqa: E402
from minidl.models.gpt import GPT, GPTConfig  # noqa: E402

STRATEGIES = {
    "none": dict(checkpointed=False, hooks=None, policy=None),
    "full block": dict(checkpointed=True, hooks=None, policy=None),
    "selective (matmul, attention)": dict(checkpointed=True, hooks=None, policy="matmul,attention"),
    "save_as bfloat16": dict(checkpointed=False, hooks="bfloat16", policy=None),
    "save_as int8": dict(checkpointed=False, hooks="int8", policy=None),
}


def make_step(model, idx, checkpointed, hooks, policy):
    B, T = idx.shape  # noqa: N806
    C = model.config.n_embd  # noqa: N806

    def step():
        model.zero_grad()
        context = save_as(hooks) if hooks else contextlib.nullcontext()
        with context:
            h = (model.tok_emb(idx) + model.pos_emb(mdl.arange(T))).reshape(B * T, C)
            for block in model.blocks:
                h = checkpoint(block, h, T, policy=policy) if checkpointed else block(h, T)
            loss = (h * h).mean()
        loss.backward()
        return [p.grad.numpy() for p in model.blocks.parameters()]
    return step


def run(batch, seq, repeat):
    mdl.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=seq, n_layer=4, n_head=4, n_embd=128))
    idx = mdl.tensor(np.random.default_rng(0).integers(0, 65, (batch, seq)))
    steps = {name: make_step(model, idx, **kw) for name, kw in STRATEGIES.items()}
    rows, reference = {}, None
    for name, step in steps.items():
        with memory.track() as m:
            grads = step()
        reference = grads if reference is None else reference
        error = max(float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(grads, reference))
        rows[name] = {"peak_bytes": m.peak_bytes, "allocator_peak_bytes": m.allocator_peak_bytes,
                      "grad_error": error, "cpu_s": float("inf")}
    for _ in range(repeat):  # interleaved: each round times every strategy once
        for name, step in steps.items():
            start = time.process_time()
            step()
            rows[name]["cpu_s"] = min(rows[name]["cpu_s"], time.process_time() - start)
    plain = rows["none"]
    for row in rows.values():
        row["memory_ratio"] = row["peak_bytes"] / plain["peak_bytes"]
        row["time_ratio"] = row["cpu_s"] / plain["cpu_s"]
    return rows


def table(rows) -> str:
    lines = ["| strategy | saved for backward, peak | vs none | allocator's peak | step (CPU s) | vs none "
             "| gradient error |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {memory.format_bytes(r['peak_bytes'])} | {r['memory_ratio']:.2f} | "
                     f"{memory.format_bytes(r['allocator_peak_bytes'])} | "
                     f"{r['cpu_s']:.3f} | {r['time_ratio']:.2f} | {r['grad_error']:.1e} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_memory_strategies.json")
    args = parser.parse_args(argv)
    rows = run(args.batch, args.seq, args.repeat)
    print(f"GPT, 4 blocks, n_embd 128, batch {args.batch} x {args.seq} tokens, float32")
    print(table(rows))
    if args.save:
        print(save_results("memory_strategies", {"machine": machine_info(), "batch": args.batch, "seq": args.seq,
                                                 "rows": rows}))


if __name__ == "__main__":
    main()
