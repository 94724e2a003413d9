"""Indexing and sorting: gather, scatter, index_select, masked ops, sort, topk, nonzero.

Every op here moves values without changing them, so each backward moves the
gradient back to where the value came from. The pair at the heart of it:

    gather:       y[i][j] = x[i][index[i][j]]   (dim = 1)
    scatter_add:  y = x;  y[i][index[i][j]] += src[i][j]

are each other's backward: a gathered value's gradient is added back at the
place it was read from (scatter_add into zeros), and the gradient of an
added-in ``src`` is read at the place it was added (gather). Each is linear in
its inputs, so its tangent rule is the op applied to the tangents. Sorting and
top-k find their indices on the raw array (no gradient: indices are
integers) and take their values with gather, so their gradient is gather's.
Shown for dim = 1 of a 2-D tensor; every dim of every rank works alike.
"""
from __future__ import annotations

import collections
import operator

import numpy as np

from minidl.autograd import Function
from minidl.backend import scatter_add as _scatter_add_arrays
from minidl.backend import xp_of
from minidl.ops.elementwise import where
from minidl.ops.shape import broadcast_to, filled_tangents, getitem
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods (scatter: see scatter_reduce.py).
TENSOR_METHODS = ("gather", "scatter_add", "index_select", "masked_fill", "masked_select",
                  "sort", "argsort", "topk", "nonzero")

ValuesIndices = collections.namedtuple("ValuesIndices", ["values", "indices"])
ValuesIndices.__doc__ = """``(values, indices)``, as PyTorch's ``torch.return_types`` (max, min, sort, topk).

``values`` carries the gradient; ``indices`` is an int64 Tensor without one."""


def _dim(op, dim, ndim, shape):
    """``dim`` as a non-negative int; a 0-d tensor accepts 0 and -1, as in PyTorch."""
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{op}: dim must be one int, got {dim!r}") from None
    limit = max(ndim, 1)
    if not -limit <= dim < limit:
        raise ValueError(f"{op}: dim {dim} is out of range for a tensor of shape {shape} "
                         f"({ndim} dimensions); use a dim from {-limit} to {limit - 1}")
    return dim % limit


def _index(op, index, x: Tensor, name="index") -> Tensor:
    """An integer index (Tensor, array or list) as an int64 Tensor on x's device.

    An int64 Tensor on x's device is returned as it is, so the op that keeps it sees an
    in-place change to it (its version); any other index is converted, a copy that no
    later change can reach.
    """
    data = index.array if isinstance(index, Tensor) else index
    data = x.xp.asarray(data)
    if data.dtype.kind not in "iu":
        raise TypeError(f"{op}: {name} must hold integers (int64 as in PyTorch), got dtype {data.dtype}")
    if isinstance(index, Tensor) and data is index.array and data.dtype == np.int64:
        return index
    return Tensor(data.astype(np.int64, copy=False))


def _positions(index, dim):
    """The full index tuple of ``out[...][index][...]``: index along ``dim``, the place itself elsewhere."""
    xp = xp_of(index)
    key = []
    for d, n in enumerate(index.shape):
        if d == dim:
            key.append(index)
        else:
            shape = [1] * index.ndim
            shape[d] = n
            key.append(xp.arange(n).reshape(shape))
    return tuple(key)


def _checked_index(op, x, dim, index, src=None):
    """dim normalized and index checked against PyTorch's rules for gather and scatter."""
    dim = _dim(op, dim, x.ndim, x.shape)
    index_tensor = _index(op, index, x)
    index = index_tensor.array
    if index.ndim != x.ndim:
        raise ValueError(f"{op}: index of shape {index.shape} must have as many dims as the input "
                         f"of shape {x.shape}")
    if src is not None and src.ndim != x.ndim:
        raise ValueError(f"{op}: src of shape {src.shape} must have as many dims as the input of shape {x.shape}")
    for d, (n, m) in enumerate(zip(index.shape, x.shape)):
        if d != dim and n > m:
            raise ValueError(f"{op}: index of shape {index.shape} is larger than the input of shape "
                             f"{x.shape} at dim {d}; only dim {dim} may differ")
        if src is not None and n > src.shape[d]:
            raise ValueError(f"{op}: index of shape {index.shape} is larger than src of shape {src.shape} "
                             f"at dim {d}")
    if index.size and (int(index.min()) < 0 or int(index.max()) >= max(x.shape[dim] if x.ndim else 1, 1)):
        raise ValueError(f"{op}: index holds {int(index.min())}..{int(index.max())}, out of range "
                         f"for size {x.shape[dim] if x.ndim else 1} at dim {dim} (0 to size - 1)")
    return dim, index_tensor


def _source(op, x, dim, index, src, value):
    """src cut to index's shape (PyTorch reads only that window of a larger src)."""
    if (src is None) == (value is None):
        raise TypeError(f"{op}: pass exactly one of src (a Tensor) and value (a number)")
    if src is None:
        return None
    if src.shape != index.shape:
        src = getitem(src, tuple(slice(0, n) for n in index.shape))
    return src


class Gather(Function):
    """y[i][j] = x[i][index[i][j]] (dim = 1);  dx = zeros with dy added at x[i][index[i][j]] (a scatter_add).

    ``index`` has x's number of dims and is no larger than x outside ``dim``
    (PyTorch's rule): y takes index's shape.
    """
    saved_inputs = ()

    def __init__(self, dim, index: Tensor):
        self.dim, self.index, self.saved_indices = dim, index, (index,)

    def forward(self, x):
        self.in_shape = x.shape
        index = self.index.array
        window = tuple(slice(None) if d == self.dim else slice(0, n) for d, n in enumerate(index.shape))
        return xp_of(x).take_along_axis(x[window], index, axis=self.dim)

    def backward(self, gy):
        zeros = Tensor(gy.xp.zeros(self.in_shape, gy.dtype))
        return ScatterAdd(self.dim, self.index)(zeros, gy)

    def jvp(self, dx):
        """ẏ[i][j] = ẋ[i][index[i][j]]."""
        return Gather(self.dim, self.index)(dx)


def gather(x: Tensor, dim: int, index) -> Tensor:
    """PyTorch's ``gather``: ``y[i][j] = x[i][index[i][j]]`` for dim = 1; y has index's shape."""
    dim, index = _checked_index("gather", x, dim, index)
    return Gather(dim, index)(x)


class ScatterAdd(Function):
    """y = x;  y[i][index[i][j]] += s[i][j] (dim = 1; repeats add up);  dx = dy,  ds[i][j] = dy[i][index[i][j]].

    s is ``src``; its gradient ds is a gather of dy.
    """
    saved_inputs = ()

    def __init__(self, dim, index: Tensor):
        self.dim, self.index, self.saved_indices = dim, index, (index,)

    def forward(self, x, src):
        y = x.copy()
        _scatter_add_arrays(y, _positions(self.index.array, self.dim), src)
        return y

    def backward(self, gy):
        x, src = self.inputs
        return (gy if x.requires_grad else None,
                Gather(self.dim, self.index)(gy) if src.requires_grad else None)

    def jvp(self, dx, dsrc):
        """ẏ = ẋ;  ẏ[i][index[i][j]] += ṡ[i][j]."""
        if dsrc is None:
            return dx
        return ScatterAdd(self.dim, self.index)(*filled_tangents((dx, dsrc), self.inputs))


def scatter_add(x: Tensor, dim: int, index, src) -> Tensor:
    """PyTorch's out-of-place ``scatter_add``: x with ``src[i][j]`` added at ``[i][index[i][j]]`` (repeats add)."""
    src = as_tensor(src, like=x)
    dim, index = _checked_index("scatter_add", x, dim, index, src)
    return ScatterAdd(dim, index)(x, _source("scatter_add", x, dim, index, src, None))


class Scatter(Function):
    """y = x, then y[i][index[i][j]] = s[i][j] (dim = 1);  dx = dy with 0 where written,  ds[i][j] = dy[i][index[i][j]].

    s is ``src``, or the number ``value`` (then there is no ds). dx is a
    scatter of 0 into dy, ds a gather of dy. Where an index repeats, which write lands is unspecified (as in PyTorch);
    dsrc then reads the same dy for each of the repeats.
    """
    saved_inputs = ()

    def __init__(self, dim, index: Tensor, value=None):
        self.dim, self.index, self.value, self.saved_indices = dim, index, value, (index,)

    def forward(self, x, src=None):
        y = x.copy()
        y[_positions(self.index.array, self.dim)] = self.value if src is None else src
        return y

    def backward(self, gy):
        gx = Scatter(self.dim, self.index, 0)(gy) if self.inputs[0].requires_grad else None
        if len(self.inputs) == 1:
            return gx
        return gx, Gather(self.dim, self.index)(gy) if self.inputs[1].requires_grad else None

    def jvp(self, dx, dsrc=None):
        """ẏ = ẋ, then ẏ[i][index[i][j]] = ṡ[i][j] (0 for a number), the same places written.

        With repeats this is the tangent of the write that landed, so there (only) the backward is
        not the tangent rule's transpose.
        """
        if dsrc is None:
            return None if dx is None else Scatter(self.dim, self.index, 0)(dx)
        return Scatter(self.dim, self.index)(*filled_tangents((dx, dsrc), self.inputs))


def scatter(x: Tensor, dim: int, index, src=None, *, value=None) -> Tensor:
    """PyTorch's out-of-place ``scatter``: x with ``src[i][j]`` (or ``value``) written at ``[i][index[i][j]]``.

    ``scatter(x, dim, index, 2.5)`` with a number as src is PyTorch's
    ``scatter(dim, index, value)``.
    """
    if src is not None and value is None and isinstance(src, (int, float)):
        src, value = None, src
    src_tensor = src if src is None else as_tensor(src, like=x)
    dim, index = _checked_index("scatter", x, dim, index, src_tensor)
    src = _source("scatter", x, dim, index, src_tensor, value)
    if src is None:
        return Scatter(dim, index, value)(x)
    return Scatter(dim, index)(x, src)


def index_select(x: Tensor, dim: int, index) -> Tensor:
    """The slices ``index`` (1-D) of ``x`` along ``dim``; repeats allowed (their gradients add up)."""
    dim = _dim("index_select", dim, x.ndim, x.shape)
    index_tensor = _index("index_select", index, x)
    index = index_tensor.array
    if index.ndim > 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {index.shape}")
    size = x.shape[dim] if x.ndim else 1
    if index.size and (int(index.min()) < 0 or int(index.max()) >= size):
        raise ValueError(f"index_select: index holds {int(index.min())}..{int(index.max())}, out of range "
                         f"for size {size} at dim {dim} of shape {x.shape} (0 to size - 1)")
    flat = index_tensor if index.ndim == 1 else index_tensor.reshape(-1)  # a view: the same version
    if x.ndim == 0:
        y = getitem(broadcast_to(x, (1,)), flat)
        return y.reshape(()) if index.size == 1 else y  # PyTorch keeps a 0-d input 0-d
    return getitem(x, (slice(None),) * dim + (flat,))


def _mask(op, mask, x: Tensor) -> Tensor:
    """The mask as a boolean Tensor (itself when it is one, so its version is checked)."""
    mask = mask if isinstance(mask, Tensor) else Tensor(x.xp.asarray(mask))
    if mask.dtype != np.bool_:
        raise TypeError(f"{op}: mask must be a boolean tensor, got dtype {mask.dtype}")
    return mask


def masked_fill(x: Tensor, mask, value) -> Tensor:
    """x with ``value`` where ``mask`` holds (mask broadcasts to x's shape);  dx = dy where not mask."""
    mask = _mask("masked_fill", mask, x)
    try:
        shape = np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise ValueError(f"masked_fill: mask of shape {mask.shape} does not broadcast to the input's shape {x.shape}")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise ValueError(f"masked_fill: value must be a number or a 0-d tensor, got shape {value.shape}")
    return where(mask, value, x)


def masked_select(x: Tensor, mask) -> Tensor:
    """The 1-D tensor of x's values where ``mask`` holds (x and mask broadcast together)."""
    mask = _mask("masked_select", mask, x)
    try:
        shape = np.broadcast_shapes(mask.shape, x.shape)
    except ValueError:
        raise ValueError(f"masked_select: mask of shape {mask.shape} and input of shape {x.shape} "
                         "do not broadcast") from None
    return getitem(broadcast_to(x, shape), broadcast_to(mask, shape))


# ---------------------------------------------------------------- sorting (indices found on arrays)
def _argsort(data, dim, descending):
    """Stable argsort along ``dim``; descending keeps equal values in their original order, NaN first."""
    xp = xp_of(data)
    stable = {"kind": "stable"} if xp is np else {}  # CuPy's sort is always stable
    if not descending:
        return xp.argsort(data, axis=dim, **stable)
    n = data.shape[dim]
    flipped = xp.flip(data, axis=dim)  # a stable ascending sort of the reversed row, read backwards
    return (n - 1) - xp.flip(xp.argsort(flipped, axis=dim, **stable), axis=dim)


def argsort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    """The int64 indices that sort ``x`` along ``dim`` (always a stable sort; NaN counts as largest)."""
    if x.ndim == 0:
        return Tensor(x.xp.zeros((), np.int64))
    dim = _dim("argsort", dim, x.ndim, x.shape)
    return Tensor(_argsort(x.array, dim, descending).astype(np.int64, copy=False))


def sort(x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> ValuesIndices:
    """``(values, indices)`` of x sorted along ``dim``;  dvalues flows back through the indices (a gather).

    The sort is always stable (``stable=`` is accepted for PyTorch's signature):
    equal values keep their order, also when descending.
    """
    indices = argsort(x, dim, descending)
    if x.ndim == 0:
        return ValuesIndices(x, indices)
    dim = dim % x.ndim
    return ValuesIndices(Gather(dim, indices)(x), indices)


def topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:  # noqa: A002
    """``(values, indices)`` of the ``k`` largest (or smallest) entries along ``dim``, in sorted order.

    ``sorted=False`` is accepted; the result is sorted anyway (PyTorch leaves that order unspecified).
    """
    if x.ndim == 0:
        x1 = topk(broadcast_to(x, (1,)), k, 0, largest, sorted)
        return ValuesIndices(x1.values.reshape(()), Tensor(x1.indices.array.reshape(())))
    dim = _dim("topk", dim, x.ndim, x.shape)
    k = operator.index(k)
    if not 0 <= k <= x.shape[dim]:
        raise ValueError(f"topk: k = {k} is out of range for size {x.shape[dim]} at dim {dim} of shape {x.shape}")
    order = _argsort(x.array, dim, descending=largest)
    key = (slice(None),) * dim + (slice(0, k),)
    indices = Tensor(order[key].astype(np.int64, copy=False))
    return ValuesIndices(Gather(dim, indices)(x), indices)


def nonzero(x: Tensor, as_tuple: bool = False):
    """The int64 indices of x's nonzero entries: an (n, ndim) tensor, or one 1-D tensor per dim."""
    xp = x.xp
    data = x.array.reshape(1) if x.ndim == 0 else x.array
    where_nonzero = xp.nonzero(data)
    if as_tuple:
        return tuple(Tensor(i.astype(np.int64, copy=False)) for i in where_nonzero)
    if x.ndim == 0:
        return Tensor(xp.zeros((len(where_nonzero[0]), 0), np.int64))
    return Tensor(xp.stack(where_nonzero, axis=1).astype(np.int64, copy=False))

