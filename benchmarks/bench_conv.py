"""Convolution at the machine's limit: conv2d forward + backward and a CNN training step, minidl vs PyTorch CPU.

Everything runs in one process and the two systems are timed *interleaved*
(minidl, PyTorch, minidl, PyTorch, ...), so that load from other work on the
machine falls on both alike; the reported time of each is the fastest of the
repeats and the ratio is the median of the per-round ratios (robust to a
noisy round). PyTorch uses as many threads as NumPy's BLAS (``--threads``,
default: the number of CPUs, which is what OpenBLAS uses).

Cases (float32, bias, 3×3 padding 1 unless said):

- the three shapes of issue 19: 32×64×32×32, 64×32×16×16, 16×128×16×16 (C → C);
- a 1×1 convolution 32×64×32×32 → 128 and a strided 3×3 (stride 2) 32×64×32×32 → 128;
- a CNN training step (SGD): conv(3→32, 3×3) relu maxpool2 conv(32→64, 3×3) relu maxpool2
  linear(4096→256) relu linear(256→10), cross-entropy, batch 64 of 32×32×3 inputs;
- the machine's sgemm peak (NumPy, 512³... 1536³) and each case's fraction of it;
- each case's GEMM floor: the three products of an im2col convolution alone, on ready-made
  operands (``GEMMs ms``), and that floor over PyTorch's whole time (``/torch``): no im2col
  engine on this BLAS gets a lower ratio.

With ``--device cuda`` both run on the GPU (minidl on CuPy, PyTorch on CUDA), each
round timed with CUDA events after the same warm-up; the peak is CuPy's 4096³
float32 product and the GEMM floor (a NumPy measurement) is left out.

    python benchmarks/bench_conv.py [--repeat 15] [--save] [--device cuda]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from common import add_device_option, device_timers, gemm_peak, require_device, save_results

CONV_CASES = (  # name, (N, C, H, W), out channels, kernel, stride, padding
    ("3x3 32x64x32x32", (32, 64, 32, 32), 64, 3, 1, 1),
    ("3x3 64x32x16x16", (64, 32, 16, 16), 32, 3, 1, 1),
    ("3x3 16x128x16x16", (16, 128, 16, 16), 128, 3, 1, 1),
    ("1x1 32x64x32x32->128", (32, 64, 32, 32), 128, 1, 1, 0),
    ("3x3/2 32x64x32x32->128", (32, 64, 32, 32), 128, 3, 2, 1),
)
BATCH, LR = 64, 0.01


def conv_flops(shape, out_channels, kernel, stride, padding):
    """Forward + backward FLOPs of one conv: 3 GEMMs of 2·N·OH·OW·O·C·K² each."""
    n, c, h, w = shape
    oh = (h + 2 * padding - kernel) // stride + 1
    ow = (w + 2 * padding - kernel) // stride + 1
    return 3 * 2 * n * oh * ow * out_channels * c * kernel * kernel


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(fns: dict, repeat: int, warmup: int = 2, pause: float = 0.15, device: str = "cpu") -> dict:
    """Time each function once per round, rounds alternating between systems.

    Each switch between systems first waits ``pause`` seconds: NumPy's OpenBLAS and
    PyTorch's OpenMP threads keep spinning for about 0.1 s after a call, and the
    other library's threads would find both cores taken (see minidl.roofline.suite).
    Returns {name: [seconds per round]}. On a GPU the rounds are timed with CUDA events
    (minidl.roofline.timing; no pause: no thread pools spin there).
    """
    if device != "cpu":
        from minidl.roofline import timing
        return timing.alternate(fns, device_timers(device, fns), rounds=repeat, warmup=warmup)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for r in range(repeat):
        order = list(fns.items()) if r % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            time.sleep(pause)
            times[name].append(_time(fn))
    return times


def summary(times: dict, flops: float) -> dict:
    out = {name: {"best_ms": min(t) * 1e3, "median_ms": statistics.median(t) * 1e3,
                  "gflops": flops / min(t) / 1e9} for name, t in times.items()}
    if "torch" in times:
        ratios = [a / b for a, b in zip(times["minidl"], times["torch"])]
        out["ratio_median"] = statistics.median(ratios)
        out["ratio_best"] = min(times["minidl"]) / min(times["torch"])
    return out


# ---------------------------------------------------------------- one convolution
def conv_fns(shape, out_channels, kernel, stride, padding, device="cpu"):
    import minidl as mdl
    import minidl.functional as F
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = (rng.standard_normal((out_channels, shape[1], kernel, kernel), dtype=np.float32)
         / np.sqrt(shape[1] * kernel * kernel)).astype(np.float32)
    b = rng.standard_normal(out_channels, dtype=np.float32)
    xm, wm, bm = (mdl.tensor(a, requires_grad=True, device=device) for a in (x, w, b))

    def minidl_step():
        y = F.conv2d(xm, wm, bm, stride=stride, padding=padding)
        y.backward(gym)
        xm.grad = wm.grad = bm.grad = None

    oh = (shape[2] + 2 * padding - kernel) // stride + 1
    gy = rng.standard_normal((shape[0], out_channels, oh, oh), dtype=np.float32)
    gym = mdl.tensor(gy, device=device)
    fns = {"minidl": minidl_step}
    try:
        import torch
    except ImportError:
        return fns
    if device != "cpu" and not torch.cuda.is_available():
        return fns
    xt, wt, bt = (torch.tensor(a, requires_grad=True, device=device) for a in (x, w, b))
    gyt = torch.tensor(gy, device=device)

    def torch_step():
        y = torch.nn.functional.conv2d(xt, wt, bt, stride=stride, padding=padding)
        y.backward(gyt)
        xt.grad = wt.grad = bt.grad = None
    fns["torch"] = torch_step
    return fns


def gemm_floor(shape, out_channels, kernel, stride, padding, repeat=7):
    """Seconds of the three products an im2col convolution cannot avoid, on ready-made operands:
    Y = X_col W (forward), dX_col = dY Wᵀ (input gradient), dW = X_colᵀ dY (weight gradient).

    No copies, no layout changes, no bias: the floor of any engine that convolves through this
    BLAS's GEMM, whatever else it does well.
    """
    n, c, h, w = shape
    oh = (h + 2 * padding - kernel) // stride + 1
    m, k = n * oh * oh, c * kernel * kernel
    rng = np.random.default_rng(0)
    cols = rng.standard_normal((m, k), dtype=np.float32)
    weight = rng.standard_normal((k, out_channels), dtype=np.float32)
    gy = rng.standard_normal((m, out_channels), dtype=np.float32)
    products = (lambda: cols @ weight, lambda: gy @ weight.T, lambda: cols.T @ gy)
    for product in products:
        product()
    return sum(min(_time(product) for _ in range(repeat)) for product in products)


# ---------------------------------------------------------------- a CNN training step
def cnn_weights(seed=0):
    rng = np.random.default_rng(seed)

    def uniform(shape, fan_in):
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(np.float32)
    weights = [uniform((32, 3, 3, 3), 27), uniform(32, 27), uniform((64, 32, 3, 3), 288), uniform(64, 288),
               uniform((256, 64 * 8 * 8), 4096), uniform(256, 4096), uniform((10, 256), 256), uniform(10, 256)]
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    return weights, x, y


def cnn_flops():
    """Forward + backward FLOPs of the CNN step's GEMMs (convolutions and linear layers)."""
    conv1 = 3 * 2 * BATCH * 32 * 32 * 32 * 3 * 9
    conv2 = 3 * 2 * BATCH * 16 * 16 * 64 * 32 * 9
    fc = 3 * 2 * BATCH * (4096 * 256 + 256 * 10)
    return conv1 + conv2 + fc


def cnn_minidl(weights, x, y, device="cpu"):
    import minidl as mdl
    import minidl.functional as F
    p = [mdl.tensor(w, requires_grad=True, device=device) for w in weights]
    xt, y = mdl.tensor(x, device=device), mdl.tensor(y, device=device)

    def step():
        h = F.max_pool2d(F.relu(F.conv2d(xt, p[0], p[1], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p[2], p[3], padding=1)), 2)
        h = F.relu(F.linear(h.reshape(BATCH, -1), p[4], p[5]))
        loss = F.cross_entropy(F.linear(h, p[6], p[7]), y)
        loss.backward()
        for w in p:
            w.array -= LR * w.grad.array
            w.grad = None
    return step


def cnn_torch(weights, x, y, device="cpu"):
    import torch
    import torch.nn.functional as F
    if device != "cpu" and not torch.cuda.is_available():
        raise ImportError("PyTorch has no CUDA here")
    p = [torch.tensor(w, requires_grad=True, device=device) for w in weights]
    xt, yt = torch.tensor(x, device=device), torch.tensor(y, device=device)

    def step():
        h = F.max_pool2d(F.relu(F.conv2d(xt, p[0], p[1], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p[2], p[3], padding=1)), 2)
        h = F.relu(F.linear(h.reshape(BATCH, -1), p[4], p[5]))
        loss = F.cross_entropy(F.linear(h, p[6], p[7]), yt)
        loss.backward()
        with torch.no_grad():
            for w in p:
                w -= LR * w.grad
                w.grad = None
    return step


def im2col_peak_bytes(shape, out_channels, kernel, stride, padding):
    """The column buffer one conv call builds at once (float32), after chunking over the batch."""
    try:
        from minidl.ops.conv import batch_chunk
    except ImportError:  # a minidl from before the chunking
        return {}
    n, c, h, w = shape
    oh = (h + 2 * padding - kernel) // stride + 1
    per_sample = oh * oh * c * kernel * kernel * 4
    if kernel == 1 and stride == 1 and padding == 0:  # minidl's 1×1 path builds no columns
        return {"unchunked_mib": 0.0, "chunk": n, "peak_mib": 0.0}
    chunk = batch_chunk(shape, (out_channels, c, kernel, kernel), (stride, stride), ((padding, padding),) * 2,
                        (1, 1), 4)
    return {"unchunked_mib": n * per_sample / 2 ** 20, "chunk": chunk, "peak_mib": chunk * per_sample / 2 ** 20}


def load() -> str:
    try:
        return "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        return "load average unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="interleaved rounds per case")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OPENBLAS_NUM_THREADS", os.cpu_count())),
                        help="PyTorch threads (default: what NumPy's OpenBLAS uses, $OPENBLAS_NUM_THREADS "
                             "or the CPU count)")
    parser.add_argument("--only", default="", help="run only cases whose name contains this")
    parser.add_argument("--limit-mib", type=float, default=None,
                        help="im2col buffer limit for this run (default: minidl.ops.conv.IM2COL_LIMIT_BYTES)")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_conv.json")
    add_device_option(parser)
    args = parser.parse_args(argv)
    require_device(args.device)
    on_gpu = args.device != "cpu"
    try:
        import torch
        torch.set_num_threads(args.threads)
    except ImportError:
        pass
    import minidl.ops.conv as conv
    conv.IM2COL_LIMIT_BYTES = getattr(conv, "IM2COL_LIMIT_BYTES", float("inf"))
    if args.limit_mib is not None:
        conv.IM2COL_LIMIT_BYTES = int(args.limit_mib * 2 ** 20)
    results = {"threads": args.threads, "im2col_limit_mib": conv.IM2COL_LIMIT_BYTES / 2 ** 20,
               "load_before": load(), "repeat": args.repeat, "device": args.device}
    if on_gpu:
        from minidl.roofline.ceilings import measure_gemm
        peak = measure_gemm(4096, args.device) / 1e9
    else:
        peak = gemm_peak()
    results["gemm_peak_gflops"] = peak
    print(f"sgemm peak ({'CuPy 4096³' if on_gpu else 'NumPy'}): {peak:.1f} GFLOP/s; torch threads {args.threads}; "
          f"{results['load_before']}")
    print(f"{'case':<26}{'minidl ms':>10}{'torch ms':>10}{'ratio':>7}{'minidl GF/s':>12}{'% peak':>8}"
          f"{'im2col MiB':>11}{'GEMMs ms':>10}{'/torch':>8}")
    cases = {}
    for name, shape, out_channels, kernel, stride, padding in CONV_CASES:
        if args.only not in name:
            continue
        flops = conv_flops(shape, out_channels, kernel, stride, padding)
        res = summary(interleaved(conv_fns(shape, out_channels, kernel, stride, padding, args.device), args.repeat,
                                  device=args.device), flops)
        res["gflop"] = flops / 1e9
        res["peak_fraction"] = res["minidl"]["gflops"] / peak
        res["im2col"] = im2col_peak_bytes(shape, out_channels, kernel, stride, padding)
        res["gemm_floor_ms"] = float("nan") if on_gpu else gemm_floor(shape, out_channels, kernel, stride,
                                                                       padding) * 1e3
        cases[name] = res
        t = res.get("torch", {}).get("best_ms", float("nan"))
        print(f"{name:<26}{res['minidl']['best_ms']:>10.1f}{t:>10.1f}{res.get('ratio_median', float('nan')):>7.2f}"
              f"{res['minidl']['gflops']:>12.1f}{100 * res['peak_fraction']:>7.0f}%"
              f"{res['im2col'].get('peak_mib', float('nan')):>11.1f}{res['gemm_floor_ms']:>10.1f}"
              f"{res['gemm_floor_ms'] / t:>8.2f}")
    if args.only in "cnn step":
        weights, x, y = cnn_weights()
        fns = {"minidl": cnn_minidl([w.copy() for w in weights], x, y, args.device)}
        try:
            fns["torch"] = cnn_torch([w.copy() for w in weights], x, y, args.device)
        except ImportError:
            pass
        flops = cnn_flops()
        res = summary(interleaved(fns, args.repeat, device=args.device), flops)
        res["gflop"] = flops / 1e9
        res["peak_fraction"] = res["minidl"]["gflops"] / peak
        cases["cnn step"] = res
        t = res.get("torch", {}).get("best_ms", float("nan"))
        print(f"{'CNN SGD step, batch 64':<26}{res['minidl']['best_ms']:>10.1f}{t:>10.1f}"
              f"{res.get('ratio_median', float('nan')):>7.2f}{res['minidl']['gflops']:>12.1f}"
              f"{100 * res['peak_fraction']:>7.0f}%")
    results["cases"] = cases
    results["load_after"] = load()
    print("ratio = median over interleaved rounds of minidl / torch; times are the best round; GEMMs = the three "
          "products alone (the floor of im2col on this BLAS);", results["load_after"])
    if args.save:
        name = "conv" if args.threads == os.cpu_count() else f"conv_{args.threads}thread"
        name = f"conv_{args.device}" if on_gpu else name
        print("saved", save_results(name, results))


if __name__ == "__main__":
    sys.exit(main())
