"""Real programs, step by step, on minidl against PyTorch: each written once for PyTorch.

Each program of ``benchmarks/programs/`` is a PyTorch program (``import torch``, ``import
torch.nn as nn``, ...). It is loaded twice from the same text: once as written, once with its
import lines changed to minidl's (``import minidl as torch``, ...), nothing else. The two steps
are timed in alternating rounds (a, b, b, a, ...), each round running a step as often as fits in
a quarter of a second, at 1 thread and at 2 threads (BLAS and PyTorch's intra-op pool alike, with a
0.15 s pause before each round there, as in bench_conv.py); a time is the median of the rounds and
the ratio the median of the per-round ratios.

A program that also defines ``make_traced_step(seed, compile)`` (regression, nanogpt, mnist) is timed
in that form too: its update as a function of the batch, eagerly, traced by ``minidl.compile`` (and
traced with ``lower=False``: each op's own forward, no buffers) and on PyTorch; with the arrays a
replay allocates and its peak of new memory, with and without the lowering's buffers.

At 1 thread both libraries compute in the calling thread, so the default clock there is that
thread's CPU time (``time.thread_time``): other work on a shared machine slows neither side's
count. At 2 threads the work is spread over threads, so the clock is elapsed time, and on a
busy machine those figures scatter more.

    python benchmarks/bench_programs.py [--rounds 7] [--only regression,mnist] [--threads 1,2] [--save]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import types

from common import save_results

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ("makemore_transformer", "nanogpt", "regression", "mnist", "makemore_mlp")
MINIDL_IMPORTS = [  # PyTorch's import lines and minidl's, the only lines that differ
    (r"^import torch$", "import minidl as torch"),
    (r"^import torch\.nn as nn$", "import minidl.nn as nn"),
    (r"^import torch\.nn\.functional as F$", "import minidl.nn.functional as F"),
    (r"^from torch\.nn import functional as F$", "from minidl.nn import functional as F"),
    (r"^import torch\.optim as optim$", "import minidl.optim as optim"),
]


def source(name: str, library: str) -> str:
    """The program's text, with minidl's import lines for ``library == "minidl"``."""
    with open(os.path.join(HERE, "programs", f"{name}.py")) as f:
        text = f.read()
    if library == "minidl":
        for pattern, replacement in MINIDL_IMPORTS:
            text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
        if re.search(r"^\s*(import|from) torch", text, flags=re.MULTILINE):
            raise ValueError(f"{name}: an import of torch has no minidl line in MINIDL_IMPORTS")
    return text


def load(name: str, library: str) -> types.ModuleType:
    """The program as a module of its own, run on ``library`` ("torch" or "minidl")."""
    module = types.ModuleType(f"{name}_{library}")
    module.__file__ = os.path.join(HERE, "programs", f"{name}.py")
    exec(compile(source(name, library), module.__file__, "exec"), module.__dict__)  # noqa: S102 - our own file
    return module


def alternate(steps: dict, rounds: int, clock, round_seconds: float = 0.25, pause: float = 0.0) -> dict:
    """``{name: [seconds per step, one per round]}``: warmed up, then timed in alternating order,
    with ``pause`` seconds before each round (the other library's threads spin for about 0.1 s
    after a call, and would take the cores from the round that follows)."""
    for step in steps.values():
        for _ in range(3):
            step()
    counts = {}
    for name, step in steps.items():
        start = clock()
        step()
        counts[name] = max(1, int(round_seconds / max(clock() - start, 1e-6)))
    number = min(counts.values())  # the same number of steps for both, so each round is one workload
    times = {name: [] for name in steps}
    order = list(steps.items())
    for _ in range(rounds):
        for name, step in order:
            time.sleep(pause)
            start = clock()
            for _ in range(number):
                step()
            times[name].append((clock() - start) / number)
        order.reverse()
    return times


def _keeping(compiled: dict, label: str, lower: bool):
    """``minidl.compile`` with ``lower``, the compiled step kept in ``compiled[label]`` (to read its plan)."""
    import minidl

    def compile_and_keep(step):
        compiled[label] = minidl.compile(step, lower=lower)
        return compiled[label]
    return compile_and_keep


def _memory_figures(compiled: dict, steps: dict) -> dict:
    """For the traced step with and without lowering: the results a replay allocates (counted in its
    plan: the ops' own forwards' results other than views, and lowered results written without out=),
    the plan's buffers, and the peak of new traced memory during one replay (tracemalloc, KiB)."""
    import tracemalloc
    figures = {}
    for label, suffix in (("minidl traced", ""), ("minidl traced, forwards", "_forwards")):
        plan = list(compiled[label].plans.values())[-1]
        figures["new_arrays" + suffix] = plan.memory.new_arrays
        figures["buffers" + suffix] = len(plan.buffers)
        tracemalloc.start()
        try:
            start = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            steps[label]()
            figures["peak_kib" + suffix] = (tracemalloc.get_traced_memory()[1] - start) / 1024
        finally:
            tracemalloc.stop()
    return figures


def run(names, rounds: int, threads, clock_at_one: str = "cpu") -> dict:
    import torch
    from threadpoolctl import threadpool_limits
    results = {}
    for count in threads:
        clock = time.thread_time if count == 1 and clock_at_one == "cpu" else time.perf_counter
        torch.set_num_threads(count)
        with threadpool_limits(limits=count, user_api="blas"):
            for name in names:
                steps = {"minidl": load(name, "minidl").make_step(0), "torch": load(name, "torch").make_step(0)}
                program = load(name, "minidl")
                compiled = {}
                if hasattr(program, "make_traced_step"):  # the step as a function of the batch, eager and traced
                    steps["minidl eager (batch in)"] = program.make_traced_step(0)
                    for label, lower in (("minidl traced", True), ("minidl traced, forwards", False)):
                        steps[label] = load(name, "minidl").make_traced_step(0, _keeping(compiled, label, lower))
                    steps["torch (batch in)"] = load(name, "torch").make_traced_step(0)
                times = alternate(steps, rounds, clock, pause=0.15 if count > 1 else 0.0)
                entry = {"minidl_ms": statistics.median(times["minidl"]) * 1e3,
                         "torch_ms": statistics.median(times["torch"]) * 1e3,
                         "ratio": statistics.median(a / b for a, b in zip(times["minidl"], times["torch"])),
                         "rounds": rounds, "clock": "thread cpu" if clock is time.thread_time else "wall"}
                if "minidl traced" in times:
                    torch_in = times["torch (batch in)"]
                    entry.update({
                        "eager_batch_in_ms": statistics.median(times["minidl eager (batch in)"]) * 1e3,
                        "traced_ms": statistics.median(times["minidl traced"]) * 1e3,
                        "torch_batch_in_ms": statistics.median(torch_in) * 1e3,
                        "eager_batch_in_ratio": statistics.median(
                            a / b for a, b in zip(times["minidl eager (batch in)"], torch_in)),
                        "traced_ratio": statistics.median(a / b for a, b in zip(times["minidl traced"], torch_in)),
                        # the plan without lowering: each op's own forward, a new array per result
                        "traced_forwards_ms": statistics.median(times["minidl traced, forwards"]) * 1e3,
                        "traced_forwards_ratio": statistics.median(
                            a / b for a, b in zip(times["minidl traced, forwards"], torch_in)),
                        **_memory_figures(compiled, steps)})
                results.setdefault(f"{count}_thread{'s' if count > 1 else ''}", {})[name] = entry
                print(f"{count} thread{'s' if count > 1 else ' '} {name:<22} minidl {entry['minidl_ms']:8.2f} ms   "
                      f"torch {entry['torch_ms']:8.2f} ms   minidl/torch {entry['ratio']:5.2f}", flush=True)
                if "traced_ms" in entry:
                    print(f"{'':9} {name + ', batch in':<22} eager {entry['eager_batch_in_ms']:8.3f} ms   traced "
                          f"{entry['traced_ms']:8.3f} ms   torch {entry['torch_batch_in_ms']:8.3f} ms   "
                          f"eager/torch {entry['eager_batch_in_ratio']:5.2f}   "
                          f"traced/torch {entry['traced_ratio']:5.2f}",
                          flush=True)
                    print(f"{'':9} {'':<22} traced with each op's forward {entry['traced_forwards_ms']:8.3f} ms "
                          f"(/torch {entry['traced_forwards_ratio']:5.2f}); arrays allocated per step "
                          f"{entry['new_arrays_forwards']} -> {entry['new_arrays']} ({entry['buffers']} buffers); "
                          f"peak new memory {entry['peak_kib_forwards']:.0f} -> {entry['peak_kib']:.0f} KiB",
                          flush=True)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated programs: " + ", ".join(PROGRAMS))
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default 1,2)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="the clock at 1 thread: the thread's CPU time (default) or elapsed time")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/<machine>_programs.json")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown programs {unknown}; choose from {', '.join(PROGRAMS)}")
    threads = [int(t) for t in args.threads.split(",") if t]
    results = run(names, args.rounds, threads, args.clock)
    if args.save:
        print("saved", save_results("programs", results))


if __name__ == "__main__":
    sys.exit(main())
