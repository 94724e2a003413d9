"""Elementwise math: trigonometric and hyperbolic functions, logarithms and powers in other
bases, the error function, rounding, remainders, and the predicates and logical ops.

Each differentiable op is one Function whose backward multiplies the upstream
gradient by the scalar derivative (written with differentiable ops, so second
derivatives come free); binary ops sum a broadcast gradient back with
:func:`sum_to`. The derivatives and their conventions are PyTorch's:

- rounding (floor, ceil, round, trunc) and sign are step functions: their gradient is 0
  everywhere, also at the jumps, where the true derivative does not exist;
- fmod and remainder pass the gradient through to the dividend; the divisor gets
  −dy · (the quotient the op rounded), trunc(a/b) for fmod and floor(a/b) for remainder;
- predicates (isnan, isclose...) and logical ops return bool tensors with no gradient.

As in PyTorch, an integer or bool input to an op whose result is not an integer
(sin, exp2, rsqrt, atan2...) is computed in float32; rounding an integer tensor
gives an integer copy.
"""
from __future__ import annotations

import math

import numpy as np

from minidl import backend
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of as _xp
from minidl.ops.elementwise import Binary, _broadcast_error, _pair, _spread, div, exp, sqrt
from minidl.ops.shape import sum_to
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = (
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh",
    "floor", "ceil", "round", "trunc", "sign", "rsqrt", "reciprocal", "erf", "erfc",
    "log1p", "expm1", "log2", "log10", "exp2", "fmod", "remainder", "lerp", "logaddexp", "copysign",
    "isnan", "isinf", "isfinite", "isclose", "allclose",
    "logical_and", "logical_or", "logical_not", "logical_xor",
)

# The ops here that return bool tensors: nothing to differentiate, so they have no gradcheck case.
BOOLEAN_RESULTS = ("isnan", "isinf", "isfinite", "isclose", "allclose",
                   "logical_and", "logical_or", "logical_not", "logical_xor")

_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)


class Unary(Function):
    """Shared forward: the array library's function named ``ufunc`` (``xp.sin``...)."""

    ufunc = ""

    def forward(self, x):
        return getattr(_xp(x), self.ufunc)(x)


# ---------------------------------------------------------------- trigonometric and hyperbolic
class Sin(Unary):
    """y = sin x;  dx = dy · cos x."""
    ufunc = "sin"

    def backward(self, gy):
        return gy * cos(self.inputs[0])

    def jvp(self, dx):
        """dy = dx · cos x."""
        x = self.inputs[0]
        return dx * cos(x)


def sin(x):
    return Sin()(_floating(x))


class Cos(Unary):
    """y = cos x;  dx = −dy · sin x."""
    ufunc = "cos"

    def backward(self, gy):
        return -(gy * sin(self.inputs[0]))

    def jvp(self, dx):
        """dy = −dx · sin x."""
        x = self.inputs[0]
        return -(dx * sin(x))


def cos(x):
    return Cos()(_floating(x))


class Tan(Unary):
    """y = tan x;  dx = dy · (1 + y²)."""
    ufunc = "tan"
    saved_inputs = ()

    def backward(self, gy):
        y = self.output()
        return gy * (1 + y * y)

    def jvp(self, dx):
        """dy = dx · (1 + y²)."""
        y = self.output()
        return dx * (1 + y * y)


def tan(x):
    return Tan()(_floating(x))


class Asin(Unary):
    """y = arcsin x;  dx = dy / √(1 − x²)  (|x| < 1)."""
    ufunc = "arcsin"

    def backward(self, gy):
        x = self.inputs[0]
        return gy / sqrt(1 - x * x)

    def jvp(self, dx):
        """dy = dx / √(1 − x²)."""
        x = self.inputs[0]
        return dx / sqrt(1 - x * x)


def asin(x):
    return Asin()(_floating(x))


class Acos(Unary):
    """y = arccos x;  dx = −dy / √(1 − x²)  (|x| < 1)."""
    ufunc = "arccos"

    def backward(self, gy):
        x = self.inputs[0]
        return -gy / sqrt(1 - x * x)

    def jvp(self, dx):
        """dy = −dx / √(1 − x²)."""
        x = self.inputs[0]
        return -dx / sqrt(1 - x * x)


def acos(x):
    return Acos()(_floating(x))


class Atan(Unary):
    """y = arctan x;  dx = dy / (1 + x²)."""
    ufunc = "arctan"

    def backward(self, gy):
        x = self.inputs[0]
        return gy / (1 + x * x)

    def jvp(self, dx):
        """dy = dx / (1 + x²)."""
        x = self.inputs[0]
        return dx / (1 + x * x)


def atan(x):
    return Atan()(_floating(x))


class Atan2(Binary):
    """y = the angle of the point (b, a), atan2(a, b);  da = dy · b / (a² + b²),  db = −dy · a / (a² + b²)."""
    name = "atan2"

    def compute(self, a, b):
        return _xp(a).arctan2(a, b)

    def backward(self, gy):
        a, b = self.inputs
        r2 = a * a + b * b
        ga = sum_to(gy * b / r2, a.shape) if a.requires_grad else None
        gb = sum_to(-gy * a / r2, b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = (b · da − a · db) / (a² + b²)."""
        a, b = self.inputs
        r2 = a * a + b * b
        terms = (None if da is None else da * b / r2, None if db is None else -db * a / r2)
        return _spread(tangent_sum(*terms), self.output().shape)


def atan2(input, other):  # noqa: A002 - PyTorch's argument name
    """The angle of the point (other, input) in (−π, π]: ``atan2(y, x)``."""
    return Atan2()(*_floating_pair(input, other))


class Sinh(Unary):
    """y = sinh x = (eˣ − e⁻ˣ)/2;  dx = dy · (eˣ + e⁻ˣ)/2, the cosh."""
    ufunc = "sinh"

    def backward(self, gy):
        return gy * cosh(self.inputs[0])

    def jvp(self, dx):
        """dy = dx · cosh x."""
        x = self.inputs[0]
        return dx * cosh(x)


def sinh(x):
    return Sinh()(_floating(x))


class Cosh(Unary):
    """y = cosh x = (eˣ + e⁻ˣ)/2;  dx = dy · (eˣ − e⁻ˣ)/2, the sinh."""
    ufunc = "cosh"

    def backward(self, gy):
        return gy * sinh(self.inputs[0])

    def jvp(self, dx):
        """dy = dx · sinh x."""
        x = self.inputs[0]
        return dx * sinh(x)


def cosh(x):
    return Cosh()(_floating(x))


class Asinh(Unary):
    """y = arsinh x;  dx = dy / √(x² + 1)."""
    ufunc = "arcsinh"

    def backward(self, gy):
        x = self.inputs[0]
        return gy / sqrt(x * x + 1)

    def jvp(self, dx):
        """dy = dx / √(x² + 1)."""
        x = self.inputs[0]
        return dx / sqrt(x * x + 1)


def asinh(x):
    return Asinh()(_floating(x))


class Acosh(Unary):
    """y = arcosh x;  dx = dy / √(x² − 1)  (x > 1)."""
    ufunc = "arccosh"

    def backward(self, gy):
        x = self.inputs[0]
        return gy / sqrt(x * x - 1)

    def jvp(self, dx):
        """dy = dx / √(x² − 1)."""
        x = self.inputs[0]
        return dx / sqrt(x * x - 1)


def acosh(x):
    return Acosh()(_floating(x))


class Atanh(Unary):
    """y = artanh x;  dx = dy / (1 − x²)  (|x| < 1)."""
    ufunc = "arctanh"

    def backward(self, gy):
        x = self.inputs[0]
        return gy / (1 - x * x)

    def jvp(self, dx):
        """dy = dx / (1 − x²)."""
        x = self.inputs[0]
        return dx / (1 - x * x)


def atanh(x):
    return Atanh()(_floating(x))


# ---------------------------------------------------------------- logarithms, powers, error function
class Log1p(Unary):
    """y = ln(1 + x), accurate for small x;  dx = dy / (1 + x)."""
    ufunc = "log1p"

    def backward(self, gy):
        return gy / (1 + self.inputs[0])

    def jvp(self, dx):
        """dy = dx / (1 + x)."""
        x = self.inputs[0]
        return dx / (1 + x)


def log1p(x):
    return Log1p()(_floating(x))


class Expm1(Unary):
    """y = eˣ − 1, accurate for small x;  dx = dy · (y + 1)."""
    ufunc = "expm1"
    saved_inputs = ()

    def backward(self, gy):
        return gy * (self.output() + 1)

    def jvp(self, dx):
        """dy = dx · (y + 1)."""
        y = self.output()
        return dx * (y + 1)


def expm1(x):
    return Expm1()(_floating(x))


class Log2(Unary):
    """y = log₂ x;  dx = dy / (x · ln 2)."""
    ufunc = "log2"

    def backward(self, gy):
        return gy / (self.inputs[0] * math.log(2))

    def jvp(self, dx):
        """dy = dx / (x · ln 2)."""
        x = self.inputs[0]
        return dx / (x * math.log(2))


def log2(x):
    return Log2()(_floating(x))


class Log10(Unary):
    """y = log₁₀ x;  dx = dy / (x · ln 10)."""
    ufunc = "log10"

    def backward(self, gy):
        return gy / (self.inputs[0] * math.log(10))

    def jvp(self, dx):
        """dy = dx / (x · ln 10)."""
        x = self.inputs[0]
        return dx / (x * math.log(10))


def log10(x):
    return Log10()(_floating(x))


class Exp2(Unary):
    """y = 2ˣ;  dx = dy · y · ln 2."""
    ufunc = "exp2"
    saved_inputs = ()

    def backward(self, gy):
        return gy * (self.output() * math.log(2))

    def jvp(self, dx):
        """dy = dx · y · ln 2."""
        y = self.output()
        return dx * (y * math.log(2))


def exp2(x):
    return Exp2()(_floating(x))


class Rsqrt(Function):
    """y = 1/√x;  dx = −dy · y³ / 2."""
    saved_inputs = ()

    def forward(self, x):
        return 1 / _xp(x).sqrt(x)

    def backward(self, gy):
        y = self.output()
        return gy * (-0.5 * y * y * y)

    def jvp(self, dx):
        """dy = −dx · y³ / 2."""
        y = self.output()
        return dx * (-0.5 * y * y * y)


def rsqrt(x):
    return Rsqrt()(_floating(x))


class Reciprocal(Function):
    """y = 1/x;  dx = −dy · y²."""
    saved_inputs = ()

    def forward(self, x):
        return 1 / x

    def backward(self, gy):
        y = self.output()
        return -(gy * (y * y))

    def jvp(self, dx):
        """dy = −dx · y²."""
        y = self.output()
        return -(dx * (y * y))


def reciprocal(x):
    return Reciprocal()(_floating(x))


class Erf(Function):
    """y = erf x = (2/√π) ∫₀ˣ e^(−t²) dt;  dx = dy · (2/√π) · e^(−x²)."""

    def forward(self, x):
        return backend.erf(x)

    def backward(self, gy):
        x = self.inputs[0]
        return gy * (_TWO_OVER_SQRT_PI * exp(-(x * x)))

    def jvp(self, dx):
        """dy = dx · (2/√π) · e^(−x²)."""
        x = self.inputs[0]
        return dx * (_TWO_OVER_SQRT_PI * exp(-(x * x)))


def erf(x):
    return Erf()(_floating(x))


class Erfc(Function):
    """y = erfc x = 1 − erf x;  dx = −dy · (2/√π) · e^(−x²).

    On the CPU with SciPy the value is SciPy's erfc, accurate in the far tail (erfc 10 ≈ 2·10⁻⁴⁵);
    elsewhere it is 1 − erf x, which rounds to 0 once erfc x is below the dtype's resolution
    near 1 (x ≳ 3.9 in float32, ≳ 5.9 in float64).
    """

    def forward(self, x):
        special = backend.scipy_special() if _xp(x) is np else None
        if special is not None:
            return special.erfc(x).astype(x.dtype, copy=False)
        return 1 - backend.erf(x)

    def backward(self, gy):
        x = self.inputs[0]
        return gy * (-_TWO_OVER_SQRT_PI * exp(-(x * x)))

    def jvp(self, dx):
        """dy = −dx · (2/√π) · e^(−x²)."""
        x = self.inputs[0]
        return dx * (-_TWO_OVER_SQRT_PI * exp(-(x * x)))


def erfc(x):
    return Erfc()(_floating(x))


# ---------------------------------------------------------------- step functions: zero gradient
class Floor(Unary):
    """y = ⌊x⌋;  dx = 0.

    A step function's derivative is 0 wherever it exists, and PyTorch returns 0 at the jumps
    too; the other step functions (ceil, trunc, round, sign) share this backward.
    """
    ufunc = "floor"
    saved_inputs = ()

    def backward(self, gy):
        return Tensor(gy.xp.zeros(gy.shape, gy.dtype))

    def jvp(self, dx):
        """dy = 0 (shared by ceil, trunc, round and sign)."""
        return None


def floor(x):
    return _step(Floor(), x)


class Ceil(Floor):
    """y = −⌊−x⌋ (the ceiling);  dx = 0."""
    ufunc = "ceil"


def ceil(x):
    return _step(Ceil(), x)


class Trunc(Floor):
    """y = x rounded toward 0;  dx = 0."""
    ufunc = "trunc"


def trunc(x):
    return _step(Trunc(), x)


class Sign(Floor):
    """y = sign(x), one of −1, 0, 1;  dx = 0."""
    ufunc = "sign"


def sign(x):
    x = as_tensor(x)
    if x.dtype.kind == "b":
        return Tensor(x.array.copy())
    return Sign()(x)


class Round(Floor):
    """y = x rounded to ``decimals`` places, halves to even (as PyTorch and NumPy);  dx = 0."""

    def __init__(self, decimals=0):
        self.decimals = decimals

    def forward(self, x):
        return _xp(x).round(x, self.decimals)


def round(x, decimals: int = 0):  # noqa: A001 - the op's name
    """x rounded to ``decimals`` decimal places (negative: to tens, hundreds...), halves to even."""
    if not isinstance(decimals, (int, np.integer)) or isinstance(decimals, bool):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    x = as_tensor(x)
    if x.dtype.kind in "biu" and decimals >= 0:
        return Tensor(x.array.copy())
    return Round(int(decimals))(_floating(x))


# ---------------------------------------------------------------- two-argument ops
class Fmod(Binary):
    """y = a − q · b with q = a/b rounded toward 0 (the sign of a, as C's fmod);  da = dy,  db = −dy · q."""
    name = "fmod"

    def compute(self, a, b):
        return _xp(a).fmod(a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy, a.shape) if a.requires_grad else None
        gb = sum_to(-gy * div(a, b, rounding_mode="trunc"), b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = da − q · db."""
        a, b = self.inputs
        term_b = None if db is None else -db * div(a, b, rounding_mode="trunc")
        return _spread(tangent_sum(da, term_b), self.output().shape)


def fmod(input, other):  # noqa: A002
    """The remainder of input / other with the sign of ``input`` (C's fmod, ``torch.fmod``)."""
    return Fmod()(*_pair(input, other))


class Remainder(Binary):
    """y = a − ⌊a/b⌋ · b (the sign of b, as Python's %);  da = dy,  db = −dy · ⌊a/b⌋."""
    name = "remainder"

    def compute(self, a, b):
        return _xp(a).remainder(a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy, a.shape) if a.requires_grad else None
        gb = sum_to(-gy * div(a, b, rounding_mode="floor"), b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = da − ⌊a/b⌋ · db."""
        a, b = self.inputs
        term_b = None if db is None else -db * div(a, b, rounding_mode="floor")
        return _spread(tangent_sum(da, term_b), self.output().shape)


def remainder(input, other):  # noqa: A002
    """The remainder of input / other with the sign of ``other`` (Python's ``%``, ``torch.remainder``)."""
    return Remainder()(*_pair(input, other))


class LogAddExp(Binary):
    """y = ln(exp(a) + exp(b));  da = dy / (1 + exp(b − a)),  db = dy / (1 + exp(a − b))  (the softmax of (a, b))."""
    name = "logaddexp"

    def compute(self, a, b):
        return _xp(a).logaddexp(a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy / (1 + exp(b - a)), a.shape) if a.requires_grad else None
        gb = sum_to(gy / (1 + exp(a - b)), b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = da / (1 + exp(b − a)) + db / (1 + exp(a − b))."""
        a, b = self.inputs
        terms = (None if da is None else da / (1 + exp(b - a)), None if db is None else db / (1 + exp(a - b)))
        return _spread(tangent_sum(*terms), self.output().shape)


def logaddexp(input, other):  # noqa: A002
    """ln(eᵃ + eᵇ) without overflow."""
    return LogAddExp()(*_floating_pair(input, other))


class CopySign(Binary):
    """y = |a| with the sign of b;  da = dy · y/a (±1; 0 where a = 0, as PyTorch),  db = 0."""
    name = "copysign"

    def compute(self, a, b):
        return _xp(a).copysign(a, b)

    def backward(self, gy):
        a, b = self.inputs
        ga = gb = None
        if a.requires_grad:
            xp, ad, bd = gy.xp, a.array, b.array
            ratio = xp.where(ad == 0, 0, xp.copysign(1, ad) * xp.copysign(1, bd)).astype(gy.dtype, copy=False)
            ga = sum_to(gy * Tensor(ratio), a.shape)
        if b.requires_grad:
            gb = Tensor(gy.xp.zeros(b.shape, gy.dtype))
        return ga, gb

    def jvp(self, da, db):
        """dy = da · y/a (0 where a = 0)."""
        if da is None:
            return None
        a, b = self.inputs
        xp, ad, bd = da.xp, a.array, b.array
        ratio = xp.where(ad == 0, 0, xp.copysign(1, ad) * xp.copysign(1, bd)).astype(da.dtype, copy=False)
        return _spread(da * Tensor(ratio), self.output().shape)


def copysign(input, other):  # noqa: A002
    """|input| with the sign of ``other`` (its sign bit: −0.0 counts as negative)."""
    return CopySign()(*_floating_pair(input, other))


# ---------------------------------------------------------------- functional forms
def _floating(x):
    """``x`` as a Tensor, an integer or bool tensor converted to float32 (as PyTorch does for sin, exp2...)."""
    x = as_tensor(x)
    if x.dtype.kind not in "fc":
        x = Tensor(x.array.astype(np.float32))
    return x


def _floating_pair(a, b):
    a, b = _pair(a, b)
    return _floating(a), _floating(b)


def _step(op, x):
    x = as_tensor(x)
    if x.dtype.kind in "biu":  # already whole numbers: an integer copy, as PyTorch
        return Tensor(x.array.copy())
    return op(x)


def lerp(input, end, weight):  # noqa: A002
    """input + weight · (end − input); ``weight`` a number or a tensor, every input differentiable.

    Composed of differentiable ops: d input = dy · (1 − w),  d end = dy · w,  d w = dy · (end − input).
    """
    start = as_tensor(input, like=end if isinstance(end, Tensor) else None)
    return start + weight * (end - start)


# ---------------------------------------------------------------- predicates and logical ops (no gradient)
def _array(x):
    return x.array if isinstance(x, Tensor) else x


def _predicate(op, fn, *xs):
    """``fn`` on the raw values; a bool tensor that carries no gradient."""
    arrays = [_array(x) for x in xs]
    try:
        return Tensor(fn(*arrays))
    except ValueError:
        if len(arrays) == 2:
            raise _broadcast_error(op, *[as_tensor(x) for x in xs]) from None
        raise


def isnan(x):
    return _predicate("isnan", lambda a: _xp(a).isnan(a), as_tensor(x))


def isinf(x):
    return _predicate("isinf", lambda a: _xp(a).isinf(a), as_tensor(x))


def isfinite(x):
    return _predicate("isfinite", lambda a: _xp(a).isfinite(a), as_tensor(x))


def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False):  # noqa: A002
    """|input − other| ≤ atol + rtol · |other|, elementwise (PyTorch's and NumPy's rule and defaults)."""
    a, b = _pair(input, other)
    return _predicate("isclose", lambda x, y: _xp(x).isclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan), a, b)


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:  # noqa: A002
    """True when :func:`isclose` holds everywhere: a Python bool, as ``torch.allclose``."""
    return bool(isclose(input, other, rtol, atol, equal_nan).array.all())


def logical_and(input, other):  # noqa: A002
    a, b = _pair(input, other)
    return _predicate("logical_and", lambda x, y: _xp(x).logical_and(x, y), a, b)


def logical_or(input, other):  # noqa: A002
    a, b = _pair(input, other)
    return _predicate("logical_or", lambda x, y: _xp(x).logical_or(x, y), a, b)


def logical_xor(input, other):  # noqa: A002
    a, b = _pair(input, other)
    return _predicate("logical_xor", lambda x, y: _xp(x).logical_xor(x, y), a, b)


def logical_not(input):  # noqa: A002
    return _predicate("logical_not", lambda x: _xp(x).logical_not(x), as_tensor(input))
