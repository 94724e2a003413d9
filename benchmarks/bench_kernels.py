"""The array kernels that real programs spend their steps in, forward + backward, against PyTorch.

Each case is one op (or a tiny group of ops) on the sizes a small real model
gives it, timed in minidl and PyTorch in alternating rounds (a, b, b, a, ...)
at one thread (both BLAS libraries limited to one); a time is the median of the
rounds, the ratio the median of the per-round ratios. With one thread each library
computes in the calling thread, so by default the clock is that thread's CPU time
(``time.thread_time``): other work on a shared machine then slows neither side's
count, where wall-clock time would charge each side for the moments it waited
(``--clock wall`` measures that instead).

    python benchmarks/bench_kernels.py [--rounds 9] [--only gelu,erf] [--clock cpu|wall] [--save]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from common import save_results

N_ELEMENTS = 131072  # 32 × 64 × 64: a transformer's MLP activation at batch 32, block 64, width 64


def _rng():
    return np.random.default_rng(0)


def _pair(make):
    """``(minidl step, torch step)`` from ``make(lib, tensor)``, where ``tensor(array, grad)`` builds a
    tensor of that library from a NumPy array."""
    import torch

    import minidl as mdl

    def mdl_tensor(a, grad=False):
        return mdl.tensor(a, requires_grad=grad)

    def torch_tensor(a, grad=False):
        return torch.tensor(a, requires_grad=grad)

    return make(mdl, mdl_tensor), make(torch, torch_tensor)


def _elementwise(fn_of_lib):
    """Forward + backward of y = fn(x), x of N_ELEMENTS float32, seeded with ones."""
    data = _rng().standard_normal(N_ELEMENTS).astype(np.float32)

    def make(lib, tensor):
        x = tensor(data, True)
        fn = fn_of_lib(lib)

        def step():
            x.grad = None
            fn(x).sum().backward()
        return step
    return _pair(make)


def case_pow3():
    return _elementwise(lambda lib: lambda x: x ** 3.0)


def case_pow_half():
    data = np.abs(_rng().standard_normal(N_ELEMENTS)).astype(np.float32) + 0.5

    def make(lib, tensor):
        x = tensor(data, True)

        def step():
            x.grad = None
            (x ** 0.5 + x ** -1.5).sum().backward()
        return step
    return _pair(make)


def case_gelu_tanh():
    return _elementwise(lambda lib: lambda x: lib.nn.functional.gelu(x, approximate="tanh"))


def case_gelu():
    return _elementwise(lambda lib: lambda x: lib.nn.functional.gelu(x))


def case_makemore_gelu():
    """makemore's NewGELU, written out: 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³)))."""
    import math
    return _elementwise(lambda lib: lambda x: 0.5 * x * (1.0 + lib.tanh(math.sqrt(2.0 / math.pi)
                                                                        * (x + 0.044715 * x ** 3.0))))


def case_erf():
    """erf forward alone (float32)."""
    import torch

    from minidl import backend
    data = _rng().standard_normal(N_ELEMENTS).astype(np.float32)
    t = torch.tensor(data)
    return (lambda: backend.erf(data)), (lambda: torch.erf(t))


def _embedding(vocabulary, positions):
    """An embedding of width 64 looked up at (32, positions) tokens, forward and backward."""
    idx = _rng().integers(0, vocabulary, size=(32, positions))
    table = _rng().standard_normal((vocabulary, 64)).astype(np.float32)

    def make(lib, tensor):
        emb = lib.nn.Embedding(vocabulary, 64)
        with lib.no_grad():
            emb.weight.copy_(tensor(table))
        i = tensor(idx)

        def step():
            emb.weight.grad = None
            emb(i).sum().backward()
        return step
    return _pair(make)


def case_embedding():
    """Token embedding, vocabulary 65, width 64, batch 32 × 128 positions."""
    return _embedding(65, 128)


def case_embedding_characters():
    """makemore's character embedding: vocabulary 28, width 64, batch 32 × 16 positions (one-hot sums)."""
    return _embedding(28, 16)


def case_layer_norm():
    data = _rng().standard_normal((32 * 128, 64)).astype(np.float32)

    def make(lib, tensor):
        norm = lib.nn.LayerNorm(64)
        x = tensor(data, True)
        g = tensor(_rng().standard_normal(data.shape).astype(np.float32))

        def step():
            x.grad = norm.weight.grad = norm.bias.grad = None
            (norm(x) * g).sum().backward()
        return step
    return _pair(make)


def case_masked_softmax():
    """Causal attention scores (32, 4, 64, 64): masked_fill with −∞, softmax, backward."""
    data = _rng().standard_normal((32, 4, 64, 64)).astype(np.float32)
    causal = np.tril(np.ones((64, 64), bool))

    def make(lib, tensor):
        x = tensor(data, True)
        masked = tensor(~causal)
        g = tensor(_rng().standard_normal(data.shape).astype(np.float32))

        def step():
            x.grad = None
            (lib.nn.functional.softmax(x.masked_fill(masked, float("-inf")), dim=-1) * g).sum().backward()
        return step
    return _pair(make)


def case_cross_entropy():
    """Logits (32 · 128, 65) against class targets: log_softmax + nll, backward."""
    data = _rng().standard_normal((32 * 128, 65)).astype(np.float32)
    targets = _rng().integers(0, 65, size=32 * 128)

    def make(lib, tensor):
        x = tensor(data, True)
        y = tensor(targets)

        def step():
            x.grad = None
            lib.nn.functional.cross_entropy(x, y).backward()
        return step
    return _pair(make)


def case_clip_grad_norm():
    """clip_grad_norm_ over 12 gradients of a small GPT's shapes (about 0.8 M values)."""
    shapes = [(65, 128), (64, 128)] + [(128, 384), (384,), (128, 128), (128,), (128, 512), (512,),
                                       (512, 128), (128,)] * 2

    def make(lib, tensor):
        params = []
        for i, s in enumerate(shapes):
            p = tensor(np.zeros(s, np.float32), True)
            p.grad = tensor(np.random.default_rng(i).standard_normal(s).astype(np.float32))
            params.append(p)
        clip = lib.nn.utils.clip_grad_norm_
        return lambda: clip(params, 1.0)
    return _pair(make)


def _smooth_l1(rows):
    pred = _rng().standard_normal((rows, 1)).astype(np.float32)
    target = _rng().standard_normal((rows, 1)).astype(np.float32)

    def make(lib, tensor):
        x, t = tensor(pred, True), tensor(target)

        def step():
            x.grad = None
            lib.nn.functional.smooth_l1_loss(x, t).backward()
        return step
    return _pair(make)


def case_smooth_l1():
    """smooth_l1_loss of (4096, 1) predictions, mean, backward."""
    return _smooth_l1(4096)


def case_smooth_l1_small():
    """smooth_l1_loss of (32, 1) predictions (pytorch/examples' regression): overhead only."""
    return _smooth_l1(32)


def _conv(shape, out_channels, needs_input_grad):
    data = _rng().standard_normal(shape).astype(np.float32)

    def make(lib, tensor):
        conv = lib.nn.Conv2d(shape[1], out_channels, 3)
        x = tensor(data, needs_input_grad)

        def step():
            conv.weight.grad = conv.bias.grad = x.grad = None
            conv(x).sum().backward()
        return step
    return _pair(make)


def case_conv_mnist1():
    """MNIST's first convolution: 64 × 1 × 28 × 28 → 32 channels, 3×3 (the image needs no gradient)."""
    return _conv((64, 1, 28, 28), 32, False)


def case_conv_mnist2():
    """MNIST's second convolution: 64 × 32 × 26 × 26 → 64 channels, 3×3."""
    return _conv((64, 32, 26, 26), 64, True)


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def alternate(steps: dict, rounds, clock=time.thread_time, min_seconds=0.05):
    """``{name: [seconds per call, one per round]}`` for each step of ``steps``, in alternating
    order (a, b, b, a, ...) after a warm-up; each round runs a step as often as fits in
    ``min_seconds`` of the clock (at least once)."""
    for fn in steps.values():
        fn()
        fn()
    first = next(iter(steps.values()))
    start = clock()
    first()
    number = max(1, int(min_seconds / max(clock() - start, 1e-7)))
    times = {name: [] for name in steps}
    order = list(steps.items())
    for _ in range(rounds):
        for name, fn in order:
            start = clock()
            for _ in range(number):
                fn()
            times[name].append((clock() - start) / number)
        order.reverse()
    return times


def run(names, rounds, clock="cpu"):
    import torch
    from threadpoolctl import threadpool_limits
    torch.set_num_threads(1)
    results = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for name in names:
            minidl_step, torch_step = CASES[name]()
            times = alternate({"minidl": minidl_step, "torch": torch_step}, rounds, CLOCKS[clock])
            results[name] = {
                "minidl_ms": statistics.median(times["minidl"]) * 1e3,
                "torch_ms": statistics.median(times["torch"]) * 1e3,
                "ratio": statistics.median(a / b for a, b in zip(times["minidl"], times["torch"])),
                "rounds": rounds, "clock": clock}
            r = results[name]
            print(f"{name:<18} minidl {r['minidl_ms']:9.3f} ms   torch {r['torch_ms']:9.3f} ms   "
                  f"ratio {r['ratio']:6.2f}", flush=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", default="", help="comma-separated case names: " + ", ".join(CASES))
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: the calling thread's CPU time (default); wall: elapsed time")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_kernels.json")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    results = run(names, args.rounds, args.clock)
    if args.save:
        print("saved", save_results("kernels", {"one_thread": results}))


if __name__ == "__main__":
    sys.exit(main())
