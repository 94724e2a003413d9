"""Timing a step on either device, two libraries side by side.

On the GPU the host only queues work: a clock read right after a call measures
the queueing, not the work. A device timer records a CUDA event before and
after the calls and reads the time between them once the second event has
happened (one synchronization per timing, none inside it). On the CPU it reads
the host clock.

Two libraries are compared in alternating rounds (a, b, b, a, a, b...), each
round timing every library once after the same warm-up, so that a change in
the machine's state (other work, clocks, temperature) hits both alike; the
ratio is taken round by round. This is what ``minidl selftest`` and the
benchmarks with ``--device cuda`` share.

    timers = {"minidl": device_timer("cuda"), "torch": torch_timer("cuda")}
    rounds = alternate({"minidl": step, "torch": torch_step}, timers, rounds=5)
    summary(rounds)     # best and median ms of each, the median ratio minidl / torch
"""
from __future__ import annotations

import statistics
import time

from minidl import backend


def device_timer(device: str = "cpu"):
    """``timer(fn, number) -> seconds per call`` for minidl's (NumPy or CuPy) work on ``device``.

    On a GPU: CUDA events on the current stream around ``number`` calls.
    """
    if backend.parse_device(device)[0] == "cpu":
        return _host_timer
    cp = backend.cupy_module()

    def timer(fn, number=1):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3 / number
    return timer


def torch_timer(device: str = "cpu"):
    """The same for PyTorch's work: ``torch.cuda.Event`` pairs on a GPU (PyTorch imported here)."""
    if backend.parse_device(device)[0] == "cpu":
        return _host_timer
    import torch

    def timer(fn, number=1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / number
    return timer


def _host_timer(fn, number=1):
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def alternate(fns: dict, timers: dict, rounds: int = 5, warmup: int = 2, number: int = 1,
              deadline: float | None = None) -> dict:
    """``{name: [seconds per call, one per round]}``: each function warmed up, then timed once a round.

    The order turns round each round (a, b, b, a...), so neither library always runs
    right after the other. ``deadline`` (a ``time.perf_counter()`` value): stop after
    the round that passes it (at least one round is always timed).
    """
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        timers[name](lambda: None)  # waits for the warm-up's queued work to finish
    times = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order:
            times[name].append(timers[name](fns[name], number))
        order.reverse()
        if deadline is not None and time.perf_counter() > deadline:
            break
    return times


def summary(times: dict, reference: str = "torch", subject: str = "minidl") -> dict:
    """Best and median ms of each library; with both there, the median of the per-round ratios."""
    out = {name: {"best_ms": min(t) * 1e3, "median_ms": statistics.median(t) * 1e3, "rounds": len(t)}
           for name, t in times.items() if t}
    if times.get(reference) and times.get(subject):
        out["ratio"] = statistics.median(a / b for a, b in zip(times[subject], times[reference]))
    return out
