"""The schedule under a memory budget against √L segments and the balanced planner: memory against time.

Two chains of Linear → ReLU layers (float32, He initialization), one step
each (forward, then backward of the output with a fixed gradient, so that
no loss node adds to the memory held):

- **widths 64 and 640** in stretches of unequal length (36 layers, as in
  bench_checkpoint.py): √L uniform segments (PyTorch's), the balanced planner
  at k ∈ {2, 3, 4, 6, 8, 12} segments, and ``optimal_schedule`` at the
  balanced planner's peaks and at lower budgets down to the smallest
  feasible peak;
- **32 equal layers** of width 256: √L segments, segments at k ∈ {2, 4, 8,
  16}, Revolve's binomial schedule with s ∈ {1, …, 6} kept inputs, and
  ``optimal_schedule`` at the same budgets (the layers' profiled times
  averaged: they are identical layers, see ``steady_profile``).

For each: the peak of bytes saved for backward, predicted by the schedule's
equations (modeled) and counted by ``minidl.memory.track`` (saved); the
allocator's peak above the step's start (real: tracemalloc, every buffer,
gradients and temporaries included); the forward calls of every layer
predicted and counted; the step time predicted from the profiled layer
times and measured (process CPU time with one BLAS thread, the median ratio
to a plain step timed right before it, over a few rounds: on a machine
shared with other jobs the CPU time is the work itself); and whether the
gradients are bit-for-bit the plain run's.

Then the real peaks (``--real-only`` runs just this part): the ReLU chain
6 × (Linear(256, 256), ReLU), batch 2048, and the GPT of
bench_memory_strategies.py as a chain of layers (``pipeline_layers``), each
with a mean-square or cross-entropy loss, plain, checkpointed layer by layer,
and by ``optimal_schedule`` at 1, 1.5, 2 and 3 times the smallest peak: the
modeled peak, the saved bytes the tracker counts (the loss's nodes included)
and the allocator's peak, from no gradients (so theirs are part of it).

Writes benchmarks/results/<machine>_schedule.json and _schedule.png.
Usage: python benchmarks/bench_schedule.py [--batch 128] [--repeat 5] [--out DIR] [--real-only]
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads: the work itself, not the waiting

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import mlp  # noqa: E402

import minidl as mdl  # noqa: E402
import minidl.functional as F  # noqa: E402
from minidl import memory, nn  # noqa: E402
from minidl.checkpoint import (  # noqa: E402
    SegmentPlan,
    balanced_segments,
    binomial_schedule,
    checkpoint_sequential,
    count_forward_calls,
    optimal_schedule,
    profile_layers,
    segment_schedule,
    smallest_peak,
    sqrt_segments,
    uniform_boundaries,
)
from minidl.models.gpt import GPT, GPTConfig, pipeline_layers  # noqa: E402
from minidl.roofline.suite import machine_name  # noqa: E402
from minidl.serialization import atomic_write  # noqa: E402


def varying_widths(depth=36):
    pattern = [64] * 6 + [640] * 3 + [64] * 4 + [640] * 8 + [64] * 9 + [640] * 2 + [64] * 4
    return (pattern * 2)[:depth + 1]


def steady_profile(model, x, rounds=5, equal_layers=False):
    """The layers measured a few times: sizes from one run, each layer's fastest times.

    With ``equal_layers`` every layer gets the mean of those times: the layers are identical, and
    what still tells them apart is the machine's noise, which the dynamic program would otherwise
    exploit (recomputing the layers that happened to run fast in the dry run).
    """
    runs = [profile_layers(model, x) for _ in range(rounds)]
    L = runs[0].num_layers
    forward = [min(r.forward_seconds[i] for r in runs) for i in range(L)]
    backward = [min(r.backward_seconds[i] for r in runs) for i in range(L)]
    if equal_layers:
        forward, backward = [float(np.mean(forward))] * L, [float(np.mean(backward))] * L
    return SegmentPlan([0], runs[0].input_bytes, runs[0].layer_bytes, forward, backward)


def make_step(model, x, grad, how):
    """how: 'plain', a list of segment starts (checkpoint_sequential) or a Schedule."""
    def step():
        if isinstance(how, str):
            out = model(x)
        elif isinstance(how, list):
            out = checkpoint_sequential(model, how, x)
        else:
            out = how.run(model, x)
        out.backward(grad)
    return step


def measure_once(model, step):
    model.zero_grad()
    with count_forward_calls(model) as counter, memory.track() as tracked:
        step()
    return tracked, counter.calls, [p.grad.numpy().copy() for p in model.parameters()]


def cpu_time(step):
    start = time.process_time()
    step()
    return time.process_time() - start


def run_chain(name, model, x, configs, profile, repeat):
    """configs: (strategy, label, how, predicted schedule). Returns one row per config."""
    grad = mdl.tensor(np.ones(model(x).shape, dtype=np.float32))
    plain_step = make_step(model, x, grad, "plain")
    _, _, reference = measure_once(model, plain_step)
    rows, steps = [], []
    for strategy, label, how, schedule in configs:
        step = make_step(model, x, grad, how)
        tracked, calls, grads = measure_once(model, step)
        rows.append({"strategy": strategy, "label": label, "predicted_peak_bytes": schedule.peak_bytes(),
                     "measured_peak_bytes": tracked.peak_bytes, "allocator_peak_bytes": tracked.allocator_peak_bytes,
                     "predicted_forward_calls": sum(schedule.forward_calls()),
                     "measured_forward_calls": sum(calls), "calls_match": calls == schedule.forward_calls(),
                     "predicted_slowdown": schedule.slowdown(),
                     "grads_identical": all(np.array_equal(a, b) for a, b in zip(grads, reference))})
        steps.append(step)
    ratios = [[] for _ in rows]
    for _ in range(repeat):  # a plain step right before each: a pair sees the same load
        for i, step in enumerate(steps):
            plain = cpu_time(plain_step)
            ratios[i].append(cpu_time(step) / plain)
    plain_bytes = profile.plain_bytes()
    print(f"\n{name}: {profile.num_layers} layers, plain peak {memory.format_bytes(plain_bytes)}, "
          f"smallest feasible peak {memory.format_bytes(smallest_peak(profile))}")
    print("saved for backward: modeled by the schedule, counted by memory.track; real: the allocator's peak")
    print(f"{'strategy':>9} {'config':>14} {'modeled':>10} {'saved':>10} {'% plain':>7} {'real':>10} "
          f"{'calls':>6} {'=':>2} {'time pred':>9} {'measured':>8} {'grads ==':>8}")
    for row, r in zip(rows, ratios):
        row["measured_slowdown"] = float(np.median(r))
        row["memory_fraction"] = row["measured_peak_bytes"] / plain_bytes
        print(f"{row['strategy']:>9} {row['label']:>14} {memory.format_bytes(row['predicted_peak_bytes']):>10} "
              f"{memory.format_bytes(row['measured_peak_bytes']):>10} {100 * row['memory_fraction']:7.1f} "
              f"{memory.format_bytes(row['allocator_peak_bytes']):>10} "
              f"{row['measured_forward_calls']:6d} {'y' if row['calls_match'] else 'n':>2} "
              f"{row['predicted_slowdown']:9.2f} {row['measured_slowdown']:8.2f} {str(row['grads_identical']):>8}",
              flush=True)
    return {"layers": profile.num_layers, "plain_peak_bytes": plain_bytes,
            "smallest_peak_bytes": smallest_peak(profile), "rows": rows}


def heterogeneous(batch, repeat):
    widths = varying_widths()
    model, x = mlp(widths, seed=1), mdl.randn(batch, widths[0])
    profile = steady_profile(model, x)
    L = profile.num_layers
    root = sqrt_segments(L)
    configs = [("sqrt", f"√L={root} uniform", uniform_boundaries(L, root),
                segment_schedule(profile, uniform_boundaries(L, root)))]
    budgets = []
    for k in (2, 3, 4, 6, 8, 12):
        plan = balanced_segments(model, x, k, profile)
        configs.append(("balanced", f"{k} segments", plan.boundaries, segment_schedule(plan)))
        budgets.append(plan.peak_bytes())
    least = smallest_peak(profile)
    budgets += [int(least + f * (min(budgets) - least)) for f in (0.0, 0.25, 0.5, 0.75)]
    for budget in sorted(set(budgets)):
        schedule = optimal_schedule(model, x, budget, profile=profile)
        configs.append(("optimal", f"{memory.format_bytes(budget)}", schedule, schedule))
    result = run_chain("widths 64..640", model, x, configs, profile, repeat)
    result["widths"] = widths
    return result


def homogeneous(batch, repeat, depth=32, width=256):
    model, x = mlp([width] * (depth + 1)), mdl.randn(batch, width)
    profile = steady_profile(model, x, equal_layers=True)
    L = profile.num_layers
    root = sqrt_segments(L)
    configs = [("sqrt", f"√L={root} uniform", uniform_boundaries(L, root),
                segment_schedule(profile, uniform_boundaries(L, root)))]
    budgets = []
    for k in (2, 4, 8, 16):
        starts = uniform_boundaries(L, k)
        configs.append(("segments", f"{k} segments", starts, segment_schedule(profile, starts)))
        budgets.append(segment_schedule(profile, starts).peak_bytes())
    for s in range(1, 7):
        schedule = binomial_schedule(L, s, profile=profile)
        configs.append(("binomial", f"s={s}", schedule, schedule))
        budgets.append(schedule.peak_bytes())
    for budget in sorted(set(budgets)):
        schedule = optimal_schedule(model, x, budget, profile=profile)
        configs.append(("optimal", f"{memory.format_bytes(budget)}", schedule, schedule))
    return run_chain(f"{depth} equal layers of width {width}", model, x, configs, profile, repeat)


STYLE = {"sqrt": ("C3", "*", "√L uniform segments"), "balanced": ("C1", "s", "balanced planner, k segments"),
         "segments": ("C1", "s", "uniform segments, k = 2, 4, 8, 16"),
         "binomial": ("C2", "^", "Revolve binomial, s = 1..6"),
         "optimal": ("C0", "o", "optimal schedule (dynamic program)")}


def figure(results, path):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    for ax, (title, result) in zip(axes, results.items()):
        plain = result["plain_peak_bytes"]
        for strategy in dict.fromkeys(row["strategy"] for row in result["rows"]):
            rows = sorted((r for r in result["rows"] if r["strategy"] == strategy),
                          key=lambda r: r["predicted_peak_bytes"])
            color, marker, label = STYLE[strategy]
            memory_pred = [100 * r["predicted_peak_bytes"] / plain for r in rows]
            memory_meas = [100 * r["measured_peak_bytes"] / plain for r in rows]
            ax.plot(memory_pred, [r["predicted_slowdown"] for r in rows], marker=marker, color=color,
                    linestyle="-" if strategy != "sqrt" else "none", label=f"{label}: predicted")
            ax.plot(memory_meas, [r["measured_slowdown"] for r in rows], marker=marker, color=color,
                    markerfacecolor="none", linestyle=":", alpha=0.8, label="  measured")
        ax.axvline(100 * result["smallest_peak_bytes"] / plain, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xlabel("peak saved for backward (memory.track), % of the plain run (dashed: smallest feasible)")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_yticks([1, 1.25, 1.5, 2, 3, 4, 6, 8])
        ax.set_ylabel("step time / plain step time (CPU time)")
        ax.set_title(title)
        ax.legend(fontsize=7)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


# ---------------------------------------------------------------- real peaks: the allocator beside the model
def relu_chain():
    mdl.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers), mdl.randn(2048, 256), lambda out: (out * out).mean()


def gpt_chain():
    mdl.manual_seed(0)
    B, T = 8, 128  # noqa: N806
    model = GPT(GPTConfig(vocab_size=65, block_size=T, n_layer=4, n_head=4, n_embd=128))
    idx = mdl.tensor(np.random.default_rng(0).integers(0, 65, (B, T)))
    targets = mdl.tensor(np.random.default_rng(1).integers(0, 65, (B * T,)))
    return pipeline_layers(model), idx, lambda out: F.cross_entropy(out.reshape(B * T, 65), targets)


def real_peaks():
    """Modeled, saved and real (allocator) peaks of each schedule on the two chains."""
    results = {}
    for name, make in (("6 × (Linear(256, 256), ReLU), batch 2048", relu_chain),
                       ("GPT as a chain (4 blocks, 8 × 128 tokens)", gpt_chain)):
        model, x, loss_fn = make()
        measured = profile_layers(model, x)  # sizes; each layer's bytes stand for its time (no timing noise)
        profile = SegmentPlan([0], measured.input_bytes, measured.layer_bytes,
                              [float(b) for b in measured.layer_bytes], [0.0] * measured.num_layers)
        least = smallest_peak(profile)
        configs = {"plain": None, "each layer checkpointed": segment_schedule(profile, list(range(profile.num_layers)))}
        for factor in (1, 1.5, 2, 3):
            configs[f"optimal, {factor} × smallest peak"] = optimal_schedule(model, x, int(factor * least),
                                                                            profile=profile)
        rows = {}
        print(f"\n{name}: peaks of one step from no gradients (modeled: the schedule's equations; saved: "
              "memory.track, loss nodes included; real: the allocator, tracemalloc)")
        for label, schedule in configs.items():
            for p in model.parameters():
                p.grad = None
            with memory.track() as m:
                loss_fn(model(x) if schedule is None else schedule.run(model, x)).backward()
            modeled = profile.plain_bytes() if schedule is None else schedule.peak_bytes()
            rows[label] = {"modeled_peak_bytes": modeled, "saved_peak_bytes": m.peak_bytes,
                           "allocator_peak_bytes": m.allocator_peak_bytes}
            print(f"{label:>32}: modeled {modeled / 2**20:6.1f} MiB  saved {m.peak_bytes / 2**20:6.1f} MiB  "
                  f"real {m.allocator_peak_bytes / 2**20:6.1f} MiB", flush=True)
        results[name] = {"gradient_bytes": sum(p.array.nbytes for p in model.parameters()), "rows": rows}
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--real-only", action="store_true", help="only the real peaks (writes _schedule_real.json)")
    args = parser.parse_args(argv)
    if args.real_only:
        path = os.path.join(args.out, machine_name() + "_schedule_real.json")
        real = real_peaks()

        def write_real(tmp):
            with open(tmp, "w") as f:
                json.dump({"real_peaks": real}, f, indent=1)
        atomic_write(path, write_real)
        print("wrote", path)
        return
    results = {"widths 64..640 (36 layers)": heterogeneous(args.batch, args.repeat),
               "32 equal layers, width 256": homogeneous(args.batch, args.repeat)}
    name = os.path.join(args.out, machine_name() + "_schedule")
    info = {"batch": args.batch, "dtype": "float32", "blas_threads": 1, "repeat": args.repeat,
            "time": "process CPU time, median ratio to a plain step timed right before",
            "memory": "modeled and saved: bytes saved for backward (equations, memory.track); "
                      "real: the allocator's peak above the step's start (tracemalloc)"}
    real = real_peaks()

    def write_json(path):
        with open(path, "w") as f:
            json.dump({"info": info, "chains": results, "real_peaks": real}, f, indent=1)
    atomic_write(name + ".json", write_json)
    figure(results, name + ".png")
    print("wrote", name + ".json", "and .png")


if __name__ == "__main__":
    main()
