"""Reductions: every axis form (None, int, negative, tuple) with keepdims, ties, ddof, empty axes."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl as mdl
import minidl.functional as F

FEW = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**32 - 1)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)

def _numpy_spelling(op, **fixed):
    """The op called with NumPy's axis/keepdims (max and min then give values only, as np.max)."""
    return lambda x, axis=None, keepdims=False: op(x, axis=axis, keepdims=keepdims, **fixed)


REDUCTIONS = {
    "sum": (_numpy_spelling(F.sum), np.sum),
    "mean": (_numpy_spelling(F.mean), np.mean),
    "max": (_numpy_spelling(F.max), np.max),
    "min": (_numpy_spelling(F.min), np.min),
    "var": (_numpy_spelling(F.var, ddof=0), np.var),
    "var_ddof1": (_numpy_spelling(F.var),  # PyTorch's default: unbiased
                  lambda x, axis=None, keepdims=False: np.var(x, axis=axis, keepdims=keepdims, ddof=1)),
}
SMOOTH = {"sum", "mean", "var", "var_ddof1"}


@st.composite
def axis_for(draw, ndim):
    """None, one axis (maybe negative) or a tuple of distinct axes (maybe negative)."""
    one = st.integers(-ndim, ndim - 1)
    return draw(st.one_of(st.none(), one, st.lists(one, min_size=1, max_size=ndim, unique_by=lambda a: a % ndim)
                          .map(tuple)))


def distinct_values(rng, shape):
    """A permutation of well-separated values: max/min have no ties, so finite differences apply."""
    n = int(np.prod(shape))
    return rng.permutation(np.arange(n, dtype=np.float64) * 0.37 - n * 0.15).reshape(shape)


@pytest.mark.parametrize("name", REDUCTIONS)
@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_forward_and_gradcheck_over_every_axis_form(name, shape, seed, data):
    op, np_op = REDUCTIONS[name]
    axis = data.draw(axis_for(len(shape)), label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    x = distinct_values(np.random.default_rng(seed), shape)
    if name == "var_ddof1":  # needs more than one element in each reduced group
        reduced = np.prod([shape[a] for a in np.atleast_1d(axis if axis is not None else range(len(shape)))])
        if reduced < 2:
            return
    t = mdl.tensor(x, requires_grad=True)
    y = op(t, axis, keepdims)
    expected = np_op(x, axis=axis, keepdims=keepdims)
    assert y.shape == np.shape(expected) and y.dtype == np.float64
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)
    fn = lambda a: op(a, axis, keepdims)  # noqa: E731
    assert mdl.gradcheck(fn, [t])
    if name in SMOOTH:
        assert mdl.gradgradcheck(lambda a: fn(a * a), [t])


@pytest.mark.parametrize("name", ["sum", "mean", "var"])
def test_dim_and_keepdim_aliases(name):
    x = mdl.tensor(np.random.default_rng(0).standard_normal((2, 3, 4)))
    op = getattr(F, name)
    for axis in (1, -1, (0, 2)):
        np.testing.assert_array_equal(op(x, dim=axis, keepdim=True).numpy(), op(x, axis=axis, keepdims=True).numpy())
        np.testing.assert_array_equal(op(x, axis, keepdim=True).numpy(), op(x, axis=axis, keepdims=True).numpy())
        np.testing.assert_array_equal(getattr(x, name)(dim=axis).numpy(), op(x, axis=axis).numpy())


def test_methods_match_functions():
    x = mdl.tensor(np.arange(6.0).reshape(2, 3))
    assert x.sum().item() == 15.0 and x.mean().item() == 2.5
    np.testing.assert_array_equal(x.max(axis=0).numpy(), [3.0, 4.0, 5.0])
    np.testing.assert_array_equal(x.min(axis=1, keepdims=True).numpy(), [[0.0], [3.0]])


# ---------------------------------------------------------------- ties, ddof, by hand
def test_max_and_min_split_ties_evenly():
    # NumPy's spelling (axis=) and the global max share the gradient among ties, as PyTorch's amax and max()
    x = mdl.tensor(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]), requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    x.grad = None
    x.max().backward()  # over everything: the two 3s share
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [0, 0, 0]])
    x.grad = None
    x.min(axis=0).backward(grad=np.array([1.0, 10.0, 100.0]))
    np.testing.assert_allclose(x.grad.numpy(), [[1, 0, 0], [0, 10, 100]])


@pytest.mark.parametrize("ddof", [0, 1, 2])
def test_var_with_ddof_matches_numpy_and_the_hand_gradient(ddof):
    v = np.array([1.0, 2.0, 4.0, 7.0])
    x = mdl.tensor(v, requires_grad=True)
    y = x.var(ddof=ddof)
    assert y.item() == pytest.approx(np.var(v, ddof=ddof), rel=1e-14)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (v - v.mean()) / (len(v) - ddof), rtol=1e-14)


def _var_case(shape, axis, ddof):
    v = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5 + 1.0
    x = mdl.tensor(v, requires_grad=True)
    with pytest.warns(RuntimeWarning):  # NumPy warns that there are no degrees of freedom left
        y = F.var(x, axis=axis, ddof=ddof)
    with np.errstate(invalid="ignore"):  # inf · 0 = NaN is the expected value here
        y.sum().backward()
    return v, y.numpy(), x.grad.numpy()


def test_var_with_as_many_corrections_as_values_is_nan_or_inf_not_an_exception():
    # one value per row, ddof=1: 0/0 in the forward; the factor 2/(n − ddof) = 2/0 = +inf meets x − x̄ = 0
    _, y, grad = _var_case((3, 1), 1, 1)
    assert np.isnan(y).all() and y.shape == (3,)
    assert np.isnan(grad).all() and grad.shape == (3, 1)
    # two values per row, ddof=2: Σ(x − x̄)² = 2·0.75² > 0 over 0 is +inf; x − x̄ = ∓0.75 gives ∓inf
    _, y, grad = _var_case((3, 2), 1, 2)
    np.testing.assert_array_equal(y, [np.inf] * 3)
    np.testing.assert_array_equal(grad, [[-np.inf, np.inf]] * 3)


def test_var_with_more_corrections_than_values_keeps_the_finite_factor():
    # n = 2, ddof = 3: the forward divides by max(n − ddof, 0) = 0; dx = 2(x − x̄)/(n − ddof) = −2·(∓0.75)
    _, y, grad = _var_case((3, 2), 1, 3)
    np.testing.assert_array_equal(y, [np.inf] * 3)
    np.testing.assert_array_equal(grad, [[1.5, -1.5]] * 3)


@pytest.mark.parametrize("ddof", [0, 1])
def test_var_over_an_empty_axis_is_nan_with_an_empty_gradient(ddof):
    _, y, grad = _var_case((3, 0), 1, ddof)
    assert y.shape == (3,) and np.isnan(y).all()
    assert grad.shape == (3, 0)


@pytest.mark.parametrize("shape, axis, ddof", [
    ((3, 1), 1, 1), ((3, 2), 1, 2), ((3, 2), 1, 3), ((3, 2), (0, 1), 6), ((3, 0), 1, 0), ((3, 0), 1, 1),
    ((1,), 0, 1), ((4, 3), 0, 1),
])
def test_var_without_degrees_of_freedom_matches_pytorch(shape, axis, ddof):
    torch = pytest.importorskip("torch")
    v = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5 + 1.0
    x = mdl.tensor(v, requires_grad=True)
    theirs = torch.tensor(v, requires_grad=True)
    with warnings.catch_warnings():  # both libraries warn that no degrees of freedom are left
        warnings.simplefilter("ignore")
        y = F.var(x, axis=axis, ddof=ddof)
        y.sum().backward()
        ty = torch.var(theirs, dim=axis, correction=ddof)
        ty.sum().backward()
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(x.grad.numpy(), theirs.grad.numpy())


def test_var_accepts_pytorchs_correction_keyword():
    v = np.array([[1.0, 2.0, 4.0], [0.5, -1.0, 3.0]])
    for correction in (0, 1, 2):
        np.testing.assert_allclose(F.var(mdl.tensor(v), dim=1, correction=correction).numpy(),
                                   np.var(v, axis=1, ddof=correction), rtol=1e-14)
    np.testing.assert_allclose(mdl.tensor(v).var(dim=0, correction=1, keepdim=True).numpy(),
                               np.var(v, axis=0, ddof=1, keepdims=True), rtol=1e-14)


def test_mean_gradient_is_one_over_n():
    x = mdl.tensor(np.ones((4, 5)), requires_grad=True)
    x.mean(axis=(0, 1)).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((4, 5), 1 / 20))


# ---------------------------------------------------------------- empty axes and 0-d tensors
def test_reductions_over_an_empty_batch():
    x = mdl.tensor(np.zeros((0, 3)), requires_grad=True)
    s = x.sum(axis=0)
    np.testing.assert_array_equal(s.numpy(), np.zeros(3))
    s.backward(grad=np.ones(3))
    assert x.grad.shape == (0, 3)
    m = x.mean(axis=1)  # one mean per (absent) row
    assert m.shape == (0,)
    m.backward(grad=np.zeros(0))
    mx = x.max(axis=1)  # max over the non-empty axis of an empty batch: an empty result
    assert mx.shape == (0,)
    mx.backward(grad=np.zeros(0))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_over_an_empty_axis_is_a_clear_error(name):
    with pytest.raises(ValueError, match=f"{name}.*empty.*\\(0, 3\\)"):
        REDUCTIONS[name][0](mdl.zeros(0, 3), 0)
    with pytest.raises(ValueError, match=f"{name}.*empty.*\\(0, 3\\)"):
        getattr(F, name)(mdl.zeros(0, 3), 0)  # PyTorch's spelling: (values, indices)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
@pytest.mark.parametrize("axis", [0, -1, None])
def test_zero_dimensional_input(name, axis):
    x = mdl.tensor(np.array(2.5), requires_grad=True)
    y = REDUCTIONS[name][0](x, axis)  # PyTorch accepts axis 0 and -1 on a 0-d tensor
    assert y.shape == () and y.item() == (0.0 if name == "var" else 2.5)  # population variance of one value
    y.backward()
    assert x.grad.item() == (0.0 if name == "var" else 1.0)


# ---------------------------------------------------------------- errors and dtypes
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
@pytest.mark.parametrize("axis", [2, -3, (0, 5)])
def test_axis_out_of_range_names_the_op_and_shape(name, axis):
    with pytest.raises(ValueError) as info:
        REDUCTIONS[name][0](mdl.zeros(2, 3), axis)
    message = str(info.value)
    assert name in message and "(2, 3)" in message and "out of range" in message


@pytest.mark.parametrize("name", REDUCTIONS)
def test_float32_stays_float32(name):
    x = mdl.tensor([[1.0, 2.5, -1.0], [0.5, 3.0, 2.0]], requires_grad=True)
    y = REDUCTIONS[name][0](x, 1)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


# ---------------------------------------------------------------- on each device
@pytest.mark.parametrize("name", REDUCTIONS)
def test_forward_and_backward_on_device(device, name):
    op, np_op = REDUCTIONS[name]
    x = distinct_values(np.random.default_rng(0), (3, 4))
    t = mdl.tensor(x, requires_grad=True, device=device)
    c = mdl.tensor(x, requires_grad=True)
    y = op(t, 1)
    np.testing.assert_allclose(y.numpy(), np_op(x, axis=1), rtol=1e-12)
    y.backward(grad=mdl.tensor(np.arange(3.0), device=device))
    op(c, 1).backward(grad=np.arange(3.0))
    assert t.grad.device == t.device
    np.testing.assert_allclose(t.grad.numpy(), c.grad.numpy(), rtol=1e-12)


def test_std_at_zero_spread_has_gradient_zero_as_pytorch():
    """std = √var: at a constant row the chain rule gives 0·∞ = NaN; PyTorch masks it to 0, and so do we.
    The other row keeps the usual dx = (x − x̄) / ((n − 1)·std)."""
    rows = np.array([[2.5, 2.5, 2.5, 2.5], [1.0, 2.0, 4.0, 7.0]])
    x = mdl.tensor(rows, requires_grad=True)
    F.std(x, dim=1).sum().backward()
    centered = rows[1] - rows[1].mean()
    expected = np.stack([np.zeros(4), centered / (3 * rows[1].std(ddof=1))])
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12, atol=0)
    torch = pytest.importorskip("torch")
    t = torch.tensor(rows, requires_grad=True)
    t.std(dim=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-12, atol=0)


def test_a_constant_feature_does_not_make_a_normalized_loss_nan():
    x = mdl.tensor(np.array([[1.0, 3.0], [1.0, 5.0], [1.0, 4.0]]), requires_grad=True)  # column 0 is constant
    ((x - x.mean(dim=0)) / (x.std(dim=0) + 1e-5)).pow(3).sum().backward()
    assert np.isfinite(x.grad.numpy()).all()
