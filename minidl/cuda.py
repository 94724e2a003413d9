"""PyTorch's ``torch.cuda`` names a training script calls, over minidl's backend.

    device = mdl.device("cuda" if mdl.cuda.is_available() else "cpu")
    mdl.cuda.manual_seed_all(0)
    scaler = mdl.cuda.amp.GradScaler()     # torch.cuda.amp's path to minidl.amp

Everything here answers on a machine without a GPU or CuPy (``is_available()`` is
False, ``device_count()`` 0); only ``synchronize`` and ``current_device`` need one.
"""
from minidl import backend


def is_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    return backend.gpu_available()


def device_count() -> int:
    """The number of GPUs CuPy sees (0 without CuPy or a GPU)."""
    if not backend.gpu_available():
        return 0
    return backend.cupy_module().cuda.runtime.getDeviceCount()


def current_device() -> int:
    """The index of the GPU that ``"cuda"`` means (minidl's "cuda" is always GPU 0)."""
    _require("current_device")
    return 0


def manual_seed(seed: int) -> None:
    """Seed the GPUs' generators (not the CPU's, as in PyTorch); harmless without a GPU."""
    backend.seed_gpus(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every GPU's generator: minidl seeds GPU i with ``seed + i``, all from this one call."""
    backend.seed_gpus(seed)


def synchronize(device=None) -> None:
    """Wait until the GPU ``device`` (default GPU 0) has finished its queued work."""
    _require("synchronize")
    kind, index = backend.parse_device("cuda" if device is None else device)
    cp = backend.cupy_module()
    with cp.cuda.Device(index):
        cp.cuda.Device(index).synchronize()


def _require(name):
    if not backend.gpu_available():
        raise RuntimeError(f"minidl.cuda.{name}: no GPU is available (CuPy is missing or sees no device); "
                           "check minidl.cuda.is_available() first")


def __getattr__(name):
    """``minidl.cuda.amp``: PyTorch's older path to the mixed-precision names (minidl.amp)."""
    if name == "amp":
        from minidl import amp  # a layer above; imported on first use of this alias only
        return amp
    raise AttributeError(f"module 'minidl.cuda' has no attribute {name!r}")
