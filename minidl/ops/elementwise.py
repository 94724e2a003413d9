"""Elementwise arithmetic with NumPy broadcasting.

Each backward applies the scalar derivative elementwise and, where an input
was broadcast, sums the gradient back to that input's shape with
:func:`sum_to`. Gradients are computed only for inputs that need them.
"""
from __future__ import annotations

import operator

import numpy as np

from minidl.autograd import Function, no_grad, tangent_sum
from minidl.backend import xp_of as _xp
from minidl.ops.shape import broadcast_to, sum_to
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("add", "sub", "mul", "div", "floor_divide", "pow", "neg", "exp", "log", "sqrt", "abs",
                  "clamp", "clip", "maximum", "minimum")


def _broadcast_error(op, a, b):
    return ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast "
                      "(NumPy rule: trailing axes must be equal or 1)")


def _spread(t, shape):
    """A tangent broadcast to the output's shape (None, a zero tangent, stays None)."""
    return t if t is None or tuple(t.shape) == tuple(shape) else broadcast_to(t, shape)


class Binary(Function):
    """Shared forward: one NumPy call, with a broadcast error that names the op."""

    name = "binary"

    def forward(self, a, b):
        try:
            return self.compute(a, b)
        except ValueError:
            raise _broadcast_error(self.name, a, b) from None


class Add(Binary):
    """y = a + b;  da = dy,  db = dy (each summed to its input's shape)."""
    saved_inputs = ()
    name = "add"

    def compute(self, a, b):
        return a + b

    def backward(self, gy):
        a, b = self.inputs
        return (sum_to(gy, a.shape) if a.requires_grad else None,
                sum_to(gy, b.shape) if b.requires_grad else None)

    def jvp(self, da, db):
        """dy = da + db (each broadcast to y's shape)."""
        return _spread(tangent_sum(da, db), self.output().shape)


def add(a, b):
    return Add()(*_pair(a, b))


class Sub(Binary):
    """y = a - b;  da = dy,  db = -dy."""
    saved_inputs = ()
    name = "sub"

    def compute(self, a, b):
        return a - b

    def backward(self, gy):
        a, b = self.inputs
        return (sum_to(gy, a.shape) if a.requires_grad else None,
                sum_to(-gy, b.shape) if b.requires_grad else None)

    def jvp(self, da, db):
        """dy = da − db."""
        return _spread(tangent_sum(da, None if db is None else -db), self.output().shape)


def sub(a, b):
    return Sub()(*_pair(a, b))


class Mul(Binary):
    """y = a * b;  da = dy * b,  db = dy * a."""
    saved_inputs = "each other"  # a is read only for db, b only for da
    name = "mul"

    def compute(self, a, b):
        return a * b

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy * b, a.shape) if a.requires_grad else None
        gb = sum_to(gy * a, b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = da · b + a · db."""
        a, b = self.inputs
        return _spread(tangent_sum(None if da is None else da * b, None if db is None else a * db), self.output().shape)


def mul(a, b):
    return Mul()(*_pair(a, b))


class Div(Binary):
    """y = a / b;  da = dy / b,  db = -dy * a / b²."""
    name = "div"

    def compute(self, a, b):
        return a / b

    def backward(self, gy):
        a, b = self.inputs
        ga = sum_to(gy / b, a.shape) if a.requires_grad else None
        gb = sum_to(-gy * a / (b * b), b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = (da − y · db) / b."""
        b = self.inputs[1]
        top = tangent_sum(da, None if db is None else -(self.output() * db))
        return _spread(top / b, self.output().shape)


class Pow(Binary):
    """y = a ** b;  da = dy · b · a^(b−1),  db = dy · y · ln a.

    Where these formulas meet 0·∞ or ln 0, the values are PyTorch's:
      da = 0 where b = 0, also at a = 0 (a⁰ = 1 does not depend on a);
      db = 0 where a = 0 and b ≥ 0 (0^b is flat in b: 0 for b > 0, the limit from b > 0 at b = 0);
      db = −∞ where a = 0 and b < 0 (y · ln a → +∞ · −∞).
    Inside the masked places the formulas see stand-ins (b = 1 in a^(b−1), a = 1 in ln a), so the
    backward is finite there and differentiating it again gives 0 there, not NaN.
    """
    name = "pow"

    def compute(self, a, b):
        return a ** b

    def backward(self, gy):
        a, b = self.inputs
        ga = gb = None
        if a.requires_grad:
            flat = b.array == 0
            ga = sum_to(where(flat, 0, gy * b * a ** (where(flat, 1, b) - 1)), a.shape)
        if b.requires_grad:
            zero_base = (a.array == 0) & (b.array >= 0)
            gb = sum_to(where(zero_base, 0, gy * self.output() * log(where(zero_base, 1, a))), b.shape)
        return ga, gb

    def jvp(self, da, db):
        """dy = b · a^(b−1) · da + y · ln a · db, with the same conventions where they meet 0·∞."""
        a, b = self.inputs
        terms = []
        if da is not None:
            flat = b.array == 0
            terms.append(where(flat, 0, da * b * a ** (where(flat, 1, b) - 1)))
        if db is not None:
            zero_base = (a.array == 0) & (b.array >= 0)
            terms.append(where(zero_base, 0, db * self.output() * log(where(zero_base, 1, a))))
        return _spread(tangent_sum(*terms), self.output().shape)


# Exponents computed as products, as PyTorch's CPU pow does: NumPy's general float32 pow takes
# 8.3 ms for x ** 3.0 on 131k elements where x·x·x takes 0.034 ms (makemore's GELU spent half its
# step there). Integers up to 4 by multiplication, ±½ by a square root, negatives as 1 / x^|c|.
SMALL_POWERS = frozenset({0, 1, 2, 3, 4, 0.5, -0.5, -1, -2, -3, -4})


def power_array(x, c):
    """``x ** c`` on an array for a Python number ``c``, small exponents as products, a square
    root and a reciprocal (within 3 ulps of the exact power; a complex one within 5):

        x² = x·x,  x³ = x·x·x,  x⁴ = (x·x)²,  x^½ = √x,  x^(−c) = 1 / x^c.

    These are PyTorch's routes for 2, 3, ½, −½, −1 and −2, so the special values are its own
    (√(−0) = −0 where ``pow`` gives +0); an integer power's special values are ``pow``'s. x⁰ is
    1 everywhere, NaN included. Floating and complex dtypes take this path, float16 and
    bfloat16 computed in float32 and rounded once (as PyTorch does: an x⁴ or a 1/x² would under-
    or overflow in 16 bits on the way), integer arrays for exponents 0 to 4 (the integers
    ``pow`` gives); any other exponent or dtype is ``x ** c`` itself. The dtype is x's.
    """
    dtype = x.dtype
    if type(c) not in (int, float) or c not in SMALL_POWERS:
        return x ** c
    floating = dtype.kind in "fc" or (dtype.kind == "V" and dtype.name == "bfloat16")
    if not floating and not (dtype.kind in "iu" and type(c) is int and c >= 0):
        return x ** c
    xp = _xp(x)
    if floating and dtype.itemsize == 2:
        return power_array(x.astype(np.float32), c).astype(dtype)
    magnitude = -c if c < 0 else c
    whole = int(magnitude)
    if magnitude == 0:
        return xp.ones_like(x)
    if whole == 0:  # each first result lands in a new array (for a 0-d x, x * x would be a scalar)
        y = xp.sqrt(x, out=xp.empty_like(x))
    else:
        y = xp.multiply(x, x, out=xp.empty_like(x)) if whole >= 2 else x.copy()
        if whole == 3:
            y *= x
        elif whole == 4:
            y *= y
    if c < 0:
        xp.divide(dtype.type(1), y, out=y)
    return y


class PowScalar(Function):
    """y = x ** c for a constant c;  dx = dy · c · x^(c−1), and dx = 0 for c = 0.

    c = 0 gives 0 everywhere, also at x = 0 where c · x^(c−1) would be 0 · ∞ (PyTorch's
    convention: x⁰ = 1 does not depend on x). At x = 0 the other exponents give what the
    formula gives, as in PyTorch: 0 for c > 1, 1 for c = 1, +∞ for 0 < c < 1, ±∞ for c < 0.
    Small c (the forward's, and so the gradient's x^(c−1)) are computed as products, √x and
    1/x: see :func:`power_array`.
    """

    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return power_array(x, self.c)

    def backward(self, gy):
        x = self.inputs[0]
        if self.c == 0:
            return Tensor(gy.xp.zeros(x.shape, gy.dtype))
        if self.c == 2:  # the common square: avoid a power call
            return gy * (2 * x)
        return gy * (self.c * x ** (self.c - 1))

    def jvp(self, dx):
        """dy = c · x^(c−1) · dx (0 for c = 0)."""
        x = self.inputs[0]
        if self.c == 0:
            return None
        if self.c == 2:
            return dx * (2 * x)
        return dx * (self.c * x ** (self.c - 1))


def pow(a, b):  # noqa: A001 - the op's name
    """a ** b; a constant Python exponent takes the cheaper PowScalar path."""
    if isinstance(b, (int, float)) and isinstance(a, Tensor):
        return PowScalar(b)(a)
    return Pow()(*_pair(a, b))


class Neg(Function):
    """y = -x;  dx = -dy."""
    saved_inputs = ()

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy

    def jvp(self, dx):
        """dy = −dx."""
        return -dx


def neg(x):
    return Neg()(x)


class Exp(Function):
    """y = eˣ;  dx = dy * y."""
    saved_inputs = ()

    def forward(self, x):
        return _xp(x).exp(x)

    def backward(self, gy):
        return gy * self.output()

    def jvp(self, dx):
        """dy = dx · y."""
        return dx * self.output()


def exp(x):
    return Exp()(x)


class Log(Function):
    """y = ln x;  dx = dy / x."""

    def forward(self, x):
        return _xp(x).log(x)

    def backward(self, gy):
        return gy / self.inputs[0]

    def jvp(self, dx):
        """dy = dx / x."""
        return dx / self.inputs[0]


def log(x):
    return Log()(x)


class Sqrt(Function):
    """y = √x;  dx = dy / (2y)."""
    saved_inputs = ()

    def forward(self, x):
        return _xp(x).sqrt(x)

    def backward(self, gy):
        return gy / (2 * self.output())

    def jvp(self, dx):
        """dy = dx / (2y)."""
        return dx / (2 * self.output())


def sqrt(x):
    return Sqrt()(x)


class Abs(Function):
    """y = |x|;  dx = dy * sign(x) (0 at x = 0, as PyTorch)."""

    def forward(self, x):
        return _xp(x).abs(x)

    def backward(self, gy):
        x = self.inputs[0]
        return gy * Tensor(_xp(x.array).sign(x.array))

    def jvp(self, dx):
        """dy = dx · sign(x)."""
        x = self.inputs[0]
        return dx * Tensor(_xp(x.array).sign(x.array))


def abs(x):  # noqa: A001
    return Abs()(x)


class Clip(Function):
    """y = min(max(x, lo), hi) for constant bounds;  dx = dy where lo ≤ x ≤ hi, else 0.

    At a bound the gradient passes (the interval is closed), as PyTorch's clamp.
    """
    saved_inputs = ()
    saved_arrays = ("lo", "hi", "inside")

    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def forward(self, x):
        xp = _xp(x)
        inside = xp.ones(x.shape, bool)
        if self.lo is not None:
            inside &= x >= self.lo
        if self.hi is not None:
            inside &= x <= self.hi
        # kept in x's dtype, as backward multiplies by it: the mask itself then reaches that op (a traced
        # step maps it to each call's), where a conversion made in backward would be an array of its own
        self.inside = inside.astype(x.dtype)
        return xp.clip(x, self.lo, self.hi)

    def backward(self, gy):
        return gy * Tensor(self.inside)

    def jvp(self, dx):
        """dy = dx where lo ≤ x ≤ hi, else 0."""
        return dx * Tensor(self.inside)


class ClampTensor(Function):
    """y = min(max(x, a), b) for tensor bounds a, b;  dx = dy · [a ≤ x ≤ b],  da = dy · [x < a < b],
    db = dy · [x > b or b < a]  (PyTorch's rule).

    The output is b wherever a > b, so b then gets the whole gradient. A bound the call
    left out is passed in as ±∞ (its gradient is never needed).
    """
    saved_inputs = ()
    saved_arrays = ("to_x", "to_lo", "to_hi")

    def forward(self, x, lo, hi):
        xp = _xp(x)
        try:
            self.to_x = (x >= lo) & (x <= hi)
        except ValueError:
            raise ValueError(f"clamp: shapes {x.shape}, {lo.shape} (min) and {hi.shape} (max) do not "
                             "broadcast (NumPy rule: trailing axes must be equal or 1)") from None
        self.to_lo = (x < lo) & (lo < hi)
        self.to_hi = (x > hi) | (hi < lo)
        return xp.minimum(xp.maximum(x, lo), hi)

    def backward(self, gy):
        x, lo, hi = self.inputs
        return tuple(sum_to(gy * Tensor(mask.astype(gy.dtype)), t.shape) if t.requires_grad else None
                     for t, mask in ((x, self.to_x), (lo, self.to_lo), (hi, self.to_hi)))

    def jvp(self, dx, dlo, dhi):
        """dy = dx · [a ≤ x ≤ b] + da · [x < a < b] + db · [x > b or b < a]."""
        terms = [None if d is None else d * Tensor(mask.astype(d.dtype))
                 for d, mask in ((dx, self.to_x), (dlo, self.to_lo), (dhi, self.to_hi))]
        return _spread(tangent_sum(*terms), self.output().shape)


def clamp(x, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """x limited to [min, max]; each bound a number, a tensor (broadcast, and differentiable) or None.

    The gradient passes where min ≤ x ≤ max, bounds included (PyTorch's convention).
    """
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if not isinstance(min, Tensor) and not isinstance(max, Tensor):
        return Clip(min, max)(x)
    lo = _bound(x, min, -1)
    hi = _bound(x, max, +1)
    return ClampTensor()(x, lo, hi)


class DivRounded(Binary):
    """y = a / b rounded toward 0 (``"trunc"``) or down (``"floor"``);  da = db = 0 (a step function)."""
    saved_inputs = ()
    name = "div"

    def __init__(self, mode):
        self.mode = mode

    def compute(self, a, b):
        xp = _xp(a)
        if self.mode == "floor":
            return xp.floor_divide(a, b)
        if a.dtype.kind in "fc" or b.dtype.kind in "fc":
            return xp.trunc(a / b)
        q = xp.floor_divide(a, b)  # integers: floor, then one up where the exact quotient was negative
        return xp.where((q < 0) & (q * b != a), q + 1, q)

    def backward(self, gy):
        a, b = self.inputs
        return (Tensor(gy.xp.zeros(a.shape, gy.dtype)) if a.requires_grad else None,
                Tensor(gy.xp.zeros(b.shape, gy.dtype)) if b.requires_grad else None)

    def jvp(self, da, db):
        """dy = 0."""
        return None


def div(a, b, rounding_mode=None):
    """a / b; ``rounding_mode="trunc"`` rounds the quotient toward 0, ``"floor"`` down (both with
    zero gradient, and integer results for integer inputs), as ``torch.div``. True division of two
    integer tensors gives float32, as in PyTorch (NumPy would give float64)."""
    if rounding_mode is None:
        a, b = _pair(a, b)
        if a.dtype.kind in "biu" and b.dtype.kind in "biu":  # as torch: integers divide into float32
            a, b = Tensor(a.array.astype(np.float32)), Tensor(b.array.astype(np.float32))
        return Div()(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    return DivRounded(rounding_mode)(*_pair(a, b))


def floor_divide(a, b):
    """⌊a / b⌋, the ``//`` operator: ``div(a, b, rounding_mode="floor")``."""
    return DivRounded("floor")(*_pair(a, b))


class Where(Function):
    """y = a where cond else b;  da = dy where cond,  db = dy elsewhere (cond, an input, gets no gradient).

    The condition is an input of the op, not a constructor argument, so that a traced step
    (:mod:`minidl.tracing`) reads each call's; its version is checked as any saved input's.
    """
    saved_inputs = (0,)  # backward reads the condition only

    def forward(self, cond, a, b):
        try:
            return _xp(a).where(cond, a, b)
        except ValueError:
            raise _broadcast_error("where", a, b) from None

    def backward(self, gy):
        cond, a, b = self.inputs
        zero = Tensor(gy.xp.zeros((), gy.dtype))
        ga = sum_to(where(cond, gy, zero), a.shape) if a.requires_grad else None
        gb = sum_to(where(cond, zero, gy), b.shape) if b.requires_grad else None
        return None, ga, gb

    def jvp(self, dcond, da, db):
        """dy = da where cond, db elsewhere."""
        cond, a, b = self.inputs
        shape = self.output().shape
        da = Tensor(a.xp.zeros((), a.dtype)) if da is None else da
        db = Tensor(b.xp.zeros((), b.dtype)) if db is None else db
        return _spread(where(cond, da, db), shape)


def where(cond, a, b):
    """Elementwise choice: ``a`` where ``cond`` holds, else ``b`` (cond gets no gradient).

    ``cond`` must be boolean, as in PyTorch: a float condition is an error, not "nonzero"
    (NumPy's reading, under which NaN counts as true).
    """
    if not isinstance(cond, Tensor):
        cond = Tensor(cond if hasattr(cond, "dtype") else np.asarray(cond))
    if cond.dtype != np.bool_:
        raise TypeError(f"where: the condition must be a boolean tensor, got dtype {cond.dtype}; "
                        "compare first (x > 0) or convert it (cond.bool())")
    return Where()(cond, *_pair(a, b))


class Compare(Function):
    """y = a ⊙ b for a comparison ⊙ (``name``, of Python's ``operator`` module: eq, ne, lt, le, gt,
    ge, on the arrays as NumPy compares them): a boolean tensor, which gets no gradient.

    An op rather than arithmetic on the arrays, so that a mask made in a traced step (where(x > 0,
    ...)) is recomputed from each call's values. ``other`` is the right-hand side when it is not a
    Tensor (a number, an array); the call runs without recording, so the mask never requires grad.
    """

    def __init__(self, name, other=None):
        self.name, self.other = name, other

    def forward(self, a, *b):
        return getattr(operator, self.name)(a, b[0] if b else self.other)

    def jvp(self, *dxs):
        """No tangent: a comparison is piecewise constant (it has no backward either)."""
        return None


def compare(name):
    """The Tensor operator for the comparison ``name`` (``x > 0``: "gt"): a :class:`Compare` op."""
    def comparison(self, other):
        with no_grad():
            if isinstance(other, Tensor):
                return Compare(name)(self, other)
            return Compare(name, other)(self)
    comparison.__name__ = f"__{name}__"
    return comparison


class Maximum(Binary):
    """y = max(a, b);  the gradient goes to the larger input, split evenly on ties."""
    saved_inputs = ()
    saved_arrays = ("share_a",)
    name = "maximum"

    def compute(self, a, b):
        self.share_a = (a > b) + 0.5 * (a == b)  # 1, ½ on ties, 0
        return _xp(a).maximum(a, b)

    def backward(self, gy):
        a, b = self.inputs
        share_a = Tensor(self.share_a.astype(gy.dtype))
        ga = sum_to(gy * share_a, a.shape) if a.requires_grad else None
        gb = sum_to(gy * (1 - share_a), b.shape) if b.requires_grad else None
        return ga, gb

    def jvp(self, da, db):
        """dy = da · s + db · (1 − s), s = 1 where a wins, ½ on ties, 0 elsewhere."""
        share_a = Tensor(self.share_a.astype((da if da is not None else db).dtype))
        terms = (None if da is None else da * share_a, None if db is None else db * (1 - share_a))
        return _spread(tangent_sum(*terms), self.output().shape)


def maximum(a, b):
    return Maximum()(*_pair(a, b))


class Minimum(Maximum):
    """y = min(a, b);  the gradient goes to the smaller input, split evenly on ties."""
    saved_arrays = ("share_a",)
    name = "minimum"

    def compute(self, a, b):
        self.share_a = (a < b) + 0.5 * (a == b)
        return _xp(a).minimum(a, b)


def minimum(a, b):
    return Minimum()(*_pair(a, b))


# ---------------------------------------------------------------- functional forms
def _pair(a, b):
    """Both operands as Tensors; Python scalars take the other operand's dtype, and an integer or
    boolean operand takes a floating one's (PyTorch's rule: float32 · int64 is float32; NumPy's
    float64 would silently widen a model's activations)."""
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = as_tensor(b, like=a)
    dtype_a, dtype_b = a._data.dtype, b._data.dtype
    if dtype_a is not dtype_b and dtype_a.kind != dtype_b.kind:
        kind_a, kind_b = dtype_a.kind, dtype_b.kind
        if kind_a == "f" and kind_b in "biu":
            b = Tensor(b._data.astype(a._data.dtype))
        elif kind_b == "f" and kind_a in "biu":
            a = Tensor(a._data.astype(b._data.dtype))
    return a, b


def _bound(x, value, side):
    """A clamp bound as a tensor; a missing one is ±∞ (or the integer dtype's extreme)."""
    if value is None:
        if x.dtype.kind in "fc":
            value = side * float("inf")
        else:
            info = np.iinfo(x.dtype)
            value = int(info.max if side > 0 else info.min)
    return as_tensor(value, like=x)


def clip(x, min=None, max=None, *, lo=None, hi=None):  # noqa: A002
    """Alias of :func:`clamp` (``torch.clip``); ``lo``/``hi`` are accepted for minidl's older spelling."""
    return clamp(x, min if lo is None else lo, max if hi is None else hi)


