"""Reductions over dims: sum, mean, max, min, var, std (and var_mean, std_mean), prod, argmax, argmin, any, all.

Each backward first puts back the reduced axes as size 1 (so the gradient
broadcasts against the input), then applies the derivative:
sum → 1, mean → 1/n, max/min → 1 at the extreme (shared on ties),
var → 2(x − x̄)/(n − correction), prod → the product of the others.

The public functions speak PyTorch: ``dim``, ``keepdim``, ``correction``
(unbiased variance by default); NumPy's ``axis``, ``keepdims`` and ``ddof``
are accepted as aliases. ``max(x, dim)`` returns ``(values, indices)`` as in
PyTorch, while ``max(x, axis=...)`` keeps NumPy's meaning (values only).
"""
from __future__ import annotations

import builtins
import math
import operator

import numpy as np

from minidl import backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.elementwise import maximum, minimum, where
from minidl.ops.indexing import Gather, ValuesIndices
from minidl.ops.scan import Cumprod
from minidl.ops.shape import Transpose, broadcast_to, concatenate, reshape
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin", "any", "all")


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

    def jvp(self, dx):
        """dy = Σ dx over axes."""
        return Sum(self.axes, self.keepdims)(dx)


@autocast_to("float32")
def sum(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """Σ x over ``dim`` (an int, a tuple, or all dims by default)."""
    return Sum(_dims("sum", dim, axis), _keep("sum", keepdim, keepdims))(x)


class Mean(Reduction):
    """y = (1/n) Σ x over axes;  dx = dy / n broadcast to x's shape."""
    saved_inputs = ()

    def forward(self, x):
        self.prepare(x)
        return backend.mean(x, self.axes, self.keepdims)

    def backward(self, gy):
        return broadcast_to(self.expand(gy) / self.count, self.inputs[0].shape)

    def jvp(self, dx):
        """dy = (1/n) Σ dx over axes."""
        return Mean(self.axes, self.keepdims)(dx)


def mean(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The mean of x over ``dim`` (an int, a tuple, or all dims by default)."""
    return Mean(_dims("mean", dim, axis), _keep("mean", keepdim, keepdims))(x)


class Max(Reduction):
    """y = max x over axes;  dx = dy at the maximum, split evenly among ties."""
    saved_inputs = ()
    saved_arrays = ("share",)

    extreme = "max"

    def forward(self, x):
        self.prepare(x)
        if builtins.any(x.shape[a] == 0 for a in self.axes):  # an empty batch over other axes is fine
            raise ValueError(f"{self.extreme}: cannot reduce over an empty axis (shape {x.shape}, axis {self.axis})")
        y = getattr(x, self.extreme)(axis=self.axes, keepdims=True)
        hits = x == y
        self.share = hits / hits.sum(axis=self.axes, keepdims=True)
        return y if self.keepdims else y.reshape(tuple(n for i, n in enumerate(x.shape) if i not in self.axes))

    def backward(self, gy):
        return self.expand(gy) * Tensor(self.share.astype(gy.dtype, copy=False))

    def jvp(self, dx):
        """dy = Σ dx · share over axes (the share: 1 at the maximum, split evenly among ties)."""
        return Sum(self.axes, self.keepdims)(dx * Tensor(self.share.astype(dx.dtype, copy=False)))


class Min(Max):
    """y = min x over axes;  dx = dy at the minimum, split evenly among ties."""

    extreme = "min"


def max(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """PyTorch's ``max``: the largest value, or ``(values, indices)`` along ``dim``, or ``maximum(x, other)``.

    - ``max(x)``: the largest value (a 0-d Tensor); ties share the gradient evenly.
    - ``max(x, dim)`` / ``max(x, dim=d, keepdim=True)``: a named tuple ``(values, indices)``
      (``indices`` int64, no gradient); the gradient goes to the index returned, the first
      of equal values, as in PyTorch.
    - ``max(x, other_tensor)``: the elementwise :func:`maximum`.
    - ``max(x, axis=...)``, ``keepdims=``: NumPy's meaning: the values only, over one dim or a
      tuple of dims, ties sharing the gradient. A deliberate difference from PyTorch, where
      ``axis=`` is an alias of ``dim`` and gives the named tuple.
    """
    return _extreme("max", x, dim, keepdim, axis, keepdims)


def min(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """PyTorch's ``min``; see :func:`max` (``(values, indices)`` with ``dim``, values only with ``axis``)."""
    return _extreme("min", x, dim, keepdim, axis, keepdims)


class Var(Reduction):
    """y = Σ (x − x̄)² / (n − ddof);  dx = dy · 2(x − x̄)/(n − ddof).

    ``ddof=0`` is the population variance; ``ddof=1`` is the unbiased
    estimate, the default of :func:`var` (PyTorch calls ddof ``correction``).
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
        if x.dtype.kind == "c":  # NumPy's is E|x − x̄|²; the analytic continuation (complex-step gradcheck):
            centered = x - x.mean(axis=self.axes, keepdims=True)
            return (centered * centered).sum(axis=self.axes, keepdims=self.keepdims) / (self.count - self.ddof)
        return x.var(axis=self.axes, keepdims=self.keepdims, ddof=self.ddof)

    def backward(self, gy):
        x = self.inputs[0]
        if x.array.size == 0:
            return Tensor(x.xp.zeros(x.shape, gy.dtype))
        dof = self.count - self.ddof
        scale = 2.0 / dof if dof else math.inf
        centered = x - mean(x, axis=self.axes, keepdims=True)
        return self.expand(gy) * centered * scale

    def jvp(self, dx):
        """dy = Σ 2(x − x̄) dx / (n − ddof) over axes."""
        x = self.inputs[0]
        if x.array.size == 0:
            return None
        dof = self.count - self.ddof
        scale = 2.0 / dof if dof else math.inf
        centered = x - mean(x, axis=self.axes, keepdims=True)
        return Sum(self.axes, self.keepdims)(centered * dx) * scale


def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None, ddof=None, axis=None, keepdims=None):
    """Variance over ``dim``: Σ (x − x̄)² / (n − correction), unbiased (correction = 1) by default as in PyTorch.

    Pass one of ``correction=`` (PyTorch), ``unbiased=`` (True: 1, False: 0) or NumPy's
    ``ddof=``; ``var(x, False)`` is PyTorch's ``var(unbiased=False)``, the population variance.
    """
    if isinstance(dim, (bool, np.bool_)):  # PyTorch's var(x, unbiased)
        if unbiased is not None:
            raise TypeError(f"var: got unbiased twice ({dim!r} and {unbiased!r})")
        dim, unbiased = None, dim
    ddof = _correction("var", unbiased, correction, ddof)
    return Var(_dims("var", dim, axis), _keep("var", keepdim, keepdims), ddof)(x)


class Std(Var):
    """y = √var(x);  dx = dy · (x − x̄) / ((n − ddof) · y),  dx = 0 where y = 0.

    This is Var's backward with dy/(2y) as its upstream gradient. At zero spread (a
    constant row) the chain rule gives 0·∞ = NaN; PyTorch masks that to 0, and so
    does this: one constant feature must not make every gradient NaN.
    """

    def forward(self, x):
        return xp_of(x).sqrt(super().forward(x))

    def backward(self, gy):
        y = self.output()
        flat = y.array == 0
        return super().backward(where(flat, 0.0, gy / (2 * where(flat, 1.0, y))))

    def jvp(self, dx):
        """dy = d(var) / (2y), 0 where y = 0."""
        dvar = super().jvp(dx)
        if dvar is None:
            return None
        y = self.output()
        flat = y.array == 0
        return where(flat, 0.0, dvar / (2 * where(flat, 1.0, y)))


def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None, ddof=None, axis=None, keepdims=None):
    """Standard deviation √var (same arguments as :func:`var`, unbiased by default);  dx = dvar / (2 std),
    0 where std = 0 (see :class:`Std`)."""
    if isinstance(dim, (bool, np.bool_)):
        if unbiased is not None:
            raise TypeError(f"std: got unbiased twice ({dim!r} and {unbiased!r})")
        dim, unbiased = None, dim
    ddof = _correction("std", unbiased, correction, ddof)
    return Std(_dims("std", dim, axis), _keep("std", keepdim, keepdims), ddof)(x)


class Prod(Reduction):
    """y = Π x over axes;  dx_k = dy Π_{j≠k} x_j = dy (Π_{j<k} x_j)(Π_{j>k} x_j).

    The product of the others is taken as the exclusive products from the
    left and from the right (two cumprods), never as y / x_k: so it is right
    with zeros in x (one zero: only its own gradient is nonzero; two: all are
    0), and its derivative, built from cumprod's, is right as well.
    """

    def forward(self, x):
        self.prepare(x)
        return x.prod(axis=self.axes, keepdims=self.keepdims)

    def backward(self, gy):
        x = self.inputs[0]
        if not self.axes:  # a 0-d x: y = x
            return gy
        if x.array.size == 0:
            return Tensor(x.xp.zeros(x.shape, gy.dtype))
        return self.others(gy)

    def others(self, gy=None) -> Tensor:
        """dy Π_{j≠k} x_j for every k, in x's shape (just the products of the others without dy)."""
        x = self.inputs[0]
        kept = [a for a in range(x.ndim) if a not in self.axes]
        perm = tuple(kept + list(self.axes))  # the reduced axes last, flattened into one row of n values
        lead = tuple(x.shape[a] for a in kept)
        rows = reshape(Transpose(perm)(x), lead + (self.count,))
        one = Tensor(x.xp.ones(lead + (1,), x.dtype))
        before = Cumprod(rows.ndim - 1)(concatenate([one, rows[..., :-1]], axis=-1))  # Π_{j<k} x_j
        after = Cumprod(rows.ndim - 1, reverse=True)(concatenate([rows[..., 1:], one], axis=-1))  # Π_{j>k} x_j
        g = before * after if gy is None else reshape(gy, lead + (1,)) * before * after
        inverse = tuple(perm.index(a) for a in range(x.ndim))
        return Transpose(inverse)(reshape(g, tuple(x.shape[a] for a in perm)))

    def jvp(self, dx):
        """dy = Σ_k dx_k Π_{j≠k} x_j over axes (the same products of the others)."""
        x = self.inputs[0]
        if not self.axes:
            return dx
        if x.array.size == 0:
            return None
        return Sum(self.axes, self.keepdims)(self.others() * dx)


@autocast_to("float32")
def prod(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """Π x over ``dim`` (all dims by default); gradients are right with zeros in x (see :class:`Prod`)."""
    return Prod(_dims("prod", dim, axis), _keep("prod", keepdim, keepdims))(x)


# ---------------------------------------------------------------- argument spelling
def _dims(op, dim, axis):
    """PyTorch's ``dim`` or NumPy's ``axis`` (one of them)."""
    if axis is None:
        return dim
    if dim is not None:
        raise TypeError(f"{op}: got dim={dim!r} and axis={axis!r}; pass one of them (axis is NumPy's name for dim)")
    return axis


def _keep(op, keepdim, keepdims):
    """PyTorch's ``keepdim`` or NumPy's ``keepdims``."""
    if keepdims is None:
        return bool(keepdim)
    if keepdim and not keepdims:
        raise TypeError(f"{op}: got keepdim={keepdim!r} and keepdims={keepdims!r}; pass one of them")
    return bool(keepdims)


def _one_dim(op, x, dim):
    try:
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{op}: dim must be one int, got {dim!r}") from None
    return _normalize_axis(dim, x.ndim, op, x.shape)


def _extreme(op, x, dim, keepdim, axis, keepdims):
    reduction, elementwise = (Max, maximum) if op == "max" else (Min, minimum)
    if isinstance(dim, Tensor):  # PyTorch's x.max(other): the elementwise maximum
        return elementwise(x, dim)
    keep = _keep(op, keepdim, keepdims)
    if axis is not None or dim is None:
        return reduction(_dims(op, dim, axis), keep)(x)
    if isinstance(dim, (tuple, list)):
        raise TypeError(f"{op}: dim must be one int when indices are returned, got {dim!r}; for the "
                        f"values over several dims pass axis={tuple(dim)!r} (NumPy's meaning: values only)")
    dim = _one_dim(op, x, dim)
    if not dim:  # a 0-d x: the value itself, at index 0
        return ValuesIndices(reshape(x, x.shape), Tensor(x.xp.zeros((), np.int64)))
    if x.shape[dim[0]] == 0:
        raise ValueError(f"{op}: cannot reduce over an empty dim (shape {x.shape}, dim {dim[0]})")
    d = dim[0]
    index = getattr(x.xp, "arg" + op)(x.array, axis=d, keepdims=True).astype(np.int64, copy=False)
    values = Gather(d, Tensor(index))(x)  # the gradient goes to the index found, as in PyTorch
    if not keep:
        values, index = reshape(values, values.shape[:d] + values.shape[d + 1:]), index.squeeze(d)
    return ValuesIndices(values, Tensor(index))


def _correction(op, unbiased, correction, ddof):
    given = [name for name, v in (("unbiased", unbiased), ("correction", correction), ("ddof", ddof))
             if v is not None]
    if len(given) > 1:
        raise TypeError(f"{op}: got {' and '.join(given)}; pass one of them "
                        "(correction = ddof = the number subtracted from n; unbiased=True is correction=1)")
    if unbiased is not None:
        if not isinstance(unbiased, (bool, np.bool_)):
            raise TypeError(f"{op}: unbiased must be True or False, got {unbiased!r}; "
                            "for another correction pass correction= (or NumPy's ddof=)")
        return int(unbiased)
    value = correction if correction is not None else ddof
    return 1 if value is None else value


def _dim_of(dim):
    """The dim of a call that may have put ``unbiased`` in dim's place (PyTorch's ``var(x, False)``)."""
    return None if isinstance(dim, (bool, np.bool_)) else dim


def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None, ddof=None, axis=None, keepdims=None):
    """PyTorch's ``var_mean``: the tuple ``(var(x), mean(x))`` over the same dims (arguments of :func:`var`)."""
    return (var(x, dim, unbiased, keepdim, correction=correction, ddof=ddof, axis=axis, keepdims=keepdims),
            mean(x, _dim_of(dim), keepdim, axis=axis, keepdims=keepdims))


def std_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None, ddof=None, axis=None, keepdims=None):
    """PyTorch's ``std_mean``: the tuple ``(std(x), mean(x))`` over the same dims (arguments of :func:`std`)."""
    return (std(x, dim, unbiased, keepdim, correction=correction, ddof=ddof, axis=axis, keepdims=keepdims),
            mean(x, _dim_of(dim), keepdim, axis=axis, keepdims=keepdims))


def _arg_extreme(op, x, dim, keepdim, axis, keepdims):
    dim, keep = _dims(op, dim, axis), _keep(op, keepdim, keepdims)
    xp = x.xp
    find = getattr(xp, op)
    if dim is None:
        if x.array.size == 0:
            raise ValueError(f"{op}: cannot search an empty tensor (shape {x.shape})")
        index = find(x.array.reshape(-1)).astype(np.int64)
        return Tensor(index.reshape((1,) * x.ndim) if keep else index)
    (d,) = _one_dim(op, x, dim) or (None,)
    if d is None:  # a 0-d x
        return Tensor(xp.zeros((), np.int64))
    if x.shape[d] == 0:
        raise ValueError(f"{op}: cannot search an empty dim (shape {x.shape}, dim {d})")
    return Tensor(find(x.array, axis=d, keepdims=keep).astype(np.int64, copy=False))


def argmax(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The int64 index of the largest value (flat index without ``dim``); first one on ties; no gradient."""
    return _arg_extreme("argmax", x, dim, keepdim, axis, keepdims)


def argmin(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The int64 index of the smallest value (flat index without ``dim``); first one on ties; no gradient."""
    return _arg_extreme("argmin", x, dim, keepdim, axis, keepdims)


def _logical(op, x, dim, keepdim, axis, keepdims):
    dim, keep = _dims(op, dim, axis), _keep(op, keepdim, keepdims)
    axes = _normalize_axis(dim, x.ndim, op, x.shape)
    return Tensor(getattr(x.xp, op)(x.array, axis=axes, keepdims=keep))


def any(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """True where some value over ``dim`` is nonzero (a bool Tensor, no gradient)."""
    return _logical("any", x, dim, keepdim, axis, keepdims)


def all(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """True where every value over ``dim`` is nonzero (a bool Tensor, no gradient)."""
    return _logical("all", x, dim, keepdim, axis, keepdims)
