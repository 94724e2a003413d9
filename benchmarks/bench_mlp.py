"""One SGD step of an MLP 784-1024-1024-10, batch 256, float32, three ways in one run:

- minidl (nn-free: F.linear, F.relu, F.cross_entropy, autograd, in-place SGD),
- the same step written by hand in NumPy (forward, softmax cross-entropy,
  backward by the chain rule, update) — the floor for any NumPy engine,
- PyTorch on the CPU, where installed.

With ``--device cuda`` the three run on the GPU: minidl on CuPy, the hand-written
step on CuPy (the same lines, ``xp`` = cupy), PyTorch on CUDA; each timed with
CUDA events after a warm-up, in alternating rounds (minidl.roofline.timing).

The step is ~4.3 GFLOP (3 GEMMs per layer); the ratio minidl / NumPy is the
framework's overhead, minidl / PyTorch the distance to the peer.

    python benchmarks/bench_mlp.py [--save] [--device cuda]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from common import add_device_option, best_time, device_timers, gemm_peak, require_device, save_results

SIZES = (784, 1024, 1024, 10)
BATCH, LR = 256, 0.01


def init_weights(seed=0, sizes=SIZES, batch=BATCH):
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1 / np.sqrt(fan_in)
        weights.append(rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32))
        weights.append(rng.uniform(-bound, bound, fan_out).astype(np.float32))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch)
    return weights, x, y


def numpy_step(weights, x, y, device="cpu"):
    """Forward, backward and SGD by hand: y = relu(x W1ᵀ + b1) ... softmax cross-entropy (CuPy on "cuda")."""
    from minidl import backend
    xp = backend.xp_for(device)
    weights, x, y = [backend.to_device(w, device) for w in weights], backend.to_device(x, device), \
        backend.to_device(y, device)

    def step():
        acts, h = [x], x
        for i in range(0, len(weights), 2):
            h = h @ weights[i].T
            h += weights[i + 1]
            if i < len(weights) - 2:
                xp.maximum(h, 0, out=h)
            acts.append(h)
        z = h - h.max(axis=1, keepdims=True)
        p = xp.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[xp.arange(len(y)), y] -= 1
        g = p / len(y)  # dL/dlogits
        for i in range(len(weights) - 2, -1, -2):
            a = acts[i // 2]
            gw, gb = g.T @ a, g.sum(axis=0)
            if i:
                g = g @ weights[i]
                g *= a > 0
            weights[i] -= LR * gw
            weights[i + 1] -= LR * gb
    return step


def minidl_step(weights, x, y, device="cpu"):
    import minidl as mdl
    import minidl.functional as F
    params = [mdl.tensor(w, requires_grad=True, device=device) for w in weights]
    xt, y = mdl.tensor(x, device=device), mdl.tensor(y, device=device)

    def step():
        h = xt
        for i in range(0, len(params), 2):
            h = F.linear(h, params[i], params[i + 1])
            if i < len(params) - 2:
                h = F.relu(h)
        loss = F.cross_entropy(h, y)
        loss.backward()
        for p in params:
            p.array -= LR * p.grad.array
            p.grad = None
    return step


def torch_step(weights, x, y, device="cpu"):
    import torch
    params = [torch.tensor(w, requires_grad=True, device=device) for w in weights]
    xt, yt = torch.tensor(x, device=device), torch.tensor(y, device=device)

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


def run(repeat=10, device="cpu", sizes=SIZES, batch=BATCH):
    """Milliseconds per step of each system: the best of ``repeat`` (on a GPU, of alternating rounds)."""
    steps = {}
    for name, make in (("numpy", numpy_step), ("minidl", minidl_step), ("torch", torch_step)):
        weights, x, y = init_weights(0, sizes, batch)
        try:
            steps[name] = make(weights, x, y, device)
        except ImportError:
            continue
        except (RuntimeError, AssertionError) as exc:  # PyTorch without CUDA ("not compiled with CUDA")
            print(f"  {name} left out: {exc}")
    if device == "cpu":
        return {name: best_time(step, repeat=repeat, number=1, warmup=3) * 1e3 for name, step in steps.items()}
    from minidl.roofline import timing
    times = timing.alternate(steps, device_timers(device, steps), rounds=repeat, warmup=3)
    return {name: min(t) * 1e3 for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description="MLP SGD step: minidl vs NumPy by hand vs PyTorch")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_mlp.json")
    add_device_option(parser)
    args = parser.parse_args(argv)
    require_device(args.device)
    if args.device == "cpu":
        peak = gemm_peak()
    else:
        from minidl.roofline.ceilings import measure_gemm
        peak = measure_gemm(4096, args.device) / 1e9
    res = run(args.repeat, args.device)
    flops = 6 * BATCH * sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:]))
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, one SGD step on {args.device} "
          f"(best of {args.repeat}):")
    for name, ms in res.items():
        print(f"  {name:<7} {ms:8.2f} ms   {flops / ms / 1e6:7.1f} GFLOP/s   {flops / ms / 1e6 / peak:4.0%} of peak")
    print(f"  sgemm peak ({'NumPy, the best of 512³, 1024³, 1536³' if args.device == 'cpu' else 'CuPy, 4096³'}): "
          f"{peak:.1f} GFLOP/s")
    print(f"  minidl / numpy = {res['minidl'] / res['numpy']:.2f}x")
    if "torch" in res:
        print(f"  minidl / torch = {res['minidl'] / res['torch']:.2f}x")
    if args.save:
        print("saved", save_results("mlp" if args.device == "cpu" else f"mlp_{args.device}",
                                    {"ms_per_step": res, "gflop_per_step": flops / 1e9, "gemm_peak_gflops": peak,
                                     "device": args.device}))


if __name__ == "__main__":
    sys.exit(main())
