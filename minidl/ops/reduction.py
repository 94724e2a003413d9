"""Reductions over axes: sum, mean, max, min, var (NumPy's axis and keepdims).

Each backward first puts back the reduced axes as size 1 (so the gradient
broadcasts against the input), then applies the derivative:
sum → 1, mean → 1/n, max/min → 1 at the extreme (shared on ties),
var → 2(x − x̄)/(n − ddof).
"""
from __future__ import annotations

import builtins
import math

from minidl import backend
from minidl.amp import autocast_to
from minidl.autograd import Function
from minidl.ops.shape import broadcast_to, reshape
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("sum", "mean", "max", "min", "var")


def _normalize_axis(axis, ndim, op="reduction", shape=None):
    """A tuple of non-negative axes (all axes for None), with a clear error when out of range.

    A 0-d tensor accepts axis 0 or -1, as PyTorch does, and has no axis to reduce.
    """
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    limit = builtins.max(ndim, 1)
    for a in axes:
        if not -limit <= a < limit:
            raise ValueError(f"{op}: axis {a} is out of range for a tensor of shape {shape} "
                             f"({ndim} dimensions); use an axis from {-limit} to {limit - 1}")
    return tuple(sorted(a % ndim for a in axes)) if ndim else ()


def _kept_shape(in_shape, axes):
    """The output shape with keepdims=True: reduced axes become 1."""
    return tuple(1 if i in axes else n for i, n in enumerate(in_shape))


class Reduction(Function):
    def __init__(self, axis=None, keepdims=False):
        self.axis, self.keepdims = axis, keepdims

    def expand(self, gy: Tensor) -> Tensor:
        """dy with the reduced axes restored as size 1, ready to broadcast against x."""
        return gy if self.keepdims else reshape(gy, self.kept_shape)

    def prepare(self, x):
        self.axes = _normalize_axis(self.axis, x.ndim, type(self).__name__.lower(), x.shape)
        self.kept_shape = _kept_shape(x.shape, self.axes)
        self.count = math.prod([x.shape[a] for a in self.axes])


class Sum(Reduction):
    """y = Σ x over axes;  dx = dy broadcast to x's shape."""
    saved_inputs = ()

    def forward(self, x):
        self.prepare(x)
        return backend.sum(x, self.axes, self.keepdims)  # 16-bit floats add up in float32

    def backward(self, gy):
        return broadcast_to(self.expand(gy), self.inputs[0].shape)


class Mean(Reduction):
    """y = (1/n) Σ x over axes;  dx = dy / n broadcast to x's shape."""
    saved_inputs = ()

    def forward(self, x):
        self.prepare(x)
        return backend.mean(x, self.axes, self.keepdims)

    def backward(self, gy):
        return broadcast_to(self.expand(gy) / self.count, self.inputs[0].shape)


class Max(Reduction):
    """y = max x over axes;  dx = dy at the maximum, split evenly among ties."""
    saved_inputs = ()

    extreme = "max"

    def forward(self, x):
        self.prepare(x)
        if any(x.shape[a] == 0 for a in self.axes):  # an empty batch over other axes is fine
            raise ValueError(f"{self.extreme}: cannot reduce over an empty axis (shape {x.shape}, axis {self.axis})")
        y = getattr(x, self.extreme)(axis=self.axes, keepdims=True)
        hits = x == y
        self.share = hits / hits.sum(axis=self.axes, keepdims=True)
        return y if self.keepdims else y.reshape(tuple(n for i, n in enumerate(x.shape) if i not in self.axes))

    def backward(self, gy):
        return self.expand(gy) * Tensor(self.share.astype(gy.dtype, copy=False))


class Min(Max):
    """y = min x over axes;  dx = dy at the minimum, split evenly among ties."""

    extreme = "min"


class Var(Reduction):
    """y = Σ (x − x̄)² / (n − ddof);  dx = dy · 2(x − x̄)/(n − ddof).

    ``ddof=0`` (NumPy's default) is the population variance; ``ddof=1`` is
    PyTorch's default unbiased estimate (PyTorch calls ddof ``correction``).
    When n ≤ ddof there is no estimate, and the numbers are PyTorch's: the
    forward divides by max(n − ddof, 0), giving NaN (0/0) or inf; the
    backward keeps the formula with 2/(n − ddof) taken as +inf at n = ddof,
    so dx is NaN where x = x̄ and ±inf elsewhere (for n < ddof the factor is
    the finite 2/(n − ddof), as in PyTorch). An empty x has an empty gradient.
    """

    def __init__(self, axis=None, keepdims=False, ddof=0):
        super().__init__(axis, keepdims)
        self.ddof = ddof

    def forward(self, x):
        self.prepare(x)
        return x.var(axis=self.axes, keepdims=self.keepdims, ddof=self.ddof)

    def backward(self, gy):
        x = self.inputs[0]
        if x.data.size == 0:
            return Tensor(x.xp.zeros(x.shape, gy.dtype))
        dof = self.count - self.ddof
        scale = 2.0 / dof if dof else math.inf
        centered = x - mean(x, axis=self.axes, keepdims=True)
        return self.expand(gy) * centered * scale


def _axis(axis, dim):
    return axis if dim is None else dim


@autocast_to("float32")
def sum(x, axis=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    """Σ x over ``axis`` (all axes by default); ``dim``/``keepdim`` are PyTorch aliases."""
    return Sum(_axis(axis, dim), keepdims if keepdim is None else keepdim)(x)


def mean(x, axis=None, keepdims=False, *, dim=None, keepdim=None):
    return Mean(_axis(axis, dim), keepdims if keepdim is None else keepdim)(x)


def max(x, axis=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    return Max(_axis(axis, dim), keepdims if keepdim is None else keepdim)(x)


def min(x, axis=None, keepdims=False, *, dim=None, keepdim=None):  # noqa: A001
    return Min(_axis(axis, dim), keepdims if keepdim is None else keepdim)(x)


def var(x, axis=None, keepdims=False, ddof=0, *, dim=None, keepdim=None, correction=None):
    """Variance over ``axis`` with n − ``ddof`` in the denominator; ``correction`` is PyTorch's name for ddof."""
    ddof = ddof if correction is None else correction
    return Var(_axis(axis, dim), keepdims if keepdim is None else keepdim, ddof)(x)
