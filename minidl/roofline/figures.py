"""The suite's figures (matplotlib, PNG): the roofline, the batch-size sweep, a training step's profile.

Each ``*_figure`` function takes the results dict of :func:`minidl.roofline.suite.run`
(or the JSON it wrote) and returns a matplotlib Figure; :func:`save_all`
writes the three PNGs next to the JSON.
"""
from __future__ import annotations

import os

import numpy as np

PHASE_MARKERS = {"forward": "o", "backward": "s", "update": "^"}
FRAMEWORK_STYLE = {"minidl": dict(alpha=0.95), "numpy": dict(alpha=0.35), "torch": dict(alpha=0.35)}


def _pyplot():
    import matplotlib.pyplot as plt  # headless machines get the Agg backend automatically
    return plt


def _plain_log_ticks(ax, axis: str = "y"):
    """Label a log axis with plain numbers (60, 200, 1000) instead of 6×10¹, and only where they fit."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())


def _roof(ax, ceilings, x_min, x_max, cache=True):
    """Draw min(peak, I × bandwidth) (and the in-cache roof, dashed) from x_min to x_max."""
    peak, bw, balance = ceilings["peak_flops"], ceilings["bandwidth"], ceilings["balance"]
    xs = np.geomspace(x_min, x_max, 200)
    ax.plot(xs, np.minimum(peak, xs * bw) / 1e9, color="black", lw=2,
            label=f"roofline: {peak / 1e9:.0f} GFLOP/s, {bw / 1e9:.1f} GB/s")
    if cache and ceilings.get("cache_bandwidth", 0) > bw:
        cbw = ceilings["cache_bandwidth"]
        ax.plot(xs, np.minimum(peak, xs * cbw) / 1e9, color="gray", lw=1, ls="--",
                label=f"in-cache roof: {cbw / 1e9:.0f} GB/s")
    ax.axvline(balance, color="black", lw=0.8, ls=":")
    ax.text(balance, peak / 1e9 * 1.15, f" balance {balance:.1f} FLOP/B", fontsize=8, va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved GFLOP/s")


def roofline_figure(results: dict, frameworks=("minidl", "torch")):
    """Every measured op with arithmetic placed at (intensity, achieved FLOP/s) under the roofline."""
    plt = _pyplot()
    rows = [r for r in results["rows"] if r["flops"] > 0 and r["framework"] in frameworks]
    fig, ax = plt.subplots(figsize=(9, 6), layout="constrained")
    ceilings = results["ceilings"]
    xs = [r["intensity"] for r in rows] or [1.0]
    _roof(ax, ceilings, min(min(xs), 0.05) / 2, max(max(xs), ceilings["balance"] * 10) * 2)
    ops = list(dict.fromkeys(r["op"] for r in rows))
    colors = {op: plt.cm.tab20(i % 20) for i, op in enumerate(ops)}
    groups = {}
    for r in rows:  # one scatter call per (op, phase, framework): far fewer artists to draw
        groups.setdefault((r["op"], r["phase"], r["framework"]), []).append(r)
    for (op, phase, framework), members in groups.items():
        ax.scatter([r["intensity"] for r in members], [r["flops_per_s"] / 1e9 for r in members],
                   color=colors[op], marker=PHASE_MARKERS.get(phase, "o"), s=36 if framework == "minidl" else 18,
                   edgecolors="black" if framework == "minidl" else "none", linewidths=0.4,
                   **FRAMEWORK_STYLE.get(framework, {}))
    for op in ops:
        ax.scatter([], [], color=colors[op], label=op)
    for phase, marker in PHASE_MARKERS.items():
        ax.scatter([], [], color="white", edgecolors="black", marker=marker, label=phase)
    name = results.get("info", {}).get("gpu") or results.get("info", {}).get("processor", "")
    others = [f for f in frameworks[1:] if any(r["framework"] == f for r in rows)]  # only those measured
    ax.set_title(f"Roofline of {results.get('name', '')} ({results['device']}{', ' + name if name else ''}):"
                 f" minidl (outlined){' vs ' + ', '.join(others) + ' (faint)' if others else ''}",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    ax.grid(True, alpha=0.2)
    return fig


def linear_sweep_rows(results: dict, framework: str = "minidl", phase: str = "forward") -> list[dict]:
    """The Linear layer's rows of one framework and phase, by increasing batch."""
    rows = [r for r in results["rows"]
            if r["op"] == "linear" and r["framework"] == framework and r["phase"] == phase]
    return sorted(rows, key=lambda r: r["params"]["batch"])


def batch_sweep_figure(results: dict):
    """Achieved GFLOP/s of a Linear layer against batch size, under the roof its intensity allows."""
    plt = _pyplot()
    ceilings = results["ceilings"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), layout="constrained")
    base = linear_sweep_rows(results)
    if not base:
        return fig
    batches = np.array([r["params"]["batch"] for r in base])
    shape = base[0]["params"]
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:red")):
        for framework, style in (("minidl", "-o"), ("torch", ":x"), ("numpy", "--.")):
            rows = linear_sweep_rows(results, framework, phase)
            if rows:
                left.plot([r["params"]["batch"] for r in rows], [r["flops_per_s"] / 1e9 for r in rows], style,
                          color=color, alpha=1.0 if framework == "minidl" else 0.5, label=f"{framework} {phase}")
    intensity = np.array([r["intensity"] for r in base])
    left.plot(batches, np.minimum(ceilings["peak_flops"], intensity * ceilings["bandwidth"]) / 1e9,
              color="black", lw=2, label="roof at this intensity")
    crossing = _crossing(batches, intensity, ceilings["balance"])
    from matplotlib.ticker import FuncFormatter
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 64, not 2⁶
        ax.set_xlabel("batch size B")
        ax.grid(True, alpha=0.2)
        if crossing:
            ax.axvline(crossing, color="gray", ls=":")
    left.set_yscale("log")
    _plain_log_ticks(left)
    left.set_ylabel("achieved GFLOP/s")
    left.set_title(f"Linear {shape['in_features']}→{shape['out_features']}, float32: memory-bound "
                   f"(left of B≈{crossing:.0f}) to compute-bound" if crossing else "Linear layer", fontsize=10)
    left.legend(fontsize=7)
    right.plot(batches, intensity, "-o", color="tab:green", label="intensity of the forward (FLOP/byte)")
    right.axhline(ceilings["balance"], color="black", ls="--", label=f"machine balance {ceilings['balance']:.1f}")
    right.plot(batches, batches / 2, ":", color="gray", label="B/2 (weights dominate the traffic)")
    right.set_yscale("log")
    _plain_log_ticks(right)
    right.set_ylabel("FLOP per byte")
    right.set_title("intensity grows with B until activations dominate the traffic", fontsize=10)
    right.legend(fontsize=7)
    return fig


def _crossing(batches, intensity, balance):
    """The batch size where the intensity reaches the machine balance (log interpolation), or None."""
    above = np.nonzero(intensity >= balance)[0]
    if not len(above) or above[0] == 0:
        return None
    i = above[0]
    b0, b1, y0, y1 = np.log(batches[i - 1]), np.log(batches[i]), np.log(intensity[i - 1]), np.log(intensity[i])
    return float(np.exp(b0 + (np.log(balance) - y0) * (b1 - b0) / (y1 - y0)))


def step_profile_figure(results: dict):
    """Time per op type in one training step, forward / backward / update stacked (from the profiler)."""
    plt = _pyplot()
    step = results["training_step"]
    by_op = step["by_op"]
    names = sorted(by_op, key=lambda n: sum(by_op[n].values()))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.6), layout="constrained")
    left = np.zeros(len(names))
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:red"), ("update", "tab:green"),
                         ("region", "tab:gray")):
        widths = np.array([by_op[n].get(phase, 0.0) * 1e3 for n in names])
        if widths.any():
            ax.barh(names, widths, left=left, color=color, label=phase)
            left += widths
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f} ms", va="center", fontsize=8)
    ax.set_xlim(0, left.max() * 1.18 if len(left) else 1)
    ax.set_xlabel("milliseconds")
    ax.set_title(f"One training step, MLP {step['model']}, batch {step['batch']}: {step['wall_s'] * 1e3:.1f} ms; "
                 f"overhead {step['overhead_us_per_op']:.0f} µs/op", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.2)
    return fig


def save_figure(fig, path: str) -> str:
    """Save as PNG atomically (:func:`minidl.serialization.atomic_write`) and close the figure."""
    from minidl.serialization import atomic_write
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    _pyplot().close(fig)
    return path


def save_all(results: dict, out_dir: str, name: str) -> dict:
    """Write <name>_roofline.png, <name>_batch_sweep.png, <name>_step_profile.png; return their paths."""
    paths = {}
    for key, make in (("roofline", roofline_figure), ("batch_sweep", batch_sweep_figure),
                      ("step_profile", step_profile_figure)):
        paths[key] = save_figure(make(results), os.path.join(out_dir, f"{name}_{key}.png"))
    return paths
