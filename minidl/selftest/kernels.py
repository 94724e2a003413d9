"""The kernels stage: every optimizer's fused update compiled and run on the device, timed on first call.

In normal use a fused kernel that fails to compile warns and the update runs
as separate CuPy calls (slower, same numbers). Here that warning is an error:
this stage is where a machine without NVRTC or CUDA's headers is found. Each
optimizer's first step on a fresh kernel cache includes CuPy's compile (or its
on-disk cache's load); the second step is the kernel alone. Both are reported.

The numbers each kernel computes are checked by the parity stage; the check
that CuPy compiles exactly the source CI compiles with NVRTC is
``tests/optim/test_nvrtc_compile.py`` (run by ``benchmarks/gpu_run.sh``).
"""
from __future__ import annotations

import time
import warnings

import numpy as np

from minidl.selftest.parity import OPTIMIZERS, UNFUSED


def first_calls(name: str, device: str, size: int) -> dict:
    """Seconds of the first and second step of optimizer ``name`` on ``size`` float32 parameters, and
    the kernels it compiled; a kernel that fails to compile raises (its warning made an error)."""
    import minidl as mdl
    from minidl import optim
    from minidl.optim import kernels
    from minidl.roofline.ceilings import synchronizer
    sync = synchronizer(device)
    kernels._kernels.clear()
    rng = np.random.default_rng(0)
    w = mdl.tensor(rng.standard_normal(size).astype(np.float32), requires_grad=True, device=device)
    opt = getattr(optim, name)([w], **OPTIMIZERS[name])
    times = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "did not compile ... running it as separate CuPy operations"
        for _ in range(2):
            if name == "AdaHessian":
                opt.zero_grad()
                (w * w * w).sum().backward(create_graph=True)
            else:
                w.grad = mdl.tensor(rng.standard_normal(size).astype(np.float32), device=device)
            sync()
            started = time.perf_counter()
            opt.step()
            sync()
            times.append(time.perf_counter() - started)
    compiled = [entry for entry in kernels._kernels.values() if entry is not False]
    return {"first_s": times[0], "second_s": times[1], "kernels": len(compiled),
            "compiled": bool(compiled) and all(entry[3] for entry in compiled)}


def run(stage) -> dict:
    size = 1 << 16 if stage.quick else 1 << 20
    rows, failures = {}, []
    for name in OPTIMIZERS:
        if name in UNFUSED:
            continue
        if stage.expired():
            break
        try:
            rows[name] = row = first_calls(name, stage.device, size)
        except Exception as exc:  # noqa: BLE001 - the compile error is this stage's finding
            failures.append(f"{name}: {type(exc).__name__}: {exc}"[:1000])
            continue
        if not row["compiled"]:
            failures.append(f"{name}: no fused kernel was compiled")
    fused = [n for n in OPTIMIZERS if n not in UNFUSED]
    total = sum(r["first_s"] for r in rows.values())
    slowest = max(rows, key=lambda n: rows[n]["first_s"]) if rows else None
    return {"optimizers": rows, "failures": failures, "partial": len(rows) + len(failures) < len(fused),
            "summary": f"{len(rows)}/{len(fused)} fused updates compiled and ran ({size:,} parameters); "
                       f"first calls {total:.2f} s in all"
                       + (f", slowest {slowest} {rows[slowest]['first_s']:.2f} s" if slowest else "")}
