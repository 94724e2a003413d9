"""Elementwise ops: forward against NumPy, gradients against finite differences, on broadcast shapes."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl as mdl
import minidl.functional as F
from tests.conftest import leaf

FEW = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**32 - 1)
# Pairs of shapes that broadcast against each other: 0-d, size-1 dims and stretched dims.
pair_shapes = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=3)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def values(rng, shape, kind="any"):
    """float64 test values; 'positive' for log/sqrt/pow bases, 'nonzero' keeps 0.3 from a kink or pole."""
    x = rng.standard_normal(shape)
    if kind == "positive":
        return np.abs(x) + 0.5
    if kind == "nonzero":
        return np.where(x >= 0, x + 0.3, x - 0.3)
    return x


# name: (minidl op, NumPy formula, kind of a, kind of b, smooth?)
BINARY = {
    "add": (F.add, np.add, "any", "any", True),
    "sub": (F.sub, np.subtract, "any", "any", True),
    "mul": (F.mul, np.multiply, "any", "any", True),
    "div": (F.div, np.divide, "any", "nonzero", True),
    "pow": (F.pow, np.power, "positive", "any", True),
    "maximum": (mdl.maximum, np.maximum, "any", "any", False),
    "minimum": (mdl.minimum, np.minimum, "any", "any", False),
}
# name: (minidl op, NumPy formula, kind of x, smooth?)
UNARY = {
    "neg": (F.neg, np.negative, "any", True),
    "exp": (F.exp, np.exp, "any", True),
    "log": (F.log, np.log, "positive", True),
    "sqrt": (F.sqrt, np.sqrt, "positive", True),
    "abs": (F.abs, np.abs, "nonzero", False),
    "square": (lambda x: x ** 2, np.square, "any", True),
    "cube": (lambda x: x ** 3, lambda a: a ** 3, "any", True),
    "pow_half": (lambda x: x ** 0.5, np.sqrt, "positive", True),
    "pow_neg": (lambda x: x ** -1.5, lambda a: a ** -1.5, "positive", True),
    "clip": (lambda x: F.clip(x, -0.5, 0.5), lambda a: np.clip(a, -0.5, 0.5), "any", False),
    "clip_lo": (lambda x: x.clip(0.2), lambda a: np.maximum(a, 0.2), "any", False),
}


def _away_from_clip_kinks(x):
    for kink in (-0.5, 0.2, 0.5):
        x = np.where(np.abs(x - kink) < 0.03, x + 0.07, x)
    return x


# ---------------------------------------------------------------- binary ops
@pytest.mark.parametrize("name", BINARY)
@FEW
@given(shapes=pair_shapes, seed=seeds)
def test_binary_forward_and_gradcheck(name, shapes, seed):
    op, np_op, kind_a, kind_b, smooth = BINARY[name]
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    a, b = values(rng, sa, kind_a), values(rng, sb, kind_b)
    if name in ("maximum", "minimum"):  # a on a grid of 0.1, b halfway between: never a tie
        a, b = rng.integers(-20, 20, sa) * 0.1, rng.integers(-20, 20, sb) * 0.1 + 0.05
    ta, tb = leaf(a), leaf(b)
    out = op(ta, tb)
    assert out.shape == shapes.result_shape and out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), np_op(a, b), rtol=1e-12)
    assert mdl.gradcheck(op, [ta, tb])
    if smooth:
        assert mdl.gradgradcheck(op, [ta, tb])


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("sa, sb", [((0, 3), (3,)), ((0, 1), (1, 3)), ((2, 0), (2, 1)), ((0,), ())])
def test_binary_on_empty_batches(name, sa, sb):
    op, np_op, kind_a, kind_b, _ = BINARY[name]
    rng = np.random.default_rng(0)
    a, b = values(rng, sa, kind_a), values(rng, sb, kind_b)
    ta, tb = leaf(a), leaf(b)
    out = op(ta, tb)
    assert out.shape == np.broadcast_shapes(sa, sb)
    out.backward(grad=np.zeros(out.shape))
    assert ta.grad.shape == sa and tb.grad.shape == sb
    np.testing.assert_array_equal(tb.grad.numpy(), np.zeros(sb))  # summed over nothing


@pytest.mark.parametrize("name", BINARY)
def test_binary_broadcast_mismatch_names_the_op_and_shapes(name):
    op = BINARY[name][0]
    with pytest.raises(ValueError) as info:
        op(mdl.ones(2, 3), mdl.ones(4, 5))
    message = str(info.value)
    assert name in message and "(2, 3)" in message and "(4, 5)" in message


def test_where_broadcast_mismatch_names_the_op():
    with pytest.raises(ValueError, match=r"where.*\(2, 3\).*\(4,\)"):
        mdl.where(np.ones((2, 3), bool), mdl.ones(2, 3), mdl.ones(4))


# ---------------------------------------------------------------- unary ops
@pytest.mark.parametrize("name", UNARY)
@FEW
@given(shape=shapes, seed=seeds)
def test_unary_forward_and_gradcheck(name, shape, seed):
    op, np_op, kind, smooth = UNARY[name]
    x = values(np.random.default_rng(seed), shape, kind)
    if name.startswith("clip"):
        x = _away_from_clip_kinks(x)
    t = leaf(x)
    out = op(t)
    assert out.shape == shape and out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), np_op(x), rtol=1e-12)
    assert mdl.gradcheck(op, [t])
    if smooth:
        assert mdl.gradgradcheck(op, [t])


@pytest.mark.parametrize("name", UNARY)
def test_unary_on_an_empty_batch(name):
    op, np_op, kind, _ = UNARY[name]
    t = leaf(np.ones((0, 3)))
    out = op(t)
    assert out.shape == (0, 3)
    out.backward(grad=np.zeros((0, 3)))
    assert t.grad.shape == (0, 3)


# ---------------------------------------------------------------- where
@FEW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3), seed=seeds)
def test_where_forward_and_gradcheck(shapes, seed):
    sc, sa, sb = shapes.input_shapes
    rng = np.random.default_rng(seed)
    cond = rng.random(sc) < 0.5
    a, b = values(rng, sa), values(rng, sb)
    ta, tb = leaf(a), leaf(b)
    fn = lambda x, y: mdl.where(cond, x, y)  # noqa: E731
    np.testing.assert_array_equal(fn(ta, tb).numpy(), np.where(cond, a, b))
    assert mdl.gradcheck(fn, [ta, tb])
    assert mdl.gradcheck(lambda x, y: mdl.where(mdl.tensor(cond), x * x, y.exp()), [ta, tb])


def test_where_sends_the_gradient_only_to_the_chosen_branch():
    a, b = leaf(np.array([1.0, 2.0, 3.0])), leaf(np.array([10.0, 20.0, 30.0]))
    mdl.where(a > 1.5, a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 0.0, 0.0])


# ---------------------------------------------------------------- kinks, ties and hand-derived values
def test_maximum_and_minimum_split_ties_evenly():
    a, b = leaf(np.array([1.0, 2.0, 3.0])), leaf(np.array([1.0, 0.0, 5.0]))
    mdl.maximum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 0.0, 1.0])
    a.grad = b.grad = None
    mdl.minimum(a, b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(b.grad.numpy(), [0.5, 1.0, 0.0])


def test_maximum_with_a_scalar_is_relu_like():
    x = leaf(np.array([-1.0, 0.0, 2.0]))
    y = mdl.maximum(x, 0.0)
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 2.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.5, 1.0])


def test_abs_has_zero_gradient_at_zero():
    x = leaf(np.array([-2.0, 0.0, 3.0]))
    abs(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [-1.0, 0.0, 1.0])


def test_clip_passes_the_gradient_inside_and_on_the_bounds():
    x = leaf(np.array([-2.0, -1.0, 0.0, 1.0, 2.0]))
    y = F.clip(x, -1.0, 1.0)
    np.testing.assert_array_equal(y.numpy(), [-1.0, -1.0, 0.0, 1.0, 1.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 1.0, 1.0, 0.0])


def test_reflected_operators_with_python_and_numpy_operands():
    v = np.array([1.0, 2.0, 4.0])
    x = leaf(v)
    y = (2 - x) + 3 / x + 2 ** x + 5 * x + (1 + x) + np.ones(3) * x
    np.testing.assert_allclose(y.numpy(), (2 - v) + 3 / v + 2 ** v + 5 * v + (1 + v) + v)
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), -1 - 3 / v ** 2 + np.log(2) * 2 ** v + 5 + 1 + 1)


def test_power_by_hand():
    x = leaf(np.array([2.0]))
    (x ** 3).backward()
    assert x.grad.item() == 12.0
    x.grad = None
    (x ** -1).backward()
    assert x.grad.item() == -0.25
    x.grad = None
    e = leaf(np.array([3.0]))
    (x ** e).backward()  # d/de 2^e = 2^e ln 2
    assert x.grad.item() == pytest.approx(12.0) and e.grad.item() == pytest.approx(8 * np.log(2))


# ---------------------------------------------------------------- powers at zero
INF = np.inf
# (exponent x, d/dx 0**x): 0**x is 0 for x > 0 and 1 at 0, flat in x; for x < 0 it is +inf, and
# d/dx = 0**x · ln 0 = +inf · −inf = −inf.
ZERO_BASE = [(-2.0, -INF), (-1.0, -INF), (-0.5, -INF), (0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (2.0, 0.0)]
# (c, d/dx x**c at x = 0): c·0^(c−1), with x**0 = 1 flat in x.
SCALAR_EXPONENT_AT_ZERO = [(0, 0.0), (0.0, 0.0), (0.5, INF), (1, 1.0), (2, 0.0), (3, 0.0), (-1, -INF), (-2.0, -INF)]
# (y, d/dx x**y, d/dy x**y) at x = 0, with a tensor exponent.
TENSOR_EXPONENT_AT_ZERO = [(-1.0, -INF, -INF), (0.0, 0.0, 0.0), (0.5, INF, 0.0), (1.0, 1.0, 0.0), (2.0, 0.0, 0.0)]


def _grads(fn, *vals):
    ts = [mdl.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for v in vals]
    with np.errstate(divide="ignore", invalid="ignore"):
        return [g.numpy() for g in mdl.grad(fn(*ts).sum(), ts)]


def test_gradient_of_a_power_of_zero_by_hand():
    xs, expected = zip(*ZERO_BASE)
    np.testing.assert_array_equal(_grads(lambda x: 0.0 ** x, xs)[0], expected)
    np.testing.assert_array_equal(_grads(lambda x: F.pow(0.0, x), xs)[0], expected)
    # the same base as a tensor that needs no gradient, broadcast against the exponents
    np.testing.assert_array_equal(_grads(lambda x: mdl.zeros(2, 1, dtype="float64") ** x, xs)[0],
                                  2 * np.array(expected))


@pytest.mark.parametrize("c, expected", SCALAR_EXPONENT_AT_ZERO)
def test_gradient_of_zero_to_a_constant_power_by_hand(c, expected):
    (gx,) = _grads(lambda x: x ** c, [0.0, 2.0])
    assert gx[0] == expected
    assert gx[1] == pytest.approx(c * 2.0 ** (c - 1), rel=1e-15)  # the plain formula away from zero


def test_gradient_of_zero_to_a_tensor_power_by_hand():
    ys, dx, dy = zip(*TENSOR_EXPONENT_AT_ZERO)
    gx, gy = _grads(lambda x, y: x ** y, np.zeros(len(ys)), ys)
    np.testing.assert_array_equal(gx, dx)
    np.testing.assert_array_equal(gy, dy)
    # x**0 has gradient 0 in x wherever x is, and 2**y has gradient 2**y ln 2 in y
    gx, gy = _grads(lambda x, y: x ** y, [0.0, 3.0, 2.0], [0.0, 0.0, 3.0])
    np.testing.assert_array_equal(gx, [0.0, 0.0, 12.0])
    np.testing.assert_allclose(gy, [0.0, np.log(3.0), 8 * np.log(2.0)], rtol=1e-15)


def test_second_derivatives_of_powers_at_zero_are_finite_where_the_function_is_flat():
    def second(fn, *vals):
        ts = [mdl.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for v in vals]
        first = mdl.grad(fn(*ts).sum(), ts, create_graph=True)
        return [[g.numpy() for g in mdl.grad(f.sum(), ts, retain_graph=True)] for f in first]
    # 0**x = 0 for x > 0 and 1 at x = 0, flat from the right: d²/dx² = 0 (a NaN would come from 0 · ln 0)
    ((d2,),) = second(lambda x: 0.0 ** x, [0.0, 0.5, 2.0])
    np.testing.assert_array_equal(d2, 0.0)
    # x**2 with a tensor exponent at x = 0, y = 2: d²/dx² = y(y−1)x^(y−2) = 2; d²/dy² = x^y ln²x → 0;
    # d²/dx dy = x^(y−1)(1 + y ln x) → 0
    (dxx, dxy), (dyx, dyy) = second(lambda x, y: x ** y, [0.0], [2.0])
    np.testing.assert_array_equal([dxx, dxy, dyx, dyy], [[2.0], [0.0], [0.0], [0.0]])


def test_powers_at_zero_match_pytorch():
    torch = pytest.importorskip("torch")

    def theirs(fn, *vals):
        ts = [torch.tensor(np.asarray(v, dtype=np.float64), requires_grad=True) for v in vals]
        return [g.numpy() for g in torch.autograd.grad(fn(*ts).sum(), ts)]

    def same(ours, reference):  # the same infinities and NaNs; finite values to the last bits
        np.testing.assert_allclose(ours, reference, rtol=1e-14, atol=0)

    xs = [x for x, _ in ZERO_BASE]
    same(_grads(lambda x: 0.0 ** x, xs)[0], theirs(lambda x: 0.0 ** x, xs)[0])
    same(_grads(lambda x: F.pow(0.0, x), xs)[0], theirs(lambda x: torch.pow(0.0, x), xs)[0])
    for c, _ in SCALAR_EXPONENT_AT_ZERO:
        same(_grads(lambda x: x ** c, [0.0, -2.0, 2.0])[0],
                                      theirs(lambda x: x ** c, [0.0, -2.0, 2.0])[0])
    bases = np.array([[0.0], [-2.0], [2.0]])  # broadcast against the exponents
    exponents = np.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    for ours, reference in zip(_grads(lambda x, y: x ** y, bases, exponents),
                               theirs(lambda x, y: x ** y, bases, exponents)):
        same(ours, reference)


# ---------------------------------------------------------------- small powers as products
from minidl.ops.elementwise import SMALL_POWERS, power_array  # noqa: E402

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 0.5, -0.5, 3e-20, 7e15])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.complex128, np.int64])
def test_small_powers_are_within_three_ulps_of_the_exact_power(dtype):
    """power_array against a long-double pow rounded once to the dtype: within 3 ulps (x⁻⁴ takes
    four roundings), 5 for complex, integers exactly."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.2, 3.0, 500) * np.where(rng.random(500) < 0.5, -1, 1)
    if dtype == np.complex128:
        x = x + 1j * rng.uniform(-2, 2, 500)
    x = x.astype(dtype) if dtype != np.int64 else rng.integers(-50, 50, 500)
    for c in sorted(SMALL_POWERS):
        if dtype == np.int64 and type(c) is int and c < 0:  # NumPy refuses integers to negative integer powers
            with pytest.raises(ValueError):
                power_array(x, c)
            continue
        if dtype == np.int64 and abs(c) == 0.5:  # NumPy's own float64 power, NaN for the negative integers
            with np.errstate(invalid="ignore", divide="ignore"):
                np.testing.assert_array_equal(power_array(x, c), x ** c)
            continue
        with np.errstate(invalid="ignore"):
            y = power_array(x, c)
            exact = (x.astype(np.clongdouble if dtype == np.complex128 else np.longdouble) ** c)
        assert y.dtype == x.dtype
        if dtype == np.int64:
            np.testing.assert_array_equal(y, x ** c)
            continue
        rounded = exact.astype(dtype)
        finite = np.isfinite(rounded)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(rounded))
        ulps = 5 if dtype == np.complex128 else 3
        real = {np.float16: np.float32, np.complex128: np.float64}.get(dtype, dtype)  # float16: computed in float32
        tolerance = ulps * np.spacing(np.abs(rounded[finite]).astype(real))
        assert np.all(np.abs(y[finite] - rounded[finite]) <= np.abs(tolerance)), c


def test_small_powers_give_pytorchs_special_values(torch):
    """±0, ±∞, NaN and ordinary values: the same results as torch.pow, signs of zero and
    infinities included, and finite values to 2 ulps (PyTorch takes √, 1/√ and x·x·x itself)."""
    for dtype, torch_dtype in ((np.float32, torch.float32), (np.float64, torch.float64)):
        for c in sorted(SMALL_POWERS):
            with np.errstate(all="ignore"):
                ours = power_array(SPECIAL.astype(dtype), c)
            theirs = torch.pow(torch.tensor(SPECIAL, dtype=torch_dtype), c).numpy()
            np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
            exact = (np.isinf(theirs) | (theirs == 0)) & ~np.isnan(theirs)
            np.testing.assert_array_equal(ours[exact], theirs[exact])
            np.testing.assert_array_equal(np.signbit(ours[exact]), np.signbit(theirs[exact]))
            finite = ~exact & ~np.isnan(theirs)
            np.testing.assert_allclose(ours[finite], theirs[finite], rtol=4 * np.finfo(dtype).eps)


def test_other_exponents_and_integer_arrays_keep_numpys_power():
    x = np.array([1.5, 2.0, 0.25], np.float32)
    for c in (5, 0.25, -1.5, 2.5, np.float64(3.0)):
        np.testing.assert_array_equal(power_array(x, c), x ** c)
        assert power_array(x, c).dtype == (x ** c).dtype
    ints = np.array([2, -3, 4])
    assert power_array(ints, 3.0).dtype == np.float64  # a float exponent makes NumPy's float64, as before
    np.testing.assert_array_equal(power_array(ints, 3), [8, -27, 64])
    assert power_array(np.array(2.0), 3) == 8.0 and power_array(np.array(2.0), 3).shape == ()


def test_pow_with_a_tensor_exponent_keeps_float32():
    x = mdl.tensor([0.0, 1.5, 2.0], requires_grad=True)
    y = mdl.tensor([0.0, 2.0, 0.5], requires_grad=True)
    out = x ** y
    out.sum().backward()
    assert out.dtype == x.grad.dtype == y.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 3.0, 0.5 / np.sqrt(2.0)], rtol=1e-6)


# ---------------------------------------------------------------- float32 stays float32
FLOAT32_CASES = {
    "x*2.0": lambda x: x * 2.0, "2.0*x": lambda x: 2.0 * x, "x+1": lambda x: x + 1,
    "1-x": lambda x: 1 - x, "x/3": lambda x: x / 3, "3/x": lambda x: 3 / x,
    "x**2": lambda x: x ** 2, "x**0.5": lambda x: x ** 0.5, "x**-1": lambda x: x ** -1,
    "2**x": lambda x: 2 ** x, "-x": lambda x: -x, "exp": F.exp, "log": F.log, "sqrt": F.sqrt,
    "abs": F.abs, "clip": lambda x: F.clip(x, 0.5, 1.5), "maximum": lambda x: mdl.maximum(x, 1.0),
    "minimum": lambda x: mdl.minimum(x, 1.0), "where": lambda x: mdl.where(x > 1, x, 0.0),
    "x*x": lambda x: x * x, "x/x.exp()": lambda x: x / x.exp(),
}


@pytest.mark.parametrize("name", FLOAT32_CASES)
def test_float32_stays_float32_forward_and_backward(name):
    x = mdl.tensor([0.5, 1.25, 2.0], requires_grad=True)
    y = FLOAT32_CASES[name](x)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


# ---------------------------------------------------------------- on each device
@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum"])
def test_binary_on_device(device, name):
    op, np_op, kind_a, kind_b, _ = BINARY[name]
    rng = np.random.default_rng(1)
    a, b = values(rng, (2, 3), kind_a), values(rng, (3,), kind_b) + 0.1
    ta, tb = leaf(a, device), leaf(b, device)
    out = op(ta, tb)
    assert out.device == ta.device
    np.testing.assert_allclose(out.numpy(), np_op(a, b), rtol=1e-12)
    out.sum().backward()
    cpu_a, cpu_b = leaf(a), leaf(b)
    op(cpu_a, cpu_b).sum().backward()
    assert ta.grad.device == ta.device
    np.testing.assert_allclose(ta.grad.numpy(), cpu_a.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), cpu_b.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "abs", "square", "clip"])
def test_unary_on_device(device, name):
    op, np_op, kind, _ = UNARY[name]
    x = values(np.random.default_rng(2), (4,), kind)
    t = leaf(x, device)
    y = op(t)
    np.testing.assert_allclose(y.numpy(), np_op(x), rtol=1e-12)
    y.sum().backward()
    cpu = leaf(x)
    op(cpu).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), cpu.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("condition", [np.array([0.5, 0.0, np.nan]), np.array([1, 0, 2])], ids=["float", "int"])
def test_where_refuses_a_condition_that_is_not_boolean(condition):
    a, b = mdl.tensor([1.0, 2.0, 3.0]), mdl.tensor([-1.0, -2.0, -3.0])
    with pytest.raises(TypeError, match=rf"where: the condition must be a boolean tensor, got dtype {condition.dtype}"):
        F.where(mdl.tensor(condition), a, b)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="bool"):  # PyTorch refuses too, rather than reading NaN as true
        torch.where(torch.tensor(condition), torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -3.0]))
