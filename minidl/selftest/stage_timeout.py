"""A stage's alarm, and what must happen before any alarm is armed: the imports.

Each stage runs under an alarm (SIGALRM) that raises :class:`StageTimeout` wherever the stage is.
Raised inside an ``import``, it leaves that module half-initialized: ``import torch`` stopped
halfway by the environment stage's alarm on a cold machine breaks every later use of torch (the
speed stage's reference). So :func:`import_up_front` imports every library and minidl module the
stages use once, with no alarm armed, before the first stage starts; a stage's own ``import`` is then
a lookup in ``sys.modules``. Its time is the run's and is reported (``results["imports"]``).
"""
from __future__ import annotations

import importlib
import time

__all__ = ["PRELOADED", "StageTimeout", "import_up_front"]

# The optional libraries first (PyTorch is the speed reference; matplotlib and Pillow draw the results'
# PNGs), then the minidl modules the stages import inside their functions.
PRELOADED = (
    "torch", "scipy.special", "scipy.sparse", "matplotlib.pyplot", "matplotlib.backends.backend_agg", "PIL.Image",
    "safetensors", "tqdm.auto", "threadpoolctl",
    "minidl.op_cases", "minidl.optim.kernels", "minidl.train", "minidl.parallel", "minidl.models.gpt_train",
    "minidl.memory", "minidl.profiler", "minidl.roofline.suite", "minidl.roofline.ceilings", "minidl.roofline.figures",
)


class StageTimeout(BaseException):
    """Raised inside a stage when its time is up (a BaseException: the stage's own handlers let it pass)."""


def import_up_front(names=PRELOADED) -> dict:
    """Import ``names`` and CuPy's NCCL binding now, before any stage's alarm is armed.

    Returns ``{"seconds": time taken, "failed": {name: why}}``; a module that cannot be imported
    (PyTorch absent, NCCL missing) is recorded, never raised: the stage that needs it reports it.
    """
    from minidl import backend
    started, failed = time.perf_counter(), {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - an optional library, or a broken one: the stage says so
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        backend.nccl()
    except RuntimeError as exc:
        failed["nccl"] = str(exc)[:300]
    if "PIL.Image" not in failed:  # Pillow imports its image plugins at the first save (the results' PNGs)
        import PIL.Image
        PIL.Image.preinit()
    return {"seconds": time.perf_counter() - started, "failed": failed}
