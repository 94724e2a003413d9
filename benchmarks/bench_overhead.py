"""Framework overhead: microseconds per op on tiny tensors, forward plus backward.

With 4x4 tensors the arithmetic is nothing, so what is timed is the
engine itself: creating nodes, the backward walk, accumulating gradients.
The same chain of ops runs in minidl and, where installed, PyTorch (CPU).

    python benchmarks/bench_overhead.py [--save]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from common import best_time, save_results

OPS_PER_STEP = 8  # mul, add, relu, mul, sub, tanh, mean, + the scalar loss seed


def minidl_step():
    import minidl as mdl
    x = mdl.tensor(np.random.randn(4, 4).astype(np.float32), requires_grad=True)
    w = mdl.tensor(np.random.randn(4, 4).astype(np.float32), requires_grad=True)

    def step():
        y = (x * w + x).relu()
        y = (y * 0.5 - w).tanh()
        y.mean().backward()
        x.grad = w.grad = None
    return step


def torch_step():
    import torch
    torch.set_num_threads(1)
    x = torch.randn(4, 4, requires_grad=True)
    w = torch.randn(4, 4, requires_grad=True)

    def step():
        y = (x * w + x).relu()
        y = (y * 0.5 - w).tanh()
        y.mean().backward()
        x.grad = w.grad = None
    return step


def run(number=2000):
    results = {"minidl": best_time(minidl_step(), repeat=5, number=number) / OPS_PER_STEP * 1e6}
    try:
        results["torch"] = best_time(torch_step(), repeat=5, number=number) / OPS_PER_STEP * 1e6
    except ImportError:
        pass
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000, help="steps per timing")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_overhead.json")
    args = parser.parse_args(argv)
    res = run(args.number)
    print("µs per op (forward + backward, 4x4 float32), best of 5:")
    for name, us in res.items():
        print(f"  {name:<8} {us:7.2f} µs")
    if "torch" in res:
        print(f"  minidl / torch = {res['minidl'] / res['torch']:.2f}x")
    if args.save:
        print("saved", save_results("overhead", {"us_per_op": res}))


if __name__ == "__main__":
    sys.exit(main())
