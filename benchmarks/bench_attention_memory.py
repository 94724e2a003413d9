"""Attention in tiles against the plain op: memory saved for backward and time, at sequence lengths 256 to 4096.

One head, features 64, float32, causal; forward, then backward of the output's sum. For each
sequence length n and each path (``tiled=False``: the plain op keeps the n × n probabilities;
``tiled=True``: FlashAttention's online softmax keeps the output and one log-sum-exp per row):

- bytes saved for backward (the arrays the graph's nodes hold), counted by
  ``minidl.memory.track`` (q, k and v included, as the tracker counts a user's inputs);
- forward and forward + backward time (process CPU time, one BLAS thread, best of a few
  repeats, the two paths interleaved);
- the largest difference between the two paths' outputs and gradients.

Writes benchmarks/results/<machine>_attention_memory.json and a PNG of memory against n.
Usage: python benchmarks/bench_attention_memory.py [--lengths 256 512 1024 2048 4096] [--out DIR]
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: the work itself, not the waiting

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import memory  # noqa: E402
from minidl.roofline.suite import machine_name  # noqa: E402
from minidl.serialization import atomic_write  # noqa: E402


def one_step(n, features, tiled, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (mdl.tensor(rng.standard_normal((1, n, features), dtype=np.float32), requires_grad=True)
               for _ in range(3))
    with memory.track() as tracked:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, tiled=tiled)
        out.sum().backward()
    return tracked.peak_bytes, out.numpy(), [x.grad.numpy() for x in (q, k, v)]


def cpu_seconds(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    rows = []
    for n in args.lengths:
        row = {"n": n}
        results = {}
        for tiled in (False, True):
            name = "tiled" if tiled else "plain"
            peak, out, grads = one_step(n, args.features, tiled)
            results[name] = (out, grads)
            row[f"{name}_bytes"] = peak
        for tiled in (False, True):  # timed after both ran once (warm), interleaved by repeat
            name = "tiled" if tiled else "plain"
            rng = np.random.default_rng(1)
            q, k, v = (mdl.tensor(rng.standard_normal((1, n, args.features), dtype=np.float32), requires_grad=True)
                       for _ in range(3))
            with mdl.no_grad():
                row[f"{name}_forward_s"] = cpu_seconds(
                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, tiled=tiled), args.repeat)
            row[f"{name}_step_s"] = cpu_seconds(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, tiled=tiled).sum().backward(),
                args.repeat)
        (a, ga), (b, gb) = results["plain"], results["tiled"]
        row["max_difference"] = float(max(np.abs(a - b).max(), *(np.abs(x - y).max() for x, y in zip(ga, gb))))
        rows.append(row)
        print(f"n={n:5d}  saved for backward: plain {memory.format_bytes(row['plain_bytes']):>10}  "
              f"tiled {memory.format_bytes(row['tiled_bytes']):>10}   step: plain {row['plain_step_s'] * 1e3:8.1f} ms  "
              f"tiled {row['tiled_step_s'] * 1e3:8.1f} ms  ({row['tiled_step_s'] / row['plain_step_s']:.2f}x)   "
              f"max difference {row['max_difference']:.1e}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    name = machine_name() + "_attention_memory"
    results = {"features": args.features, "dtype": "float32", "causal": True, "blas_threads": 1, "rows": rows}
    def write_json(path):
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
    atomic_write(os.path.join(args.out, name + ".json"), write_json)
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.5, 3.6), constrained_layout=True)
    ns = [r["n"] for r in rows]
    ax.loglog(ns, [r["plain_bytes"] / 2**20 for r in rows], "o-", label="plain: keeps the n × n probabilities")
    ax.loglog(ns, [r["tiled_bytes"] / 2**20 for r in rows], "s-", label="tiled: keeps O and one number per row")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("saved for backward (MiB, q k v included)")
    ax.set_title(f"attention, one head, {args.features} features, float32")
    ax.legend(fontsize=8)
    atomic_write(os.path.join(args.out, name + ".png"), lambda path: fig.savefig(path, format="png", dpi=110))
    print("wrote", os.path.join(args.out, name + ".json"), "and .png")


if __name__ == "__main__":
    main()
