"""Convolution by FFT against im2col: where, in kernel size against image size, the FFT wins on this machine.

For each image size and kernel size, one convolution layer (batch 8, 8 → 8 channels, float32,
'same' padding, bias) is timed forward + backward through ``minidl.ops.fft_conv.fft_conv2d`` and
through ``minidl.functional.conv2d`` (im2col and a GEMM), in alternating rounds at one BLAS thread
on this thread's CPU clock (NumPy's FFT runs on one thread anyway); a time is the
best round, the ratio fft / im2col of the best rounds. A ratio below 1 is a win for the FFT.

The FFT's cost does not grow with the kernel (every transform is the size of the padded image),
im2col's grows with KH·KW: the crossover moves to smaller kernels as images grow. With more BLAS
threads the GEMM gains and NumPy's FFT (pocketfft, one thread) does not, so on many cores the
crossover moves to larger kernels.

    python benchmarks/bench_fft_conv.py [--images 16,32,64] [--kernels 3,5,7,11,15] [--save]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from common import best_time, save_results

import minidl as mdl
import minidl.functional as F
from minidl.ops.fft_conv import fft_conv2d


def layer_step(conv, size: int, kernel: int, batch: int = 8, channels: int = 8):
    """A forward + backward of one convolution (bias, 'same' padding) through ``conv``."""
    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.standard_normal((batch, channels, size, size), dtype=np.float32), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((channels, channels, kernel, kernel), dtype=np.float32) / kernel,
                   requires_grad=True)
    b = mdl.tensor(np.zeros(channels, np.float32), requires_grad=True)

    def step():
        x.grad = w.grad = b.grad = None
        conv(x, w, b, padding=kernel // 2).sum().backward()
    return step


def measure(images, kernels, repeat: int = 3) -> list[dict]:
    rows = []
    for size in images:
        for kernel in kernels:
            if kernel > size:
                continue
            fft = layer_step(fft_conv2d, size, kernel)
            im2col = layer_step(F.conv2d, size, kernel)
            times = {"fft": float("inf"), "im2col": float("inf")}
            for _ in range(repeat):  # alternate, so a busy moment hits both
                times["fft"] = min(times["fft"], best_time(fft, repeat=1, warmup=1, clock=time.thread_time))
                times["im2col"] = min(times["im2col"], best_time(im2col, repeat=1, warmup=1, clock=time.thread_time))
            rows.append({"image": size, "kernel": kernel, "fft_ms": 1e3 * times["fft"],
                         "im2col_ms": 1e3 * times["im2col"], "ratio": times["fft"] / times["im2col"]})
            print(f"image {size:>3}  kernel {kernel:>2}:  fft {rows[-1]['fft_ms']:8.2f} ms   "
                  f"im2col {rows[-1]['im2col_ms']:8.2f} ms   fft / im2col {rows[-1]['ratio']:.2f}", flush=True)
    return rows


def crossover(rows) -> dict:
    """{image size: the smallest kernel from which the FFT is faster at every larger kernel measured}."""
    out = {}
    for size in sorted({r["image"] for r in rows}):
        ratios = [(r["kernel"], r["ratio"]) for r in rows if r["image"] == size]
        wins = [k for i, (k, _) in enumerate(ratios) if all(ratio < 1 for _, ratio in ratios[i:])]
        out[size] = wins[0] if wins else None
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="16,32,64")
    parser.add_argument("--kernels", default="3,5,7,11,15")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--save", action="store_true")
    args = parser.parse_args(argv)
    mdl.set_num_threads(1)  # every library computes in this thread: its CPU time is the clock
    rows = measure([int(v) for v in args.images.split(",")], [int(v) for v in args.kernels.split(",")],
                   args.repeat)
    cross = crossover(rows)
    for size, kernel in cross.items():
        print(f"image {size}: FFT faster from kernel {kernel}" if kernel else f"image {size}: im2col faster throughout")
    if args.save:
        print(save_results("fft_conv", {"rows": rows, "crossover": {str(k): v for k, v in cross.items()},
                                        "threads": 1}))


if __name__ == "__main__":
    main()
