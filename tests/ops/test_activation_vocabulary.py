"""The activations of the PyTorch vocabulary: NumPy formulas, PyTorch's values and gradients
(first and second order, at ±50 and at the kinks), PyTorch's keywords, dim rules and inplace."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.tensor import Tensor

SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def np_sigmoid(x):
    return 0.5 * np.tanh(0.5 * x) + 0.5


def np_softplus(x):
    return np.logaddexp(0, x)


# name: (minidl call, NumPy formula, torch call) for the pointwise activations and their keyword forms
POINTWISE = {
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x)), lambda F_, x: F_.silu(x)),
    "mish": (F.mish, lambda x: x * np.tanh(np_softplus(x)), lambda F_, x: F_.mish(x)),
    "selu": (F.selu, lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0))),
             lambda F_, x: F_.selu(x)),
    "celu": (F.celu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), lambda F_, x: F_.celu(x)),
    "celu_alpha": (lambda x: F.celu(x, alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0) / 0.5)),
                   lambda F_, x: F_.celu(x, alpha=0.5)),
    "relu6": (F.relu6, lambda x: np.minimum(np.maximum(x, 0), 6), lambda F_, x: F_.relu6(x)),
    "hardtanh": (F.hardtanh, lambda x: np.clip(x, -1, 1), lambda F_, x: F_.hardtanh(x)),
    "hardtanh_bounds": (lambda x: F.hardtanh(x, min_val=-0.5, max_val=2.0), lambda x: np.clip(x, -0.5, 2.0),
                        lambda F_, x: F_.hardtanh(x, min_val=-0.5, max_val=2.0)),
    "hardswish": (F.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6, lambda F_, x: F_.hardswish(x)),
    "hardsigmoid": (F.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1), lambda F_, x: F_.hardsigmoid(x)),
    "logsigmoid": (F.logsigmoid, lambda x: -np_softplus(-x), lambda F_, x: F_.logsigmoid(x)),
    "softsign": (F.softsign, lambda x: x / (1 + np.abs(x)), lambda F_, x: F_.softsign(x)),
    "softplus": (F.softplus, lambda x: np.where(x > 20, x, np_softplus(x)), lambda F_, x: F_.softplus(x)),
    "softplus_beta": (lambda x: F.softplus(x, beta=2.0, threshold=3.0),
                      lambda x: np.where(2 * x > 3, x, np_softplus(2 * x) / 2),
                      lambda F_, x: F_.softplus(x, beta=2.0, threshold=3.0)),
    "leaky_relu_kw": (lambda x: F.leaky_relu(x, negative_slope=0.2), lambda x: np.where(x > 0, x, 0.2 * x),
                      lambda F_, x: F_.leaky_relu(x, negative_slope=0.2)),
    "elu_kw": (lambda x: F.elu(x, alpha=0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(np.minimum(x, 0))),
               lambda F_, x: F_.elu(x, alpha=0.5)),
    "gelu_tanh_kw": (lambda x: F.gelu(x, approximate="tanh"),
                     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                     lambda F_, x: F_.gelu(x, approximate="tanh")),
    "gelu_none_kw": (lambda x: F.gelu(x, approximate="none"),
                     lambda x: x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
                     lambda F_, x: F_.gelu(x, approximate="none")),
}
SMOOTH = ["silu", "mish", "logsigmoid", "softplus", "softplus_beta", "gelu_tanh_kw", "gelu_none_kw", "celu"]
# far out, both sides of every kink (0, ±1, ±3, 6, softplus_beta's cut-off at 1.5), at none of them exactly
X = np.concatenate([[-50.0, -30.0, -20.5, -7.3, -3.2, -2.9, -1.2, -0.8, -0.3, 0.2, 0.9, 1.1, 1.4, 1.6, 2.7],
                    [3.1, 5.9, 6.2, 19.5, 20.5, 30.0, 50.0], np.linspace(-4.05, 4.05, 28)])


def minidl_value_and_grad(fn, x, v, create_graph=False):
    t = mdl.tensor(x, requires_grad=True)
    y = fn(t)
    (g,) = mdl.grad([y], [t], grad_outputs=[Tensor(v)], create_graph=create_graph)
    return t, y, g


@pytest.mark.parametrize("name", POINTWISE)
def test_values_match_the_numpy_formula(name):
    op, formula, _ = POINTWISE[name]
    y = op(mdl.tensor(X))
    assert y.dtype == np.float64 and y.shape == X.shape
    np.testing.assert_allclose(y.numpy(), formula(X), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", POINTWISE)
def test_float32_stays_float32(name):
    op, formula, _ = POINTWISE[name]
    y = op(mdl.tensor(X.astype(np.float32)))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), formula(X), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", POINTWISE)
def test_values_and_gradients_match_torch(name):
    torch = pytest.importorskip("torch")
    op, _, torch_op = POINTWISE[name]
    v = np.random.default_rng(0).standard_normal(X.shape)
    _, y, g = minidl_value_and_grad(op, X, v)
    tx = torch.tensor(X, requires_grad=True)
    ty = torch_op(torch.nn.functional, tx)
    (tg,) = torch.autograd.grad(ty, tx, torch.tensor(v))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-13, atol=1e-15)
    # torch's float64 hardsigmoid backward multiplies by 1/6 rounded to float32 (relative error 3e-8)
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-7 if name == "hardsigmoid" else 1e-12, atol=1e-15)


def test_hardsigmoid_gradient_is_exactly_one_sixth_inside():
    _, _, g = minidl_value_and_grad(F.hardsigmoid, np.array([-4.0, -2.5, 0.3, 2.9, 3.5]), np.ones(5))
    np.testing.assert_array_equal(g.numpy(), [0.0, 1 / 6, 1 / 6, 1 / 6, 0.0])


@pytest.mark.parametrize("name", SMOOTH)
def test_second_derivatives_match_torch(name):
    torch = pytest.importorskip("torch")
    op, _, torch_op = POINTWISE[name]
    rng = np.random.default_rng(1)
    v, w = rng.standard_normal(X.shape), rng.standard_normal(X.shape)
    t, _, g = minidl_value_and_grad(op, X, v, create_graph=True)
    (gg,) = mdl.grad([g], [t], grad_outputs=[Tensor(w)])
    tx = torch.tensor(X, requires_grad=True)
    (tg,) = torch.autograd.grad(torch_op(torch.nn.functional, tx), tx, torch.tensor(v), create_graph=True)
    (tgg,) = torch.autograd.grad(tg, tx, torch.tensor(w))
    np.testing.assert_allclose(gg.numpy(), tgg.numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("name,kinks", [("relu6", [0.0, 6.0]), ("hardtanh", [-1.0, 1.0]),
                                        ("hardswish", [-3.0, 3.0]), ("hardsigmoid", [-3.0, 3.0])])
def test_gradient_at_the_kinks_is_pytorchs(name, kinks):
    """PyTorch's choice at a kink: 0 outside the open interval (hardswish: 0 at −3, 1 at 3)."""
    torch = pytest.importorskip("torch")
    op, _, torch_op = POINTWISE[name]
    x = np.array(kinks)
    _, _, g = minidl_value_and_grad(op, x, np.ones(2))
    tx = torch.tensor(x, requires_grad=True)
    torch_op(torch.nn.functional, tx).sum().backward()
    np.testing.assert_array_equal(g.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logsigmoid_and_softplus_are_finite_and_exact_far_out(dtype):
    x = mdl.tensor(np.array([-1000.0, -50.0, 50.0, 1000.0], dtype), requires_grad=True)
    y = F.logsigmoid(x)
    y.sum().backward()
    np.testing.assert_allclose(y.numpy(), [-1000.0, -50.0, -np.exp(-50.0), 0.0], rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 1.0, np.exp(-50.0), 0.0], rtol=1e-6)
    x.grad = None
    y = F.softplus(x)
    y.sum().backward()
    np.testing.assert_allclose(y.numpy(), [0.0, np.exp(-50.0), 50.0, 1000.0], rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), [0.0, np.exp(-50.0), 1.0, 1.0], rtol=1e-6)
    x.grad = None
    F.mish(x).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()


def test_softplus_threshold_is_pytorchs_linear_region():
    """Above threshold/β the output is x itself and the gradient exactly 1; threshold=None has no cut-off."""
    x = mdl.tensor(np.array([0.5, 1.49, 1.51, 25.0]), requires_grad=True)
    y = F.softplus(x, beta=2, threshold=3)
    y.sum().backward()
    assert y.numpy()[2] == 1.51 and y.numpy()[3] == 25.0
    np.testing.assert_allclose(y.numpy()[:2], np.log1p(np.exp(2 * x.numpy()[:2])) / 2, rtol=1e-14)
    np.testing.assert_allclose(x.grad.numpy(), [np_sigmoid(1.0), np_sigmoid(2.98), 1.0, 1.0], rtol=1e-14)
    assert F.softplus(mdl.tensor(np.array([25.0])), threshold=None).numpy()[0] == 25.0 + np.log1p(np.exp(-25.0))


def test_selu_keeps_a_unit_gaussian_at_zero_mean_unit_variance():
    """The point of SELU's constants (Klambauer et al. 2017): N(0, 1) in, mean ≈ 0 and variance ≈ 1 out."""
    y = F.selu(mdl.tensor(np.random.default_rng(0).standard_normal(400_000))).numpy()
    assert abs(y.mean()) < 0.01 and abs(y.var() - 1) < 0.01


# ---------------------------------------------------------------- glu, prelu, softmin
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_glu_matches_torch(dim):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).standard_normal((4, 6, 2))
    v = np.random.default_rng(3).standard_normal(torch.nn.functional.glu(torch.tensor(x), dim).shape)
    _, y, g = minidl_value_and_grad(lambda t: F.glu(t, dim), x, v)
    half = x.shape[dim] // 2
    a, b = np.split(x, 2, axis=dim)
    np.testing.assert_allclose(y.numpy(), a * np_sigmoid(b), rtol=1e-13)
    assert y.shape[dim] == half
    tx = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad(torch.nn.functional.glu(tx, dim), tx, torch.tensor(v))
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-12, atol=1e-15)


def test_glu_refuses_an_odd_dimension():
    with pytest.raises(ValueError, match=r"glu: .*even.*dimension 1.*\(2, 3\).*size 3"):
        F.glu(mdl.randn(2, 3), dim=1)


@pytest.mark.parametrize("x_shape,w_shape", [((2, 3, 4, 5), (3,)), ((2, 3), (3,)), ((2, 3, 4), (1,)), ((5,), (1,)),
                                             ((2, 3), ())])
def test_prelu_matches_torch_values_and_both_gradients(x_shape, w_shape):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal(x_shape), rng.uniform(-0.5, 0.5, w_shape)
    v = rng.standard_normal(x_shape)
    tx, tw = mdl.tensor(x, requires_grad=True), mdl.tensor(w, requires_grad=True)
    y = F.prelu(tx, tw)
    gx, gw = mdl.grad([y], [tx, tw], grad_outputs=[Tensor(v)])
    w_b = w.reshape((-1,) + (1,) * (len(x_shape) - 2)) if w.size > 1 else w
    np.testing.assert_allclose(y.numpy(), np.where(x > 0, x, w_b * x), rtol=1e-15)
    torch_x, torch_w = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.prelu(torch_x, torch_w)
    tgx, tgw = torch.autograd.grad(ty, [torch_x, torch_w], torch.tensor(v))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-15)
    np.testing.assert_allclose(gx.numpy(), tgx.numpy(), rtol=1e-14)
    assert gw.shape == w.shape
    np.testing.assert_allclose(gw.numpy(), tgw.numpy(), rtol=1e-12)


def test_prelu_is_a_tensor_method_and_checks_its_weight():
    x, w = mdl.randn(2, 3, dtype="float64"), mdl.tensor(np.array([0.1, 0.2, 0.3]))
    np.testing.assert_array_equal(x.prelu(w).numpy(), F.prelu(x, w).numpy())
    with pytest.raises(ValueError, match=r"prelu: weight has 4 slopes.*\(2, 3\).*3 channel"):
        F.prelu(x, mdl.tensor(np.ones(4)))
    with pytest.raises(ValueError, match=r"prelu: .*1 channel"):
        F.prelu(mdl.randn(4), mdl.tensor(np.ones(4)))
    with pytest.raises(ValueError, match=r"prelu: weight must be a scalar or 1-D.*\(1, 3\)"):
        F.prelu(x, mdl.tensor(np.ones((1, 3))))


@pytest.mark.parametrize("dim", [0, 1])
def test_softmin_matches_torch(dim):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(5).standard_normal((3, 4)) * 3
    v = np.random.default_rng(6).standard_normal((3, 4))
    _, y, g = minidl_value_and_grad(lambda t: F.softmin(t, dim=dim), x, v)
    e = np.exp(-x - (-x).max(axis=dim, keepdims=True))
    np.testing.assert_allclose(y.numpy(), e / e.sum(axis=dim, keepdims=True), rtol=1e-13)
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.softmin(tx, dim=dim)
    (tg,) = torch.autograd.grad(ty, tx, torch.tensor(v))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-13)
    np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-11, atol=1e-15)


# ---------------------------------------------------------------- the softmax family's dim
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_softmax_family_without_dim_is_pytorchs_implicit_choice_up_to_two_axes(name, shape):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(7).standard_normal(shape)
    with pytest.warns(UserWarning, match="Implicit dimension"):
        expected = getattr(torch.nn.functional, name)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(getattr(F, name)(mdl.tensor(x)).numpy(), expected, rtol=1e-13)


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_family_without_dim_refuses_three_axes(name):
    """PyTorch's implicit choice there is axis 0 (3-D) or 1 (4-D): not the last axis, so minidl asks for dim."""
    with pytest.raises(ValueError, match=rf"{name}: give dim for an input of shape \(2, 3, 4\)"):
        getattr(F, name)(mdl.randn(2, 3, 4))
    assert getattr(F, name)(mdl.randn(2, 3, 4), -1).shape == (2, 3, 4)


def test_softmax_family_keywords_and_dtype():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    tx = torch.tensor(x)
    for name in ["softmax", "log_softmax", "softmin"]:
        ours, theirs = getattr(F, name), getattr(torch.nn.functional, name)
        np.testing.assert_allclose(ours(mdl.tensor(x), dim=1).numpy(), theirs(tx, dim=1).numpy(), rtol=1e-6)
        np.testing.assert_array_equal(ours(mdl.tensor(x), axis=1).numpy(), ours(mdl.tensor(x), 1).numpy())
        y = ours(mdl.tensor(x), dim=0, dtype=np.float64)
        assert y.dtype == np.float64
        np.testing.assert_allclose(y.numpy(), theirs(tx, dim=0, dtype=torch.float64).numpy(), rtol=1e-13)
    np.testing.assert_allclose(mdl.tensor(x).softmax(2).numpy(), tx.softmax(2).numpy(), rtol=1e-6)
    np.testing.assert_allclose(mdl.tensor(x).log_softmax(dim=0).numpy(), tx.log_softmax(dim=0).numpy(), rtol=1e-6)


# ---------------------------------------------------------------- inplace
INPLACE = {
    "relu": lambda x, **k: F.relu(x, **k), "leaky_relu": lambda x, **k: F.leaky_relu(x, 0.2, **k),
    "elu": lambda x, **k: F.elu(x, 0.5, **k), "silu": F.silu, "mish": F.mish, "selu": F.selu,
    "celu": lambda x, **k: F.celu(x, 0.5, **k), "relu6": F.relu6,
    "hardtanh": lambda x, **k: F.hardtanh(x, -0.5, 2.0, **k), "hardswish": F.hardswish,
    "hardsigmoid": F.hardsigmoid,
}


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_writes_into_the_input_and_returns_it(name):
    op = INPLACE[name]
    data = np.linspace(-5, 7, 13)
    expected = op(mdl.tensor(data)).numpy()
    x = mdl.tensor(data.copy())
    out = op(x, inplace=True)
    assert out is x
    np.testing.assert_array_equal(x.numpy(), expected)
    leaf = mdl.tensor(data.copy(), requires_grad=True)
    with mdl.no_grad():
        assert op(leaf, inplace=True) is leaf
    np.testing.assert_array_equal(leaf.numpy(), expected)
    np.testing.assert_array_equal(op(mdl.tensor(data), inplace=False).numpy(), expected)


@pytest.mark.parametrize("name", INPLACE)
def test_inplace_on_a_tensor_that_needs_a_gradient_is_refused(name):
    x = mdl.tensor(np.linspace(-5, 7, 13), requires_grad=True)
    hidden = x * 2  # a non-leaf, as after a convolution
    with pytest.raises(RuntimeError, match=rf"{name}\(inplace=True\): minidl records no in-place op.*inplace=False"):
        INPLACE[name](hidden, inplace=True)
    np.testing.assert_array_equal(hidden.numpy(), np.linspace(-10, 14, 13))  # untouched


# ---------------------------------------------------------------- errors and devices
def test_bad_arguments_raise_naming_the_op():
    with pytest.raises(ValueError, match=r"hardtanh: min_val \(2.0\) cannot be greater than max_val \(1.0\)"):
        F.hardtanh(mdl.randn(3), 2.0, 1.0)
    with pytest.raises(ValueError, match="celu: alpha cannot be 0"):
        F.celu(mdl.randn(3), alpha=0.0)
    with pytest.raises(ValueError, match="glu: a 0-d input"):
        F.glu(mdl.tensor(1.0))


def test_every_new_activation_runs_on_the_device(device):
    x = np.random.default_rng(9).standard_normal((4, 6)).astype(np.float32) * 4
    w = np.array([0.1, -0.2, 0.3, 0.05, 0.2, 0.25], np.float32)
    calls = [F.silu, F.mish, F.selu, F.celu, F.relu6, F.hardtanh, F.hardswish, F.hardsigmoid, F.logsigmoid,
             F.softsign, lambda t: F.softmin(t, 1), lambda t: F.softplus(t, 2.0, 3.0), F.glu,
             lambda t: F.prelu(t, mdl.tensor(w).to(t.device))]
    for call in calls:
        cpu = mdl.tensor(x, requires_grad=True)
        on = mdl.tensor(x, requires_grad=True, device=device)
        call(cpu).sum().backward()
        y = call(on)
        y.sum().backward()
        assert y.device == on.device and y.dtype == np.float32
        np.testing.assert_allclose(y.numpy(), call(mdl.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(on.grad.numpy(), cpu.grad.numpy(), rtol=1e-5, atol=1e-6)
