"""Shape ops: reshape, transpose, broadcasting, indexing, joining, padding.

None of these change values, so each backward only moves the gradient back
to where the value came from: undo the reshape, apply the inverse
permutation, sum over the broadcast axes, scatter into the indexed places.
"""
from __future__ import annotations

import operator

import numpy as np

from minidl.autograd import Function
from minidl.backend import scatter_add, xp_of
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("reshape", "transpose", "broadcast_to", "sum_to", "flatten")


class Reshape(Function):
    """y = x viewed with a new shape;  dx = dy reshaped to x's shape."""
    saved_inputs = ()

    def __init__(self, shape):
        self.shape = shape

    def forward(self, x):
        self.in_shape = x.shape
        try:
            return x.reshape(self.shape)
        except ValueError:
            raise ValueError(f"reshape: cannot view a tensor of shape {x.shape} "
                             f"({x.size} elements) as {self.shape}") from None

    def backward(self, gy):
        return reshape(gy, self.in_shape)


def reshape(x: Tensor, *shape) -> Tensor:
    """NumPy's reshape; accepts ``reshape(x, 2, 3)`` or ``reshape(x, (2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if x.shape == shape:
        return x
    return Reshape(shape)(x)


class Transpose(Function):
    """y = x with axes permuted, y.shape[i] = x.shape[axes[i]];  dx = dy with the inverse permutation.

    ``axes`` is a permutation of 0..ndim−1 (negative axes count from the end),
    or None to reverse the axes. The inverse permutation p⁻¹ satisfies
    p⁻¹[p[i]] = i, computed from the axes made non-negative.
    """
    saved_inputs = ()

    def __init__(self, axes):
        self.axes = axes

    def forward(self, x):
        return x.transpose(self.axes)

    def backward(self, gy):
        if self.axes is None:
            return Transpose(None)(gy)
        inverse = [0] * len(self.axes)
        for i, axis in enumerate(self.axes):
            inverse[axis % len(self.axes)] = i
        return Transpose(tuple(inverse))(gy)


def _bad_axes(x, axes, why):
    ndim = x.ndim
    example = tuple(reversed(range(ndim)))
    return ValueError(f"transpose: axes {axes} {why} for a tensor of shape {x.shape} ({ndim} dimensions); "
                      f"pass a permutation of its {ndim} axes, e.g. {example}, each from {-ndim} to {ndim - 1}"
                      ", or two axes to swap")


def _axis_index(x, axes, axis):
    try:
        return operator.index(axis)
    except TypeError:
        raise TypeError(f"transpose: axes must be integers, got {axes} for a tensor of shape {x.shape}") from None


def transpose(x: Tensor, *axes) -> Tensor:
    """NumPy's transpose: no axes reverses them; ``transpose(x, 1, 0, 2)`` permutes.

    Two separate axes swap those two, as PyTorch's ``transpose(dim0, dim1)``
    does: on a matrix ``transpose(0, 1)`` is its transpose, while the tuple
    ``transpose((0, 1))`` stays NumPy's identity permutation. Negative axes
    count from the end. Axes that are not a permutation (wrong count, a
    repeat, out of range) raise ValueError.
    """
    permutation = len(axes) == 1 and isinstance(axes[0], (tuple, list))
    if permutation:
        axes = tuple(axes[0])
    if not axes:
        return Transpose(None)(x)
    given = axes
    ndim = x.ndim
    axes = tuple(_axis_index(x, given, a) for a in axes)
    if len(axes) == 2 and not (permutation and ndim == 2):  # PyTorch's transpose(dim0, dim1)
        if ndim == 0 and all(a in (0, -1) for a in axes):  # PyTorch lets a 0-d tensor swap 0 with itself
            return Transpose(None)(x)
        if any(not -ndim <= a < ndim for a in axes):
            raise _bad_axes(x, given, "are out of range")
        perm = list(range(ndim))
        perm[axes[0]], perm[axes[1]] = perm[axes[1]], perm[axes[0]]
        return Transpose(tuple(perm))(x)
    if len(axes) != ndim:
        raise _bad_axes(x, given, f"name {len(axes)} axis" if len(axes) == 1 else f"name {len(axes)} axes")
    if any(not -ndim <= a < ndim for a in axes):
        raise _bad_axes(x, given, "are out of range")
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != ndim:
        raise _bad_axes(x, given, "repeat an axis")
    return Transpose(axes)(x)


def swap_last_axes(x: Tensor) -> Tensor:
    """The matrix transpose of a batch of matrices (last two axes swapped)."""
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return Transpose(tuple(perm))(x)


class BroadcastTo(Function):
    """y = x repeated along broadcast axes;  dx = dy summed back to x's shape."""
    saved_inputs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        self.in_shape = x.shape
        try:
            return xp_of(x).broadcast_to(x, self.shape)
        except ValueError:
            raise ValueError(f"broadcast_to: shape {x.shape} cannot broadcast to {self.shape}") from None

    def backward(self, gy):
        return sum_to(gy, self.in_shape)


def broadcast_to(x: Tensor, shape) -> Tensor:
    if x.shape == tuple(shape):
        return x
    return BroadcastTo(shape)(x)


class SumTo(Function):
    """y = x summed over the axes that broadcasting added or stretched;  dx = dy broadcast back.

    This is the one helper every broadcasting backward uses: if y = f(a, b)
    broadcast a from shape s, then dL/da = sum over the broadcast axes of
    dL/dy, which is ``sum_to(dy, s)``.
    """
    saved_inputs = ()

    def __init__(self, shape):
        self.shape = tuple(shape)

    def forward(self, x):
        self.in_shape = x.shape
        lead = x.ndim - len(self.shape)
        axes = tuple(range(lead)) + tuple(
            lead + i for i, n in enumerate(self.shape) if n == 1 and x.shape[lead + i] != 1)
        y = x.sum(axis=axes, keepdims=True)
        return y.reshape(self.shape) if lead else y

    def backward(self, gy):
        return broadcast_to(gy, self.in_shape)


def sum_to(x: Tensor, shape) -> Tensor:
    """Sum ``x`` down to ``shape`` (the inverse of broadcasting); no-op when equal."""
    if x.shape == tuple(shape):
        return x
    return SumTo(shape)(x)


def _plain_key(key):
    """Tensors in an index become their arrays; lists become arrays."""
    if isinstance(key, tuple):
        return tuple(_plain_key(k) for k in key)
    if isinstance(key, Tensor):
        return key.data
    if isinstance(key, list):
        return np.asarray(key)
    return key


def _has_integer_array(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(hasattr(k, "dtype") and k.dtype.kind in "iu" for k in keys)


class GetItem(Function):
    """y = x[key] (slices, integers, integer arrays, boolean masks);  dx = dy scattered into zeros."""
    saved_inputs = ()

    def __init__(self, key):
        self.key = key

    def forward(self, x):
        self.in_shape = x.shape
        return x[self.key]

    def backward(self, gy):
        return GetItemGrad(self.key, self.in_shape)(gy)


class GetItemGrad(Function):
    """y = zeros(shape) with dy added at x[key] (repeated indices add up);  dx = dy[key]."""
    saved_inputs = ()

    def __init__(self, key, shape):
        self.key, self.shape = key, shape

    def forward(self, gy):
        xp = xp_of(gy)
        gx = xp.zeros(self.shape, gy.dtype)
        if _has_integer_array(self.key):
            scatter_add(gx, self.key, gy)  # an index may repeat: add, do not overwrite
        else:
            gx[self.key] = gy
        return gx

    def backward(self, ggx):
        return GetItem(self.key)(ggx)


def getitem(x: Tensor, key) -> Tensor:
    return GetItem(_plain_key(key))(x)


class Concatenate(Function):
    """y = [x1, x2, ...] joined along ``axis``;  dx_i = the slice of dy that x_i filled."""
    saved_inputs = ()

    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        self.sizes = [x.shape[self.axis] for x in xs]
        try:
            return xp_of(xs[0]).concatenate(xs, axis=self.axis)
        except ValueError:
            shapes = ", ".join(str(x.shape) for x in xs)
            raise ValueError(f"concatenate: shapes {shapes} do not match outside axis {self.axis}") from None

    def backward(self, gy):
        bounds = np.cumsum([0] + self.sizes)
        axis = self.axis % gy.ndim
        lead = (slice(None),) * axis
        return tuple(gy[lead + (slice(a, b),)] for a, b in zip(bounds[:-1], bounds[1:]))


def concatenate(tensors, axis: int = 0, dim: int | None = None) -> Tensor:
    """Join tensors along an existing axis (``dim`` is PyTorch's name for it)."""
    axis = axis if dim is None else dim
    return Concatenate(axis)(*[as_tensor(t) for t in tensors])


class Stack(Function):
    """y = tensors stacked along a new ``axis``;  dx_i = dy taken at index i of that axis."""
    saved_inputs = ()

    def __init__(self, axis):
        self.axis = axis

    def forward(self, *xs):
        shapes = {x.shape for x in xs}
        if len(shapes) > 1:
            raise ValueError(f"stack: all tensors need one shape, got {sorted(shapes)}")
        return xp_of(xs[0]).stack(xs, axis=self.axis)

    def backward(self, gy):
        axis = self.axis % gy.ndim
        lead = (slice(None),) * axis
        return tuple(gy[lead + (i,)] for i in range(gy.shape[axis]))


def stack(tensors, axis: int = 0, dim: int | None = None) -> Tensor:
    axis = axis if dim is None else dim
    return Stack(axis)(*[as_tensor(t) for t in tensors])


class Pad(Function):
    """y = x with constant borders (NumPy's pad_width);  dx = the interior of dy."""
    saved_inputs = ()

    def __init__(self, pad_width, value):
        self.pad_width, self.value = pad_width, value

    def forward(self, x):
        return xp_of(x).pad(x, self.pad_width, mode="constant", constant_values=self.value)

    def backward(self, gy):
        key = tuple(slice(before, gy.shape[i] - after) for i, (before, after) in enumerate(self.pad_width))
        return gy[key]


def pad(x: Tensor, pad_width, value: float = 0.0) -> Tensor:
    """Constant padding with NumPy's ``pad_width``: an int, a (before, after) pair, or one pair per axis."""
    pad_width = np.broadcast_to(np.asarray(pad_width, dtype=int), (x.ndim, 2))
    pad_width = tuple((int(a), int(b)) for a, b in pad_width)
    return Pad(pad_width, value)(x)


def flatten(x: Tensor, start_axis: int = 1) -> Tensor:
    """Collapse the axes from ``start_axis`` on into one (PyTorch's Flatten default)."""
    return reshape(x, x.shape[:start_axis] + (-1,))
