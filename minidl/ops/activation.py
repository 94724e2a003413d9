"""Activation functions and the softmax family.

Each derivative is written in terms of what forward already computed (the
output y or a mask), so backward costs one or two elementwise passes. The
softmax family subtracts the maximum before exponentiating, so logits of
±1000 give exact, finite results.
"""
from __future__ import annotations

import math

from minidl.autograd import Function, is_grad_enabled
from minidl.backend import xp_of
from minidl.ops.elementwise import exp, where
from minidl.ops.reduction import _normalize_axis
from minidl.ops.reduction import sum as reduce_sum
from minidl.tensor import Tensor


class ReLU(Function):
    """y = max(x, 0);  dx = dy · [x > 0].

    No mask is saved: backward holds x anyway, and recomputing [x > 0] there is
    cheaper than writing a mask and multiplying by it here (one pass in forward).
    """

    def forward(self, x):
        return xp_of(x).maximum(x, 0)

    def backward(self, gy):
        positive = self.inputs[0].data > 0
        if not is_grad_enabled():  # first-order backward: one array product, no node to build
            return Tensor(gy.data * positive)
        return gy * Tensor(positive)


class LeakyReLU(Function):
    """y = x for x > 0, αx otherwise;  dx = dy · (1 or α)."""

    def __init__(self, slope=0.01):
        self.slope = slope

    def forward(self, x):
        self.slopes = xp_of(x).where(x > 0, x.dtype.type(1), x.dtype.type(self.slope))
        return x * self.slopes

    def backward(self, gy):
        return gy * Tensor(self.slopes)


class ELU(Function):
    """y = x for x > 0, α(eˣ − 1) otherwise;  dx = dy · (1 or y + α)."""

    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def forward(self, x):
        xp = xp_of(x)
        self.positive = x > 0
        return xp.where(self.positive, x, self.alpha * xp.expm1(xp.minimum(x, 0)))

    def backward(self, gy):
        return gy * where(self.positive, 1.0, self.output() + self.alpha)


class Tanh(Function):
    """y = tanh x;  dx = dy · (1 − y²)."""

    def forward(self, x):
        return xp_of(x).tanh(x)

    def backward(self, gy):
        y = self.output()
        if not is_grad_enabled():  # first-order backward: plain array arithmetic, no nodes
            return Tensor(gy.data * (1 - y.data * y.data))
        return gy * (1 - y * y)


class Sigmoid(Function):
    """y = 1 / (1 + e⁻ˣ) (computed as ½ tanh(x/2) + ½, stable for any x);  dx = dy · y(1 − y)."""

    def forward(self, x):
        return xp_of(x).tanh(x * 0.5) * 0.5 + 0.5

    def backward(self, gy):
        y = self.output()
        if not is_grad_enabled():
            return Tensor(gy.data * y.data * (1 - y.data))
        return gy * y * (1 - y)


class Softplus(Function):
    """y = ln(1 + eˣ) (as max(x, 0) + ln(1 + e^−|x|));  dx = dy · σ(x)."""

    def forward(self, x):
        xp = xp_of(x)
        return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))

    def backward(self, gy):
        return gy * sigmoid(self.inputs[0])


class GELU(Function):
    """Gaussian error linear unit, y = x Φ(x).

    exact:  Φ(x) = ½(1 + erf(x/√2)),      dy/dx = Φ(x) + x φ(x)
    tanh:   Φ(x) ≈ ½(1 + tanh(u)), u = √(2/π)(x + 0.044715x³),
            dy/dx = ½(1 + t) + ½x(1 − t²) √(2/π)(1 + 3·0.044715x²)
    """

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        return x * _gelu_cdf(x, self.approximate)

    def backward(self, gy):
        return gy * GELUGrad(self.approximate)(self.inputs[0])


class GELUGrad(Function):
    """y = d gelu(x)/dx (see GELU);  dx = dy · d²gelu/dx² (checked by gradgradcheck)."""

    def __init__(self, approximate):
        self.approximate = approximate

    def forward(self, x):
        xp = xp_of(x)
        if self.approximate == "tanh":
            c = math.sqrt(2 / math.pi)
            t = xp.tanh(c * (x + 0.044715 * x ** 3))
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)
        return _gelu_cdf(x, "none") + x * xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)

    def backward(self, gy):
        x = self.inputs[0].data
        xp = xp_of(x)
        if self.approximate == "tanh":
            c, k = math.sqrt(2 / math.pi), 0.044715
            u = c * (x + k * x ** 3)
            t = xp.tanh(u)
            du = c * (1 + 3 * k * x * x)
            second = (1 - t * t) * du + 0.5 * x * (-2 * t * (1 - t * t) * du * du + (1 - t * t) * c * 6 * k * x)
        else:
            second = xp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) * (2 - x * x)
        return gy * Tensor(second.astype(x.dtype, copy=False))


def _gelu_cdf(x, approximate):
    xp = xp_of(x)
    if approximate == "tanh":
        return 0.5 * (1 + xp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * (1 + _erf(x / math.sqrt(2)))


def _erf(x):
    xp = xp_of(x)
    if xp.__name__ == "numpy":
        try:
            from scipy.special import erf  # exact when SciPy is installed
            return erf(x).astype(x.dtype, copy=False)
        except ImportError:
            return _erf_series(x)
    import cupyx.scipy.special
    return cupyx.scipy.special.erf(x)


def _erf_series(x):
    """erf through Python's math.erf, element by element: exact but slow (install SciPy for speed)."""
    import numpy as np
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


class Softmax(Function):
    """y_i = e^(x_i − max x) / Σ_j e^(x_j − max x);  dx = y ⊙ (dy − Σ_j dy_j y_j)."""

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        _check_axis("softmax", x, self.axis)
        xp = xp_of(x)
        e = xp.exp(x - x.max(axis=self.axis, keepdims=True))
        e /= e.sum(axis=self.axis, keepdims=True)
        return e

    def backward(self, gy):
        y = self.output()
        if not is_grad_enabled():  # first-order backward: the same line on arrays, no nodes
            g, y = gy.data, y.data
            return Tensor(y * (g - (g * y).sum(axis=self.axis, keepdims=True)))
        return y * (gy - reduce_sum(gy * y, axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    """y = (x − m) − ln Σ e^(x − m), m = max x;  dx = dy − softmax(x) Σ_j dy_j.

    Subtracting m first, not x − logsumexp(x), keeps float32 exact near ±1000:
    m + ln Σ would round to the float32 spacing at 1000 (6e-5) before the difference.
    """

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        _check_axis("log_softmax", x, self.axis)
        shifted = x - _finite_max(x, self.axis)
        xp = xp_of(x)
        return shifted - xp.log(xp.exp(shifted).sum(axis=self.axis, keepdims=True))

    def backward(self, gy):
        if not is_grad_enabled():  # first-order backward: the same line on arrays, no nodes
            g = gy.data
            return Tensor(g - xp_of(g).exp(self.output().data) * g.sum(axis=self.axis, keepdims=True))
        softmax_x = exp(self.output())
        return gy - softmax_x * reduce_sum(gy, axis=self.axis, keepdims=True)


class LogSumExp(Function):
    """y = m + ln Σ e^(x − m), m = max x;  dx = dy · softmax(x)."""

    def __init__(self, axis=-1, keepdims=False):
        self.axis, self.keepdims = axis, keepdims

    def forward(self, x):
        _check_axis("logsumexp", x, self.axis)
        y = _logsumexp(x, self.axis)
        return y if self.keepdims else y.squeeze(axis=self.axis)

    def backward(self, gy):
        x = self.inputs[0]
        if not self.keepdims:
            axes = _normalize_axis(self.axis, x.ndim)  # axis may be None, negative or a tuple
            gy = gy.reshape(tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
        # softmax(x), not e^(x − y): y ≈ 1000 is rounded to float32's spacing there (6e-5)
        return gy * Softmax(self.axis)(x)


def _check_axis(op, x, axis):
    """A ValueError naming the op and the shape when ``axis`` does not exist in x."""
    if not (type(axis) is int and -x.ndim <= axis < x.ndim):  # the common case costs one test
        _normalize_axis(axis, x.ndim, op, x.shape)


def _finite_max(x, axis):
    """max x over axis (keepdims), 0 where it is ±inf: a row of all −inf stays −inf instead of NaN."""
    xp = xp_of(x)
    m = x.max(axis=axis, keepdims=True)
    return xp.where(xp.isfinite(m), m, 0)


def _logsumexp(x, axis):
    """logsumexp with keepdims=True; the max shift keeps e^(·) ≤ 1 (no overflow at ±1000)."""
    xp = xp_of(x)
    m = _finite_max(x, axis)
    return m + xp.log(xp.exp(x - m).sum(axis=axis, keepdims=True))


# ---------------------------------------------------------------- functional forms
def relu(x):
    return ReLU()(x)


def leaky_relu(x, negative_slope=0.01):
    return LeakyReLU(negative_slope)(x)


def elu(x, alpha=1.0):
    return ELU(alpha)(x)


def tanh(x):
    return Tanh()(x)


def sigmoid(x):
    return Sigmoid()(x)


def softplus(x):
    return Softplus()(x)


def gelu(x, approximate="none"):
    """GELU, exact (erf) by default or with PyTorch's ``approximate='tanh'``."""
    return GELU(approximate)(x)


def softmax(x, axis=-1, *, dim=None):
    return Softmax(axis if dim is None else dim)(x)


def log_softmax(x, axis=-1, *, dim=None):
    return LogSoftmax(axis if dim is None else dim)(x)


def logsumexp(x, axis=-1, keepdims=False, *, dim=None, keepdim=None):
    return LogSumExp(axis if dim is None else dim, keepdims if keepdim is None else keepdim)(x)
