"""Activations and the softmax family: NumPy formulas, finite differences, stability at ±1000."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl as mdl
import minidl.functional as F
from tests.conftest import check_device_against_cpu

FEW = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**32 - 1)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
batched = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)

_erf = np.vectorize(math.erf)


def np_sigmoid(x):
    return 1 / (1 + np.exp(-x))


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_logsumexp(x, axis, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# name: (minidl op, NumPy formula, smooth?) — pointwise activations
POINTWISE = {
    "relu": (F.relu, lambda x: np.maximum(x, 0), False),
    "leaky_relu": (F.leaky_relu, lambda x: np.where(x > 0, x, 0.01 * x), False),
    "leaky_relu_0.2": (lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x), False),
    "elu": (F.elu, lambda x: np.where(x > 0, x, np.exp(x) - 1), True),
    "elu_2": (lambda x: F.elu(x, 2.0), lambda x: np.where(x > 0, x, 2 * (np.exp(x) - 1)), True),
    "tanh": (F.tanh, np.tanh, True),
    "sigmoid": (F.sigmoid, np_sigmoid, True),
    "softplus": (F.softplus, lambda x: np.log1p(np.exp(x)), True),
    "gelu": (F.gelu, lambda x: x * 0.5 * (1 + _erf(x / math.sqrt(2))), True),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), np_gelu_tanh, True),
}
# name: (minidl op on axis, NumPy formula on axis)
SOFTMAX_FAMILY = {
    "softmax": (lambda x, axis: F.softmax(x, axis), np_softmax),
    "log_softmax": (lambda x, axis: F.log_softmax(x, axis), lambda x, axis: x - np_logsumexp(x, axis, True)),
    "logsumexp": (lambda x, axis: F.logsumexp(x, axis), np_logsumexp),
}


def away_from_zero(x):
    """relu/leaky_relu/elu kinks at 0: keep every value 0.1 from it."""
    return np.where(x >= 0, x + 0.1, x - 0.1)


@pytest.mark.parametrize("name", POINTWISE)
@FEW
@given(shape=shapes, seed=seeds)
def test_pointwise_forward_and_gradcheck(name, shape, seed):
    op, np_op, smooth = POINTWISE[name]
    x = away_from_zero(np.random.default_rng(seed).standard_normal(shape) * 2)
    t = mdl.tensor(x, requires_grad=True)
    y = op(t)
    assert y.shape == shape and y.dtype == np.float64
    np.testing.assert_allclose(y.numpy(), np_op(x), rtol=1e-10, atol=1e-12)
    assert mdl.gradcheck(op, [t])
    if smooth:
        assert mdl.gradgradcheck(op, [t])


@pytest.mark.parametrize("name", list(POINTWISE) + list(SOFTMAX_FAMILY))
def test_empty_batch(name):
    t = mdl.tensor(np.zeros((0, 3)), requires_grad=True)
    y = POINTWISE[name][0](t) if name in POINTWISE else SOFTMAX_FAMILY[name][0](t, -1)
    assert y.shape == ((0,) if name == "logsumexp" else (0, 3))
    y.backward(grad=np.zeros(y.shape))
    assert t.grad.shape == (0, 3)


def test_relu_and_leaky_relu_gradients_by_hand():
    x = mdl.tensor(np.array([-2.0, 0.0, 3.0]), requires_grad=True)
    F.relu(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 1.0])  # 0 at the kink, as PyTorch
    x.grad = None
    F.leaky_relu(x, 0.1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.1, 0.1, 1.0])


@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
@FEW
@given(shape=batched, seed=seeds, data=st.data())
def test_softmax_family_forward_and_gradcheck(name, shape, seed, data):
    op, np_op = SOFTMAX_FAMILY[name]
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    x = np.random.default_rng(seed).standard_normal(shape) * 3
    t = mdl.tensor(x, requires_grad=True)
    y = op(t, axis)
    np.testing.assert_allclose(y.numpy(), np_op(x, axis), rtol=1e-10, atol=1e-12)
    fn = lambda a: op(a, axis)  # noqa: E731
    assert mdl.gradcheck(fn, [t])
    assert mdl.gradgradcheck(fn, [t])


def test_softmax_rows_sum_to_one_and_dim_alias():
    x = mdl.randn(4, 5, dtype="float64")
    np.testing.assert_allclose(F.softmax(x, dim=0).numpy().sum(axis=0), np.ones(5))
    np.testing.assert_array_equal(F.softmax(x, dim=0).numpy(), x.softmax(axis=0).numpy())
    np.testing.assert_array_equal(F.log_softmax(x, dim=1).numpy(), x.log_softmax().numpy())


@FEW
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=3), seed=seeds, data=st.data())
def test_logsumexp_axis_variants_and_keepdims(shape, seed, data):
    ndim = len(shape)
    axis = data.draw(st.one_of(
        st.none(), st.integers(-ndim, ndim - 1),
        st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True).map(tuple)), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    x = np.random.default_rng(seed).standard_normal(shape)
    t = mdl.tensor(x, requires_grad=True)
    y = F.logsumexp(t, axis, keepdims)
    np.testing.assert_allclose(y.numpy(), np_logsumexp(x, axis, keepdims), rtol=1e-12)
    if axis is not None:  # dim=None means "not given" (the default axis -1), not "all axes"
        np.testing.assert_array_equal(F.logsumexp(t, dim=axis, keepdim=keepdims).numpy(), y.numpy())
    assert mdl.gradcheck(lambda a: F.logsumexp(a, axis, keepdims), [t])


# ---------------------------------------------------------------- stability at ±1000
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_family_is_stable_at_plus_minus_1000(dtype):
    x = np.array([[1000.0, -1000.0, 999.0, 0.0], [-1000.0, -1000.0, -999.0, -1001.0]], dtype=dtype)
    t = mdl.tensor(x, requires_grad=True)
    shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True).astype(np.float64)
    lse = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-6 if dtype == np.float32 else 0)
    p = np.exp(shifted - lse)
    # with an upstream gradient of ones: d softmax = p(1 − Σp) = 0, d log_softmax = 1 − 4p, d logsumexp = p
    for y, expected, expected_grad in ((t.softmax(), p, 0 * p), (t.log_softmax(), shifted - lse, 1 - 4 * p),
                                       (t.logsumexp(), (x.max(axis=-1, keepdims=True) + lse)[:, 0], p)):
        assert y.dtype == dtype and np.isfinite(y.numpy()).all()
        np.testing.assert_allclose(y.numpy(), expected, **tol)
        y.backward(grad=np.ones(y.shape, dtype))
        assert t.grad.dtype == dtype
        np.testing.assert_allclose(t.grad.numpy(), expected_grad, rtol=1e-5, atol=1e-5)
        t.grad = None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_logsumexp_of_an_all_minus_inf_row_is_minus_inf_not_nan():
    x = mdl.tensor(np.array([[-np.inf, -np.inf], [0.0, 0.0]]))
    np.testing.assert_array_equal(x.logsumexp().numpy(), [-np.inf, np.log(2.0)])
    np.testing.assert_allclose(x.log_softmax().numpy()[1], np.log([0.5, 0.5]), rtol=1e-15)


@pytest.mark.parametrize("name", ["sigmoid", "softplus", "tanh", "elu", "gelu", "gelu_tanh"])
def test_pointwise_activations_are_finite_at_plus_minus_1000(name):
    op, np_op, _ = POINTWISE[name]
    x = mdl.tensor(np.array([-1000.0, -30.0, 30.0, 1000.0]), requires_grad=True)
    with np.errstate(over="raise", invalid="raise"):  # no overflow anywhere inside
        y = op(x)
        y.sum().backward()
    assert np.isfinite(y.numpy()).all() and np.isfinite(x.grad.numpy()).all()
    np.testing.assert_allclose(y.numpy()[[0, 3]], {"sigmoid": [0, 1], "softplus": [0, 1000], "tanh": [-1, 1],
                                                   "elu": [-1, 1000], "gelu": [0, 1000],
                                                   "gelu_tanh": [0, 1000]}[name], atol=1e-12)


# ---------------------------------------------------------------- errors and dtypes
@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
@pytest.mark.parametrize("axis", [2, -3])
def test_axis_out_of_range_names_the_op_and_shape(name, axis):
    with pytest.raises(ValueError) as info:
        SOFTMAX_FAMILY[name][0](mdl.randn(2, 3), axis)
    message = str(info.value)
    assert name in message and "(2, 3)" in message and str(axis) in message


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="gelu.*'fast'"):
        F.gelu(mdl.randn(2), approximate="fast")


ALL_FLOAT32 = {**{k: v[0] for k, v in POINTWISE.items()},
               **{k: (lambda op: lambda x: op(x, -1))(v[0]) for k, v in SOFTMAX_FAMILY.items()}}


@pytest.mark.parametrize("name", ALL_FLOAT32)
def test_float32_stays_float32(name):
    x = mdl.tensor([[-1.5, 0.25, 2.0]], requires_grad=True)
    y = ALL_FLOAT32[name](x)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


def test_gelu_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.linspace(-4, 4, 17)
    for approximate in ("none", "tanh"):
        t = mdl.tensor(x, requires_grad=True)
        F.gelu(t, approximate=approximate).sum().backward()
        tt = torch.tensor(x, requires_grad=True)
        ty = torch.nn.functional.gelu(tt, approximate=approximate)
        ty.sum().backward()
        ours = F.gelu(mdl.tensor(x), approximate).numpy()
        np.testing.assert_allclose(ours, ty.detach().numpy(), rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-10, atol=1e-14)


# ---------------------------------------------------------------- on each device
@pytest.mark.parametrize("name", ["relu", "elu", "tanh", "sigmoid", "softplus", "gelu",
                                  "softmax", "log_softmax", "logsumexp"])
def test_forward_and_backward_on_device(device, name):
    x = away_from_zero(np.random.default_rng(3).standard_normal((3, 4)))
    check_device_against_cpu(ALL_FLOAT32[name], x, device, rtol=1e-12, seed=4)
