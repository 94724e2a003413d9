"""Shape ops: reshape, transpose, broadcasting, indexing, joining, splitting, padding.

None of these change values, so each backward only moves the gradient back
to where the value came from: undo the reshape, apply the inverse
permutation, sum over the broadcast axes, scatter into the indexed places,
join the split pieces. The PyTorch names that are one of these ops with other
arguments (flatten, unflatten, squeeze and unsqueeze are reshapes; permute
and movedim transposes; expand a broadcast; narrow an indexing; cat a
concatenation) are defined here too.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from minidl import backend
from minidl.autograd import Function
from minidl.backend import scatter_add, xp_of
from minidl.tensor import Tensor, as_tensor, index_key

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("reshape", "transpose", "t", "broadcast_to", "sum_to", "flatten", "unflatten", "squeeze", "unsqueeze",
                  "permute", "movedim", "expand", "split", "chunk", "narrow", "contiguous", "view_as", "reshape_as",
                  "expand_as")


def filled_tangents(dxs, inputs) -> tuple:
    """The tangents of a jvp with each None (a zero tangent) made zeros of its input's shape and dtype.

    For the tangent rules that apply one op to all their inputs' tangents at once (a
    concatenation of tangents, a scatter of one tangent into another).
    """
    return tuple(Tensor(x.xp.zeros(x.shape, x.dtype)) if dx is None else dx for dx, x in zip(dxs, inputs))


def dim_index(op: str, x: Tensor, dim, new: int = 0) -> int:
    """``dim`` as an index from 0 to x.ndim − 1 + new (negative counts from the end), or a clear error.

    ``new`` counts dims the op adds (unsqueeze may name the place after the last).
    A 0-d tensor accepts dim 0 or -1, as PyTorch does.
    """
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{op}: dim must be an integer, got {dim!r} for a tensor of shape {x.shape}") from None
    limit = max(x.ndim + new, 1)
    if not -limit <= dim < limit:
        raise ValueError(f"{op}: dim {dim} is out of range for a tensor of shape {x.shape} ({x.ndim} "
                         f"dimensions); use a dim from {-limit} to {limit - 1}")
    return dim % limit


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

    def jvp(self, dx):
        """ẏ = ẋ viewed with the new shape.

        Every op of this module is linear in its inputs, so each tangent rule is the op itself
        applied to the tangents (ẋ is the tangent of x: the change of x along a direction).
        """
        return Reshape(self.shape)(dx)


def reshape(x: Tensor, *shape) -> Tensor:
    """NumPy's reshape; accepts ``reshape(x, 2, 3)`` or ``reshape(x, (2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if x.shape == shape:
        return x
    return Reshape(shape)(x)


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """PyTorch's flatten: dims start_dim..end_dim merged into one, all of them by default.

    A (2, 3, 4) tensor becomes (24,); ``flatten(x, 1)`` keeps the batch axis,
    (2, 12), as ``nn.Flatten()`` does. A 0-d tensor becomes (1,).
    """
    if x.ndim == 0:
        return reshape(x, 1)
    start, end = dim_index("flatten", x, start_dim), dim_index("flatten", x, end_dim)
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} "
                         f"for a tensor of shape {x.shape}")
    return reshape(x, x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:])


def unflatten(x: Tensor, dim: int, sizes) -> Tensor:
    """Split dim ``dim`` into ``sizes`` (one of them may be -1): the inverse of flatten."""
    d = dim_index("unflatten", x, dim)
    sizes = tuple(operator.index(n) for n in sizes)
    n = x.shape[d]
    known = math.prod(k for k in sizes if k != -1)
    unknown = sizes.count(-1)
    fits = (known > 0 and n % known == 0) if unknown else known == n
    if not sizes or unknown > 1 or any(k < -1 for k in sizes) or not fits:
        raise ValueError(f"unflatten: sizes {sizes} do not split dim {dim} of size {n} (tensor of shape "
                         f"{x.shape}); their product must be {n}, with at most one -1 standing for the rest")
    sizes = tuple(n // known if k == -1 else k for k in sizes)
    return reshape(x, x.shape[:d] + sizes + x.shape[d + 1:])


def squeeze(x: Tensor, dim=None) -> Tensor:
    """Remove dims of size 1: all of them (dim=None), or those of ``dim`` (an int or a tuple) that have size 1.

    As in PyTorch, a named dim whose size is not 1 is left alone, not an error.
    """
    if dim is None:
        dims = range(x.ndim)
    else:
        dims = {dim_index("squeeze", x, d) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
    drop = {d for d in dims if d < x.ndim and x.shape[d] == 1}
    return reshape(x, tuple(n for i, n in enumerate(x.shape) if i not in drop))


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """Insert a dim of size 1 at place ``dim`` (from −(ndim + 1) to ndim)."""
    d = dim_index("unsqueeze", x, dim, new=1)
    return reshape(x, x.shape[:d] + (1,) + x.shape[d:])


def _bad_axes(x, axes, why, op="transpose"):
    ndim = x.ndim
    example = tuple(reversed(range(ndim)))
    hint = ", or two axes to swap" if op == "transpose" else ""
    return ValueError(f"{op}: axes {axes} {why} for a tensor of shape {x.shape} ({ndim} dimensions); "
                      f"pass a permutation of its {ndim} axes, e.g. {example}, each from {-ndim} to {ndim - 1}"
                      + hint)


def _axis_index(x, axes, axis, op="transpose"):
    try:
        return operator.index(axis)
    except TypeError:
        raise TypeError(f"{op}: axes must be integers, got {axes} for a tensor of shape {x.shape}") from None


def _permutation(x, given, op):
    """``given`` as a permutation of x's axes made non-negative, or a clear error."""
    ndim = x.ndim
    axes = tuple(_axis_index(x, given, a, op) for a in given)
    if len(axes) != ndim:
        raise _bad_axes(x, given, f"name {len(axes)} axis" if len(axes) == 1 else f"name {len(axes)} axes", op)
    if any(not -ndim <= a < ndim for a in axes):
        raise _bad_axes(x, given, "are out of range", op)
    axes = tuple(a % ndim for a in axes)
    if len(set(axes)) != ndim:
        raise _bad_axes(x, given, "repeat an axis", op)
    return axes


def _varargs(values):
    """``f(x, 2, 3)`` and ``f(x, (2, 3))`` both as the tuple (2, 3)."""
    if len(values) == 1 and isinstance(values[0], (tuple, list)):
        return tuple(values[0])
    return tuple(values)


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

    def jvp(self, dx):
        """ẏ = ẋ permuted alike."""
        return Transpose(self.axes)(dx)


def transpose(x: Tensor, *axes, dim0: int | None = None, dim1: int | None = None) -> Tensor:
    """Two dims swap them, as PyTorch's ``transpose(dim0, dim1)``; other forms are NumPy's.

    ``transpose(x, 0, 2)`` (or ``dim0=0, dim1=2``) swaps those two axes; on a
    matrix ``transpose(0, 1)`` is its transpose. NumPy's forms stay: no axes
    reverses them, and a tuple, or three or more ints, is a permutation, so the
    tuple ``transpose((0, 1))`` is NumPy's identity permutation (PyTorch has no
    such form; its ``permute`` is :func:`permute` here). Negative axes count
    from the end. Axes that are not a permutation (wrong count, a repeat, out
    of range) raise ValueError.
    """
    if dim0 is not None or dim1 is not None:
        if axes or dim0 is None or dim1 is None:
            raise TypeError(f"transpose: pass two dims, either as transpose(dim0, dim1) or with both keywords, "
                            f"got axes {axes} and dim0={dim0}, dim1={dim1}")
        axes = (dim0, dim1)
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
    return Transpose(_permutation(x, given, "transpose"))(x)


def permute(x: Tensor, *args, dims=None) -> Tensor:
    """PyTorch's permute: y.shape[i] = x.shape[dims[i]]; ``permute(x, 2, 0, 1)`` or ``permute(x, dims=(2, 0, 1))``."""
    if dims is not None and args:
        raise TypeError(f"permute: name the dims once, as permute(x, 2, 0, 1) or permute(x, dims=(2, 0, 1)); "
                        f"got {args} and dims={dims}")
    return Transpose(_permutation(x, _varargs(args) if dims is None else tuple(dims), "permute"))(x)


def movedim(x: Tensor, source, destination) -> Tensor:
    """Move dims ``source`` to places ``destination`` (ints or sequences); the others keep their order."""
    many = isinstance(source, (tuple, list))
    sources = tuple(source) if many else (source,)
    destinations = tuple(destination) if isinstance(destination, (tuple, list)) else (destination,)
    if len(sources) != len(destinations):
        raise ValueError(f"movedim: source {source} and destination {destination} must name as many dims")
    sources = tuple(dim_index("movedim", x, d) for d in sources)
    destinations = tuple(dim_index("movedim", x, d) for d in destinations)
    for named, what in ((sources, source), (destinations, destination)):
        if len(set(named)) != len(named):
            raise ValueError(f"movedim: {what} repeats a dim (tensor of shape {x.shape})")
    order = [d for d in range(x.ndim) if d not in sources]
    for place, d in sorted(zip(destinations, sources)):
        order.insert(place, d)
    if order == list(range(x.ndim)):
        return x
    return Transpose(tuple(order))(x)


def t(x: Tensor) -> Tensor:
    """The transpose of a matrix; a vector or a scalar as it is (``torch.t``, ``Tensor.t``)."""
    if x.ndim > 2:
        raise ValueError(f"t(): expects a tensor with at most 2 dimensions, got shape {x.shape}; "
                         "use x.mT for the last two axes or transpose(...) for others")
    return transpose(x) if x.ndim == 2 else x


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

    def jvp(self, dx):
        """ẏ = ẋ broadcast alike."""
        return BroadcastTo(self.shape)(dx)


def broadcast_to(x: Tensor, shape) -> Tensor:
    if x.shape == tuple(shape):
        return x
    return BroadcastTo(shape)(x)


def expand(x: Tensor, *sizes) -> Tensor:
    """PyTorch's expand: broadcast_to, where -1 keeps a dim's size; new dims may be added in front.

    ``expand(x, 3, -1)`` or ``expand(x, (3, -1))``; only dims of size 1 grow.
    """
    sizes = tuple(operator.index(n) for n in _varargs(sizes))
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: sizes {sizes} name fewer dims than the tensor's shape {x.shape}")
    target = list(sizes)
    for i, n in enumerate(sizes):
        old = x.shape[i - lead] if i >= lead else None
        if n == -1 and old is not None:
            target[i] = old
        elif n < 0 or (old is not None and old != 1 and old != n):
            raise ValueError(f"expand: cannot expand a tensor of shape {x.shape} to {sizes}: each size must "
                             f"equal the tensor's, or the tensor's must be 1 (or -1 keeps it; new leading "
                             f"dims need sizes ≥ 0), but dim {i} asks {n}")
    return broadcast_to(x, tuple(target))


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
        y = backend.sum(x, axes, keepdims=True)
        return y.reshape(self.shape) if lead else y

    def backward(self, gy):
        return broadcast_to(gy, self.in_shape)

    def jvp(self, dx):
        """ẏ = ẋ summed alike."""
        return SumTo(self.shape)(dx)


def sum_to(x: Tensor, shape) -> Tensor:
    """Sum ``x`` down to ``shape`` (the inverse of broadcasting); no-op when equal."""
    if x.shape == tuple(shape):
        return x
    return SumTo(shape)(x)


def _has_integer_array(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(hasattr(k, "dtype") and k.dtype.kind in "iu" for k in keys)


def index_places(key, index_tensors):
    """``(template, places, inputs, version_only)``: ``key`` with each index Tensor's array taken out.

    An index array that came from a Tensor of the call (an embedding's token ids) is an input of
    the op, not part of its constructor's key, so that a traced step (:mod:`minidl.tracing`) reads
    each call's: ``template`` has None at those ``places`` (-1: the whole key), ``inputs`` are those
    Tensors in order. ``version_only`` are the index Tensors whose arrays are not in the key (as
    given: a key derived from them), kept only for the in-place check.
    """
    by_array = {id(t.array): t for t in index_tensors}
    if not isinstance(key, tuple):
        t = by_array.get(id(key))
        if t is None:
            return key, (), (), tuple(index_tensors)
        return None, (-1,), (t,), ()
    template, places, inputs = list(key), [], []
    for i, k in enumerate(key):
        t = by_array.get(id(k))
        if t is not None:
            template[i] = None
            places.append(i)
            inputs.append(t)
    used = {id(t) for t in inputs}
    return tuple(template), tuple(places), tuple(inputs), tuple(t for t in index_tensors if id(t) not in used)


def _filled(template, places, arrays):
    """The key with each call's index arrays put back at their places (see :func:`index_places`)."""
    if not places:
        return template
    if places == (-1,):
        return arrays[0]
    key = list(template)
    for i, array in zip(places, arrays):
        key[i] = array
    return tuple(key)


class GetItem(Function):
    """y = x[key] (slices, integers, integer arrays, boolean masks);  dx = dy scattered into zeros.

    ``select`` (None, or a basic key applied first) gives PyTorch's order of indexing
    (see :func:`minidl.tensor.index_key`). The key's index Tensors are inputs after x, put
    back into ``key`` at ``places`` (see :func:`index_places`); they get no gradient.
    ``index_tensors``: Tensors the key was derived from, whose versions backward checks.
    """
    saved_inputs = ()  # set per call: backward reads the index inputs, never x
    saved_arrays = ("key",)  # a constant index array of the key (one given as an array, not a Tensor)

    def __init__(self, key, select=None, places=(), index_tensors=()):
        self.key, self.select, self.places, self.saved_indices = key, select, places, index_tensors
        if places:
            self.saved_inputs = tuple(range(1, len(places) + 1))

    def forward(self, x, *indices):
        self.in_shape = x.shape
        if self.select is not None:
            x = x[self.select]
        key = _filled(self.key, self.places, indices)
        if type(key) is np.ndarray and key.dtype.kind in "iu" and x.ndim:
            return np.take(x, key, axis=0)  # rows by one index array (an embedding): 3× NumPy's x[key]
        return x[key]

    def backward(self, gy):
        grad = GetItemGrad(self.key, self.in_shape, self.select, self.places, self.saved_indices)
        return (grad(gy, *self.inputs[1:]),) + (None,) * len(self.places)

    def jvp(self, dx, *dindices):
        """ẏ = ẋ[key]."""
        return GetItem(self.key, self.select, self.places, self.saved_indices)(dx, *self.inputs[1:])


class GetItemGrad(Function):
    """y = zeros(shape) with dy added at x[key] (repeated indices add up);  dx = dy[key].
    The key's index Tensors, if any, are inputs after dy (see :class:`GetItem`)."""
    saved_inputs = ()
    saved_arrays = ("key",)

    def __init__(self, key, shape, select=None, places=(), index_tensors=()):
        self.key, self.shape, self.select, self.places = key, shape, select, places
        self.saved_indices = index_tensors
        if places:
            self.saved_inputs = tuple(range(1, len(places) + 1))

    def forward(self, gy, *indices):
        xp = xp_of(gy)
        gx = xp.zeros(self.shape, gy.dtype)
        target = gx if self.select is None else gx[self.select]  # a view of gx
        key = _filled(self.key, self.places, indices)
        if _has_integer_array(key):
            scatter_add(target, key, gy)  # an index may repeat: add, do not overwrite
        else:
            target[key] = gy
        return gx

    def backward(self, ggx):
        gather = GetItem(self.key, self.select, self.places, self.saved_indices)
        return (gather(ggx, *self.inputs[1:]),) + (None,) * len(self.places)

    def jvp(self, dgy, *dindices):
        """ẏ = zeros(shape) with ḋy (the tangent of dy) added at x[key]."""
        scatter = GetItemGrad(self.key, self.shape, self.select, self.places, self.saved_indices)
        return scatter(dgy, *self.inputs[1:])


def getitem(x: Tensor, key) -> Tensor:
    """``x[key]`` with PyTorch's rules (integers index before index arrays: see ``index_key``)."""
    key, select, index_tensors = index_key(key)
    template, places, inputs, version_only = index_places(key, index_tensors)
    return GetItem(template, select, places, version_only)(x, *inputs)


class Contiguous(Function):
    """y = x laid out in row-major order (a copy, unless x already is);  dx = dy."""
    saved_inputs = ()

    def forward(self, x):
        return xp_of(x).ascontiguousarray(x)

    def backward(self, gy):
        return gy

    def jvp(self, dx):
        """ẏ = ẋ (row-major)."""
        return Contiguous()(dx)


def contiguous(x: Tensor) -> Tensor:
    """``x`` itself when its elements lie in row-major order, else a row-major copy (PyTorch's ``contiguous``)."""
    return x if x.array.flags.c_contiguous else Contiguous()(x)


def view_as(x: Tensor, other: Tensor) -> Tensor:
    """``x`` reshaped to ``other``'s shape."""
    return reshape(x, other.shape)


def reshape_as(x: Tensor, other: Tensor) -> Tensor:
    return reshape(x, other.shape)


def expand_as(x: Tensor, other: Tensor) -> Tensor:
    """``x`` broadcast to ``other``'s shape (a read-only view)."""
    return broadcast_to(x, other.shape)


class Concatenate(Function):
    """y = [x1, x2, ...] joined along ``axis``;  dx_i = the slice of dy that x_i filled (a split of dy)."""
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
        return Split(self.axis % gy.ndim, self.sizes)(gy)

    def jvp(self, *dxs):
        """ẏ = [ẋ1, ẋ2, ...] joined alike (a zero tangent as zeros)."""
        return Concatenate(self.axis)(*filled_tangents(dxs, self.inputs))


def concatenate(tensors, axis: int = 0, dim: int | None = None) -> Tensor:
    """Join tensors along an existing axis (``dim`` is PyTorch's name for it)."""
    axis = axis if dim is None else dim
    return Concatenate(axis)(*[as_tensor(t) for t in tensors])


def cat(tensors, dim: int = 0, *, axis: int | None = None) -> Tensor:
    """PyTorch's name for :func:`concatenate`: join tensors along an existing dim."""
    return concatenate(tensors, dim=dim if axis is None else axis)


class Split(Function):
    """y_1, y_2, ... = consecutive pieces of x along ``axis``, of the given sizes;
    dx = [dy_1, dy_2, ...] joined along axis.

    Each piece is a view of x. An output that the loss does not use gets a zero
    gradient from the engine, so dx always has x's shape.
    """
    saved_inputs = ()

    def __init__(self, axis, sizes):
        self.axis, self.sizes = axis, tuple(sizes)

    def forward(self, x):
        lead = (slice(None),) * self.axis
        bounds = np.cumsum((0,) + self.sizes).tolist()
        return tuple(x[lead + (slice(a, b),)] for a, b in zip(bounds[:-1], bounds[1:]))

    def backward(self, *gys):
        return concatenate(gys, axis=self.axis)

    def jvp(self, dx):
        """ẏ_1, ẏ_2, ... = the same pieces of ẋ."""
        return Split(self.axis, self.sizes)(dx)


def split(x: Tensor, split_size_or_sections, dim: int = 0) -> tuple:
    """PyTorch's split: pieces of ``split_size`` along ``dim`` (the last one smaller), or of the listed sizes.

    Returns a tuple of Tensors (views of x).
    """
    if x.ndim == 0:
        raise ValueError("split: a 0-d tensor has no dim to split")
    d = dim_index("split", x, dim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, (tuple, list)):
        sizes = tuple(operator.index(k) for k in split_size_or_sections)
        if any(k < 0 for k in sizes) or sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} must be non-negative and add up to {n}, the size of dim "
                             f"{dim} of a tensor of shape {x.shape}")
    else:
        size = operator.index(split_size_or_sections)
        if size < 0 or (size == 0 and n > 0):
            raise ValueError(f"split: split_size must be positive (0 only for an empty dim), got {size} for "
                             f"dim {dim} of a tensor of shape {x.shape}")
        sizes = (size,) * (n // size) + ((n % size,) if n % size else ()) if n else (0,)  # empty: one piece
    return Split(d, sizes)(x)


def chunk(x: Tensor, chunks: int, dim: int = 0) -> tuple:
    """PyTorch's chunk: split into pieces of ⌈n / chunks⌉ along ``dim``; there may be fewer than ``chunks``."""
    chunks = operator.index(chunks)
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    d = dim_index("chunk", x, dim)
    n = x.shape[d] if x.ndim else 1
    if n == 0:  # PyTorch gives ``chunks`` empty pieces
        return split(x, [0] * chunks, d)
    return split(x, -(-n // chunks), d)


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    """x[..., start:start + length, ...] along ``dim`` (a view); a negative ``start`` counts from the end."""
    d = dim_index("narrow", x, dim)
    n = x.shape[d]
    start, length = operator.index(start), operator.index(length)
    begin = start + n if start < 0 else start
    if not 0 <= begin <= n or length < 0 or begin + length > n:
        raise ValueError(f"narrow: start {start} and length {length} do not fit in dim {dim} of size {n} "
                         f"(tensor of shape {x.shape}); need -{n} ≤ start ≤ {n}, length ≥ 0, and start + "
                         "length ≤ size")
    return getitem(x, (slice(None),) * d + (slice(begin, begin + length),))


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

    def jvp(self, *dxs):
        """ẏ = the tangents stacked alike (a zero tangent as zeros)."""
        return Stack(self.axis)(*filled_tangents(dxs, self.inputs))


def stack(tensors, axis: int = 0, dim: int | None = None) -> Tensor:
    axis = axis if dim is None else dim
    return Stack(axis)(*[as_tensor(t) for t in tensors])


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_pairs(x, widths, mode):
    """PyTorch's flat ``pad`` tuple as (before, after) pairs for the last dims, last dim first."""
    if not isinstance(widths, (tuple, list)) or not all(isinstance(w, (int, np.integer)) for w in widths):
        raise TypeError(f"pad: pad must be a flat tuple of ints, as PyTorch's (left, right) for the last dim, then "
                        f"(top, bottom) for the dim before, ...; got {widths!r}. NumPy's per-axis "
                        "((before, after), ...) is not accepted: reverse the axes and flatten it")
    if len(widths) % 2:
        raise ValueError(f"pad: pad must hold a (before, after) pair per padded dim, got {len(widths)} numbers")
    pairs = [(int(widths[i]), int(widths[i + 1])) for i in range(0, len(widths), 2)]
    if len(pairs) > x.ndim:
        raise ValueError(f"pad: pad {tuple(widths)} names {len(pairs)} dims, but the tensor of shape {x.shape} "
                         f"has {x.ndim}")
    if mode != "constant" and not (1 <= len(pairs) <= 3 and x.ndim in (len(pairs) + 1, len(pairs) + 2)):
        raise ValueError(f"pad: mode '{mode}' pads the last 1, 2 or 3 dims of an input with one or two more "
                         f"dims (batch, channels); pad {tuple(widths)} pads {len(pairs)}, so the input needs "
                         f"{len(pairs) + 1} or {len(pairs) + 2} dims, got shape {x.shape}")
    return pairs[::-1]  # now first to last axis


def _source_index(n, before, after, mode):
    """Where each place of an axis of size n, padded by (before, after), copies its value from."""
    p = np.arange(-before, n + after)
    if mode == "reflect":
        p = np.abs(p)
        return np.where(p > n - 1, 2 * (n - 1) - p, p)
    if mode == "replicate":
        return np.clip(p, 0, n - 1)
    return p % n


class Pad(Function):
    """y = x with borders, a constant or copies of x's own values;
    dx = the interior of dy (constant mode), or dy added back onto the sources.

    ``widths`` holds one (before, after) pair of widths per axis, non-negative but in reflect and
    replicate modes, where a negative width crops (p then starts or ends inside x).
    Mode ``constant`` fills the borders with ``value``. The copying modes take
    y = x[s], with ``key`` holding the source index s(p) of every place p of a
    padded axis of size n (p from −before to n + after − 1):

        reflect:    s(p) = |p| mirrored at n − 1, so … 2 1 | 0 1 2 | 1 0 …
        replicate:  s(p) = min(max(p, 0), n − 1)
        circular:   s(p) = p % n

    A value copied to several places collects the gradient of each: dx is the
    scatter-add of dy onto s, the backward of indexing (whose own backward is
    the indexing again).
    """
    saved_inputs = ()

    def __init__(self, widths, mode, value, key=None):
        self.widths, self.mode, self.value, self.key = widths, mode, value, key

    def forward(self, x):
        self.in_shape = x.shape
        if self.mode == "constant":
            return xp_of(x).pad(x, self.widths, mode="constant", constant_values=self.value)
        return x[self.key]

    def backward(self, gy):
        if self.mode == "constant":
            return gy[tuple(slice(before, n - after) for n, (before, after) in zip(gy.shape, self.widths))]
        return GetItemGrad(self.key, self.in_shape)(gy)

    def jvp(self, dx):
        """ẏ = ẋ padded alike, with zero borders in constant mode (the fill value is a constant)."""
        return Pad(self.widths, self.mode, 0 if self.mode == "constant" else None, self.key)(dx)


def pad(x: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:
    """PyTorch's ``F.pad``: ``pad`` = (left, right) of the last dim, then (top, bottom) of the dim before, …

    ``F.pad(x, (1, 1))`` pads only the last dim, by one on each side;
    ``F.pad(x, (1, 1, 2, 0))`` also pads the dim before, by two at its start.
    Modes: ``constant`` (``value``, default 0), ``reflect`` (mirror without the
    edge: widths below the dim's size), ``replicate`` (repeat the edge) and
    ``circular`` (wrap around: widths at most the size); as in PyTorch, the
    copying modes pad the last 1, 2 or 3 dims of an input with one or two dims
    more. A negative width crops that side, as in PyTorch: first for ``constant``
    and ``circular`` (which wraps what is left), while ``reflect`` and ``replicate``
    still mirror (repeat) about x's own edge on the other side.
    """
    if mode not in PAD_MODES:
        raise ValueError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
    if mode != "constant" and value not in (None, 0):
        raise ValueError(f"pad: mode '{mode}' copies x's own values and takes no value, got value={value}")
    pairs = _pad_pairs(x, pad, mode)
    pairs = [(0, 0)] * (x.ndim - len(pairs)) + pairs
    if mode in ("reflect", "replicate"):
        return _pad_copying_edges(x, pairs, mode, pad)
    if any(b < 0 or a < 0 for b, a in pairs):  # crop first: the rest pads (or wraps) what is left
        key = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(x.shape, pairs))
        if any(k.stop < k.start for k in key):
            raise ValueError(f"pad: pad {tuple(pad)} crops more than a tensor of shape {x.shape} holds")
        x = getitem(x, key)
        pairs = [(max(b, 0), max(a, 0)) for b, a in pairs]
    if not any(b or a for b, a in pairs):
        return x
    if mode == "constant":
        return Pad(tuple(pairs), mode, 0 if value is None else value)(x)
    padded = [i for i, (b, a) in enumerate(pairs) if b or a]
    for i in padded:
        n, (b, a) = x.shape[i], pairs[i]
        if n == 0 or max(b, a) > n:
            raise ValueError(f"pad: mode 'circular' needs widths at most the size, but dim {i} of the (cropped) "
                             f"input of shape {x.shape} has size {n} and widths {(b, a)}")
    return _pad_by_index(x, pairs, padded, mode)


def _pad_copying_edges(x, pairs, mode, pad):
    """reflect and replicate: a place p copies x[s(p)], p counted in x's own coordinates.

    A negative width starts (or ends) the padded axis inside x, so it crops that side, and the
    other side still reflects about x's own edge, as PyTorch's reflection and replication pads do.
    """
    padded = [i for i, (b, a) in enumerate(pairs) if b or a]
    if not padded:
        return x
    for i in padded:
        n, (b, a) = x.shape[i], pairs[i]
        if n + b + a < 0:
            raise ValueError(f"pad: pad {tuple(pad)} crops away all of dim {i} of the input of shape {x.shape} "
                             f"(size {n}, widths {(b, a)})")
        if n == 0 or (mode == "reflect" and max(b, a) >= n):
            need = "widths less than the size" if mode == "reflect" else "a non-empty dim"
            raise ValueError(f"pad: mode '{mode}' needs {need}, but dim {i} of the input of shape "
                             f"{x.shape} has size {n} and widths {(b, a)}")
    return _pad_by_index(x, pairs, padded, mode)


def _pad_by_index(x, pairs, padded, mode):
    """Pad by indexing: y = x[key], key holding the source of every place of each padded axis."""
    axes = range(padded[0], padded[-1] + 1)  # index every axis between, so the index arrays stay adjacent
    xp = x.xp
    index = [xp.asarray(_source_index(x.shape[i], *pairs[i], mode)) for i in axes]
    index = [ix.reshape([-1 if j == k else 1 for k in range(len(index))]) for j, ix in enumerate(index)]
    key = (slice(None),) * padded[0] + tuple(index)
    return Pad(tuple(pairs), mode, None, key)(x)
