"""Small shared helpers for the benchmark scripts (not part of the minidl package)."""
from __future__ import annotations

import json
import os
import platform
import socket
import time

import numpy as np


def best_time(fn, repeat: int = 5, number: int = 1, warmup: int = 2, clock=time.perf_counter) -> float:
    """The fastest of ``repeat`` timings of ``number`` calls, in seconds per call.

    The minimum is the measurement least disturbed by other work on the
    machine; every system compared in one run is timed the same way.
    ``clock=time.thread_time`` counts only this thread's CPU time: right for work that runs
    in the calling thread (one BLAS thread), and blind to other jobs on a shared machine.
    """
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        for _ in range(number):
            fn()
        best = min(best, (clock() - start) / number)
    return best


def machine_name() -> str:
    return os.environ.get("MINIDL_MACHINE") or socket.gethostname() or "cpu"


def machine_info() -> dict:
    return {"machine": machine_name(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}


def save_results(name: str, results: dict) -> str:
    """Write results to benchmarks/results/<machine>_<name>.json (atomically) and return the path."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{machine_name()}_{name}.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"info": machine_info(), **results}, f, indent=2)
    os.replace(tmp, path)
    return path


def gemm_peak(repeat=7):
    """The machine's measured float32 GEMM rate (GFLOP/s): the best of a few square sizes."""
    best = 0.0
    for size in (512, 1024, 1536):
        a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
        b = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
        t = best_time(lambda: a @ b, repeat=repeat, warmup=1)
        best = max(best, 2 * size ** 3 / t / 1e9)
    return best


# ---------------------------------------------------------------- --device cuda
def add_device_option(parser) -> None:
    """``--device cpu|cuda`` for a benchmark script (cuda: CuPy for minidl, PyTorch on the same GPU)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (default), or cuda: minidl on CuPy and PyTorch on the same GPU, timed with "
                             "CUDA events after a warm-up, in alternating rounds")


def require_device(device: str) -> None:
    """Exit with status 2 and one line saying what is missing when ``device`` cannot be used."""
    from minidl import backend
    if device == "cuda" and not backend.gpu_available():
        try:
            backend.cupy_module()
        except RuntimeError as exc:
            raise SystemExit(f"--device cuda: {exc}") from None


def device_timers(device: str, names) -> dict:
    """``{name: timer(fn, number) -> seconds}``: PyTorch's CUDA events for "torch", minidl's (CuPy) for the rest."""
    from minidl.roofline import timing
    return {name: (timing.torch_timer(device) if name == "torch" else timing.device_timer(device)) for name in names}


def mlp(widths, seed=0):
    """Linear → ReLU layers with He initialization, so activations keep their scale over 100 layers.

    (With PyTorch's default initialization they shrink by about √6 per layer and reach
    float32's subnormal numbers, which the CPU computes many times slower.)
    """
    import minidl as mdl
    from minidl import nn

    mdl.manual_seed(seed)
    layers = []
    for a, b in zip(widths, widths[1:]):
        linear = nn.Linear(a, b)
        nn.init.kaiming_normal_(linear.weight, nonlinearity="relu")
        nn.init.zeros_(linear.bias)
        layers.append(nn.Sequential(linear, nn.ReLU()))
    return nn.Sequential(*layers)
