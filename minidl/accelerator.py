"""PyTorch's ``torch.accelerator``: the one device-neutral question a script asks before it trains.

    device = mdl.accelerator.current_accelerator() if mdl.accelerator.is_available() else mdl.device("cpu")
    model.to(device)

minidl has one kind of accelerator, a CUDA GPU through CuPy, so these answer what
:mod:`minidl.cuda` answers, under the device-neutral names pytorch/examples use. One
difference: PyTorch's ``current_accelerator()`` names the accelerator its build was compiled
for even when none is present at run time (unless ``check_available=True``); minidl is not
compiled for a device, so it always answers from what is there now: ``mdl.device("cuda")``
when a GPU is usable, None otherwise.
"""
from minidl import backend
from minidl import cuda as _cuda


def is_available() -> bool:
    """True when an accelerator (a GPU that CuPy sees) is usable now."""
    return backend.gpu_available()


def current_accelerator(check_available: bool = False):
    """The accelerator as a device (``mdl.device("cuda")``, whose ``.type`` is ``"cuda"``), or None.

    ``check_available`` is taken for PyTorch's signature; minidl always checks (see the module's text).
    """
    return backend.device("cuda") if is_available() else None


def device_count() -> int:
    """The number of accelerators (GPUs) visible; 0 without one."""
    return _cuda.device_count()


def current_device_index() -> int:
    """The index of the accelerator that ``"cuda"`` means (always 0 in minidl); needs one."""
    if not is_available():
        raise RuntimeError("minidl.accelerator.current_device_index: no accelerator is available; "
                           "check minidl.accelerator.is_available() first")
    return 0


def synchronize(device=None) -> None:
    """Wait until the accelerator has finished its queued work (``torch.accelerator.synchronize``)."""
    if not is_available():
        raise RuntimeError("minidl.accelerator.synchronize: no accelerator is available; "
                           "check minidl.accelerator.is_available() first")
    _cuda.synchronize(device)
