"""Elementwise arithmetic with NumPy broadcasting.

Each backward applies the scalar derivative elementwise and, where an input
was broadcast, sums the gradient back to that input's shape with
:func:`sum_to`. Gradients are computed only for inputs that need them.
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import xp_of as _xp
from minidl.ops.shape import sum_to
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("exp", "log", "sqrt", "abs", "clip")


def _broadcast_error(op, a, b):
    return ValueError(f"{op}: shapes {a.shape} and {b.shape} do not broadcast "
                      "(NumPy rule: trailing axes must be equal or 1)")


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
            flat = b.data == 0
            ga = sum_to(where(flat, 0, gy * b * a ** (where(flat, 1, b) - 1)), a.shape)
        if b.requires_grad:
            zero_base = (a.data == 0) & (b.data >= 0)
            gb = sum_to(where(zero_base, 0, gy * self.output() * log(where(zero_base, 1, a))), b.shape)
        return ga, gb


class PowScalar(Function):
    """y = x ** c for a constant c;  dx = dy · c · x^(c−1), and dx = 0 for c = 0.

    c = 0 gives 0 everywhere, also at x = 0 where c · x^(c−1) would be 0 · ∞ (PyTorch's
    convention: x⁰ = 1 does not depend on x). At x = 0 the other exponents give what the
    formula gives, as in PyTorch: 0 for c > 1, 1 for c = 1, +∞ for 0 < c < 1, ±∞ for c < 0.
    """

    def __init__(self, c):
        self.c = c

    def forward(self, x):
        return x ** self.c

    def backward(self, gy):
        x = self.inputs[0]
        if self.c == 0:
            return Tensor(gy.xp.zeros(x.shape, gy.dtype))
        if self.c == 2:  # the common square: avoid a power call
            return gy * (2 * x)
        return gy * (self.c * x ** (self.c - 1))


class Neg(Function):
    """y = -x;  dx = -dy."""
    saved_inputs = ()

    def forward(self, x):
        return -x

    def backward(self, gy):
        return -gy


class Exp(Function):
    """y = eˣ;  dx = dy * y."""
    saved_inputs = ()

    def forward(self, x):
        return _xp(x).exp(x)

    def backward(self, gy):
        return gy * self.output()


class Log(Function):
    """y = ln x;  dx = dy / x."""

    def forward(self, x):
        return _xp(x).log(x)

    def backward(self, gy):
        return gy / self.inputs[0]


class Sqrt(Function):
    """y = √x;  dx = dy / (2y)."""
    saved_inputs = ()

    def forward(self, x):
        return _xp(x).sqrt(x)

    def backward(self, gy):
        return gy / (2 * self.output())


class Abs(Function):
    """y = |x|;  dx = dy * sign(x) (0 at x = 0, as PyTorch)."""

    def forward(self, x):
        return _xp(x).abs(x)

    def backward(self, gy):
        x = self.inputs[0]
        return gy * Tensor(_xp(x.data).sign(x.data))


class Clip(Function):
    """y = min(max(x, lo), hi);  dx = dy where lo ≤ x ≤ hi, else 0."""
    saved_inputs = ()

    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def forward(self, x):
        xp = _xp(x)
        inside = xp.ones(x.shape, bool)
        if self.lo is not None:
            inside &= x >= self.lo
        if self.hi is not None:
            inside &= x <= self.hi
        self.inside = inside
        return xp.clip(x, self.lo, self.hi)

    def backward(self, gy):
        return gy * Tensor(self.inside.astype(gy.dtype))


class Where(Function):
    """y = a where cond else b (cond is constant);  da = dy where cond,  db = dy elsewhere."""
    saved_inputs = ()

    def __init__(self, cond):
        self.cond = cond

    def forward(self, a, b):
        try:
            return _xp(a).where(self.cond, a, b)
        except ValueError:
            raise _broadcast_error("where", a, b) from None

    def backward(self, gy):
        a, b = self.inputs
        zero = Tensor(gy.xp.zeros((), gy.dtype))
        ga = sum_to(where(self.cond, gy, zero), a.shape) if a.requires_grad else None
        gb = sum_to(where(self.cond, zero, gy), b.shape) if b.requires_grad else None
        return ga, gb


class Maximum(Binary):
    """y = max(a, b);  the gradient goes to the larger input, split evenly on ties."""
    saved_inputs = ()
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


class Minimum(Maximum):
    """y = min(a, b);  the gradient goes to the smaller input, split evenly on ties."""
    name = "minimum"

    def compute(self, a, b):
        self.share_a = (a < b) + 0.5 * (a == b)
        return _xp(a).minimum(a, b)


# ---------------------------------------------------------------- functional forms
def _pair(a, b):
    """Both operands as Tensors; Python scalars take the other operand's dtype."""
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = as_tensor(b, like=a)
    return a, b


def add(a, b):
    return Add()(*_pair(a, b))


def sub(a, b):
    return Sub()(*_pair(a, b))


def mul(a, b):
    return Mul()(*_pair(a, b))


def div(a, b):
    return Div()(*_pair(a, b))


def pow(a, b):  # noqa: A001 - the op's name
    """a ** b; a constant Python exponent takes the cheaper PowScalar path."""
    if isinstance(b, (int, float)) and isinstance(a, Tensor):
        return PowScalar(b)(a)
    return Pow()(*_pair(a, b))


def neg(x):
    return Neg()(x)


def exp(x):
    return Exp()(x)


def log(x):
    return Log()(x)


def sqrt(x):
    return Sqrt()(x)


def abs(x):  # noqa: A001
    return Abs()(x)


def clip(x, lo=None, hi=None):
    return Clip(lo, hi)(x)


def maximum(a, b):
    return Maximum()(*_pair(a, b))


def minimum(a, b):
    return Minimum()(*_pair(a, b))


def where(cond, a, b):
    """Elementwise choice: ``a`` where ``cond`` holds, else ``b`` (cond gets no gradient)."""
    cond = cond.data if isinstance(cond, Tensor) else cond
    return Where(cond)(*_pair(a, b))
