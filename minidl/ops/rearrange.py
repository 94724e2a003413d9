"""Rearranging ops: flip, roll, repeat, repeat_interleave, tril/triu, diagonal, diag, unfold.

Each output element is a copy of one input element (or a zero, for tril and
triu), so each backward sends dy back to where the copies came from: undo a
flip or a roll, zero what was masked, and where one element was copied to
several places (repeat, overlapping windows) add up the gradients of its
copies, a sum over the repeats or a scatter-add onto the sources. Each op is
linear, so its tangent rule is the op itself applied to the tangent ẋ.
"""
from __future__ import annotations

import operator

import numpy as np

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops import reduction
from minidl.ops.shape import GetItemGrad, _varargs, dim_index, flatten, movedim, reshape
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("flip", "roll", "repeat", "repeat_interleave", "tril", "triu", "diagonal", "diag", "unfold")


def _dims(op, x, dims):
    """An int or a sequence of ints as a tuple of distinct non-negative dims."""
    dims = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    found = tuple(dim_index(op, x, d) for d in dims)
    if len(set(found)) != len(found):
        raise ValueError(f"{op}: dims {dims} name a dim twice (tensor of shape {x.shape})")
    return found


# ---------------------------------------------------------------- flip, roll
class Flip(Function):
    """y = x with its elements in reverse order along ``dims``;  dx = dy flipped along the same dims."""
    saved_inputs = ()

    def __init__(self, dims):
        self.dims = dims

    def forward(self, x):
        return xp_of(x).flip(x, self.dims) if self.dims else x.copy()  # a view with negative strides

    def backward(self, gy):
        return Flip(self.dims)(gy)

    def jvp(self, dx):
        """ẏ = ẋ flipped alike."""
        return Flip(self.dims)(dx)


def flip(x: Tensor, *args, dims=None) -> Tensor:
    """Reverse the order of elements along dims: ``flip(x, 0)``, ``flip(x, 0, 1)``, ``flip(x, dims=(0, 1))``."""
    if (dims is None) == (not args):
        raise TypeError(f"flip: name the dims once, as flip(x, 0, 1) or flip(x, dims=(0, 1)); got {args} and "
                        f"dims={dims}")
    dims = _varargs(args) if dims is None else dims
    return Flip(_dims("flip", x, dims) if x.ndim else ())(x)


class Roll(Function):
    """y[(i + s) % n] = x[i] along each of ``dims`` (x shifted cyclically by s);  dx = dy rolled back by −s.

    With ``dims`` None the tensor is rolled as if flattened, then given its
    shape back (PyTorch's and NumPy's rule).
    """
    saved_inputs = ()

    def __init__(self, shifts, dims):
        self.shifts, self.dims = shifts, dims

    def forward(self, x):
        return xp_of(x).roll(x, self.shifts, axis=self.dims)

    def backward(self, gy):
        negated = -self.shifts if self.dims is None else tuple(-s for s in self.shifts)
        return Roll(negated, self.dims)(gy)

    def jvp(self, dx):
        """ẏ = ẋ rolled by s."""
        return Roll(self.shifts, self.dims)(dx)


def roll(x: Tensor, shifts, dims=None) -> Tensor:
    """Shift elements cyclically: ``roll(x, 1)`` (flattened), ``roll(x, (1, -2), (0, 1))``; as torch.roll."""
    many = isinstance(shifts, (tuple, list))
    shift_list = tuple(operator.index(s) for s in (shifts if many else (shifts,)))
    if dims is None:
        if len(shift_list) != 1:
            raise ValueError(f"roll: without dims, shifts must be one int (the flattened tensor is rolled), "
                             f"got {shifts}")
        return Roll(shift_list[0], None)(x)
    dim_list = tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)
    if len(dim_list) != len(shift_list):
        raise ValueError(f"roll: shifts {shifts} and dims {dims} must have the same length")
    dim_list = tuple(dim_index("roll", x, d) for d in dim_list)
    return Roll(shift_list, dim_list)(x)


# ---------------------------------------------------------------- repeat, repeat_interleave
class Repeat(Function):
    """y[i] = x[i % n] along each axis (x tiled, ``sizes`` copies along each);  dx = the sum of dy over the copies.

    As ``np.tile``: when ``sizes`` names more axes than x has, x counts as
    having leading axes of size 1. The backward views dy of shape
    (r₁·n₁, r₂·n₂, …) as (r₁, n₁, r₂, n₂, …) and sums over the r axes.
    """
    saved_inputs = ()

    def __init__(self, sizes):
        self.sizes = sizes

    def forward(self, x):
        self.in_shape = x.shape
        return xp_of(x).tile(x, self.sizes)

    def backward(self, gy):
        shape = (1,) * (len(self.sizes) - len(self.in_shape)) + self.in_shape
        pairs = tuple(n for r, size in zip(self.sizes, shape) for n in (r, size))
        summed = reduction.sum(reshape(gy, pairs), tuple(range(0, len(pairs), 2)))
        return reshape(summed, self.in_shape)

    def jvp(self, dx):
        """ẏ = ẋ tiled alike."""
        return Repeat(self.sizes)(dx)


def repeat(x: Tensor, *sizes) -> Tensor:
    """PyTorch's ``Tensor.repeat``: tile x, ``sizes[k]`` copies along dim k (NumPy's ``np.tile``).

    ``x.repeat(2, 3)`` or ``x.repeat((2, 3))``; ``sizes`` names at least as many
    dims as x has, and extra ones are added in front. NumPy's ``np.repeat``,
    which repeats each element in place, is :func:`repeat_interleave`.
    """
    sizes = tuple(operator.index(n) for n in _varargs(sizes))
    if len(sizes) < x.ndim or any(n < 0 for n in sizes):
        raise ValueError(f"repeat: sizes {sizes} must be non-negative and name at least as many dims as the "
                         f"tensor's shape {x.shape}")
    return Repeat(sizes)(x)


class RepeatInterleave(Function):
    """y = x with element i along ``axis`` repeated r_i times in place;
    dx_i = the sum of dy over the r_i copies of x_i.

    With one count r for every element, the backward views dy's axis of size
    n·r as (n, r) and sums over r. With a count per element, y = x[index]
    with ``index`` = (0, …, 0, 1, …, 1, …), and dx is the scatter-add of dy
    onto ``index`` (the backward of indexing).
    """
    saved_inputs = ()

    def __init__(self, axis, repeats):
        self.axis, self.repeats = axis, repeats

    def forward(self, x):
        self.in_shape = x.shape
        return xp_of(x).repeat(x, self.repeats, axis=self.axis)

    def backward(self, gy):
        shape, axis = self.in_shape, self.axis
        if isinstance(self.repeats, int):
            return reduction.sum(reshape(gy, shape[:axis] + (shape[axis], self.repeats) + shape[axis + 1:]), axis + 1)
        index = gy.xp.asarray(np.repeat(np.arange(shape[axis]), self.repeats))
        return GetItemGrad((slice(None),) * axis + (index,), shape)(gy)

    def jvp(self, dx):
        """ẏ = ẋ repeated alike."""
        return RepeatInterleave(self.axis, self.repeats)(dx)


def repeat_interleave(x: Tensor, repeats, dim: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``dim`` (all elements, flattened, when dim is None).

    ``repeats`` is an int, or one count per element (a sequence or an integer
    tensor; one count applies to all). This is NumPy's ``np.repeat``.
    """
    if dim is None:
        x, dim = flatten(x), 0
    d = dim_index("repeat_interleave", x, dim)
    n = x.shape[d] if x.ndim else 1
    if isinstance(repeats, Tensor):
        repeats = repeats.numpy()
    counts = np.asarray(repeats)
    if counts.dtype.kind not in "iub" or counts.ndim > 1 or (counts.ndim == 1 and counts.size not in (1, n)):
        raise ValueError(f"repeat_interleave: repeats must be an int or {n} integer counts (one per element "
                         f"along dim {dim} of a tensor of shape {x.shape}), got {repeats!r}")
    if (counts < 0).any():
        raise ValueError(f"repeat_interleave: repeats must be non-negative, got {repeats!r}")
    if counts.ndim == 0 or counts.size == 1:
        return RepeatInterleave(d, int(counts.reshape(-1)[0]))(x)
    return RepeatInterleave(d, tuple(int(c) for c in counts))(x)


# ---------------------------------------------------------------- tril, triu, diagonal
def _triangle(op, x, diagonal, lower):
    if x.ndim < 2:
        raise ValueError(f"{op}: needs a tensor with at least 2 dims (a matrix or a batch of them), "
                         f"got shape {x.shape}")
    return Triangle(lower, operator.index(diagonal))(x)


class Triangle(Function):
    """y = x on one side of a diagonal of the last two axes, 0 on the other;  dx = dy with the same zeros.

    tril keeps x[i, j] where j − i ≤ ``diagonal``, triu where j − i ≥ ``diagonal``
    (0 is the main diagonal, positive ones lie above it).
    """
    saved_inputs = ()

    def __init__(self, lower, diagonal):
        self.lower, self.diagonal = lower, diagonal

    def forward(self, x):
        xp = xp_of(x)
        rows, cols = x.shape[-2:]
        below = xp.tri(rows, cols, self.diagonal if self.lower else self.diagonal - 1, dtype=bool)
        keep = below if self.lower else ~below
        return xp.where(keep, x, xp.zeros((), x.dtype))

    def backward(self, gy):
        return Triangle(self.lower, self.diagonal)(gy)

    def jvp(self, dx):
        """ẏ = ẋ with the same zeros."""
        return Triangle(self.lower, self.diagonal)(dx)


def tril(x: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of (each matrix in) x: entries on and below the ``diagonal``-th diagonal, 0 above."""
    return _triangle("tril", x, diagonal, lower=True)


def triu(x: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of (each matrix in) x: entries on and above the ``diagonal``-th diagonal, 0 below."""
    return _triangle("triu", x, diagonal, lower=False)


class Diagonal(Function):
    """y[…, k] = x[…, i + k, …, j + k, …] along ``dim1`` and ``dim2``, i = max(−offset, 0), j = max(offset, 0);
    dx = dy put back on that diagonal, 0 elsewhere.

    The two dims are removed and the diagonal becomes the last axis, as in
    PyTorch and NumPy. The backward is the scatter of dy (its diagonal axis
    moved to where indexing x by the two index arrays puts it) into zeros.
    """
    saved_inputs = ()

    def __init__(self, offset, dim1, dim2):
        self.offset, self.dim1, self.dim2 = offset, dim1, dim2

    def forward(self, x):
        self.in_shape = x.shape
        return xp_of(x).diagonal(x, self.offset, self.dim1, self.dim2).copy()  # NumPy's view is read-only

    def backward(self, gy):
        length = gy.shape[-1]
        key = [slice(None)] * len(self.in_shape)
        key[self.dim1] = gy.xp.arange(length) + max(-self.offset, 0)
        key[self.dim2] = gy.xp.arange(length) + max(self.offset, 0)
        # NumPy puts the indexed axis where the two index arrays stood if they are neighbours, else first
        place = min(self.dim1, self.dim2) if abs(self.dim1 - self.dim2) == 1 else 0
        return GetItemGrad(tuple(key), self.in_shape)(movedim(gy, -1, place))

    def jvp(self, dx):
        """ẏ = the same diagonal of ẋ."""
        return Diagonal(self.offset, self.dim1, self.dim2)(dx)


def diagonal(x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The ``offset``-th diagonal of the matrices spanned by ``dim1`` and ``dim2``, as a new last axis."""
    d1, d2 = dim_index("diagonal", x, dim1), dim_index("diagonal", x, dim2)
    if x.ndim < 2 or d1 == d2:
        raise ValueError(f"diagonal: dim1 {dim1} and dim2 {dim2} must be two different dims of the tensor "
                         f"(shape {x.shape})")
    return Diagonal(operator.index(offset), d1, d2)(x)


def diag(x: Tensor, diagonal: int = 0) -> Tensor:  # noqa: A002 - PyTorch's name
    """PyTorch's ``diag``: a vector v put on a diagonal of a square matrix, or a matrix's diagonal as a vector.

    - 1-D v of n values: the (n + |k|) × (n + |k|) matrix Y, zero but for Y[i, i + k] = v_i
      (k = ``diagonal``; above the main diagonal for k > 0, below for k < 0);
      dv_i = dY[i, i + k]. Y is dv's placement into zeros: indexing's gradient op
      (:class:`GetItemGrad`), whose backward is the indexing again.
    - 2-D x: its k-th diagonal, :func:`diagonal` ``(x, k)``.
    """
    k = operator.index(diagonal)
    if x.ndim == 2:
        return Diagonal(k, 0, 1)(x)
    if x.ndim != 1:
        raise ValueError(f"diag: expects a vector (1-D: makes a matrix) or a matrix (2-D: takes its diagonal), "
                         f"got shape {x.shape}; for batches use diagonal(x, offset, dim1, dim2) or diag_embed")
    n = x.shape[0]
    rows, columns = x.xp.arange(n) + max(-k, 0), x.xp.arange(n) + max(k, 0)
    return GetItemGrad((rows, columns), (n + abs(k), n + abs(k)))(x)


# ---------------------------------------------------------------- unfold
class Unfold(Function):
    """y[…, w, …, k] = x[…, w·step + k, …] along ``axis``: windows of ``size`` elements, ``step`` apart;
    dx = the sum of dy over every window holding x.

    Windows w = 0 … (n − size) // step replace the axis, and the positions k
    inside a window become a new last axis. The forward is a strided view of
    x, no copy; the backward moves k next to w and scatter-adds dy onto the
    window index w·step + k (the backward of indexing), so overlapping windows add.
    """
    saved_inputs = ()

    def __init__(self, axis, size, step):
        self.axis, self.size, self.step = axis, size, step

    def forward(self, x):
        self.in_shape = x.shape
        axis, n = self.axis, x.shape[self.axis]
        windows = (n - self.size) // self.step + 1
        shape = x.shape[:axis] + (windows,) + x.shape[axis + 1:] + (self.size,)
        strides = x.strides[:axis] + (x.strides[axis] * self.step,) + x.strides[axis + 1:] + (x.strides[axis],)
        return xp_of(x).lib.stride_tricks.as_strided(x, shape=shape, strides=strides)

    def backward(self, gy):
        windows = gy.shape[self.axis]
        index = gy.xp.arange(windows).reshape(-1, 1) * self.step + gy.xp.arange(self.size)
        key = (slice(None),) * self.axis + (index,)
        return GetItemGrad(key, self.in_shape)(movedim(gy, -1, self.axis + 1))

    def jvp(self, dx):
        """ẏ = the same windows of ẋ."""
        return Unfold(self.axis, self.size, self.step)(dx)


def unfold(x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """PyTorch's ``Tensor.unfold``: the windows of ``size`` elements, ``step`` apart, along ``dimension``.

    (2, 7) with ``unfold(1, 3, 2)`` gives (2, 3, 3): three windows of three.
    Not ``F.unfold`` of PyTorch, which is im2col (see :func:`minidl.ops.conv.im2col`).
    """
    if x.ndim == 0:
        raise ValueError("unfold: a 0-d tensor has no dimension to unfold; reshape it to (1,) first")
    d = dim_index("unfold", x, dimension)
    size, step = operator.index(size), operator.index(step)
    if step <= 0 or not 0 <= size <= x.shape[d]:
        raise ValueError(f"unfold: size {size} must be from 0 to the size {x.shape[d]} of dim {dimension}, "
                         f"and step {step} positive (tensor of shape {x.shape})")
    return Unfold(d, size, step)(x)
