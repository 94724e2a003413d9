"""Scans along one dim: cumsum, cumprod, logcumsumexp (y keeps x's shape).

y_i combines x_1..x_i along ``dim`` (from the end when ``reverse``), so the
gradient of x_j gathers dy_i from every i ≥ j: each backward is a scan run
the other way. ``reverse`` is how the ops below run backwards; the public
functions scan forward, as PyTorch's do.

    cumsum:        y_i = Σ_{j≤i} x_j,             dx_j = Σ_{i≥j} dy_i
    cumprod:       y_i = Π_{j≤i} x_j,             dx_k = (Π_{j<k} x_j) · Σ_{i≥k} dy_i Π_{k<j≤i} x_j
    logcumsumexp:  y_i = ln Σ_{j≤i} e^(x_j),      dx_j = Σ_{i≥j} dy_i e^(x_j − y_i)
    cummax:        y_i = max_{j≤i} x_j = x_{k(i)},  dx_j = Σ_{i: k(i) = j} dy_i   (cummin alike)

cummax and cummin find k(i) on the raw array (no gradient: indices are
integers) and take their values with gather, so their gradient is gather's.
"""
from __future__ import annotations

import numpy as np

from minidl.autocast_mode import autocast_to
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.indexing import Gather, ValuesIndices, _dim
from minidl.ops.shape import concatenate
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")


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

    def jvp(self, dx):
        """dy = cumsum(dx) (the same direction)."""
        return Cumsum(self.dim, self.reverse)(dx)


@autocast_to("float32")
def cumsum(x, dim=None, *, axis=None):
    """y_i = x_1 + ... + x_i along ``dim``;  dx = the cumsum of dy from the end."""
    d = _scan_dim("cumsum", x, dim, axis)
    return x if d is None else Cumsum(d)(x)


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

    def jvp(self, dx):
        """dy_i = x_i dy_{i−1} + y_{i−1} dx_i (the product rule on y_i = y_{i−1} x_i: a LinearScan)."""
        x = self.inputs[0]
        if x.shape[self.dim] == 0:
            return dx
        before = _shifted(self.output(), self.dim, self.reverse, 1, later=True)
        return LinearScan(self.dim, self.reverse)(x, before * dx)


@autocast_to("float32")
def cumprod(x, dim=None, *, axis=None):
    """y_i = x_1 · ... · x_i along ``dim``; gradients right with zeros (see :class:`Cumprod`)."""
    d = _scan_dim("cumprod", x, dim, axis)
    return x if d is None else Cumprod(d)(x)


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

    def jvp(self, da, db):
        """dz_k = db_k + da_k z_{k−1} + a_k dz_{k−1} (the same recurrence)."""
        a = self.inputs[0]
        before = None if da is None else da * _shifted(self.output(), self.dim, self.reverse, 0, later=True)
        return LinearScan(self.dim, self.reverse)(a, tangent_sum(db, before))


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

    def jvp(self, dx):
        """dy_i = Σ_{j≤i} dx_j e^(x_j − y_i) (a LogcumsumexpGrad with p = −y, q = −x, a = dx)."""
        return LogcumsumexpGrad(self.dim, reverse=False)(-self.output(), -self.inputs[0], dx)


def logcumsumexp(x, dim=None, *, axis=None):
    """y_i = log(e^{x_1} + ... + e^{x_i}) along ``dim``, without overflow."""
    d = _scan_dim("logcumsumexp", x, dim, axis)
    return x if d is None else Logcumsumexp(d)(x)


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

    def jvp(self, dp, dq, da):
        """dz = dp ⊙ z + the same op applied to a = da − a ⊙ dq."""
        p, q, a = self.inputs
        inner = tangent_sum(da, None if dq is None else -(a * dq))
        return tangent_sum(None if dp is None else dp * self.output(),
                           None if inner is None else LogcumsumexpGrad(self.dim, self.reverse)(p, q, inner))


def _scan_dim(op, x, dim, axis):
    """The one dim to scan (PyTorch requires it; NumPy's ``axis`` is accepted), None for a 0-d x."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}: got dim={dim!r} and axis={axis!r}; pass one of them (axis is NumPy's name for dim)")
        dim = axis
    if dim is None:
        raise TypeError(f"{op}: dim is required (PyTorch's signature {op}(x, dim)); "
                        f"for the flattened tensor use {op}(x.reshape(-1), 0)")
    d = _dim(op, dim, x.ndim, x.shape)
    return d if x.ndim else None


def _running(xp, a, dim, combine):
    """``combine`` (max or min, NaN propagating) of each prefix along ``dim``, on arrays.

    Hillis and Steele's doubling, as :func:`_linear_scan`: after the step of size s each
    place holds the combination of the 2s places up to it; log2(n) steps, on either device.
    """
    n, step = a.shape[dim], 1
    lead = (slice(None),) * dim
    while step < n:
        here, back = lead + (slice(step, n),), lead + (slice(0, n - step),)
        combined = a.copy()
        combined[here] = combine(a[here], a[back])
        a, step = combined, 2 * step
    return a


def _running_extreme(op, x, dim, axis):
    """cummax and cummin: ``(values, indices)``, the index of the latest extreme (as PyTorch's ``>=``)."""
    d = _scan_dim(op, x, dim, axis)
    xp = x.xp
    if d is None:  # a 0-d x: itself, at index 0
        return ValuesIndices(x.reshape(()), Tensor(xp.zeros((), np.int64)))
    data = x.array
    extreme = _running(xp, data, d, xp.maximum if op == "cummax" else xp.minimum)
    # x_i is a new extreme (ties included) where it equals the running one; NaN is always one
    new = (data == extreme) | (data != data)
    positions = xp.arange(data.shape[d]).reshape((-1,) + (1,) * (data.ndim - d - 1))
    index = _running(xp, xp.where(new, positions, 0), d, xp.maximum).astype(np.int64, copy=False)
    indices = Tensor(index)
    return ValuesIndices(Gather(d, indices)(x), indices)


def cummax(x, dim=None, *, axis=None):
    """``(values, indices)``: y_i = max(x_1, ..., x_i) along ``dim`` and the index it was found at.

    On ties the later index, as PyTorch; NaN propagates (and its index stays). The gradient goes to
    the index found (a gather's), as in PyTorch.
    """
    return _running_extreme("cummax", x, dim, axis)


def cummin(x, dim=None, *, axis=None):
    """``(values, indices)``: y_i = min(x_1, ..., x_i) along ``dim``; see :func:`cummax`."""
    return _running_extreme("cummin", x, dim, axis)
