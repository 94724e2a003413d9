"""Mixed precision on the CPU, measured: what 16 bits cost in time and save in memory.

Part 1. One matrix product (n×n by n×n) in float32 (BLAS), in NumPy's own
float16 ``@`` (a plain loop: NumPy has no 16-bit GEMM), in ml_dtypes'
bfloat16 ``@``, and as minidl computes 16-bit products
(:func:`minidl.backend.matmul`: widen to float32, BLAS, round back). GFLOP/s
of each, best of several runs.

Part 2. One training step (forward, cross-entropy, backward, SGD update) of
an MLP and a small CNN, in float32 and under ``amp.autocast`` with float16
(and a GradScaler) and bfloat16: step time (best of several, the three
interleaved) and peak activation memory (``minidl.memory.track``).

Part 3. The MLP's activation memory, float32 against autocast, for batches
from 64 to 4096: the 16-bit weight copies are a fixed cost, the activations
grow with the batch, so the ratio falls towards one half.

With ``--device cuda`` everything runs on the GPU: part 1 is cuBLAS's float32 and
float16 products through CuPy beside PyTorch's float32, TF32 and float16 (CuPy has
no bfloat16), parts 2 and 3 run the models on the GPU under ``autocast("cuda")``
with float16; times come from CUDA events after a warm-up, the dtypes in
alternating rounds.

Writes benchmarks/results/<machine>_amp.json (``_amp_cuda.json`` on the GPU).

    python benchmarks/bench_amp.py [--n 512] [--repeat 5] [--quick] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import sys

if __name__ == "__main__":  # BLAS threads are fixed when NumPy loads: decide before importing it
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402
from common import add_device_option, best_time, require_device, save_results  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import amp, backend, memory, nn, optim  # noqa: E402


def gemm(n: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    a32, b32 = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    flops = 2.0 * n ** 3
    cases = {"float32 BLAS": lambda: a32 @ b32}
    a16, b16 = a32.astype(np.float16), b32.astype(np.float16)
    cases["float16 NumPy @"] = lambda: a16 @ b16
    cases["float16 minidl (float32 BLAS, rounded)"] = lambda: backend.matmul(a16, b16)
    try:
        bf = backend.bfloat16()
        abf, bbf = a32.astype(bf), b32.astype(bf)
        cases["bfloat16 ml_dtypes @"] = lambda: abf @ bbf
        cases["bfloat16 minidl (float32 BLAS, rounded)"] = lambda: backend.matmul(abf, bbf)
    except TypeError:
        pass
    out = {}
    for name, fn in cases.items():
        slow = "NumPy @" in name  # the plain loop: one run is enough to see it
        seconds = best_time(fn, repeat=1 if slow else repeat, warmup=0 if slow else 1)
        out[name] = {"seconds": seconds, "gflops": flops / seconds / 1e9}
        print(f"  {name:42s} {seconds * 1e3:9.2f} ms  {flops / seconds / 1e9:7.2f} GFLOP/s")
    return out


def gemm_gpu(n: int, repeat: int, device: str) -> dict:
    """GFLOP/s of an n×n product on the GPU: CuPy float32 and float16, PyTorch float32, TF32 and float16."""
    from minidl.selftest.speed import gemm_peaks
    try:
        import torch
        with_torch = torch.cuda.is_available()
    except ImportError:
        with_torch = False
    out = {name: {"gflops": flops / 1e9} for name, flops in gemm_peaks(device, n, with_torch, repeat).items()}
    for name, row in out.items():
        print(f"  {name:42s} {row['gflops']:9.1f} GFLOP/s")
    return out


def models(device="cpu"):
    mdl.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(32 * 7 * 7, 10))
    return {"mlp 784-1024-1024-10, batch 512": (mlp.to(device), mdl.randn(512, 784, device=device)),
            "cnn 2 conv + linear, 28x28, batch 64": (cnn.to(device), mdl.randn(64, 1, 28, 28, device=device))}


def step_fn(model, x, y, dtype):
    opt = optim.SGD(model.parameters(), lr=1e-3)
    scaler = amp.GradScaler(enabled=dtype == np.float16)

    def step():
        opt.zero_grad()
        with amp.autocast(backend.parse_device(x.device)[0], dtype=dtype or np.float16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def peak_memory(model, x, y, dtype) -> int:
    with memory.track() as m:
        with amp.autocast(backend.parse_device(x.device)[0], dtype=dtype or np.float16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    model.zero_grad()
    return m.peak_bytes


def training(repeat: int, device: str = "cpu", cases: dict | None = None) -> dict:
    """Step time and peak activation memory of each model of ``cases`` (default :func:`models`) per dtype."""
    dtypes = {"float32": None, "float16": np.dtype(np.float16)}
    try:
        if device == "cpu":  # CuPy has no bfloat16 arrays
            dtypes["bfloat16"] = backend.bfloat16()
    except TypeError:
        pass
    from minidl.roofline import timing
    timer = timing.device_timer(device)
    out = {}
    for name, (model, x) in (cases or models(device)).items():
        y = mdl.tensor(np.arange(x.shape[0]) % 10, device=device)
        steps = {k: step_fn(model, x, y, d) for k, d in dtypes.items()}
        for fn in steps.values():
            fn()  # warm-up: first-call costs (CuPy's kernel compiles on a GPU)
        times = {k: float("inf") for k in dtypes}
        for _ in range(repeat):  # interleaved: a change in the machine's load hits every dtype alike
            for k, fn in steps.items():
                times[k] = min(times[k], timer(fn))
        row = {}
        for k, d in dtypes.items():
            row[k] = {"step_seconds": times[k], "time_vs_float32": times[k] / times["float32"],
                      "peak_activation_bytes": peak_memory(model, x, y, d)}
            row[k]["memory_vs_float32"] = row[k]["peak_activation_bytes"] / row["float32"]["peak_activation_bytes"]
        out[name] = row
        print(f"  {name}")
        for k, r in row.items():
            print(f"    {k:9s} step {r['step_seconds'] * 1e3:8.1f} ms ({r['time_vs_float32']:.2f}x)   "
                  f"activations {r['peak_activation_bytes'] / 2 ** 20:7.2f} MiB ({r['memory_vs_float32']:.2f}x)")
    return out


def memory_by_batch(batches, device: str = "cpu") -> dict:
    """Peak activation memory of the MLP, float32 and bfloat16, as the batch grows.

    Under autocast the graph also holds the 16-bit copies of the weights (a fixed
    cost) and the float32 input batch next to its 16-bit copy: the ratio approaches
    one half only once the activations, which grow with the batch, dominate.
    """
    model, _ = models(device)["mlp 784-1024-1024-10, batch 512"]
    low = backend.bfloat16() if _has_bfloat16() and device == "cpu" else np.dtype(np.float16)
    out = {}
    for b in batches:
        x, y = mdl.randn(b, 784, device=device), mdl.tensor(np.arange(b) % 10, device=device)
        full, half = peak_memory(model, x, y, None), peak_memory(model, x, y, low)
        out[b] = {"float32_bytes": full, "autocast_bytes": half, "ratio": half / full}
        print(f"  batch {b:5d}: {full / 2 ** 20:7.2f} MiB -> {half / 2 ** 20:7.2f} MiB ({half / full:.2f}x)")
    return out


def _has_bfloat16() -> bool:
    try:
        backend.bfloat16()
    except TypeError:
        return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="matrix size of part 1 (default 512)")
    parser.add_argument("--repeat", type=int, default=5, help="timings per case, the best kept (default 5)")
    parser.add_argument("--quick", action="store_true", help="n=256, 2 repeats: a smoke run")
    add_device_option(parser)
    args = parser.parse_args(argv)
    require_device(args.device)
    n, repeat = (256, 2) if args.quick else (args.n, args.repeat)
    if args.device != "cpu" and not args.quick and args.n == 512:
        n = 8192  # a GPU needs a large product to reach its peak
    print(f"part 1: one {n}x{n} matrix product on {args.device}")
    results = {"device": args.device,
               "gemm": {"n": n, **(gemm(n, repeat) if args.device == "cpu" else gemm_gpu(n, repeat, args.device))}}
    print("part 2: one training step, float32 against autocast")
    results["training"] = training(repeat, args.device)
    print("part 3: the MLP's activation memory under autocast, by batch size")
    results["memory_by_batch"] = memory_by_batch([64, 256, 1024, 4096] if not args.quick else [64, 1024], args.device)
    print("wrote", save_results("amp" if args.device == "cpu" else f"amp_{args.device}", results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
