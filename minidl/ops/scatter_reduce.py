"""scatter_reduce, and scatter with ``reduce=``: many values sent to one place, reduced there.

``scatter_add`` (in :mod:`minidl.ops.indexing`) adds whatever lands on a place;
``scatter_reduce`` generalizes it to the five reductions of PyTorch. The values
that land on one place p (x_p first, when ``include_self``) form a row of a table:

    place p:   x_p   s_j   s_k   ...      (every j with index sending s_j to p)
    y_p = sum / prod / mean / amax / amin of the row

so the gradient of each member is the gradient of a plain reduction over that
row, and each member's gradient goes back to where the member came from (a
gather from the table, as scatter_add's is a gather from dy).
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.indexing import Scatter, _checked_index, _positions, _source
from minidl.ops.indexing import scatter as _scatter_without_reduce
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.scan import Cumprod
from minidl.ops.shape import concatenate, filled_tangents, reshape
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("scatter_reduce", "scatter")

_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")
_EMPTY_SLOT = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf}  # each reduction's identity


def _groups(index, dim, x_shape, include_self):
    """The places ``src`` is sent to, as groups: the rows of the (U, K) table ScatterReduce reduces.

    Returns ``places`` (the U distinct flat positions in x that receive a value, ascending),
    ``self_slots`` (where x's own value sits in the flattened table: column 0 of each row, or
    nothing when not include_self), ``src_slots`` (where each src value sits, in index's C
    order), ``filled`` (the (U, K) mask of the slots that hold a value) and K.
    """
    xp = xp_of(index)
    flat = xp.zeros(index.shape, np.int64)
    stride = 1
    for d in reversed(range(len(x_shape))):  # x's flat position of [i][index[i][j]] (dim = 1)
        flat = flat + _positions(index, dim)[d] * stride
        stride *= x_shape[d]
    flat = flat.reshape(-1)
    places, group, counts = xp.unique(flat, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    order = xp.argsort(flat, **({"kind": "stable"} if xp is np else {}))  # CuPy's sort is always stable
    in_order = flat[order]
    rank = xp.empty_like(flat)
    rank[order] = xp.arange(flat.size) - xp.searchsorted(in_order, in_order)  # j's place within its group
    first = int(include_self)
    k = first + (int(counts.max()) if counts.size else 0)
    src_slots = group * k + rank + first
    self_slots = xp.arange(places.size) * k if include_self else xp.zeros(0, np.int64)
    filled = xp.zeros(places.size * k, bool)
    filled[src_slots] = True
    filled[self_slots] = True
    return places, self_slots, src_slots, filled.reshape(places.size, k), k


class ScatterReduce(Function):
    """y = x, then y_p = R(x_p, s_j, s_k, …) at each place p that src reaches;
    ds_j = dy_p ∂R/∂s_j,  dx_p = dy_p ∂R/∂x_p

    R is the reduction; s_j, s_k, … are the src values that ``index`` sends to p
    ([i][index[i][j]] for dim = 1); x_p takes part only when ``include_self``. The
    values sent to one place form a row of a table (x_p first), and each member m of
    the row gets dy_p times the reduction's own derivative:

        sum:  ∂R/∂m = 1
        mean:  ∂R/∂m = 1 / c_p  (c_p members)
        prod:  the product of the other members  (two exclusive cumprods, exact with zeros: see Prod)
        amax, amin:  1 / (the number of members equal to y_p) for a member equal to y_p, else 0

    (ties share, as in PyTorch). dx_p = dy_p at the places src does not reach, and 0 at
    the places it does when not ``include_self``. The table has one row per place
    reached and one column per member of the largest group.
    """
    saved_arrays = ("filled", "count", "places", "self_slots", "src_slots", "share")

    def __init__(self, dim, index: Tensor, reduce, include_self):
        self.dim, self.index, self.reduce, self.include_self = dim, index, reduce, include_self
        self.saved_indices = (index,)
        self.saved_inputs = None if reduce == "prod" else ()  # only prod's gradient reads the values

    def forward(self, x, src):
        xp = xp_of(x)
        self.places, self.self_slots, self.src_slots, self.filled, k = _groups(
            self.index.array, self.dim, x.shape, self.include_self)
        table = xp.full(self.places.size * k, _EMPTY_SLOT[self.reduce], x.dtype)
        if self.include_self:
            table[self.self_slots] = x.reshape(-1)[self.places]
        table[self.src_slots] = src.reshape(-1)
        table = table.reshape(self.places.size, k)
        if self.reduce in ("sum", "mean"):
            reduced = table.sum(axis=1)
            self.count = self.filled.sum(axis=1, keepdims=True).astype(x.dtype)
            reduced = reduced / self.count[:, 0] if self.reduce == "mean" else reduced
        elif self.reduce == "prod":
            reduced = table.prod(axis=1)
        else:
            reduced = table.max(axis=1) if self.reduce == "amax" else table.min(axis=1)
            hits = (table == reduced[:, None]) & self.filled
            self.share = hits / hits.sum(axis=1, keepdims=True)
        y = x.reshape(-1).copy()
        y[self.places] = reduced
        return y.reshape(x.shape)

    def _table(self, x, src, empty=1.0):
        """The table of members as a Tensor built from x and src (x_p, then each s_j), ``empty`` in the
        unfilled slots: prod's gradient reads the values' table, the tangent rule the tangents'."""
        slots = Tensor(x.xp.concatenate([self.self_slots, self.src_slots]))
        members = concatenate([reshape(x, (-1,))[Tensor(self.places)], reshape(src, (-1,))]) \
            if self.include_self else reshape(src, (-1,))
        fill = Tensor(x.xp.full(self.filled.size, empty, x.dtype))
        return reshape(Scatter(0, slots)(fill, members), self.filled.shape)

    def _derivatives(self, dtype):
        """The table of ∂R/∂m, one per member (0 in the unfilled slots)."""
        xp = xp_of(self.filled)
        if self.reduce == "sum":
            return Tensor(self.filled.astype(dtype))
        if self.reduce == "mean":
            return Tensor(self.filled / self.count)
        if self.reduce == "prod":
            table = self._table(*self.inputs)
            one = Tensor(xp.ones((table.shape[0], 1), table.dtype))
            before = Cumprod(1)(concatenate([one, table[:, :-1]], axis=1))  # Π of the members before
            after = Cumprod(1, reverse=True)(concatenate([table[:, 1:], one], axis=1))  # and after
            return before * after
        return Tensor(self.share.astype(dtype, copy=False))

    def backward(self, gy):
        x, src = self.inputs
        places = Tensor(self.places)
        flat_gy = reshape(gy, (-1,))
        g_rows = reshape(flat_gy[places], (-1, 1))  # dy_p for each row of the table
        g_table = reshape(g_rows * self._derivatives(gy.dtype), (-1,))
        gx = None
        if x.requires_grad:
            gx = (Scatter(0, places)(flat_gy, g_table[Tensor(self.self_slots)]) if self.include_self
                  else Scatter(0, places, 0)(flat_gy))
            gx = reshape(gx, x.shape)
        gsrc = reshape(g_table[Tensor(self.src_slots)], src.shape) if src.requires_grad else None
        return gx, gsrc

    def jvp(self, dx, dsrc):
        """The same derivatives as the backward, summed over each row instead of handed out:

            ẏ_p = Σ_m ∂R/∂m · ṁ  at a place p that src reaches,   ẏ_p = ẋ_p elsewhere,

        with ṁ the members' tangents (ẋ_p and the ṡ_j) laid out in the table as the members are.
        """
        dx, dsrc = filled_tangents((dx, dsrc), self.inputs)
        rows = reduce_sum(self._derivatives(dx.dtype) * self._table(dx, dsrc, empty=0.0), axis=1)
        return reshape(Scatter(0, Tensor(self.places))(reshape(dx, (-1,)), rows), dx.shape)


def scatter_reduce(x: Tensor, dim: int, index, src, reduce: str, *, include_self: bool = True) -> Tensor:
    """PyTorch's out-of-place ``scatter_reduce``: each ``src[i][j]`` reduced into ``x[i][index[i][j]]`` (dim = 1).

    ``reduce`` is ``"sum"``, ``"prod"``, ``"mean"``, ``"amax"`` or ``"amin"``; with
    ``include_self=False`` the values of x at the places src reaches are left out of the
    reduction (places src does not reach keep x). See :class:`ScatterReduce` for the gradients.
    A deliberate difference: with ``include_self=False`` and ``"amax"``/``"amin"``, an x_p
    equal to the result takes no share of the gradient (it is not a member); PyTorch counts it
    as one more tie, so its src gradient there is smaller and sums to less than dy.
    """
    if reduce not in _REDUCTIONS:
        raise ValueError(f"scatter_reduce: reduce must be one of {', '.join(map(repr, _REDUCTIONS))}, got {reduce!r}")
    src = as_tensor(src, like=x)
    if src.dtype != x.dtype:
        raise TypeError(f"scatter_reduce: src has dtype {src.dtype} and the input {x.dtype}; they must match "
                        "(convert one with .to(dtype))")
    dim, index = _checked_index("scatter_reduce", x, dim, index, src)
    return ScatterReduce(dim, index, reduce, bool(include_self))(x, _source("scatter_reduce", x, dim, index, src, None))


_SCATTER_REDUCE = {"add": "sum", "multiply": "prod"}


def scatter(x: Tensor, dim: int, index, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """PyTorch's out-of-place ``scatter``: x with ``src[i][j]`` (or ``value``) written at ``[i][index[i][j]]``.

    ``reduce="add"`` or ``"multiply"`` adds (multiplies) instead of writing, every
    repeat of an index included: :func:`scatter_reduce` with ``"sum"`` (``"prod"``) and
    ``include_self=True``. Without ``reduce`` see :func:`minidl.ops.indexing.scatter`.
    """
    if reduce is None:
        return _scatter_without_reduce(x, dim, index, src, value=value)
    if reduce not in _SCATTER_REDUCE:
        raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r} "
                         "(scatter_reduce takes 'sum', 'prod', 'mean', 'amax' and 'amin')")
    if src is not None and value is None and isinstance(src, (int, float)):
        src, value = None, src
    if (src is None) == (value is None):
        raise TypeError("scatter: pass exactly one of src (a Tensor) and value (a number)")
    if src is None:
        shape = index.shape if hasattr(index, "shape") else np.shape(index)
        src = Tensor(x.xp.full(shape, value, x.dtype))
    return scatter_reduce(x, dim, index, src, _SCATTER_REDUCE[reduce], include_self=True)
