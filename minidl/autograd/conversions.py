"""The two ops the Tensor class itself needs: a move to another device and a dtype conversion.

``t.to(device)``, ``t.to(dtype)``, ``t.double()`` and ``t.clone()`` call these, so a
gradient flows back to the device and the dtype its input came from.
"""
from minidl import backend
from minidl.autograd.function import Function


class ToDevice(Function):
    """y = x on another device;  dx = dy moved back to x's device."""
    saved_inputs = ()

    def __init__(self, device):
        self.device = device

    def forward(self, x):
        self.source = backend.device_of(x)
        return backend.to_device(x, self.device)

    def backward(self, gy):
        return ToDevice(self.source)(gy)

    def jvp(self, dx):
        """dy = dx on the other device."""
        return ToDevice(self.device)(dx)


class Cast(Function):
    """y = x converted to ``dtype``;  dx = dy converted back to x's dtype.

    Any floating dtype, bfloat16 (from ml_dtypes) included: mixed precision's casts are
    this op, so a gradient always arrives in its tensor's own dtype.
    """
    saved_inputs = ()

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        self.source = x.dtype
        try:
            return x.astype(self.dtype)
        except (TypeError, ValueError) as exc:  # CuPy has no bfloat16: say so, not CuPy's words
            device = backend.device_of(x)
            raise TypeError(f"Cast: cannot convert a {x.dtype} tensor on {device} to {self.dtype} ({exc})"
                            + ("; CuPy has no bfloat16 arrays: use float16 on the GPU"
                               if device != "cpu" and "bfloat16" in str(self.dtype) else "")) from None

    def backward(self, gy):
        return Cast(self.source)(gy)

    def jvp(self, dx):
        """dy = dx converted to ``dtype``."""
        return Cast(self.dtype)(dx)
