"""Convolution by FFT against im2col: where, in kernel size against image size, the FFT wins on this machine.

For each image size and kernel size, one convolution layer (batch 8, 8 → 8 channels, float32,
'same' padding, bias) is timed forward + backward through ``minidl.ops.fft_conv.fft_conv2d`` and
through ``minidl.functional.conv2d`` (im2col and a GEMM), in alternating rounds; a time is the
best round, the ratio fft / im2col of the best rounds. A ratio below 1 is a win for the FFT.

The FFT's cost does not grow with the kernel (every transform is the size of the padded image),
im2col's grows with KH·KW: the crossover moves to smaller kernels as images grow. NumPy's FFT
(pocketfft) runs on one thread; the GEMM uses every thread BLAS has, so the crossover depends
on the core count too: the table records both the thread count and the machine.

    python benchmarks/bench_fft_conv.py [--images 16,32,64] [--kernels 3,5,7,11,15] [--save]
"""
from __future__ import annotations

import argparse
import os

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
                times["fft"] = min(times["fft"], best_time(fft, repeat=1, warmup=1))
                times["im2col"] = min(times["im2col"], best_time(im2col, repeat=1, warmup=1))
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
    rows = measure([int(v) for v in args.images.split(",")], [int(v) for v in args.kernels.split(",")],
                   args.repeat)
    cross = crossover(rows)
    for size, kernel in cross.items():
        print(f"image {size}: FFT faster from kernel {kernel}" if kernel else f"image {size}: im2col faster throughout")
    if args.save:
        print(save_results("fft_conv", {"rows": rows, "crossover": {str(k): v for k, v in cross.items()},
                                        "threads": os.environ.get("OMP_NUM_THREADS", "default")}))


if __name__ == "__main__":
    main()
