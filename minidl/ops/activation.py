"""Activation functions and the softmax family.

Each derivative is written in terms of what forward already computed (the
output y or a mask), so backward costs one or two elementwise passes. The
softmax family subtracts the maximum before exponentiating, so logits of
±1000 give exact, finite results.

Several activations of PyTorch's vocabulary are compositions of these ops and
the elementwise ones, exact as written, their gradients those of the pieces:
silu = x·σ(x), mish = x·tanh(softplus(x)), selu = λ·elu(x, α), relu6,
hardsigmoid and hardswish through hardtanh, softsign = x/(1 + |x|),
softmin = softmax(−x), glu = a·σ(b) and prelu = where(x > 0, x, a·x).
"""
from __future__ import annotations

import math

from minidl import array_kernels, autograd, backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.elementwise import abs, exp, where
from minidl.ops.reduction import _normalize_axis
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import getitem, reshape
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("relu", "sigmoid", "tanh", "softmax", "log_softmax", "logsumexp", "prelu")


class ReLU(Function):
    """y = max(x, 0);  dx = dy · [x > 0].

    No mask is saved: backward holds x anyway, and recomputing [x > 0] there is
    cheaper than writing a mask and multiplying by it here (one pass in forward).
    """

    def forward(self, x):
        return xp_of(x).maximum(x, 0)

    def backward(self, gy):
        return ReLUGrad()(gy, self.inputs[0])

    def jvp(self, dx):
        """dy = dx · [x > 0]."""
        return ReLUGrad()(dx, self.inputs[0])


def relu(x, inplace=False):
    return _result("relu", x, ReLU()(x), inplace)


class ReLUGrad(Function):
    """ReLU's gradient as an op of (dy, x), the mask m = [x > 0] read from x:  z = dy · m;  d(dy) = dz · m.

    The mask is piecewise constant, so z has no derivative with respect to x
    (almost everywhere): x is an input (so that a traced step reads each call's x)
    that gets no gradient.
    """

    def forward(self, gy, x):
        return gy * (x > 0)

    def backward(self, gz):
        return ReLUGrad()(gz, self.inputs[1]), None

    def jvp(self, dgy, dx=None):
        """(linear in dy): dz = d(dy) · m."""
        return None if dgy is None else ReLUGrad()(dgy, self.inputs[1])


class LeakyReLU(Function):
    """y = x for x > 0, αx otherwise;  dx = dy · (1 or α)."""
    saved_inputs = ()
    saved_arrays = ("slopes",)

    def __init__(self, slope=0.01):
        self.slope = slope

    def forward(self, x):
        self.slopes = xp_of(x).where(x > 0, x.dtype.type(1), x.dtype.type(self.slope))
        return x * self.slopes

    def backward(self, gy):
        return gy * Tensor(self.slopes)

    def jvp(self, dx):
        """dy = dx · (1 or α)."""
        return dx * Tensor(self.slopes)


def leaky_relu(x, negative_slope=0.01, inplace=False):
    return _result("leaky_relu", x, LeakyReLU(negative_slope)(x), inplace)


class ELU(Function):
    """y = x for x > 0, α(eˣ − 1) otherwise;  dx = dy · (1 or y + α)."""
    saved_inputs = ()
    saved_arrays = ("positive",)

    def __init__(self, alpha=1.0):
        self.alpha = alpha

    def forward(self, x):
        xp = xp_of(x)
        self.positive = x > 0
        return xp.where(self.positive, x, self.alpha * xp.expm1(xp.minimum(x, 0)))

    def backward(self, gy):
        return gy * where(self.positive, 1.0, self.output() + self.alpha)

    def jvp(self, dx):
        """dy = dx · (1 or y + α)."""
        return dx * where(self.positive, 1.0, self.output() + self.alpha)


def elu(x, alpha=1.0, inplace=False):
    return _result("elu", x, ELU(alpha)(x), inplace)


def selu(x, inplace=False):
    """y = λ·elu(x, α) with the self-normalizing constants α ≈ 1.6733, λ ≈ 1.0507 (Klambauer et al. 2017)."""
    return _result("selu", x, ELU(SELU_ALPHA)(x) * SELU_SCALE, inplace)


class Tanh(Function):
    """y = tanh x;  dx = dy · (1 − y²)."""
    saved_inputs = ()

    def forward(self, x):
        return xp_of(x).tanh(x)

    def backward(self, gy):
        return TanhGrad()(self.output(), gy)

    def jvp(self, dx):
        """dy = dx · (1 − y²)."""
        return TanhGrad()(self.output(), dx)


def tanh(x):
    return Tanh()(x)


class TanhGrad(Function):
    """Tanh's gradient as an op of (y, dy):  z = dy · (1 − y²);
    d(dy) = dz · (1 − y²),  dy_out = −2 · dz · dy · y  (dy_out: the gradient reaching y).
    """

    def forward(self, y, gy):
        return gy * (1 - y * y)

    def backward(self, gz):
        y, gy = self.inputs
        return -2 * gz * gy * y, gz * (1 - y * y)

    def jvp(self, d_y, d_gy):
        """dz = d(dy) · (1 − y²) − 2 · dy · y · d(y)."""
        y, gy = self.inputs
        return tangent_sum(None if d_gy is None else d_gy * (1 - y * y), None if d_y is None else -2 * gy * y * d_y)


class Sigmoid(Function):
    """y = 1 / (1 + e⁻ˣ) (computed as ½ tanh(x/2) + ½, stable for any x);  dx = dy · y(1 − y)."""
    saved_inputs = ()

    def forward(self, x):
        return xp_of(x).tanh(x * 0.5) * 0.5 + 0.5

    def backward(self, gy):
        return SigmoidGrad()(self.output(), gy)

    def jvp(self, dx):
        """dy = dx · y(1 − y)."""
        return SigmoidGrad()(self.output(), dx)


def sigmoid(x):
    return Sigmoid()(x)


class SigmoidGrad(Function):
    """Sigmoid's gradient as an op of (y, dy):  z = dy · y(1 − y);
    d(dy) = dz · y(1 − y),  dy_out = dz · dy · (1 − 2y).
    """

    def forward(self, y, gy):
        return gy * y * (1 - y)

    def backward(self, gz):
        y, gy = self.inputs
        return gz * gy * (1 - 2 * y), gz * y * (1 - y)

    def jvp(self, d_y, d_gy):
        """dz = d(dy) · y(1 − y) + dy · (1 − 2y) · d(y)."""
        y, gy = self.inputs
        return tangent_sum(None if d_gy is None else d_gy * y * (1 - y),
                           None if d_y is None else gy * (1 - 2 * y) * d_y)


class Softplus(Function):
    """y = ln(1 + e^(βx)) / β (as (max(βx, 0) + ln(1 + e^−|βx|)) / β), and y = x where βx > threshold;
    dx = dy · σ(βx) = dy · e^(β(x − y)), which is dy where βx > threshold (there y = x).

    e^(β(x − y)) is σ(βx) to full relative precision at any x (e^−50 at x = −50, where
    ½ tanh(x/2) + ½ rounds to 0). ``threshold=None`` (the default of this class, which the
    losses use) has no linear region; ``F.softplus`` passes PyTorch's threshold=20.
    """

    def __init__(self, beta=1.0, threshold=None):
        self.beta = float(beta)
        self.threshold = None if threshold is None else float(threshold)

    def forward(self, x):
        xp = xp_of(x)
        z = x if self.beta == 1 else x * self.beta
        y = xp.maximum(z, 0) + xp.log1p(xp.exp(-xp.abs(z)))
        if self.beta != 1:
            y /= self.beta
        if self.threshold is None:
            return y
        return xp.where(z > self.threshold, x, y)

    def backward(self, gy):
        gap = self.inputs[0] - self.output()
        return gy * exp(gap if self.beta == 1 else gap * self.beta)

    def jvp(self, dx):
        """dy = dx · e^(β(x − y))."""
        gap = self.inputs[0] - self.output()
        return dx * exp(gap if self.beta == 1 else gap * self.beta)


def softplus(x, beta=1.0, threshold=20.0):
    """ln(1 + e^(βx)) / β, and x itself where βx > threshold (PyTorch's semantics and defaults)."""
    return Softplus(beta, threshold)(x)


def mish(x, inplace=False):
    """y = x tanh(softplus(x)), with softplus stable for any x (no linear cut-off)."""
    return _result("mish", x, x * tanh(Softplus()(x)), inplace)


class LogSigmoid(Function):
    """y = ln σ(x) = min(x, 0) − ln(1 + e^−|x|) (finite for any x);  dx = dy · σ(−x) = dy · e^(y − x).

    e^(y − x) is σ(−x) to full relative precision at any x (e^−50 at x = 50).
    """

    def forward(self, x):
        xp = xp_of(x)
        return xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))

    def backward(self, gy):
        return gy * exp(self.output() - self.inputs[0])

    def jvp(self, dx):
        """dy = dx · e^(y − x)."""
        return dx * exp(self.output() - self.inputs[0])


def logsigmoid(x):
    """y = ln σ(x), finite and exact for any x (no log of an underflowed σ)."""
    return LogSigmoid()(x)


class CELU(Function):
    """y = x for x > 0, α(e^(x/α) − 1) otherwise;  dx = dy · (1 or y/α + 1)."""
    saved_inputs = ()
    saved_arrays = ("positive",)

    def __init__(self, alpha=1.0):
        if alpha == 0:
            raise ValueError("celu: alpha cannot be 0 (the formula divides by it)")
        self.alpha = float(alpha)

    def forward(self, x):
        xp = xp_of(x)
        self.positive = x > 0
        return xp.where(self.positive, x, self.alpha * xp.expm1(xp.minimum(x, 0) / self.alpha))

    def backward(self, gy):
        return gy * where(self.positive, 1.0, self.output() / self.alpha + 1)

    def jvp(self, dx):
        """dy = dx · (1 or y/α + 1)."""
        return dx * where(self.positive, 1.0, self.output() / self.alpha + 1)


def celu(x, alpha=1.0, inplace=False):
    """y = x for x > 0, α(e^(x/α) − 1) otherwise (α = ``alpha``)."""
    return _result("celu", x, CELU(alpha)(x), inplace)


class Hardtanh(Function):
    """y = min(max(x, lo), hi);  dx = dy where lo < x < hi, else 0 (0 at the kinks, as PyTorch)."""
    saved_inputs = ()
    saved_arrays = ("inside",)

    def __init__(self, lo=-1.0, hi=1.0):
        self.lo, self.hi = lo, hi

    def forward(self, x):
        self.inside = ((x > self.lo) & (x < self.hi)).astype(x.dtype)
        return xp_of(x).clip(x, self.lo, self.hi)

    def backward(self, gy):
        return gy * Tensor(self.inside)

    def jvp(self, dx):
        """dy = dx where lo < x < hi, else 0."""
        return dx * Tensor(self.inside)


def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _result("hardtanh", x, Hardtanh(min_val, max_val)(x), inplace)


def relu6(x, inplace=False):
    """y = min(max(x, 0), 6)."""
    return _result("relu6", x, Hardtanh(0.0, 6.0)(x), inplace)


def hardsigmoid(x, inplace=False):
    """y = min(max(x + 3, 0), 6) / 6: 0 below −3, 1 above 3, x/6 + ½ between."""
    return _result("hardsigmoid", x, Hardtanh(0.0, 6.0)(x + 3) / 6, inplace)


def hardswish(x, inplace=False):
    """y = x · min(max(x + 3, 0), 6) / 6 (MobileNetV3); dx = 0 below −3, x/3 + ½ between, 1 above 3."""
    return _result("hardswish", x, x * Hardtanh(0.0, 6.0)(x + 3) / 6, inplace)


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
_GELU_K = 0.044715  # the tanh form's cubic coefficient (Hendrycks & Gimpel 2016)


class GELU(Function):
    """Gaussian error linear unit, y = x Φ(x).

    exact:  Φ(x) = ½(1 + erf(x/√2)),      dy/dx = Φ(x) + x φ(x)
    tanh:   Φ(x) ≈ ½(1 + tanh(u)), u = √(2/π)(x + 0.044715x³),
            dy/dx = ½(1 + t) + ½x(1 − t²) √(2/π)(1 + 3·0.044715x²)

    Forward keeps Φ(x) (``cdf``) for the backward: an erf costs about as much as the rest of
    the op, so computing it once per step instead of twice is worth one more activation-sized
    array. Forward and the gradient op each fill one new buffer in place (NumPy cannot fuse
    a formula into one pass; this keeps every pass in cache and allocates once).
    """
    saved_arrays = ("cdf",)

    def __init__(self, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x):
        self.cdf = _gelu_cdf(x, self.approximate)
        return x * self.cdf

    def backward(self, gy):
        return gy * GELUGrad(self.approximate, self.cdf)(self.inputs[0])

    def jvp(self, dx):
        """dy = dx · dgelu/dx."""
        return dx * GELUGrad(self.approximate, self.cdf)(self.inputs[0])


def gelu(x, approximate="none"):
    """GELU, exact (erf) by default or with PyTorch's ``approximate='tanh'``."""
    return GELU(approximate)(x)


class GELUGrad(Function):
    """z = d gelu(x)/dx (see GELU);  dx = dz · d²gelu/dx², written with Tensor ops so that it
    can be differentiated again:
    exact:  d²gelu/dx² = φ(x)(2 − x²)
    tanh:   d²gelu/dx² = (1 − t²) u′ + ½x(−2t(1 − t²) u′² + (1 − t²) u″),
            u′ = √(2/π)(1 + 3·0.044715x²),  u″ = √(2/π)·6·0.044715x

    ``cdf`` is Φ(x) as GELU's forward computed it, for this same x (computed here if not given).
    """
    saved_arrays = ("cdf",)

    def __init__(self, approximate, cdf=None):
        self.approximate, self.cdf = approximate, cdf

    def forward(self, x):
        cdf = _gelu_cdf(x, self.approximate) if self.cdf is None else self.cdf
        xp = xp_of(x)
        z = xp.empty_like(x)  # each result is written into a new array (for a 0-d x, x * x is a scalar)
        if self.approximate == "tanh":  # ½(1 − t²) = 2Φ(1 − Φ), with t = tanh(u) = 2Φ − 1
            xp.subtract(1, cdf, out=z)
            z *= cdf
            z *= x
            slope = xp.multiply(x, x, out=xp.empty_like(x))  # u′ = √(2/π)(1 + 3·0.044715x²), doubled
            slope *= 2 * _SQRT_2_OVER_PI * 3 * _GELU_K
            slope += 2 * _SQRT_2_OVER_PI
            z *= slope
        else:  # x φ(x) = x e^(−x²/2) / √(2π)
            xp.multiply(x, x, out=z)
            z *= -0.5
            xp.exp(z, out=z)
            z *= x
            z *= 1 / math.sqrt(2 * math.pi)
        z += cdf
        return z

    def backward(self, gz):
        return gz * self.second_derivative()

    def second_derivative(self) -> Tensor:
        """d²gelu/dx² at this op's x, in Tensor ops (see the class docstring)."""
        x = self.inputs[0]
        if self.approximate == "tanh":
            c, k = _SQRT_2_OVER_PI, _GELU_K
            t = tanh(c * (x + k * x * x * x))
            sech2 = 1 - t * t
            du = c * (1 + 3 * k * x * x)
            second = sech2 * du + 0.5 * x * (-2 * t * sech2 * du * du + sech2 * (c * 6 * k) * x)
        else:
            second = exp(-0.5 * x * x) * (2 - x * x) / math.sqrt(2 * math.pi)
        return second

    def jvp(self, dx):
        """dz = dx · d²gelu/dx²."""
        return dx * self.second_derivative()


def _gelu_cdf(x, approximate):
    """Φ(x) on arrays, one new buffer changed in place (x³ as x·x·x, never a general power):
    tanh: ½(1 + tanh(u)), u = x(√(2/π) + √(2/π)·0.044715·x²);  exact: ½(1 + erf(x/√2))."""
    if approximate == "tanh":
        xp = xp_of(x)
        u = xp.multiply(x, x, out=xp.empty_like(x))  # a new array, also for a 0-d x
        u *= _SQRT_2_OVER_PI * _GELU_K
        u += _SQRT_2_OVER_PI
        u *= x
        xp.tanh(u, out=u)
    else:
        u = backend.erf(x * (1 / math.sqrt(2)))
    u += 1
    u *= 0.5
    return u


class Softmax(Function):
    """y_i = e^(x_i − max x) / Σ_j e^(x_j − max x);  dx = y ⊙ (dy − Σ_j dy_j y_j)."""
    saved_inputs = ()

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        _check_axis("softmax", x, self.axis)
        e = x - x.max(axis=self.axis, keepdims=True)  # the one new array: exp and the division in place
        xp_of(x).exp(e, out=e)
        e /= _sum_along(e, self.axis)
        return e

    def backward(self, gy):
        return SoftmaxGrad(self.axis)(self.output(), gy)

    def jvp(self, dx):
        """dy = y ⊙ (dx − Σ_j dx_j y_j) (the Jacobian is symmetric: the same op as dx)."""
        return SoftmaxGrad(self.axis)(self.output(), dx)


@autocast_to("float32")
def softmax(x, dim=None, _stacklevel=3, dtype=None, *, axis=None):
    """softmax along ``dim`` (``axis`` is an alias); ``dtype`` casts x first, as in PyTorch."""
    x = x if dtype is None else x.astype(dtype)
    return Softmax(_softmax_dim("softmax", x, dim, axis))(x)


@autocast_to("float32")
def softmin(x, dim=None, _stacklevel=3, dtype=None, *, axis=None):
    """softmin(x) = softmax(−x) along ``dim``."""
    x = x if dtype is None else x.astype(dtype)
    return Softmax(_softmax_dim("softmin", x, dim, axis))(-x)


class SoftmaxGrad(Function):
    """Softmax's gradient as an op of (y, dy), s = Σ_j dy_j y_j:  z = y ⊙ (dy − s);
    d(dy) = y ⊙ (dz − Σ_j dz_j y_j)  (the Jacobian is symmetric),
    dy_out = dz ⊙ (dy − s) − dy · Σ_j dz_j y_j.
    """

    def __init__(self, axis):
        self.axis = axis

    def forward(self, y, gy):
        z = gy - _dot_along(gy, y, self.axis)
        z *= y
        return z

    def backward(self, gz):
        y, gy = self.inputs
        s = reduce_sum(gy * y, axis=self.axis, keepdims=True)
        gz_dot_y = reduce_sum(gz * y, axis=self.axis, keepdims=True)
        return gz * (gy - s) - gy * gz_dot_y, SoftmaxGrad(self.axis)(y, gz)

    def jvp(self, d_y, d_gy):
        """dz = y ⊙ (d(dy) − Σ_j d(dy)_j y_j) + d(y) ⊙ (dy − s) − y · Σ_j dy_j d(y)_j."""
        y, gy = self.inputs
        terms = [None if d_gy is None else SoftmaxGrad(self.axis)(y, d_gy)]
        if d_y is not None:
            s = reduce_sum(gy * y, axis=self.axis, keepdims=True)
            terms.append(d_y * (gy - s) - y * reduce_sum(gy * d_y, axis=self.axis, keepdims=True))
        return tangent_sum(*terms)


class LogSoftmax(Function):
    """y = (x − m) − ln Σ e^(x − m), m = max x;  dx = dy − softmax(x) Σ_j dy_j.

    Subtracting m first, not x − logsumexp(x), keeps float32 exact near ±1000:
    m + ln Σ would round to the float32 spacing at 1000 (6e-5) before the difference.
    """
    saved_inputs = ()

    def __init__(self, axis=-1):
        self.axis = axis

    def forward(self, x):
        _check_axis("log_softmax", x, self.axis)
        shifted = x - _finite_max(x, self.axis)
        xp = xp_of(x)
        total = _sum_along(xp.exp(shifted), self.axis)
        shifted -= xp.log(total)
        return shifted

    def backward(self, gy):
        return LogSoftmaxGrad(self.axis)(self.output(), gy)

    def jvp(self, dx):
        """dy = dx − Σ_j softmax(x)_j dx_j."""
        return dx - reduce_sum(exp(self.output()) * dx, axis=self.axis, keepdims=True)


@autocast_to("float32")
def log_softmax(x, dim=None, _stacklevel=3, dtype=None, *, axis=None):
    """log softmax along ``dim`` (``axis`` is an alias), exact for logits of ±1000."""
    x = x if dtype is None else x.astype(dtype)
    return LogSoftmax(_softmax_dim("log_softmax", x, dim, axis))(x)


class LogSoftmaxGrad(Function):
    """LogSoftmax's gradient as an op of (y, dy), p = eʸ = softmax(x), S = Σ_j dy_j:  z = dy − p S;
    d(dy) = dz − Σ_j dz_j p_j,  dy_out = −dz ⊙ p S.
    """

    def __init__(self, axis):
        self.axis = axis

    def forward(self, y, gy):
        z = xp_of(y).exp(y)
        z *= _sum_along(gy, self.axis)
        xp_of(y).subtract(gy, z, out=z)
        return z

    def backward(self, gz):
        y, gy = self.inputs
        p = exp(y)
        total = reduce_sum(gy, axis=self.axis, keepdims=True)
        return -gz * p * total, gz - reduce_sum(gz * p, axis=self.axis, keepdims=True)

    def jvp(self, d_y, d_gy):
        """dz = d(dy) − p Σ_j d(dy)_j − (p ⊙ d(y)) S."""
        y, gy = self.inputs
        p = exp(y)
        terms = [None if d_gy is None else d_gy - p * reduce_sum(d_gy, axis=self.axis, keepdims=True)]
        if d_y is not None:
            terms.append(-(p * d_y) * reduce_sum(gy, axis=self.axis, keepdims=True))
        return tangent_sum(*terms)


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

    def jvp(self, dx):
        """dy = Σ softmax(x) ⊙ dx over the axis."""
        return reduce_sum(Softmax(self.axis)(self.inputs[0]) * dx, axis=self.axis, keepdims=self.keepdims)


def logsumexp(x, axis=-1, keepdims=False, *, dim=None, keepdim=None):
    return LogSumExp(axis if dim is None else dim, keepdims if keepdim is None else keepdim)(x)


def _check_axis(op, x, axis):
    """A ValueError naming the op and the shape when ``axis`` does not exist in x."""
    if not (type(axis) is int and -x.ndim <= axis < x.ndim):  # the common case costs one test
        _normalize_axis(axis, x.ndim, op, x.shape)


def _finite_max(x, axis):
    """max x over axis (keepdims), 0 where it is ±inf: a row of all −inf stays −inf instead of NaN."""
    xp = xp_of(x)
    m = x.max(axis=axis, keepdims=True)
    return xp.where(xp.isfinite(m), m, 0)


def _sum_along(x, axis):
    """x summed along one axis, keepdims; the last axis of short rows by one einsum (minidl.array_kernels)."""
    if axis == -1 or axis == x.ndim - 1:
        return array_kernels.sum_trailing(x, 1)
    return x.sum(axis=axis, keepdims=True)


def _dot_along(a, b, axis):
    """Σ a·b along one axis, keepdims, without the a·b temporary for short last-axis rows."""
    if axis == -1 or axis == a.ndim - 1:
        return array_kernels.dot_trailing(a, b, 1)
    return (a * b).sum(axis=axis, keepdims=True)


def _logsumexp(x, axis):
    """logsumexp with keepdims=True; the max shift keeps e^(·) ≤ 1 (no overflow at ±1000)."""
    xp = xp_of(x)
    m = _finite_max(x, axis)
    return m + xp.log(xp.exp(x - m).sum(axis=axis, keepdims=True))


# ---------------------------------------------------------------- functional forms
# Signatures and defaults are PyTorch's. ``inplace=True`` writes the result into x and
# returns x, as PyTorch does; minidl records no in-place op in a graph, so it is refused
# (a RuntimeError) when x requires grad and gradients are being recorded.


def silu(x, inplace=False):
    """SiLU (swish): y = x σ(x)."""
    return _result("silu", x, x * sigmoid(x), inplace)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def softsign(x):
    """y = x / (1 + |x|)."""
    return x / (1 + abs(x))


def glu(x, dim=-1):
    """Gated linear unit: x split in halves a, b along ``dim``;  y = a · σ(b)."""
    if x.ndim == 0:
        raise ValueError("glu: a 0-d input has no dimension to halve; give a tensor of at least one axis")
    axis = _normalize_axis(int(dim), x.ndim, "glu", x.shape)[0]
    if x.shape[axis] % 2:
        raise ValueError(f"glu: the halved dimension must have an even size, but dimension {dim} "
                         f"of the input of shape {x.shape} has size {x.shape[axis]}")
    half = x.shape[axis] // 2
    before = (slice(None),) * axis
    return getitem(x, before + (slice(0, half),)) * sigmoid(getitem(x, before + (slice(half, None),)))


def prelu(x, weight):
    """y = x for x > 0, a·x otherwise, a = ``weight``: one slope (numel 1) or one per channel,
    the channel axis being axis 1 (PyTorch's layout; an input of fewer than 2 axes has one channel)."""
    if weight.ndim > 1:
        raise ValueError(f"prelu: weight must be a scalar or 1-D tensor, got shape {weight.shape}")
    if weight.numel() != 1:
        channels = x.shape[1] if x.ndim >= 2 else 1
        if weight.numel() != channels:
            raise ValueError(f"prelu: weight has {weight.numel()} slopes but the input of shape {x.shape} has "
                             f"{channels} channel(s) (axis 1); give 1 slope or one per channel")
        weight = reshape(weight, (channels,) + (1,) * (x.ndim - 2))
    return where(x.array > 0, x, weight * x)


def _softmax_dim(op, x, dim, axis):
    """The axis of a softmax: ``dim`` (or its alias ``axis``); when neither is given, the last axis for
    inputs of at most 2 axes, which is also PyTorch's implicit choice there. For more axes PyTorch's
    deprecated implicit choice (axis 0 for 3-D, 1 beyond) is not the last axis: refused, not guessed."""
    if dim is None:
        dim = axis
    if dim is None:
        if x.ndim > 2:
            raise ValueError(f"{op}: give dim for an input of shape {x.shape} (PyTorch's implicit choice for "
                             f"{x.ndim} axes is deprecated and is not the last axis); dim=-1 is the last axis")
        return -1
    return dim


def _result(op, x, y, inplace):
    """y, or with ``inplace=True`` y's values written into x and x returned (see the note above)."""
    if not inplace:
        return y
    if x.requires_grad and autograd.is_grad_enabled():
        raise RuntimeError(f"{op}(inplace=True): minidl records no in-place op for backward, and this input "
                           f"(shape {x.shape}) requires grad; use inplace=False (the default), or call it "
                           "under mdl.no_grad()")
    return x.copy_(y)
