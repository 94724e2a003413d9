"""How close does one optimizer step come to the machine's memory bandwidth?

An update of N parameters is memory-bound: SGD with momentum reads w, g, b
and writes w, b (5 arrays of N values), Adam reads w, g, m, v and writes w,
m, v (7 arrays). Nothing can go faster than streaming those bytes, so the
yardstick is a plain copy (np.copyto: read N, write N) measured in the same
run. The table compares, per update:

- the optimizer class as a user calls it (``opt.step()``): on the CPU the
  update runs in cache-sized chunks; on the GPU it is one kernel generated
  from the same update function;
- the same update function called once on the whole arrays, line by line
  (each NumPy/CuPy line a full pass over memory, with temporaries).

Run:  python benchmarks/bench_optim.py [--n 10000000] [--device cpu|cuda] [--save]
--save writes benchmarks/results/<hostname>_optim.json (…_cuda_optim.json on the GPU).
Goals: ≥ 50% of copy bandwidth on the CPU, ≥ 80% on the GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time

import numpy as np

import minidl as mdl
from minidl import backend, optim
from minidl.optim.adam import adam_update
from minidl.optim.sgd import sgd_update


def timer(device):
    """best_of(fn, repeat) -> seconds of the fastest call (CUDA events on the GPU)."""
    if device == "cpu":
        def best_of(fn, repeat):
            fn()
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)
        return best_of
    cp = backend.cupy_module()

    def best_of(fn, repeat):
        fn()
        cp.cuda.Device().synchronize()
        times = []
        for _ in range(repeat):
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        return min(times)
    return best_of


def run(n: int, device: str, repeat: int) -> dict:
    xp = backend.xp_for(device)
    best_of = timer(device)
    nbytes = n * 4
    rng = np.random.default_rng(0)
    src = xp.asarray(rng.standard_normal(n, dtype=np.float32))
    dst = xp.empty_like(src)
    copy_s = best_of(lambda: xp.copyto(dst, src), repeat)
    copy_bw = 2 * nbytes / copy_s
    rows = [("copy (np.copyto)", copy_s, 2 * nbytes)]

    def param():
        w = mdl.Tensor(xp.asarray(rng.standard_normal(n, dtype=np.float32)), requires_grad=True)
        w.grad = mdl.Tensor(xp.asarray(rng.standard_normal(n, dtype=np.float32) * 1e-3))
        return w

    w = param()
    sgd = optim.SGD([w], lr=1e-3, momentum=0.9)
    sgd.step()  # allocate the momentum buffer before timing
    rows.append(("SGD momentum: opt.step()", best_of(sgd.step, repeat), 5 * nbytes))
    b = sgd.state[0]["b"]
    rows.append(("SGD momentum: whole arrays", best_of(
        lambda: sgd_update(w=w.array, g=w.grad.array, b=b, lr=1e-3, momentum=0.9), repeat), 5 * nbytes))

    w = param()
    adam = optim.Adam([w], lr=1e-3)
    adam.step()
    rows.append(("Adam: opt.step()", best_of(adam.step, repeat), 7 * nbytes))
    state = adam.state[0]
    rows.append(("Adam: whole arrays", best_of(
        lambda: adam_update(w=w.array, g=w.grad.array, m=state["m"], v=state["v"], t=10, lr=1e-3, beta1=0.9,
                            beta2=0.999, eps=1e-8), repeat), 7 * nbytes))

    results = [{"name": name, "seconds": s, "bytes": moved, "GB_per_s": moved / s / 1e9,
                "fraction_of_copy": moved / s / copy_bw} for name, s, moved in rows]
    return {"device": device, "n_params": n, "dtype": "float32", "repeat": repeat,
            "copy_GB_per_s": copy_bw / 1e9, "host": socket.gethostname(), "machine": platform.processor()
            or platform.machine(), "numpy": np.__version__, "results": results}


def print_table(report: dict):
    print(f"one update of {report['n_params']:,} float32 parameters on {report['device']} "
          f"(copy bandwidth {report['copy_GB_per_s']:.1f} GB/s)")
    print(f"{'':30s} {'ms':>8s} {'MB moved':>9s} {'GB/s':>7s} {'of copy':>8s}")
    for row in report["results"]:
        print(f"{row['name']:30s} {row['seconds'] * 1e3:8.2f} {row['bytes'] / 1e6:9.0f} "
              f"{row['GB_per_s']:7.1f} {row['fraction_of_copy']:8.0%}")


def save(report: dict) -> str:
    name = report["host"] or "cpu"
    if report["device"] != "cpu":
        name += "_cuda"
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}_optim.json")
    handle, temporary = tempfile.mkstemp(dir=folder, suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(temporary, path)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="parameters (default 10M)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls; the fastest counts")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<host>_optim.json")
    args = parser.parse_args(argv)
    report = run(args.n, args.device, args.repeat)
    print_table(report)
    if args.save:
        print("saved", save(report))


if __name__ == "__main__":
    main()
