"""Saved activations moved to host memory or stored in fewer bits, on saved-tensor hooks.

Both are :class:`minidl.autograd.saved_tensors_hooks`: every array an op
recorded inside the block saves for backward is packed when saved and
unpacked when the backward reaches that op::

    with save_on_cpu():                  # on a GPU: saved arrays wait in (pinned) host memory
        loss = model(x)
    loss.backward()                      # each comes back to the GPU when its op's backward runs

    with save_as("bfloat16"):            # saved floating arrays kept in 16 bits (or "int8")
        loss = model(x)

Offload is exact: the same bytes come back. Compression rounds what
backward reads, so the gradients differ from the plain run's by the storage
dtype's precision (float16: 2⁻¹¹ relative to each value, bfloat16: 2⁻⁸;
int8: a per-tensor scale s = max|a| / 127, an error up to s/2 per value);
the forward pass itself is unchanged. Integer and boolean arrays (indices,
masks) are saved as they are, and so are arrays already that small.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import saved_tensors_hooks
from minidl.checkpoint.segments import resolve_storage_dtype

__all__ = ["save_on_cpu", "save_as"]


class save_on_cpu(saved_tensors_hooks):  # noqa: N801 - PyTorch's name: torch.autograd.graph.save_on_cpu
    """Context: arrays saved for backward on a GPU wait in host memory until their backward.

    With ``pin_memory=True`` (default) the host copy is page-locked memory
    (``cupyx.empty_pinned``), which the GPU reads and writes at full bus
    speed. On the CPU there is nowhere else to put them: arrays pass through
    unchanged (packed as they are), so the same program runs on both devices.
    Gradients are exactly those of the plain run.
    """

    def __init__(self, pin_memory: bool = True):
        self.pin_memory = bool(pin_memory)
        super().__init__(self._pack, self._unpack)

    def _pack(self, t):
        array = t.array
        if not backend.is_device_array(array):
            return t  # on the CPU already: kept as it is
        device = backend.device_of(array)
        if self.pin_memory:
            host = backend._cupyx_module().empty_pinned(array.shape, dtype=array.dtype)
            array.get(out=host)
        else:
            host = backend.to_device(array, "cpu")
        return device, host

    def _unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        device, host = packed
        return backend.to_device(host, device)


def _storage(dtype):
    if str(dtype) == "int8" or dtype is np.int8:
        return np.dtype(np.int8)
    try:
        return resolve_storage_dtype(dtype)
    except ValueError:
        raise ValueError(f"save_as: dtype must be 'float16', 'bfloat16' or 'int8', got {dtype!r}") from None


class save_as(saved_tensors_hooks):  # noqa: N801 - a context, named as save_on_cpu
    """Context: floating arrays saved for backward are stored as ``dtype`` until their backward.

    ``dtype``: ``"float16"``, ``"bfloat16"`` (needs ml_dtypes) or ``"int8"``
    (q = round(a / s) with one scale s = max|a| / 127 per array; a ≈ q·s).
    Each comes back in its own dtype. A value beyond float16's range raises
    ValueError (use bfloat16, whose range is float32's). Arrays that are not
    floating, or not wider than ``dtype``, are kept as they are.
    """

    def __init__(self, dtype):
        self.dtype = _storage(dtype)
        super().__init__(self._pack, self._unpack)

    def _pack(self, t):
        array, dtype = t.array, self.dtype
        if not backend.is_floating(array.dtype) or array.dtype.itemsize <= dtype.itemsize:
            return t
        xp = backend.xp_of(array)
        if dtype == np.int8:
            scale = xp.abs(array).max() / 127 if array.size else xp.asarray(0, array.dtype)
            scale = xp.where(scale > 0, scale, 1).astype(array.dtype)  # an all-zero array: any scale
            return "int8", array.dtype, xp.rint(array / scale).astype(np.int8), scale
        with np.errstate(over="ignore"):  # an overflow is reported below, with its fix
            small = array.astype(dtype)
        if not bool(xp.isfinite(small).all()) and bool(xp.isfinite(array).all()):
            raise ValueError(f"save_as('{dtype}'): a saved array of shape {tuple(array.shape)} exceeds the range "
                             f"of {dtype} (largest magnitude {float(xp.abs(array).max()):.4g}); use "
                             "save_as('bfloat16') or save_as('int8')")
        return "cast", array.dtype, small

    def _unpack(self, packed):
        if not isinstance(packed, tuple):
            return packed
        if packed[0] == "int8":
            _, dtype, q, scale = packed
            return q.astype(dtype) * scale
        _, dtype, small = packed
        return small.astype(dtype)
