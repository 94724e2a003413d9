"""Elementwise math (minidl.ops.math, clamp, div's rounding modes): values against NumPy formulas
written independently of the op, and values and gradients against PyTorch's autograd."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.conftest import leaf


def grads_of(fn, arrays, upstream):
    """minidl's gradients of sum(upstream · fn(*inputs)), as NumPy arrays."""
    xs = [leaf(a) for a in arrays]
    fn(*xs).backward(mdl.tensor(upstream))
    return [x.grad.numpy() for x in xs]


def torch_grads_of(torch, fn, arrays, upstream):
    xs = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in arrays]
    fn(*xs).backward(torch.tensor(upstream))
    return [x.grad.numpy() for x in xs]


# name: (domain (low, high), an independent NumPy formula for y, one for dy/dx)
ERF = np.vectorize(math.erf)
UNARY = {
    "sin": ((-3, 3), lambda x: np.imag(np.exp(1j * x)), lambda x: np.real(np.exp(1j * x))),
    "cos": ((-3, 3), lambda x: np.real(np.exp(1j * x)), lambda x: -np.imag(np.exp(1j * x))),
    "tan": ((-1.3, 1.3), lambda x: np.sin(x) / np.cos(x), lambda x: 1 / np.cos(x) ** 2),
    "asin": ((-0.9, 0.9), lambda x: np.arctan(x / np.sqrt(1 - x * x)), lambda x: (1 - x * x) ** -0.5),
    "acos": ((-0.9, 0.9), lambda x: np.pi / 2 - np.arctan(x / np.sqrt(1 - x * x)), lambda x: -(1 - x * x) ** -0.5),
    "atan": ((-4, 4), lambda x: np.arcsin(x / np.sqrt(1 + x * x)), lambda x: 1 / (1 + x * x)),
    "sinh": ((-3, 3), lambda x: (np.exp(x) - np.exp(-x)) / 2, lambda x: (np.exp(x) + np.exp(-x)) / 2),
    "cosh": ((-3, 3), lambda x: (np.exp(x) + np.exp(-x)) / 2, lambda x: (np.exp(x) - np.exp(-x)) / 2),
    "asinh": ((-3, 3), lambda x: np.sign(x) * np.log(np.abs(x) + np.sqrt(x * x + 1)), lambda x: (x * x + 1) ** -0.5),
    "acosh": ((1.1, 4), lambda x: np.log(x + np.sqrt(x * x - 1)), lambda x: (x * x - 1) ** -0.5),
    "atanh": ((-0.9, 0.9), lambda x: 0.5 * np.log((1 + x) / (1 - x)), lambda x: 1 / (1 - x * x)),
    "rsqrt": ((0.2, 4), lambda x: x ** -0.5, lambda x: -0.5 * x ** -1.5),
    "reciprocal": ((0.2, 4), lambda x: x ** -1.0, lambda x: -(x ** -2.0)),
    "erf": ((-3, 3), ERF, lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x)),
    "erfc": ((-3, 3), lambda x: 1 - ERF(x), lambda x: -2 / np.sqrt(np.pi) * np.exp(-x * x)),
    "log1p": ((-0.5, 3), lambda x: np.log(1 + x), lambda x: 1 / (1 + x)),
    "expm1": ((-3, 3), lambda x: np.exp(x) - 1, np.exp),
    "log2": ((0.2, 8), lambda x: np.log(x) / np.log(2), lambda x: 1 / (x * np.log(2))),
    "log10": ((0.2, 8), lambda x: np.log(x) / np.log(10), lambda x: 1 / (x * np.log(10))),
    "exp2": ((-3, 3), lambda x: np.exp(x * np.log(2)), lambda x: np.log(2) * np.exp(x * np.log(2))),
}


@pytest.mark.parametrize("name", UNARY)
def test_unary_values_and_derivatives_match_independent_formulas(name):
    (low, high), formula, derivative = UNARY[name]
    rng = np.random.default_rng(0)
    x = rng.uniform(low, high, (3, 4))
    g = rng.standard_normal((3, 4))
    y = getattr(F, name)(leaf(x))
    np.testing.assert_allclose(y.numpy(), formula(x), rtol=1e-10, atol=1e-13)
    (dx,) = grads_of(getattr(F, name), [x], g)
    np.testing.assert_allclose(dx, g * derivative(x), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", UNARY)
def test_unary_values_and_gradients_match_torch(name, torch):
    (low, high), _, _ = UNARY[name]
    rng = np.random.default_rng(1)
    x = rng.uniform(low, high, (2, 5))
    g = rng.standard_normal((2, 5))
    ours = getattr(mdl, name)(leaf(x))
    theirs = getattr(torch, name)(torch.tensor(x))
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads_of(getattr(F, name), [x], g)[0],
                               torch_grads_of(torch, getattr(torch, name), [x], g)[0], rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name", UNARY)
def test_unary_dtypes_follow_torch(name, torch):
    """float32 stays float32 (and float64 float64); an integer input gives float32, as in PyTorch."""
    (low, high), _, _ = UNARY[name]
    x32 = mdl.tensor(np.linspace(low, high, 5, dtype=np.float32))
    assert getattr(F, name)(x32).dtype == np.float32
    ints = np.arange(math.ceil(low), math.floor(high) + 1)[:3]  # inside the domain
    ours = getattr(F, name)(mdl.tensor(ints))
    theirs = getattr(torch, name)(torch.tensor(ints))
    assert ours.dtype == np.float32 and theirs.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)


def test_unary_methods_and_package_names_are_the_functional_ops():
    for name in UNARY:
        (low, high), _, _ = UNARY[name]
        x = leaf([low + 0.1, high - 0.1])
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(F, name)(x).numpy())
        assert getattr(mdl, name) is getattr(F, name)


def test_erfc_keeps_its_accuracy_in_the_tail(torch):
    """1 − erf(x) would round to 0 here; erfc itself must not (SciPy's erfc on the CPU)."""
    pytest.importorskip("scipy")
    x = np.array([4.0, 6.0, 10.0])
    np.testing.assert_allclose(F.erfc(mdl.tensor(x)).numpy(), torch.erfc(torch.tensor(x)).numpy(), rtol=1e-12)
    assert F.erfc(mdl.tensor(np.float32([4.0]))).item() > 1e-8


# ---------------------------------------------------------------- step functions
STEPS = ["floor", "ceil", "trunc", "round", "sign"]
EDGES = np.array([-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, -1.7, 1.2, 3.0, -3.0, 0.49])


@pytest.mark.parametrize("name", STEPS)
def test_step_functions_match_torch_at_halves_and_zeros(name, torch):
    ours = getattr(F, name)(mdl.tensor(EDGES)).numpy()
    theirs = getattr(torch, name)(torch.tensor(EDGES)).numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))  # -0.0 stays -0.0


def test_step_functions_against_numpy_formulas():
    x = EDGES
    np.testing.assert_array_equal(F.floor(mdl.tensor(x)).numpy(), x - np.mod(x, 1))
    np.testing.assert_array_equal(F.ceil(mdl.tensor(x)).numpy(), -((-x) - np.mod(-x, 1)))
    np.testing.assert_array_equal(F.trunc(mdl.tensor(x)).numpy(), np.sign(x) * (np.abs(x) - np.mod(np.abs(x), 1)))
    np.testing.assert_array_equal(F.round(mdl.tensor(x)).numpy(), [round(v) for v in x])  # Python: halves to even
    np.testing.assert_array_equal(F.sign(mdl.tensor(x)).numpy(), (x > 0) * 1.0 - (x < 0))


@pytest.mark.parametrize("decimals", [1, 2, -1])
def test_round_with_decimals_matches_torch(decimals, torch):
    x = np.array([1.234, -5.678, 15.0, 123.456, 0.125, 0.375, -25.0])
    ours = F.round(mdl.tensor(x), decimals=decimals).numpy()
    np.testing.assert_array_equal(ours, torch.round(torch.tensor(x), decimals=decimals).numpy())
    np.testing.assert_allclose(ours, [round(v, decimals) for v in x], rtol=1e-15)


@pytest.mark.parametrize("name", STEPS)
def test_step_functions_have_zero_gradient_as_torch(name, torch):
    x = np.array([-1.5, -0.3, 0.0, 0.7, 2.0])
    g = np.arange(1.0, 6.0)
    ours = grads_of(getattr(F, name), [x], g)[0]
    np.testing.assert_array_equal(ours, torch_grads_of(torch, getattr(torch, name), [x], g)[0])
    np.testing.assert_array_equal(ours, np.zeros(5))


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round"])
def test_rounding_an_integer_tensor_gives_an_integer_copy(name):
    x = mdl.tensor([3, -4])
    y = getattr(F, name)(x)
    assert y.dtype == np.int64 and y.tolist() == [3, -4]
    y.array[0] = 0
    assert x.tolist() == [3, -4]


def test_round_rejects_a_float_decimals():
    with pytest.raises(TypeError, match="round: decimals must be an int"):
        F.round(mdl.tensor([1.0]), decimals=1.5)


# ---------------------------------------------------------------- remainders and rounded division
A = np.array([5.5, -5.5, 5.5, -5.5, 3.0, -3.0, 0.0, 7.25])
B = np.array([2.0, 2.0, -2.0, -2.0, 1.5, 1.5, 3.0, -0.5])


def test_fmod_and_remainder_follow_torch_signs(torch):
    ta, tb = torch.tensor(A), torch.tensor(B)
    np.testing.assert_array_equal(F.fmod(mdl.tensor(A), mdl.tensor(B)).numpy(), torch.fmod(ta, tb).numpy())
    np.testing.assert_array_equal(F.remainder(mdl.tensor(A), mdl.tensor(B)).numpy(), torch.remainder(ta, tb).numpy())
    np.testing.assert_array_equal((mdl.tensor(A) % mdl.tensor(B)).numpy(), (ta % tb).numpy())


def test_fmod_and_remainder_against_their_definitions():
    fmod = F.fmod(mdl.tensor(A), mdl.tensor(B)).numpy()
    rem = F.remainder(mdl.tensor(A), mdl.tensor(B)).numpy()
    np.testing.assert_allclose(fmod, A - np.trunc(A / B) * B, atol=1e-15)
    np.testing.assert_allclose(rem, A - np.floor(A / B) * B, atol=1e-15)
    np.testing.assert_array_equal(rem, [math.fmod(a, b) if (math.fmod(a, b) == 0 or (math.fmod(a, b) < 0) == (b < 0))
                                        else math.fmod(a, b) + b for a, b in zip(A, B)])
    assert all(f == 0 or np.sign(f) == np.sign(a) for f, a in zip(fmod, A))  # the dividend's sign
    assert all(r == 0 or np.sign(r) == np.sign(b) for r, b in zip(rem, B))  # the divisor's sign


def test_remainder_operators_with_numbers_and_integers(torch):
    x = mdl.tensor([5, -5, 7])
    t = torch.tensor([5, -5, 7])
    assert (x % 3).tolist() == (t % 3).tolist() == [2, 1, 1]
    assert (x % 3).dtype == np.int64
    assert (13 % x).tolist() == (13 % t).tolist()
    assert F.fmod(x, 3).tolist() == torch.fmod(t, 3).tolist() == [2, -2, 1]
    y = mdl.tensor([5.5, -5.5], dtype="float32")
    assert (y % 2).dtype == np.float32 and (y % 2).tolist() == [1.5, 0.5]


@pytest.mark.parametrize("name", ["fmod", "remainder"])
def test_fmod_and_remainder_gradients_match_torch(name, torch):
    a = np.array([[5.3, -5.3, 2.2], [-0.7, 3.9, -4.1]])
    b = np.array([2.1, -1.7, 0.9])
    g = np.random.default_rng(0).standard_normal((2, 3))
    ours = grads_of(getattr(F, name), [a, b], g)
    theirs = torch_grads_of(torch, getattr(torch, name), [a, b], g)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-12)
    rounded = np.trunc(a / b) if name == "fmod" else np.floor(a / b)
    np.testing.assert_allclose(ours[1], -(g * rounded).sum(axis=0), rtol=1e-12)  # db = −dy · q, summed over rows


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_div_rounding_modes_match_torch(mode, dtype, torch):
    a = np.array([7, -7, 7, -7, 6, -6, 0, 9]).astype(dtype)
    b = np.array([2, 2, -2, -2, 3, 3, 5, 4]).astype(dtype)
    ours = F.div(mdl.tensor(a), mdl.tensor(b), rounding_mode=mode)
    theirs = torch.div(torch.tensor(a), torch.tensor(b), rounding_mode=mode)
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(ours.numpy(), (np.trunc if mode == "trunc" else np.floor)(a / b))


def test_floor_division_operator_matches_torch(torch):
    a, b = np.array([7.5, -7.5, 7, -7]), np.array([2.0, 2.0, -2.0, 3.0])
    floored = (mdl.tensor(a) // mdl.tensor(b)).numpy()
    np.testing.assert_array_equal(floored, (torch.tensor(a) // torch.tensor(b)).numpy())
    np.testing.assert_array_equal((mdl.tensor(a) // 2).numpy(), (torch.tensor(a) // 2).numpy())
    np.testing.assert_array_equal((10 // mdl.tensor(b)).numpy(), (10 // torch.tensor(b)).numpy())
    assert (mdl.tensor([7, -7]) // 2).tolist() == [3, -4]
    np.testing.assert_array_equal(mdl.tensor(a).floor_divide(3).numpy(), np.floor(a / 3))


def test_rounded_division_has_zero_gradient_as_torch(torch):
    a, b = np.array([5.3, -2.2]), np.array([2.0, 0.7])
    g = np.array([1.0, 2.0])
    for mode in ("trunc", "floor"):
        ours = grads_of(lambda x, y: F.div(x, y, rounding_mode=mode), [a, b], g)
        theirs = torch_grads_of(torch, lambda x, y: torch.div(x, y, rounding_mode=mode), [a, b], g)
        for o, t in zip(ours, theirs):
            np.testing.assert_array_equal(o, t)
            np.testing.assert_array_equal(o, np.zeros(2))


def test_div_without_a_rounding_mode_is_true_division_and_bad_modes_are_refused(torch):
    np.testing.assert_allclose(F.div(mdl.tensor([7.0]), 2).numpy(), [3.5])
    ints = mdl.tensor([7, -3]) / mdl.tensor([2, 4])  # integers divide into float32, as torch
    assert ints.dtype == np.float32 == (torch.tensor([7, -3]) / torch.tensor([2, 4])).numpy().dtype
    assert ints.tolist() == [3.5, -0.75] and (mdl.tensor([1]) / 4).dtype == np.float32
    with pytest.raises(ValueError, match="div: rounding_mode must be None, 'trunc' or 'floor', got 'round'"):
        F.div(mdl.tensor([7.0]), 2, rounding_mode="round")


# ---------------------------------------------------------------- two-argument smooth ops
SMOOTH_BINARY = {
    "atan2": (lambda a, b: np.angle(b + 1j * a), lambda a, b: (b / (a * a + b * b), -a / (a * a + b * b))),
    "logaddexp": (lambda a, b: np.log(np.exp(a) + np.exp(b)),
                  lambda a, b: (np.exp(a) / (np.exp(a) + np.exp(b)), np.exp(b) / (np.exp(a) + np.exp(b)))),
    "copysign": (lambda a, b: np.abs(a) * np.where(b < 0, -1.0, 1.0),
                 lambda a, b: (np.sign(a) * np.where(b < 0, -1.0, 1.0), np.zeros_like(b))),
}


@pytest.mark.parametrize("name", SMOOTH_BINARY)
def test_binary_values_and_gradients_against_formulas_and_torch(name, torch):
    formula, derivatives = SMOOTH_BINARY[name]
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    g = rng.standard_normal((3, 4))
    y = getattr(F, name)(leaf(a), leaf(b))
    np.testing.assert_allclose(y.numpy(), formula(a, b), rtol=1e-12)
    np.testing.assert_allclose(y.numpy(), getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy(), rtol=1e-12)
    ours = grads_of(getattr(F, name), [a, b], g)
    theirs = torch_grads_of(torch, getattr(torch, name), [a, b], g)
    for o, t, d in zip(ours, theirs, derivatives(a, b)):
        np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(o, g * d, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name", SMOOTH_BINARY)
def test_binary_broadcast_gradients_sum_back(name, torch):
    rng = np.random.default_rng(3)
    a, b, g = rng.standard_normal((2, 3)), rng.standard_normal(3), rng.standard_normal((2, 3))
    ours = grads_of(getattr(F, name), [a, b], g)
    theirs = torch_grads_of(torch, getattr(torch, name), [a, b], g)
    assert ours[1].shape == (3,)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-10, atol=1e-14)


def test_logaddexp_does_not_overflow():
    y = F.logaddexp(leaf([1000.0, -1000.0]), leaf([1000.0, -1001.0]))
    np.testing.assert_allclose(y.numpy(), [1000 + np.log(2), -1000 + np.log1p(np.exp(-1.0))], rtol=1e-15)


def test_copysign_follows_signed_zeros_and_gives_zero_gradient_at_zero(torch):
    a = np.array([0.0, -0.0, 1.5, -2.0, 3.0])
    b = np.array([-1.0, 1.0, -0.0, 0.0, -np.inf])
    ours = F.copysign(mdl.tensor(a), mdl.tensor(b)).numpy()
    theirs = torch.copysign(torch.tensor(a), torch.tensor(b)).numpy()
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
    g = np.ones(5)
    np.testing.assert_array_equal(grads_of(F.copysign, [a, b], g)[0],
                                  torch_grads_of(torch, torch.copysign, [a, b], g)[0])


def test_atan2_quadrants(torch):
    y = np.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0])
    x = np.array([1.0, -1.0, -1.0, 1.0, -1.0, 1.0])
    np.testing.assert_allclose(F.atan2(mdl.tensor(y), mdl.tensor(x)).numpy(),
                               [math.atan2(a, b) for a, b in zip(y, x)], rtol=1e-15)
    np.testing.assert_array_equal(mdl.tensor(y).atan2(mdl.tensor(x)).numpy(),
                                  torch.atan2(torch.tensor(y), torch.tensor(x)).numpy())


@pytest.mark.parametrize("name", ["atan2", "fmod", "remainder", "logaddexp", "copysign", "floor_divide"])
def test_binary_broadcast_mismatch_names_the_op(name):
    with pytest.raises(ValueError, match=rf"{'div' if name == 'floor_divide' else name}: shapes \(2, 3\) and \(4,\)"):
        getattr(F, name)(mdl.ones(2, 3), mdl.ones(4))


# ---------------------------------------------------------------- lerp
def test_lerp_with_a_number_weight_matches_torch(torch):
    rng = np.random.default_rng(4)
    a, b, g = rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    y = F.lerp(leaf(a), leaf(b), 0.3)
    np.testing.assert_allclose(y.numpy(), 0.7 * a + 0.3 * b, rtol=1e-12)
    np.testing.assert_allclose(y.numpy(), torch.lerp(torch.tensor(a), torch.tensor(b), 0.3).numpy(), rtol=1e-12)
    ours = grads_of(lambda x, z: F.lerp(x, z, 0.3), [a, b], g)
    theirs = torch_grads_of(torch, lambda x, z: torch.lerp(x, z, 0.3), [a, b], g)
    for o, t, d in zip(ours, theirs, (0.7, 0.3)):
        np.testing.assert_allclose(o, t, rtol=1e-12)
        np.testing.assert_allclose(o, g * d, rtol=1e-12)


def test_lerp_with_a_tensor_weight_matches_torch(torch):
    rng = np.random.default_rng(5)
    a, b, w = rng.standard_normal((2, 3)), rng.standard_normal(3), rng.uniform(0, 1, (2, 1))
    g = rng.standard_normal((2, 3))
    np.testing.assert_allclose(mdl.tensor(a).lerp(mdl.tensor(b), mdl.tensor(w)).numpy(), a + w * (b - a), rtol=1e-12)
    ours = grads_of(F.lerp, [a, b, w], g)
    theirs = torch_grads_of(torch, torch.lerp, [a, b, w], g)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-12)
    np.testing.assert_allclose(ours[2], (g * (b - a)).sum(axis=1, keepdims=True), rtol=1e-12)


# ---------------------------------------------------------------- clamp
def test_clamp_with_numbers_passes_the_gradient_at_the_bounds_as_torch(torch):
    x = np.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    g = np.arange(1.0, 6.0)
    for lo, hi in [(0.0, 1.0), (None, 1.0), (0.0, None)]:
        ours = grads_of(lambda t: F.clamp(t, lo, hi), [x], g)[0]
        theirs = torch_grads_of(torch, lambda t: torch.clamp(t, lo, hi), [x], g)[0]
        np.testing.assert_array_equal(ours, theirs)
        inside = (x >= (-np.inf if lo is None else lo)) & (x <= (np.inf if hi is None else hi))
        np.testing.assert_array_equal(ours, g * inside)
        np.testing.assert_array_equal(F.clamp(mdl.tensor(x), lo, hi).numpy(), np.clip(x, lo, hi))


# (x, min, max) triples at and around every boundary, with ties and crossed bounds
CLAMP_CASES = np.array([
    [0.0, 0.0, 1.0], [1.0, 0.0, 1.0], [-1.0, 0.0, 1.0], [2.0, 0.0, 1.0], [0.5, 0.0, 1.0],
    [0.5, 1.0, 0.0], [0.5, 0.5, 0.5], [0.0, 0.5, 0.5], [1.0, 0.5, 0.5], [3.0, 2.0, -2.0],
]).T


def test_clamp_with_tensor_bounds_matches_torch_values_and_gradients(torch):
    x, lo, hi = CLAMP_CASES
    g = np.arange(1.0, len(x) + 1)
    np.testing.assert_array_equal(F.clamp(mdl.tensor(x), mdl.tensor(lo), mdl.tensor(hi)).numpy(),
                                  np.minimum(np.maximum(x, lo), hi))
    ours = grads_of(F.clamp, [x, lo, hi], g)
    theirs = torch_grads_of(torch, torch.clamp, [x, lo, hi], g)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o, t)
    # whatever the case, the whole gradient goes to one input or (only at x < min = max) none
    total = sum(ours)
    assert set(total / g) <= {0.0, 1.0}


@pytest.mark.parametrize("which", ["min", "max"])
def test_clamp_with_one_tensor_bound_matches_torch(which, torch):
    x = np.array([-1.0, 0.0, 0.3, 1.0, 2.0])
    bound = np.array([0.0, 0.0, 0.5, 1.5, 1.0])
    g = np.arange(1.0, 6.0)
    ours = grads_of(lambda a, b: F.clamp(a, **{which: b}), [x, bound], g)
    theirs = torch_grads_of(torch, lambda a, b: torch.clamp(a, **{which: b}), [x, bound], g)
    for o, t in zip(ours, theirs):
        np.testing.assert_array_equal(o, t)
    other = "max" if which == "min" else "min"
    mixed = F.clamp(mdl.tensor(x), **{which: mdl.tensor(bound), other: 0.8})  # torch wants both tensors here
    expected = torch.clamp(torch.tensor(x), **{which: torch.tensor(bound), other: torch.tensor(np.float64(0.8))})
    np.testing.assert_array_equal(mixed.numpy(), expected.numpy())


def test_clamp_broadcasts_tensor_bounds_and_sums_their_gradients(torch):
    rng = np.random.default_rng(6)
    x, lo, hi = rng.standard_normal((3, 4)), rng.uniform(-1, -0.2, 4), rng.uniform(0.2, 1, (3, 1))
    g = rng.standard_normal((3, 4))
    ours = grads_of(F.clamp, [x, lo, hi], g)
    theirs = torch_grads_of(torch, torch.clamp, [x, lo, hi], g)
    assert [o.shape for o in ours] == [(3, 4), (4,), (3, 1)]
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t, rtol=1e-15)


def test_clamp_on_integers_and_its_aliases():
    x = mdl.tensor([-5, 0, 5])
    assert F.clamp(x, -2, 2).tolist() == [-2, 0, 2]
    assert F.clamp(x, min=mdl.tensor([0, 1, 2])).tolist() == [0, 1, 5]
    assert x.clamp(max=mdl.tensor(1)).tolist() == [-5, 0, 1]
    assert x.clip(-1, 1).tolist() == F.clip(x, lo=-1, hi=1).tolist() == [-1, 0, 1]
    with pytest.raises(ValueError, match="clamp: at least one of min and max"):
        F.clamp(x)
    with pytest.raises(ValueError, match=r"clamp: shapes \(3,\), \(2,\) \(min\)"):
        F.clamp(x, mdl.tensor([0, 1]), 3)


# ---------------------------------------------------------------- predicates and logical ops
SPECIAL = np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 1e308])


@pytest.mark.parametrize("name", ["isnan", "isinf", "isfinite"])
def test_predicates_match_torch_and_carry_no_gradient(name, torch):
    x = mdl.tensor(SPECIAL, requires_grad=True)
    y = getattr(F, name)(x)
    assert y.dtype == np.bool_ and not y.requires_grad and y.creator is None
    np.testing.assert_array_equal(y.numpy(), getattr(torch, name)(torch.tensor(SPECIAL)).numpy())
    expected = {"isnan": SPECIAL != SPECIAL, "isinf": np.abs(SPECIAL) == np.inf,
                "isfinite": (SPECIAL == SPECIAL) & (np.abs(SPECIAL) != np.inf)}[name]
    np.testing.assert_array_equal(y.numpy(), expected)
    np.testing.assert_array_equal(getattr(mdl.tensor([1, 2]), name)().numpy(),
                                  getattr(torch.tensor([1, 2]), name)().numpy())  # integers too


def test_isclose_and_allclose_use_torch_defaults(torch):
    b = np.array([1.0, 1.0, 1e-9, 0.0, np.nan, 100.0])
    a = b + np.array([0.9e-5, 1.2e-5, 0.0, 2e-8, 0.0, 1.1e-3])
    ours = F.isclose(mdl.tensor(a), mdl.tensor(b)).numpy()
    np.testing.assert_array_equal(ours, torch.isclose(torch.tensor(a), torch.tensor(b)).numpy())
    np.testing.assert_array_equal(ours, np.abs(a - b) <= 1e-8 + 1e-5 * np.abs(b))
    nan_ok = F.isclose(mdl.tensor(a), mdl.tensor(b), equal_nan=True).numpy()
    np.testing.assert_array_equal(nan_ok, torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=True).numpy())
    assert mdl.allclose(mdl.tensor(a[:3]), mdl.tensor(b[:3]), rtol=2e-5) is True
    assert mdl.allclose(mdl.tensor(a), mdl.tensor(b)) is False
    assert mdl.tensor([1.0, 2.0]).allclose(mdl.tensor([1.0, 2.0 + 1e-7]))
    assert F.isclose(mdl.tensor([1.0, 2.0]), 1.0).tolist() == [True, False]


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical_ops_match_torch_on_any_dtype(name, torch):
    a = np.array([0.0, 2.0, 0.0, -1.5])
    b = np.array([0, 0, 3, 1])
    ours = getattr(F, name)(mdl.tensor(a), mdl.tensor(b))
    assert ours.dtype == np.bool_
    np.testing.assert_array_equal(ours.numpy(), getattr(torch, name)(torch.tensor(a), torch.tensor(b)).numpy())
    expected = {"logical_and": [False, False, False, True], "logical_or": [False, True, True, True],
                "logical_xor": [False, True, True, False]}[name]
    assert ours.tolist() == expected
    assert getattr(mdl.tensor(a), name)(mdl.tensor(b)).tolist() == expected


def test_logical_not_and_mask_operators():
    m = mdl.tensor([True, False, True])
    assert F.logical_not(mdl.tensor([0.0, 3.0])).tolist() == [True, False]
    assert (~m).tolist() == [False, True, False]
    assert (m & mdl.tensor([True, True, False])).tolist() == [True, False, False]
    assert (m | mdl.tensor([False, True, False])).tolist() == [True, True, True]
    assert (m ^ True).tolist() == (True ^ m).tolist() == [False, True, False]
    assert (mdl.tensor([6, 3]) & 5).tolist() == [4, 1]  # integers: bitwise, as torch
    with pytest.raises(TypeError, match="need bool or integer tensors, got float32"):
        ~mdl.tensor([1.0])


def test_logical_ops_name_the_op_when_shapes_do_not_broadcast():
    with pytest.raises(ValueError, match=r"logical_and: shapes \(2,\) and \(3,\)"):
        F.logical_and(mdl.ones(2), mdl.ones(3))


# ---------------------------------------------------------------- Tensor methods
def test_every_listed_method_is_attached_to_tensor():
    from minidl.ops import activation, elementwise, linalg, reduction, shape
    from minidl.ops import math as ops_math
    for family in (activation, elementwise, linalg, ops_math, reduction, shape):
        for name in family.TENSOR_METHODS:
            assert getattr(mdl.Tensor, name) is getattr(family, name), name


def test_arithmetic_methods_match_the_operators(torch):
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0.5, 2, (2, 3)), rng.uniform(0.5, 2, (3,))
    x, y = mdl.tensor(a), mdl.tensor(b)
    tx, ty = torch.tensor(a), torch.tensor(b)
    for name in ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "remainder", "fmod"):
        np.testing.assert_allclose(getattr(x, name)(y).numpy(), getattr(tx, name)(ty).numpy(), rtol=1e-14)
    for name in ("neg", "exp", "log", "sqrt", "abs"):
        np.testing.assert_allclose(getattr(x, name)().numpy(), getattr(tx, name)().numpy(), rtol=1e-14)
    np.testing.assert_allclose(x.matmul(mdl.tensor(a.T)).numpy(), a @ a.T, rtol=1e-14)
    np.testing.assert_allclose(x.div(y, rounding_mode="floor").numpy(), np.floor(a / b))


def test_tensor_where_takes_torch_argument_order(torch):
    a, b = np.array([1.0, -2.0, 3.0]), np.array([9.0, 9.0, 9.0])
    cond = a > 0
    ours = mdl.tensor(a).where(mdl.tensor(cond), mdl.tensor(b))
    np.testing.assert_array_equal(ours.numpy(), torch.tensor(a).where(torch.tensor(cond), torch.tensor(b)).numpy())
    np.testing.assert_array_equal(ours.numpy(), [1.0, 9.0, 3.0])
