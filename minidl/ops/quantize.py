"""Fake quantization: round to an integer grid in the forward pass, pass the gradient straight through.

Quantization-aware training (Jacob et al., 2018) trains a float network
whose weights and activations are snapped, in every forward pass, to the
values an integer network will be able to hold:

    q = clip(round(x / s) + z, q_min, q_max)        the integer code
    y = s · (q − z)                                  the value it stands for

``s`` (scale) and ``z`` (zero point) come from :mod:`minidl.quant`. The
rounding has derivative 0 almost everywhere, which would stop all learning,
so the backward pass uses the straight-through estimator (Bengio, Léonard
and Courville, 2013): the rounding is treated as the identity, and only the
clipping is differentiated,

    dx = dy · [q_min ≤ round(x / s) + z ≤ q_max]

the derivative of ``clip(x, s·(q_min − z), s·(q_max − z))``: inside the grid
the gradient passes unchanged, outside it is zero (PyTorch's
``fake_quantize_per_tensor_affine`` and ``_per_channel_affine`` use the same
mask).
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import xp_of as _xp
from minidl.tensor import Tensor, as_tensor

TENSOR_METHODS = ()


class FakeQuantize(Function):
    """y = s · (clip(round(x/s) + z, q_min, q_max) − z);  dx = dy · [q_min ≤ round(x/s) + z ≤ q_max].

    ``scale`` and ``zero_point`` are constants (numbers, or arrays that
    broadcast against x: one per channel); they get no gradient. round is
    half to even, as NumPy's and PyTorch's.
    """
    saved_inputs = ()
    saved_arrays = ("scale", "zero_point", "inside")

    def __init__(self, scale, zero_point, q_min: int, q_max: int):
        self.scale, self.zero_point, self.q_min, self.q_max = scale, zero_point, q_min, q_max

    def forward(self, x):
        xp = _xp(x)
        q = xp.round(x / self.scale) + self.zero_point
        self.inside = (q >= self.q_min) & (q <= self.q_max)
        return ((xp.clip(q, self.q_min, self.q_max) - self.zero_point) * self.scale).astype(x.dtype, copy=False)

    def backward(self, gy):
        return gy * Tensor(self.inside.astype(gy.dtype))

    def jvp(self, dx):
        """ẏ = ẋ · [q_min ≤ round(x/s) + z ≤ q_max]  (straight through, as the backward: the rounding's
        own derivative is 0 almost everywhere)."""
        return dx * Tensor(self.inside.astype(dx.dtype))


def fake_quantize(x, scale, zero_point=0, quant_min: int = -128, quant_max: int = 127) -> Tensor:
    """x snapped to the grid ``s · (q − z)``, q an integer in [quant_min, quant_max]; straight-through gradient.

    ``scale`` > 0 and the integer ``zero_point``: numbers (per tensor) or
    arrays broadcasting against x (per channel: shape (C, 1) for a Linear
    weight (C, K), (C, 1, 1, 1) for a conv kernel). The defaults are int8's
    range; uint8 is ``quant_min=0, quant_max=255``.
    """
    x = as_tensor(x)
    xp = _xp(x.array)
    scale_array = xp.asarray(scale.array if isinstance(scale, Tensor) else scale)
    zero_array = xp.asarray(zero_point.array if isinstance(zero_point, Tensor) else zero_point)
    if not int(quant_min) < int(quant_max) or quant_min != int(quant_min) or quant_max != int(quant_max):
        raise ValueError(f"fake_quantize: quant_min < quant_max must be integers, got {quant_min!r}, {quant_max!r}")
    if scale_array.size == 0 or not bool(xp.all(scale_array > 0)):
        raise ValueError(f"fake_quantize: scale must be positive, got {scale!r}")
    if zero_array.size and (bool(xp.any(zero_array != xp.round(zero_array)))
                            or bool(xp.any((zero_array < quant_min) | (zero_array > quant_max)))):
        raise ValueError(f"fake_quantize: zero_point must be integers in [{quant_min}, {quant_max}], "
                         f"got {zero_point!r}")
    for name, array in (("scale", scale_array), ("zero_point", zero_array)):
        if array.ndim > x.ndim or any(a not in (1, b) for a, b in zip(array.shape[::-1], x.shape[::-1])):
            raise ValueError(f"fake_quantize: {name} of shape {array.shape} does not broadcast to x's shape "
                             f"{x.shape} without growing it (per channel: shape (C, 1, ...))")
    dtype = x.array.dtype
    return FakeQuantize(scale_array.astype(dtype), zero_array.astype(dtype), int(quant_min), int(quant_max))(x)
