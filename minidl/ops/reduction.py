"""Reductions over dims (sum, mean, max, var, std, prod, argmax, any...) and the scans (cumsum, cumprod...).

Each backward first puts back the reduced axes as size 1 (so the gradient
broadcasts against the input), then applies the derivative:
sum → 1, mean → 1/n, max/min → 1 at the extreme (shared on ties),
var → 2(x − x̄)/(n − correction), prod → the product of the others.

The public functions speak PyTorch: ``dim``, ``keepdim``, ``correction``
(unbiased variance by default); NumPy's ``axis``, ``keepdims`` and ``ddof``
are accepted as aliases. ``max(x, dim)`` returns ``(values, indices)`` as in
PyTorch, while ``max(x, axis=...)`` keeps NumPy's meaning (values only).
A scan (cumsum...) keeps the shape: y_i combines x_1..x_i along ``dim``, so
dx_j gathers dy_i from every i ≥ j, which is a scan run backwards.
"""
from __future__ import annotations

import builtins
import math
import operator

import numpy as np

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.elementwise import maximum, minimum, sqrt
from minidl.ops.indexing import Gather, ValuesIndices
from minidl.ops.shape import Transpose, broadcast_to, concatenate, reshape
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("sum", "mean", "max", "min", "var", "std", "prod", "argmax", "argmin", "any", "all",
                  "cumsum", "cumprod", "logcumsumexp")


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
        return x.sum(axis=self.axes, keepdims=self.keepdims)

    def backward(self, gy):
        return broadcast_to(self.expand(gy), self.inputs[0].shape)


class Mean(Reduction):
    """y = (1/n) Σ x over axes;  dx = dy / n broadcast to x's shape."""
    saved_inputs = ()

    def forward(self, x):
        self.prepare(x)
        return x.mean(axis=self.axes, keepdims=self.keepdims)

    def backward(self, gy):
        return broadcast_to(self.expand(gy) / self.count, self.inputs[0].shape)


class Max(Reduction):
    """y = max x over axes;  dx = dy at the maximum, split evenly among ties."""
    saved_inputs = ()

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


class Min(Max):
    """y = min x over axes;  dx = dy at the minimum, split evenly among ties."""

    extreme = "min"


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
        return x.var(axis=self.axes, keepdims=self.keepdims, ddof=self.ddof)

    def backward(self, gy):
        x = self.inputs[0]
        if x.data.size == 0:
            return Tensor(x.xp.zeros(x.shape, gy.dtype))
        dof = self.count - self.ddof
        scale = 2.0 / dof if dof else math.inf
        centered = x - mean(x, axis=self.axes, keepdims=True)
        return self.expand(gy) * centered * scale



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
        if x.data.size == 0:
            return Tensor(x.xp.zeros(x.shape, gy.dtype))
        kept = [a for a in range(x.ndim) if a not in self.axes]
        perm = tuple(kept + list(self.axes))  # the reduced axes last, flattened into one row of n values
        lead = tuple(x.shape[a] for a in kept)
        rows = reshape(Transpose(perm)(x), lead + (self.count,))
        one = Tensor(x.xp.ones(lead + (1,), x.dtype))
        before = cumprod(concatenate([one, rows[..., :-1]], axis=-1), -1)  # Π_{j<k} x_j
        after = Cumprod(rows.ndim - 1, reverse=True)(concatenate([rows[..., 1:], one], axis=-1))  # Π_{j>k} x_j
        g = reshape(gy, lead + (1,)) * before * after
        inverse = tuple(perm.index(a) for a in range(x.ndim))
        return Transpose(inverse)(reshape(g, tuple(x.shape[a] for a in perm)))


# ---------------------------------------------------------------- scans along one dim
def _scan(xp, a, dim, reverse, scan):
    """``scan`` along ``dim`` from the first entry on, or from the last when ``reverse``."""
    if not reverse:
        return scan(a, axis=dim)
    return xp.flip(scan(xp.flip(a, axis=dim), axis=dim), axis=dim)


class Scan(Function):
    def __init__(self, dim, reverse=False):
        self.dim, self.reverse = dim, reverse

    def forward(self, x):
        xp = xp_of(x)
        return _scan(xp, x, self.dim, self.reverse, getattr(xp, self.scan))


class Cumsum(Scan):
    """y_i = Σ_{j≤i} x_j along dim;  dx_j = Σ_{i≥j} dy_i (the cumsum of dy run backwards).

    ``reverse=True`` sums from the end (y_i = Σ_{j≥i} x_j); its backward is the forward cumsum.
    """
    saved_inputs = ()
    scan = "cumsum"

    def backward(self, gy):
        return Cumsum(self.dim, not self.reverse)(gy)


class Cumprod(Scan):
    """y_i = Π_{j≤i} x_j along dim;  dx_k = (Π_{j<k} x_j) · S_k,  S_k = dy_k + x_{k+1} S_{k+1}.

    dx_k = Σ_{i≥k} dy_i times the product of x_1..x_i without x_k: the
    product before k (an exclusive cumprod) times S_k = Σ_{i≥k} dy_i Π_{k<j≤i} x_j,
    which the recurrence gives from the end (a :class:`LinearScan`). No
    division by x_k: exact with any number of zeros, at every order.
    ``reverse=True`` multiplies from the end (and everything runs the other way).
    """
    scan = "cumprod"

    def backward(self, gy):
        x = self.inputs[0]
        if x.shape[self.dim] == 0:
            return gy
        before = Cumprod(self.dim, self.reverse)(_shifted(x, self.dim, self.reverse, 1, later=True))
        after = LinearScan(self.dim, not self.reverse)(_shifted(x, self.dim, self.reverse, 0, later=False), gy)
        return before * after


def _shifted(t, dim, reverse, fill, later):
    """t moved one place along the scan (from the end when ``reverse``), ``fill`` in the vacated place.

    later=True: position k holds t at the element before k in the scan's order;
    later=False: position k holds t at the element after k.
    """
    n = t.shape[dim]
    lead = (slice(None),) * dim
    pad = Tensor(t.xp.full(t.shape[:dim] + (1,) + t.shape[dim + 1:], fill, dtype=t.dtype))
    if later != reverse:  # shifted toward the end: [fill, t_0, ..., t_{n-2}]
        return concatenate([pad, t[lead + (slice(0, n - 1),)]], axis=dim)
    return concatenate([t[lead + (slice(1, n),)], pad], axis=dim)  # [t_1, ..., t_{n-1}, fill]


def _linear_scan(xp, a, b, dim, reverse):
    """z_k = b_k + a_k z_{k-1} along dim (z_k = b_k + a_k z_{k+1} when ``reverse``), on arrays.

    Hillis and Steele's doubling: after the step of size s, each place holds
    its recurrence unrolled s places back; log2(n) steps, no division.
    """
    if reverse:
        return xp.flip(_linear_scan(xp, xp.flip(a, axis=dim), xp.flip(b, axis=dim), dim, False), axis=dim)
    n, step = a.shape[dim], 1
    lead = (slice(None),) * dim
    z, a = b.copy(), a.copy()
    while step < n:
        here, back = lead + (slice(step, n),), lead + (slice(0, n - step),)
        z_new, a_new = z.copy(), a.copy()
        z_new[here] += a[here] * z[back]
        a_new[here] *= a[back]
        z, a, step = z_new, a_new, 2 * step
    return z


class LinearScan(Function):
    """z_k = b_k + a_k z_{k−1} along dim (z_{k+1} when reverse);
    db_k = w_k = dz_k + a_{k+1} w_{k+1},  da_k = w_k z_{k−1}.

    The first-order recurrence under cumprod's gradient. Its backward is the
    same recurrence run the other way (with a moved one place), so every
    derivative is this op again.
    """

    def __init__(self, dim, reverse):
        self.dim, self.reverse = dim, reverse

    def forward(self, a, b):
        return _linear_scan(xp_of(b), a, b, self.dim, self.reverse)

    def backward(self, gz):
        a, b = self.inputs
        w = LinearScan(self.dim, not self.reverse)(_shifted(a, self.dim, self.reverse, 0, later=False), gz)
        da = w * _shifted(self.output(), self.dim, self.reverse, 0, later=True) if a.requires_grad else None
        return da, w if b.requires_grad else None


def _log_cumsum_exp(xp, a, dim, reverse=False):
    """ln Σ e^a over each prefix (suffix when ``reverse``) along ``dim``, on arrays, without overflow.

    Exact on the CPU (NumPy's logaddexp.accumulate); on the GPU a shift by the
    row's max, exact while a row's values span less than ~700 (float64) or ~80 (float32).
    """
    if xp is np:
        return _scan(np, a, dim, reverse, np.logaddexp.accumulate)
    if a.shape[dim] == 0:
        return a.copy()
    m = a.max(axis=dim, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    return xp.log(_scan(xp, xp.exp(a - m), dim, reverse, xp.cumsum)) + m


class Logcumsumexp(Function):
    """y_i = ln Σ_{j≤i} e^(x_j) along dim;  dx_j = Σ_{i≥j} dy_i e^(x_j − y_i).

    The backward is a gradient op of its own (:class:`LogcumsumexpGrad`), which
    keeps every exponent ≤ 0: no overflow for any range of x.
    """

    def __init__(self, dim):
        self.dim = dim

    def forward(self, x):
        return _log_cumsum_exp(xp_of(x), x, self.dim)

    def backward(self, gy):
        return LogcumsumexpGrad(self.dim, reverse=True)(self.inputs[0], self.output(), gy)


class LogcumsumexpGrad(Function):
    """z_k = Σ_{l≥k} a_l e^(p_k − q_l) along dim (l ≤ k when not reverse);
    dp = dz ⊙ z,  da_l = Σ_k dz_k e^(p_k − q_l),  dq = −a ⊙ da.

    Logcumsumexp's gradient is z with p = x, q = y, a = dy. da runs the scan the
    other way, with p and q swapped and negated: it is this op again, so every
    order of derivative stays one formula. Computed in the log domain, with a
    split into its positive and negative parts: z = e^(p + L⁺) − e^(p + L⁻),
    L± = the scan of ln Σ e^(ln a± − q).
    """

    def __init__(self, dim, reverse):
        self.dim, self.reverse = dim, reverse

    def forward(self, p, q, a):
        xp = xp_of(a)
        with np.errstate(divide="ignore"):  # ln 0 = −inf: that part adds nothing
            pos = _log_cumsum_exp(xp, xp.log(xp.where(a > 0, a, 0)) - q, self.dim, self.reverse)
            neg = _log_cumsum_exp(xp, xp.log(xp.where(a < 0, -a, 0)) - q, self.dim, self.reverse)
        return xp.exp(p + pos) - xp.exp(p + neg)

    def backward(self, gz):
        p, q, a = self.inputs
        da = LogcumsumexpGrad(self.dim, not self.reverse)(-q, -p, gz) if (q.requires_grad or a.requires_grad) else None
        return (gz * self.output() if p.requires_grad else None,
                -(a * da) if q.requires_grad else None,
                da if a.requires_grad else None)


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


def sum(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """Σ x over ``dim`` (an int, a tuple, or all dims by default)."""
    return Sum(_dims("sum", dim, axis), _keep("sum", keepdim, keepdims))(x)


def mean(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The mean of x over ``dim`` (an int, a tuple, or all dims by default)."""
    return Mean(_dims("mean", dim, axis), _keep("mean", keepdim, keepdims))(x)


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
    index = getattr(x.xp, "arg" + op)(x.data, axis=d, keepdims=True).astype(np.int64, copy=False)
    values = Gather(d, index)(x)  # the gradient goes to the index found, as in PyTorch
    if not keep:
        values, index = reshape(values, values.shape[:d] + values.shape[d + 1:]), index.squeeze(d)
    return ValuesIndices(values, Tensor(index))


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


def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None, ddof=None, axis=None, keepdims=None):
    """Standard deviation √var (same arguments as :func:`var`, unbiased by default);  dx = dvar / (2 std)."""
    if isinstance(dim, (bool, np.bool_)):
        if unbiased is not None:
            raise TypeError(f"std: got unbiased twice ({dim!r} and {unbiased!r})")
        dim, unbiased = None, dim
    ddof = _correction("std", unbiased, correction, ddof)
    return sqrt(Var(_dims("std", dim, axis), _keep("std", keepdim, keepdims), ddof)(x))


def prod(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """Π x over ``dim`` (all dims by default); gradients are right with zeros in x (see :class:`Prod`)."""
    return Prod(_dims("prod", dim, axis), _keep("prod", keepdim, keepdims))(x)


def _arg_extreme(op, x, dim, keepdim, axis, keepdims):
    dim, keep = _dims(op, dim, axis), _keep(op, keepdim, keepdims)
    xp = x.xp
    find = getattr(xp, op)
    if dim is None:
        if x.data.size == 0:
            raise ValueError(f"{op}: cannot search an empty tensor (shape {x.shape})")
        index = find(x.data.reshape(-1)).astype(np.int64)
        return Tensor(index.reshape((1,) * x.ndim) if keep else index)
    (d,) = _one_dim(op, x, dim) or (None,)
    if d is None:  # a 0-d x
        return Tensor(xp.zeros((), np.int64))
    if x.shape[d] == 0:
        raise ValueError(f"{op}: cannot search an empty dim (shape {x.shape}, dim {d})")
    return Tensor(find(x.data, axis=d, keepdims=keep).astype(np.int64, copy=False))


def argmax(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The int64 index of the largest value (flat index without ``dim``); first one on ties; no gradient."""
    return _arg_extreme("argmax", x, dim, keepdim, axis, keepdims)


def argmin(x, dim=None, keepdim=False, *, axis=None, keepdims=None):
    """The int64 index of the smallest value (flat index without ``dim``); first one on ties; no gradient."""
    return _arg_extreme("argmin", x, dim, keepdim, axis, keepdims)


def _logical(op, x, dim, keepdim, axis, keepdims):
    dim, keep = _dims(op, dim, axis), _keep(op, keepdim, keepdims)
    axes = _normalize_axis(dim, x.ndim, op, x.shape)
    return Tensor(getattr(x.xp, op)(x.data, axis=axes, keepdims=keep))


def any(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """True where some value over ``dim`` is nonzero (a bool Tensor, no gradient)."""
    return _logical("any", x, dim, keepdim, axis, keepdims)


def all(x, dim=None, keepdim=False, *, axis=None, keepdims=None):  # noqa: A001
    """True where every value over ``dim`` is nonzero (a bool Tensor, no gradient)."""
    return _logical("all", x, dim, keepdim, axis, keepdims)


def _scan_dim(op, x, dim, axis):
    dim = _dims(op, dim, axis)
    if dim is None:
        raise TypeError(f"{op}: dim is required (PyTorch's signature {op}(x, dim)); "
                        f"for the flattened tensor use {op}(x.reshape(-1), 0)")
    (d,) = _one_dim(op, x, dim) or (None,)
    return d


def cumsum(x, dim=None, *, axis=None):
    """y_i = x_1 + ... + x_i along ``dim``;  dx = the cumsum of dy from the end."""
    d = _scan_dim("cumsum", x, dim, axis)
    return x if d is None else Cumsum(d)(x)


def cumprod(x, dim=None, *, axis=None):
    """y_i = x_1 · ... · x_i along ``dim``; gradients right with zeros (see :class:`Cumprod`)."""
    d = _scan_dim("cumprod", x, dim, axis)
    return x if d is None else Cumprod(d)(x)


def logcumsumexp(x, dim=None, *, axis=None):
    """y_i = log(e^{x_1} + ... + e^{x_i}) along ``dim``, without overflow."""
    d = _scan_dim("logcumsumexp", x, dim, axis)
    return x if d is None else Logcumsumexp(d)(x)
