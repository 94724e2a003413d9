"""The roofline suite: every op timed forward and backward, placed against the machine's ceilings.

For each op and size (see :mod:`minidl.roofline.cases`) and each framework
(minidl, plain NumPy/CuPy, PyTorch where installed), in one run:

    time        best of several repeats (the run least disturbed by other work)
    FLOP/s      analytic FLOPs (opcosts) / time
    GB/s        analytic compulsory bytes / time
    intensity   FLOPs / bytes: a property of the op, not of the framework
    verdict     compute-bound if the intensity is at least the machine balance, else memory-bound
    roofline    achieved FLOP/s / the ceiling that applies (for an op without arithmetic: achieved
                GB/s / the bandwidth that applies): the fraction of what the machine allows.
    ceiling     which one: "memory", min(peak, intensity × main-memory bandwidth), for data larger
                than the cache; "cache", min(peak, intensity × in-cache bandwidth), for data that
                fit in the cache or that evidently came from it (faster than main memory allows).
                Above 1 even then means faster than the measured ceilings (a busy moment while they
                were measured), and the summary says so.

``run()`` also profiles one training step of an MLP with :mod:`minidl.profiler`,
writes ``<out>/<name>.json`` (atomically) and the figures
(:mod:`minidl.roofline.figures`), and returns the results as a dict.
"""
from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import time
from contextlib import contextmanager, nullcontext
from time import perf_counter

import numpy as np

from minidl import backend
from minidl.roofline import ceilings as ceilings_module
from minidl.roofline.cases import FRAMEWORKS
from minidl.roofline.cases import cases as all_cases
from minidl.roofline.opcosts import Cost


def machine_name() -> str:
    """$MINIDL_MACHINE if set (a stable name for results files), else the host name."""
    return os.environ.get("MINIDL_MACHINE") or socket.gethostname() or "machine"


def machine_load() -> dict:
    """How busy the machine is as a run starts: the 1-minute load average, the cores, the BLAS's threads.

    ``load`` is None where the system has no load average (Windows). Measured before the run's own
    work, which would raise it.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {"load": load, "cpus": os.cpu_count(), "blas_threads": backend.get_num_threads()}


def busy_warning(load: dict) -> str | None:
    """One line when the machine is busy (a load average above its number of cores), else None.

    Other work then shares the cores with every timing and with the BLAS's threads, which can
    spin against each other: the figures come out low (the peak, and small matrix products most).
    """
    if load.get("load") is None or not load.get("cpus") or load["load"] <= load["cpus"]:
        return None
    return (f"warning: this machine is busy (load {load['load']:.1f} on {load['cpus']} cores, BLAS with "
            f"{load['blas_threads']} threads): these figures will be low; measure on an idle machine "
            "(or fewer threads: minidl.set_num_threads(1))")


def machine_info(device: str, load: dict | None = None) -> dict:
    """The machine, its software and, for a CPU run, ``load`` (:func:`machine_load`, measured now if not given)."""
    info = {"machine": machine_name(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            **(load or machine_load())}
    if "torch" in sys.modules:  # compared in this run
        info["torch"] = sys.modules["torch"].__version__
    if backend.parse_device(device)[0] == "cuda":
        cp = backend.cupy_module()
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        info["cupy"] = cp.__version__
    return info


# ---------------------------------------------------------------- timing one callable
def calibrate(fn, sync, min_time: float = 0.01) -> int:
    """How many calls make one timing last ≥ ``min_time`` (after one warm-up call)."""
    fn()  # warm-up: first-call costs (allocation, caches, lazy imports) are not the op's
    sync()
    number, start = 0, perf_counter()
    while number < 100_000:  # calibrate on several calls: one call delayed by the scheduler would skew it
        fn()
        number += 1
        if perf_counter() - start >= min_time:
            sync()  # on the GPU the host runs ahead: count the time until the work is done
            if perf_counter() - start >= min_time:
                break
    return number


def time_call(fn, sync, repeat: int = 5, min_time: float = 0.01) -> float:
    """Seconds per call: calls batched so that one timing lasts ≥ ``min_time``, best of ``repeat``."""
    number = calibrate(fn, sync, min_time)
    return ceilings_module.best_time(fn, repeat=repeat, number=number, warmup=0, sync=sync)


def time_side_by_side(fns: dict, syncs: dict, repeat: int = 5, min_time: float = 0.01, pools: dict | None = None,
                      pause: float = 0.15) -> dict:
    """Best seconds per call of each callable, the repeats taken in turn (a, b, c, a, b, c...).

    Interleaving puts every framework through the same moments of a shared machine, so a burst
    of other work slows all of them alike and the ratios between them stay honest. ``pools``
    names each callable's thread pool (NumPy's BLAS, PyTorch's OpenMP): after a pool's last call
    its threads keep spinning for a while and would steal the cores from the next pool's work,
    so switching pools waits ``pause`` seconds first (OpenBLAS's threads spin for ~0.1 s).
    """
    pools = pools or {}
    last = [None]

    def switch_to(key):
        if pools.get(key) != last[0]:
            if last[0] is not None and pause:
                time.sleep(pause)
            last[0] = pools.get(key)

    numbers = {}
    for key, fn in fns.items():
        switch_to(key)
        numbers[key] = calibrate(fn, syncs[key], min_time)
    best = dict.fromkeys(fns, math.inf)
    order = list(fns)
    for _ in range(repeat):
        order.reverse()  # a, b, c, c, b, a, a, b...: one change of pool per round, not two
        for key in order:
            fn = fns[key]
            switch_to(key)
            seconds = ceilings_module.best_time(fn, repeat=1, number=numbers[key], warmup=0, sync=syncs[key])
            best[key] = min(best[key], seconds)
    return best


def _torch_sync(device):
    if backend.parse_device(device)[0] != "cuda":
        return lambda: None
    try:
        import torch
    except ImportError:  # no PyTorch: its cases are skipped anyway
        return lambda: None
    cupy_sync = ceilings_module.synchronizer(device)

    def sync():
        torch.cuda.synchronize()
        cupy_sync()
    return sync


# ---------------------------------------------------------------- analysis of one measurement
def analyse(seconds: float, cost, ceilings) -> dict:
    """Achieved FLOP/s and GB/s, intensity, verdict and fraction of the roofline for one timing.

    A phase with no compulsory work (add's backward hands dy on) has no place on the roofline:
    its verdict is "no work" and its intensity and fraction are None; its time is all overhead.
    """
    flops_per_s = cost.flops / seconds
    bytes_per_s = cost.bytes / seconds
    if not (cost.flops or cost.bytes):
        return {"seconds": seconds, "flops": 0, "bytes": 0, "flops_per_s": 0.0, "bytes_per_s": 0.0,
                "intensity": None, "verdict": "no work", "roofline_fraction": None, "ceiling": None}
    intensity = cost.flops / cost.bytes if cost.bytes else math.inf
    # The ceiling that applies: main memory's, unless the data fit in the cache or beat main memory.
    in_cache = cost.bytes <= getattr(ceilings, "cache_bytes", 0) or (
        flops_per_s > ceilings.roof(intensity) if cost.flops else bytes_per_s > ceilings.bandwidth)
    in_cache = in_cache and ceilings.cache_bandwidth > ceilings.bandwidth
    if cost.flops:
        fraction = flops_per_s / ceilings.roof(intensity, cache=in_cache)
    else:
        fraction = bytes_per_s / (ceilings.cache_bandwidth if in_cache else ceilings.bandwidth)
    return {"seconds": seconds, "flops": cost.flops, "bytes": cost.bytes, "flops_per_s": flops_per_s,
            "bytes_per_s": bytes_per_s, "intensity": intensity,
            "verdict": "compute-bound" if intensity >= ceilings.balance else "memory-bound",
            "roofline_fraction": fraction, "ceiling": "cache" if in_cache else "memory"}


# A case whose every phase does less arithmetic than this runs on one thread in every framework.
# Its products are too small to share out: a second BLAS thread only waits for the first, and on
# a busy machine for the cores too. Measured on a 2-core VM (medians, ms, 1 thread against 2):
# idle, a 64³ product 0.016 vs 0.015 and a 1×512·512×512 one 0.031 vs 0.027 (a wash); with
# other work on the cores the second thread loses (see the CHANGELOG's figures).
SMALL_WORK_FLOPS = 1.1e6


@contextmanager
def one_thread(frameworks=FRAMEWORKS):
    """NumPy's BLAS and, where it is in use, PyTorch's thread pool limited to one thread, restored after."""
    torch = sys.modules.get("torch") if "torch" in frameworks else None
    before = torch.get_num_threads() if torch is not None else None
    try:
        with backend.blas_threads(1):
            if torch is not None:
                torch.set_num_threads(1)
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)


def run_cases(device: str = "cpu", quick: bool = False, ceilings=None, frameworks=FRAMEWORKS,
              only=None, repeat: int | None = None, min_time: float | None = None, log=print,
              progress: bool | None = None) -> list[dict]:
    """Time every case in every framework; one row per (op, size, framework, phase).

    ``ceilings`` (measured quickly when None) judge each timing; ``only``: op names to run.
    A case with less than ``SMALL_WORK_FLOPS`` of work in each phase runs on one CPU thread
    (its rows say ``threads: 1``). ``progress``: a bar over the cases on stderr (None: when
    stderr is a terminal); the case lines go to ``log`` either way.
    """
    from tqdm.auto import tqdm
    if ceilings is None:
        ceilings = ceilings_module.measure(device, quick=True)
    repeat = repeat or (3 if quick else 5)
    min_time = min_time if min_time is not None else (0.002 if quick else 0.02)
    sync = ceilings_module.synchronizer(device)
    torch_sync = _torch_sync(device) if "torch" in frameworks else None
    on_cpu = backend.parse_device(device)[0] == "cpu"
    pause = (0.02 if quick else 0.15) if on_cpu and "torch" in frameworks else 0.0  # see time_side_by_side
    threads = backend.get_num_threads() if on_cpu else None
    rows = []
    cases = [case for case in all_cases(quick, device) if not only or case.op in only]
    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(cases, desc="bench", unit="case", file=sys.stderr, leave=False, dynamic_ncols=True, disable=not show)
    for case in bar:
        bar.set_postfix_str(f"{case.op} {case.size}")
        fns, syncs = {}, {}
        for framework in frameworks:
            try:
                impl = case.build(framework, device)
            except ImportError:
                impl = None
            for phase, fn in (impl or {}).items():
                fns[framework, phase] = fn
                syncs[framework, phase] = torch_sync if framework == "torch" else sync
        pools = {key: ("torch" if key[0] == "torch" else "numpy") for key in fns}
        small = on_cpu and max(cost.flops for cost in case.costs.values()) < SMALL_WORK_FLOPS
        with one_thread(frameworks) if small else nullcontext():
            times = time_side_by_side(fns, syncs, repeat, min_time, pools, pause)
        del fns
        for (framework, phase), seconds in times.items():
            rows.append({"op": case.op, "size": case.size, "framework": framework, "phase": phase,
                         "params": case.params, "threads": 1 if small else threads,
                         **analyse(seconds, case.costs[phase], ceilings)})
        if log:
            line = _case_line(case, rows) + ("  (one thread)" if small else "")
            if log is print:  # printed above the bar, which stays at the bottom
                bar.write(line, file=sys.stdout)
            else:
                log(line)
    bar.close()
    return rows


def _case_line(case, rows):
    mine = [r for r in rows if r["op"] == case.op and r["size"] == case.size]
    parts = []
    for phase in case.phases:
        times = {r["framework"]: r["seconds"] for r in mine if r["phase"] == phase}
        shown = " ".join(f"{f} {t * 1e3:.3g}" for f, t in times.items())
        parts.append(f"{phase}: {shown} ms")
    return f"  {case.op:<12} {case.size:<20} " + "; ".join(parts)


# ---------------------------------------------------------------- one training step, profiled
def profile_training_step(device: str = "cpu", quick: bool = False, steps: int = 5) -> dict:
    """Profile one SGD step of an MLP (784-1024-1024-10, batch 256; smaller when quick): the fastest of ``steps``."""
    import minidl as mdl
    import minidl.functional as F
    from minidl import nn, profiler
    widths, batch = ((784, 128, 128, 10), 64) if quick else ((784, 1024, 1024, 10), 256)
    mdl.manual_seed(0)
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(device)
    x = mdl.randn(batch, widths[0], device=device)
    y = backend.xp_for(device).asarray(np.random.default_rng(0).integers(0, widths[-1], batch))
    try:
        from minidl import optim
        opt = optim.SGD(model.parameters(), lr=0.01)
    except (ImportError, AttributeError):  # pragma: no cover - optimizers missing: update by hand
        opt = None

    def step(prof=None):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            with (prof.region("SGD.step", "update") if prof else _nothing()):
                with mdl.no_grad():
                    for p in model.parameters():
                        p.array -= 0.01 * p.grad.array
                        p.grad = None

    for _ in range(2):  # warm-up: allocator, BLAS threads, caches
        step()
    best = None
    for _ in range(steps):  # the least disturbed of a few profiled steps, as every timing here
        with profiler.profile(cuda=backend.parse_device(device)[0] == "cuda") as prof:
            step(prof)
        if best is None or prof.wall < best.wall:
            best = prof
    prof = best
    return {"model": "-".join(map(str, widths)), "batch": batch, **prof.as_dict(), "by_op": prof.by_op(),
            "table": prof.table()}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# ---------------------------------------------------------------- the whole run
def results_name(device: str = "cpu", quick: bool = False, machine: str | None = None) -> str:
    """'<machine>' for a full CPU run; '-cuda' and '-quick' suffixes otherwise."""
    name = machine or machine_name()
    if backend.parse_device(device)[0] == "cuda":
        name += "-cuda"
    return name + ("-quick" if quick else "")


def run(device: str = "cpu", quick: bool = False, out_dir: str | None = "benchmarks/results",
        machine: str | None = None, frameworks=FRAMEWORKS, ceilings=None, figures: bool = True,
        only=None, repeat: int | None = None, min_time: float | None = None, log=print,
        progress: bool | None = None) -> dict:
    """Measure the ceilings, time every case, profile a training step; write JSON and PNGs to ``out_dir``.

    ``only``: op names to run (all by default); ``repeat`` and ``min_time`` as in :func:`time_call`;
    ``progress`` as in :func:`run_cases`.
    """
    kind = backend.parse_device(device)[0]
    started = perf_counter()
    load = machine_load()  # before the run's own work raises it
    warning = busy_warning(load)
    if log and warning:
        log(warning)
    measured = ceilings is None
    if measured:
        if log:
            log(f"measuring the ceilings of {kind}{' (quick)' if quick else ''}...")
        ceilings = ceilings_module.measure(kind, quick=quick)
    if log:
        log(ceilings.summary())
        log("timing ops (milliseconds per call):")
    rows = run_cases(kind, quick, ceilings, frameworks, only, repeat, min_time, log=log, progress=progress)
    if measured:  # measured again after the ops, the better of the two kept: a busy moment only lowers them
        ceilings = ceilings.best(ceilings_module.measure(kind, quick=quick))
        # an empirical roofline: a matrix product of the suite that ran faster than the 2048³ GEMM raises the peak
        fastest = max([r["flops_per_s"] for r in rows if r["op"] in ("matmul", "linear")], default=0.0)
        ceilings.peak_flops = max(ceilings.peak_flops, fastest)
        rows = [{**r, **analyse(r["seconds"], Cost(r["flops"], r["bytes"]), ceilings)} for r in rows]
        if log:
            log("ceilings, best of before and after: " + ceilings.summary())
    if log:
        log("profiling one training step...")
    step = profile_training_step(kind, quick, steps=repeat or 5)
    name = results_name(kind, quick, machine)
    results = {"name": name, "device": kind, "quick": bool(quick), "info": machine_info(kind, load),
               "ceilings": ceilings.as_dict(), "rows": rows, "training_step": step,
               "seconds": perf_counter() - started}
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        results["json"] = write_json(results, os.path.join(out_dir, name + ".json"))
        if figures:
            from minidl.roofline import figures as figures_module
            results["figures"] = figures_module.save_all(results, out_dir, name)
    if log:
        log(summary_table(results))
        for path in [results.get("json")] + list(results.get("figures", {}).values()):
            if path:
                log(f"wrote {path}")
    return results


def write_json(results: dict, path: str) -> str:
    """Write ``results`` to ``path`` atomically (:func:`minidl.serialization.atomic_write`)."""
    from minidl.serialization import atomic_write, plain

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1, default=lambda value: plain(value, other=str))

    atomic_write(path, write)
    return path


def summary_table(results: dict) -> str:
    """minidl, NumPy and PyTorch side by side, with minidl's place on the roofline."""
    rows = results["rows"]
    keys = list(dict.fromkeys((r["op"], r["size"], r["phase"]) for r in rows))
    head = (f"{'op':<12} {'size':<20} {'phase':<8} {'minidl ms':>10} {'numpy ms':>10} {'torch ms':>10} "
            f"{'GFLOP/s':>8} {'GB/s':>7} {'FLOP/B':>7} {'roof %':>6} {'of':<6} verdict")
    lines = [head, "-" * len(head)]
    above = []
    for op, size, phase in keys:
        by = {r["framework"]: r for r in rows if (r["op"], r["size"], r["phase"]) == (op, size, phase)}
        ms = [f"{by[f]['seconds'] * 1e3:10.3f}" if f in by else f"{'-':>10}" for f in FRAMEWORKS]
        ref = by.get("minidl") or next(iter(by.values()))
        if ref["intensity"] is None:
            placed = f"{'-':>8} {'-':>7} {'-':>7} {'-':>6} {'-':<6}"
        else:
            fraction = ref["roofline_fraction"]
            mark = "*" if fraction > 1 else " "
            if fraction > 1:
                above.append(f"{op} {phase}")
            placed = (f"{ref['flops_per_s'] / 1e9:8.2f} {ref['bytes_per_s'] / 1e9:7.2f} {ref['intensity']:7.2f} "
                      f"{100 * fraction:5.1f}{mark} {ref.get('ceiling') or 'memory':<6}")
        lines.append(f"{op:<12} {size:<20} {phase:<8} {' '.join(ms)} {placed}  {ref['verdict']}")
    c = results["ceilings"]
    lines.append(f"ceilings: peak {c['peak_flops'] / 1e9:.1f} GFLOP/s, bandwidth {c['bandwidth'] / 1e9:.1f} GB/s, "
                 f"in cache {c.get('cache_bandwidth', 0) / 1e9:.1f} GB/s, balance {c['balance']:.1f} FLOP/byte; "
                 "GFLOP/s, GB/s and roof % are minidl's")
    lines.append("roof % = achieved / the ceiling in column 'of': 'memory' is min(peak, intensity x main-memory "
                 "bandwidth), for data larger than the cache; 'cache' is min(peak, intensity x in-cache bandwidth), "
                 "for data that fit in the cache or came from it (faster than main memory allows)")
    if above:
        lines.append(f"* above 100%: faster than even the measured ceiling ({', '.join(above[:6])}"
                     f"{', ...' if len(above) > 6 else ''}); the ceilings were measured at a busier moment, or "
                     "the in-cache copy (one core) understates the cache")
    warning = busy_warning(results.get("info", {}))
    if warning:
        lines.append(warning)
    step = results.get("training_step")
    if step:
        lines.append(f"training step {step['model']} batch {step['batch']}: {step['wall_s'] * 1e3:.1f} ms, "
                     f"framework overhead {step['overhead_us_per_op']:.1f} µs per op")
    return "\n".join(lines)
