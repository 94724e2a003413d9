"""Arrays and devices: NumPy on the CPU, CuPy on the GPU, behind one ``xp``.

Every layer above asks this module for the array module of a device or of an
array instead of importing numpy or cupy itself, so the same code runs on
both. This is the only module of minidl that imports cupy, and it does so
lazily: a CPU-only machine never needs it installed.

    xp = backend.xp_of(array)          # numpy or cupy, whichever owns array
    xp = backend.xp_for("cuda:0")      # the module for a device string
"""
from __future__ import annotations

import numpy as np

_cupy = None  # the cupy module once a GPU has been asked for; None before


def cupy_module():
    """Import CuPy on first use, with an error that says how to get it."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                "device 'cuda' needs CuPy, which is not installed: "
                "pip install 'minidl[gpu]' (CuPy for CUDA 12), or use device='cpu'"
            ) from exc
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"device 'cuda': CuPy is installed but no GPU can be used ({exc}); "
                "use device='cpu'"
            ) from exc
        if count == 0:  # pragma: no cover
            raise RuntimeError("device 'cuda': no GPU found on this machine; use device='cpu'")
        _cupy = cupy
    return _cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one GPU (never raises)."""
    try:
        cupy_module()
    except RuntimeError:
        return False
    return True


def parse_device(device) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'cuda' -> ('cuda', 0); 'cuda:1' -> ('cuda', 1)."""
    if device is None:
        return "cpu", 0
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind in ("cuda", "gpu") and (not index or index.isdigit()):
        return "cuda", int(index or 0)
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def xp_for(device):
    """The array module (numpy or cupy) for a device string."""
    kind, _ = parse_device(device)
    return np if kind == "cpu" else cupy_module()


def xp_of(array):
    """The array module that owns ``array``; NumPy unless it is a CuPy array."""
    if _cupy is not None and isinstance(array, _cupy.ndarray):
        return _cupy
    return np


def device_of(array) -> str:
    """'cpu' for NumPy arrays, 'cuda:N' for CuPy arrays."""
    if _cupy is not None and isinstance(array, _cupy.ndarray):
        return f"cuda:{array.device.id}"
    return "cpu"


def to_device(array, device):
    """Copy ``array`` to ``device`` (no copy when it is already there)."""
    kind, index = parse_device(device)
    if kind == "cpu":
        if _cupy is not None and isinstance(array, _cupy.ndarray):
            return _cupy.asnumpy(array)
        return np.asarray(array)
    cp = cupy_module()
    with cp.cuda.Device(index):
        return cp.asarray(array)


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (copied from the GPU if needed)."""
    return to_device(array, "cpu")


# ---------------------------------------------------------------- random numbers
# One seed drives every random source: NumPy's generator for the CPU and one
# CuPy generator per GPU, created from the same seed on first use.
_seed = None
_cpu_rng = np.random.default_rng()
_gpu_rngs: dict[int, object] = {}


def manual_seed(seed: int) -> None:
    """Seed every random source minidl uses (CPU now, each GPU on first use)."""
    global _seed, _cpu_rng
    _seed = int(seed)
    _cpu_rng = np.random.default_rng(_seed)
    _gpu_rngs.clear()


def rng(device="cpu"):
    """The generator for a device: ``numpy.random.Generator`` or CuPy's."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return _cpu_rng
    if index not in _gpu_rngs:
        cp = cupy_module()
        with cp.cuda.Device(index):
            seed = None if _seed is None else _seed + index
            _gpu_rngs[index] = cp.random.default_rng(seed)
    return _gpu_rngs[index]


def get_rng_state() -> dict:
    """The CPU generator's state, for checkpoints that must resume exactly."""
    return _cpu_rng.bit_generator.state


def set_rng_state(state: dict) -> None:
    _cpu_rng.bit_generator.state = state
