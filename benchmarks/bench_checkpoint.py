"""Gradient checkpointing measured: activation memory against step time, in one run.

Part 1. MLPs of 64 and 100 layers (Linear(w, w) → ReLU each, float32), one
training step (forward, mean-square loss, backward) with
``checkpoint_sequential`` at k ∈ {1, 2, 4, 8, √L, 16, L} segments (k = 1 is
the plain run). For each k:

- two peaks from ``minidl.memory.track``: the bytes saved for backward (the
  arrays the graph's nodes hold) and the allocator's peak (tracemalloc, which
  sees every NumPy buffer: peak growth of traced memory during the step;
  parameter gradients are allocated beforehand so that they do not count);
- step time, the best of several steps, all k interleaved so that a change in
  the machine's load hits every k alike; the ratio to the plain step is the
  median over pairs (a plain step timed right before each checkpointed one).
  Two clocks: wall time, and the process's CPU time with BLAS on one thread
  (the default here, set before NumPy loads; --blas-threads to change). On a
  machine shared with other jobs the CPU time measures the work itself, not
  the waiting for a free core; on an idle machine the two agree. The ratios
  reported as "time" use the CPU time;
- whether the gradients are bit-for-bit those of the plain run.

Part 2. Uniform (PyTorch's) against balanced segments on a network whose
layer widths vary by 10x (64 and 640), at √L segments: modeled and
measured peak memory, step time.

Part 3. 16-bit storage of the kept segment inputs (float16) on the
100-layer MLP at √L and L segments: memory saved, gradient error.

Writes benchmarks/results/<machine>_checkpoint.json and
<machine>_checkpoint_memory_time.png.

    python benchmarks/bench_checkpoint.py [--batch 256] [--width 256] [--repeat 8]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":  # BLAS threads are fixed when NumPy loads: decide before importing it
    _threads = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, _threads)

import numpy as np  # noqa: E402
from common import machine_name, mlp, save_results  # noqa: E402

import minidl as mdl  # noqa: E402
from minidl import memory  # noqa: E402
from minidl.checkpoint import balanced_segments, checkpoint_sequential, sqrt_segments, storage_report  # noqa: E402


def make_step(model, x, segments):
    def step():
        out = model(x) if segments == 1 else checkpoint_sequential(model, segments, x)
        (out * out).mean().backward()
    return step


def allocator_peak(model, step) -> int:
    """The allocator's peak (tracemalloc's growth) during one step, parameter gradients already allocated."""
    for _ in range(3):  # from the third step on, gradients accumulate in place in their own buffers
        step()
    with memory.track() as m:
        step()
    return m.allocator_peak_bytes


def timed(step) -> tuple:
    """(wall seconds, CPU seconds) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - wall, time.process_time() - cpu


def keep_best(row, times):
    row["wall_seconds"] = min(row.get("wall_seconds", float("inf")), times[0])
    row["step_seconds"] = min(row.get("step_seconds", float("inf")), times[1])


def paired_times(rows, steps, repeat):
    """Best times, and ratios to the plain step (the first) as medians over adjacent pairs.

    Each repeat times the plain step right before every other one: a pair sees
    the same load on the machine, so the median ratio of pairs is steadier than
    the ratio of two minima taken at different moments.
    """
    ratios = {label: ([], []) for label in rows}
    plain_label = next(iter(rows))
    for _ in range(repeat):
        for label, step in steps.items():
            plain = timed(steps[plain_label])
            keep_best(rows[plain_label], plain)
            here = timed(step)
            keep_best(rows[label], here)
            ratios[label][0].append(here[1] / plain[1])
            ratios[label][1].append(here[0] / plain[0])
    for label, (cpu, wall) in ratios.items():
        rows[label]["time_ratio"] = float(np.median(cpu))
        rows[label]["wall_ratio"] = float(np.median(wall))
    # plain against plain is 1 by definition; what was measured is the noise of a pair
    rows[plain_label]["noise_ratio"] = rows[plain_label]["time_ratio"]
    rows[plain_label]["time_ratio"] = rows[plain_label]["wall_ratio"] = 1.0


def measure(model, x, configs, repeat):
    """Memory (saved for backward, the allocator's peak), gradients and best step time for each segment count."""
    rows = {}
    reference = None
    for label, k in configs:
        model.zero_grad()
        with memory.track() as m:
            make_step(model, x, k)()
        grads = [p.grad.array.copy() for p in model.parameters()]
        reference = grads if reference is None else reference
        rows[label] = {"segments": k, "peak_bytes": m.peak_bytes,
                       "grads_identical": all(np.array_equal(a, b) for a, b in zip(grads, reference)),
                       "tracemalloc_peak_bytes": allocator_peak(model, make_step(model, x, k))}
    model.zero_grad()  # gradients then accumulate in place: every step does the same work
    paired_times(rows, {label: make_step(model, x, k) for label, k in configs}, repeat)
    plain = rows[configs[0][0]]
    for row in rows.values():
        row["memory_ratio"] = row["peak_bytes"] / plain["peak_bytes"]
        row["tracemalloc_ratio"] = row["tracemalloc_peak_bytes"] / plain["tracemalloc_peak_bytes"]
    return rows


def part_one(batch, width, repeat):
    results = {}
    for depth in (64, 100):
        root = sqrt_segments(depth)
        configs = [(f"{k} (√L)" if k == root else f"{k} (L)" if k == depth else str(k), k)
                   for k in sorted({1, 2, 4, 8, root, 16, depth})]
        model = mlp([width] * (depth + 1))
        x = mdl.randn(batch, width)
        rows = measure(model, x, configs, repeat)
        results[f"mlp{depth}"] = {"layers": depth, "sqrt_segments": root, "rows": rows}
        print(f"\nMLP of {depth} layers, batch {batch}, width {width} (float32)")
        print(f"{'segments':>10} {'saved MiB':>11} {'ratio':>6} {'allocator MiB':>15} {'ratio':>6} "
              f"{'CPU s':>7} {'ratio':>6} {'wall s':>7} {'ratio':>6} {'grads ==':>8}")
        for label, row in rows.items():
            print(f"{label:>10} {row['peak_bytes'] / 2**20:11.2f} {row['memory_ratio']:6.2f} "
                  f"{row['tracemalloc_peak_bytes'] / 2**20:15.2f} {row['tracemalloc_ratio']:6.2f} "
                  f"{row['step_seconds']:7.3f} {row['time_ratio']:6.2f} {row['wall_seconds']:7.3f} "
                  f"{row['wall_ratio']:6.2f} {str(row['grads_identical']):>8}")
    return results


def varying_widths(depth=36):
    """Widths 64 and 640 in stretches of unequal length: uniform segments cannot line up with them."""
    pattern = [64] * 6 + [640] * 3 + [64] * 4 + [640] * 8 + [64] * 9 + [640] * 2 + [64] * 4
    return (pattern * 2)[:depth + 1]


def part_two(batch, repeat):
    widths = varying_widths()
    depth = len(widths) - 1
    model = mlp(widths, seed=1)
    x = mdl.randn(batch, widths[0])
    k = sqrt_segments(depth)
    plan = balanced_segments(model, x, k)
    uniform = plan.uniform()
    rows = {}
    for label, segments in (("plain", 1), ("uniform", uniform), ("balanced", plan.boundaries)):
        model.zero_grad()
        with memory.track() as m:
            make_step(model, x, segments)()
        rows[label] = {"boundaries": [0] if segments == 1 else list(segments), "peak_bytes": m.peak_bytes,
                       "modeled_peak_bytes": plan.peak_bytes([0] if segments == 1 else segments),
                       "modeled_slowdown": plan.slowdown([0] if segments == 1 else segments)}
    model.zero_grad()
    paired_times(rows, {label: make_step(model, x, 1 if label == "plain" else row["boundaries"])
                        for label, row in rows.items()}, repeat)
    for row in rows.values():
        row["memory_ratio"] = row["peak_bytes"] / rows["plain"]["peak_bytes"]
    print(f"\nWidths 64..640 ({depth} layers), batch {batch}, {k} segments")
    for label, row in rows.items():
        print(f"{label:>9}: saved peak {row['peak_bytes'] / 2**20:7.2f} MiB ({row['memory_ratio']:.2f} of plain; "
              f"modeled {row['modeled_peak_bytes'] / 2**20:.2f}), step {row['step_seconds']:.3f} s "
              f"({row['time_ratio']:.2f}x; modeled {row['modeled_slowdown']:.2f}x), starts {row['boundaries']}")
    return {"widths": widths, "segments": k, "rows": rows,
            "segment_bytes": {"uniform": plan.segment_bytes(uniform), "balanced": plan.segment_bytes()}}


def part_three(batch, width, depth=100):
    model = mlp([width] * (depth + 1))
    x = mdl.randn(batch, width)
    results = {}
    print(f"\nfloat16 storage of the kept inputs, MLP of {depth} layers")
    for k in (sqrt_segments(depth), depth):
        report = storage_report(model, x, k, "float16")
        results[str(k)] = report
        print(f"{k:>4} segments: saved peak {report['peak_bytes'] / 2**20:.2f} -> "
              f"{report['peak_bytes_16bit'] / 2**20:.2f} MiB ({100 * report['saved_fraction']:.0f}% less), "
              f"gradient error {report['relative_grad_error']:.1e} (norm), "
              f"{report['max_relative_grad_error']:.1e} (largest element)")
    return results


def figure(one, two, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for (name, result), marker, color in zip(one.items(), "os", ("C0", "C2")):
        rows = list(result["rows"].items())
        times = [row["time_ratio"] for _, row in rows]
        mems = [100 * row["memory_ratio"] for _, row in rows]
        left.plot(times, mems, marker=marker, color=color, label=f"{result['layers']} layers (tracked)")
        left.plot(times, [100 * row["tracemalloc_ratio"] for _, row in rows], marker=marker, linestyle=":",
                  color=color, alpha=0.5, label=f"{result['layers']} layers (allocator, tracemalloc)")
        for (label, _), t, m in zip(rows, times, mems):
            left.annotate(label, (t, m), fontsize=7,
                          textcoords="offset points", xytext=(4, 3))
    left.axhline(25, color="gray", linewidth=0.8, linestyle="--")
    left.axvline(1.35, color="gray", linewidth=0.8, linestyle="--")
    left.set_xlabel("step time / plain step time (CPU time, median of pairs)")
    left.set_ylabel("peak saved for backward (memory.track), % of plain")
    left.set_title("Checkpointing: memory against time (labels: segments)")
    left.legend(fontsize=8)
    labels = list(two["rows"])
    right.bar(labels, [two["rows"][k]["peak_bytes"] / 2**20 for k in labels], color=["gray", "C1", "C2"])
    for i, label in enumerate(labels):
        row = two["rows"][label]
        right.annotate(f"{row['time_ratio']:.2f}x time", (i, row["peak_bytes"] / 2**20), ha="center",
                       textcoords="offset points", xytext=(0, 3), fontsize=8)
    right.set_ylabel("peak saved for backward (MiB)")
    right.set_title(f"Widths 64..640, {two['segments']} segments: uniform vs balanced")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--blas-threads", default="1", help="BLAS threads (read before NumPy loads)")
    args = parser.parse_args()
    start = time.perf_counter()
    one = part_one(args.batch, args.width, args.repeat)
    two = part_two(args.batch, args.repeat)
    three = part_three(args.batch, args.width)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results = {"batch": args.batch, "width": args.width, "repeat": args.repeat, "load_average": load,
               "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"), "time": "best CPU seconds of the process",
               "mlp": one, "uniform_vs_balanced": two, "float16_storage": three,
               "seconds": time.perf_counter() - start}
    path = save_results("checkpoint", results)
    png = os.path.join(os.path.dirname(path), f"{machine_name()}_checkpoint_memory_time.png")
    figure(one, two, png)
    for name, result in one.items():
        row = next(r for r in result["rows"].values() if r["segments"] == result["sqrt_segments"])
        print(f"{name}: at √L = {result['sqrt_segments']} segments, saved peak {100 * row['memory_ratio']:.1f}% of "
              f"plain (aim ≤ 25%), time {row['time_ratio']:.2f}x CPU, {row['wall_ratio']:.2f}x wall (aim ≤ 1.35x)")
    print(f"wrote {path} and {png} in {time.perf_counter() - start:.0f} s (load average {load})")


if __name__ == "__main__":
    main()
