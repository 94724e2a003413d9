"""One SGD step of an MLP 784-1024-1024-10, batch 256, float32, three ways in one run:

- minidl (nn-free: F.linear, F.relu, F.cross_entropy, autograd, in-place SGD),
- the same step written by hand in NumPy (forward, softmax cross-entropy,
  backward by the chain rule, update) — the floor for any NumPy engine,
- PyTorch on the CPU, where installed.

The step is ~4.3 GFLOP (3 GEMMs per layer); the ratio minidl / NumPy is the
framework's overhead, minidl / PyTorch the distance to the peer.

    python benchmarks/bench_mlp.py [--save]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from common import best_time, gemm_peak, save_results

SIZES = (784, 1024, 1024, 10)
BATCH, LR = 256, 0.01


def init_weights(seed=0):
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        bound = 1 / np.sqrt(fan_in)
        weights.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        weights.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)
    return weights, x, y


def numpy_step(weights, x, y):
    """Forward, backward and SGD by hand: y = relu(x W1ᵀ + b1) ... softmax cross-entropy."""
    def step():
        acts, h = [x], x
        for i in range(0, len(weights), 2):
            h = h @ weights[i].T
            h += weights[i + 1]
            if i < len(weights) - 2:
                np.maximum(h, 0, out=h)
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(BATCH), y] -= 1
        g = p / BATCH  # dL/dlogits
        for i in range(len(weights) - 2, -1, -2):
            a = acts[i // 2]
            gw, gb = g.T @ a, g.sum(axis=0)
            if i:
                g = g @ weights[i]
                g *= a > 0
            weights[i] -= LR * gw
            weights[i + 1] -= LR * gb
    return step


def minidl_step(weights, x, y):
    import minidl as mdl
    import minidl.functional as F
    params = [mdl.tensor(w, requires_grad=True) for w in weights]
    xt = mdl.tensor(x)

    def step():
        h = xt
        for i in range(0, len(params), 2):
            h = F.linear(h, params[i], params[i + 1])
            if i < len(params) - 2:
                h = F.relu(h)
        loss = F.cross_entropy(h, y)
        loss.backward()
        for p in params:
            p.data -= LR * p.grad.data
            p.grad = None
    return step


def torch_step(weights, x, y):
    import torch
    params = [torch.tensor(w, requires_grad=True) for w in weights]
    xt, yt = torch.tensor(x), torch.tensor(y)

    def step():
        h = xt
        for i in range(0, len(params), 2):
            h = torch.nn.functional.linear(h, params[i], params[i + 1])
            if i < len(params) - 2:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, yt)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= LR * p.grad
                p.grad = None
    return step


def run(repeat=10):
    results = {}
    for name, make in (("numpy", numpy_step), ("minidl", minidl_step), ("torch", torch_step)):
        weights, x, y = init_weights()
        try:
            step = make(weights, x, y)
        except ImportError:
            continue
        results[name] = best_time(step, repeat=repeat, number=1, warmup=3) * 1e3
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description="MLP SGD step: minidl vs NumPy by hand vs PyTorch")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_mlp.json")
    args = parser.parse_args(argv)
    peak = gemm_peak()
    res = run(args.repeat)
    flops = 6 * BATCH * sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:]))
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, one SGD step (best of {args.repeat}):")
    for name, ms in res.items():
        print(f"  {name:<7} {ms:8.2f} ms   {flops / ms / 1e6:7.1f} GFLOP/s   {flops / ms / 1e6 / peak:4.0%} of peak")
    print(f"  sgemm peak (NumPy, the best of 512³, 1024³, 1536³): {peak:.1f} GFLOP/s")
    print(f"  minidl / numpy = {res['minidl'] / res['numpy']:.2f}x")
    if "torch" in res:
        print(f"  minidl / torch = {res['minidl'] / res['torch']:.2f}x")
    if args.save:
        print("saved", save_results("mlp", {"ms_per_step": res, "gflop_per_step": flops / 1e9,
                                              "gemm_peak_gflops": peak}))


if __name__ == "__main__":
    sys.exit(main())
