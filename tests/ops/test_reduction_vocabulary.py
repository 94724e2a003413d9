"""PyTorch's reduction vocabulary: var/std defaults, max(dim) -> (values, indices), argmax, any/all, prod, scans.

Each op is checked against a NumPy formula and against PyTorch (values and gradients) on the same inputs.
"""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.ops.torch_compare import values_and_gradients


def _both(torch, fn_mdl, fn_torch, *arrays, seed=1):
    """Values and gradients (under one random upstream gradient) of the same function in minidl and PyTorch."""
    y, grads = values_and_gradients(torch, fn_mdl, fn_torch, *arrays, seed=seed, rtol=1e-12, atol=1e-12,
                                    grad_rtol=1e-10, grad_atol=1e-12)
    return mdl.tensor(y), grads


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------- var and std: PyTorch's unbiased default
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_and_std_default_to_the_unbiased_estimate(name):
    v = _x(3, 5)
    np_fn = getattr(np, name)
    x = mdl.tensor(v)
    np.testing.assert_allclose(getattr(x, name)().item(), np_fn(v, ddof=1), rtol=1e-13)
    np.testing.assert_allclose(getattr(F, name)(x, 1).numpy(), np_fn(v, axis=1, ddof=1), rtol=1e-13)
    np.testing.assert_allclose(getattr(x, name)(dim=0, keepdim=True).numpy(),
                               np_fn(v, axis=0, ddof=1, keepdims=True), rtol=1e-13)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("kwargs, ddof", [({"correction": 0}, 0), ({"correction": 2}, 2), ({"unbiased": False}, 0),
                                          ({"unbiased": True}, 1), ({"ddof": 0}, 0), ({"ddof": 1}, 1), ({}, 1)])
def test_var_and_std_corrections_match_numpy_and_pytorch(torch, name, kwargs, ddof):
    v = _x(4, 6)
    torch_kwargs = {"correction": ddof}
    y, _ = _both(torch, lambda a: getattr(F, name)(a, dim=1, **kwargs),
                 lambda a: getattr(torch, name)(a, dim=1, **torch_kwargs), v)
    np.testing.assert_allclose(y.numpy(), getattr(np, name)(v, axis=1, ddof=ddof), rtol=1e-13)


def test_var_positional_forms_are_pytorchs(torch):
    v = _x(3, 4)
    x, t = mdl.tensor(v), torch.tensor(v)
    np.testing.assert_allclose(x.var(False).item(), t.var(False).item(), rtol=1e-13)  # var(unbiased)
    np.testing.assert_allclose(x.var(1, False).numpy(), t.var(1, False).numpy(), rtol=1e-13)  # var(dim, unbiased)
    np.testing.assert_allclose(x.std(0, True, True).numpy(), t.std(0, True, True).numpy(), rtol=1e-13)
    np.testing.assert_allclose(x.var(False).item(), np.var(v), rtol=1e-13)


@pytest.mark.parametrize("kwargs", [{"correction": 1, "ddof": 1}, {"unbiased": True, "correction": 0},
                                    {"unbiased": False, "ddof": 0}])
def test_var_takes_one_correction_spelling(kwargs):
    with pytest.raises(TypeError, match="var: got .* pass one of them"):
        F.var(mdl.zeros(3), **kwargs)


def test_unbiased_must_be_a_bool():
    with pytest.raises(TypeError, match="unbiased must be True or False"):
        F.std(mdl.zeros(3), unbiased=2)


def test_dim_and_axis_together_is_an_error():
    with pytest.raises(TypeError, match="sum: got dim=0 and axis=1"):
        F.sum(mdl.zeros(2, 3), dim=0, axis=1)


# ---------------------------------------------------------------- max/min with dim: (values, indices)
@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, True), (-1, False)])
def test_max_with_dim_returns_values_and_indices_like_pytorch(torch, name, dim, keepdim):
    v = _x(3, 4, seed=3)
    x = mdl.tensor(v, requires_grad=True)
    t = torch.tensor(v, requires_grad=True)
    ours, theirs = getattr(x, name)(dim, keepdim), getattr(t, name)(dim, keepdim)
    values, indices = ours  # unpacks as a pair
    assert ours.values is values and ours.indices is indices
    assert indices.dtype == np.int64 and not indices.requires_grad
    np.testing.assert_array_equal(indices.numpy(), theirs.indices.numpy())
    np.testing.assert_array_equal(values.numpy(), theirs.values.detach().numpy())
    np_fn = getattr(np, name)
    np.testing.assert_array_equal(values.numpy(), np_fn(v, axis=dim, keepdims=keepdim))
    g = np.random.default_rng(0).standard_normal(values.shape)
    values.backward(grad=g)
    theirs.values.backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


def test_ported_max_dim_first_item_is_the_values():
    x = mdl.tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    np.testing.assert_array_equal(x.max(1)[0].numpy(), [5.0, 7.0])  # not the first row
    np.testing.assert_array_equal(F.max(x, dim=1)[1].numpy(), [1, 0])
    np.testing.assert_array_equal(F.min(x, 0).indices.numpy(), [0, 1, 0])


def test_max_with_dim_sends_the_gradient_to_the_first_tie_like_pytorch(torch):
    v = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    _, (grad,) = _both(torch, lambda a: a.max(1).values, lambda a: a.max(1).values, v)
    np.testing.assert_array_equal(grad[:, 0] != 0, [False, True])  # the first 2 of the second row


def test_max_with_axis_keeps_numpys_meaning():
    v = _x(2, 3, 4)
    x = mdl.tensor(v)
    np.testing.assert_array_equal(x.max(axis=1).numpy(), v.max(axis=1))  # values only
    np.testing.assert_array_equal(F.min(x, axis=(0, 2), keepdims=True).numpy(), v.min(axis=(0, 2), keepdims=True))
    with pytest.raises(TypeError, match="axis=\\(0, 2\\)"):
        x.max(dim=(0, 2))


def test_max_of_another_tensor_is_the_elementwise_maximum(torch):
    a, b = _x(3, 4), _x(4, seed=1)
    _both(torch, lambda p, q: p.max(q), lambda p, q: p.max(q), a, b)
    _both(torch, lambda p, q: F.min(p, q), lambda p, q: torch.min(p, q), a, b)


def test_max_without_dim_is_the_global_max():
    v = _x(3, 4)
    assert F.max(mdl.tensor(v)).item() == v.max() and mdl.tensor(v).min().item() == v.min()


# ---------------------------------------------------------------- argmax, argmin, any, all
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_matches_pytorch(torch, name):
    v = _x(3, 4, 5)
    x, t = mdl.tensor(v), torch.tensor(v)
    for kwargs in ({}, {"dim": 1}, {"dim": -1, "keepdim": True}, {"dim": None, "keepdim": True}):
        ours, theirs = getattr(x, name)(**kwargs), getattr(torch, name)(t, **kwargs)
        assert ours.dtype == np.int64 and not ours.requires_grad
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    np.testing.assert_array_equal(getattr(F, name)(x, 2).numpy(), getattr(np, name)(v, axis=2))


@pytest.mark.parametrize("name", ["any", "all"])
def test_any_and_all_match_pytorch(torch, name):
    v = np.array([[0.0, 1.0, 2.0], [0.0, 0.0, 0.0], [3.0, 4.0, 5.0]])
    x, t = mdl.tensor(v), torch.tensor(v)
    for kwargs in ({}, {"dim": 1}, {"dim": 0, "keepdim": True}):
        ours = getattr(x, name)(**kwargs)
        assert ours.dtype == np.bool_
        np.testing.assert_array_equal(ours.numpy(), getattr(torch, name)(t, **kwargs).numpy())
    np.testing.assert_array_equal(getattr(F, name)(x, axis=1).numpy(), getattr(np, name)(v, axis=1))


# ---------------------------------------------------------------- prod: exact with zeros
@pytest.mark.parametrize("values", [
    [[0.5, -1.2, 2.0, 0.8], [1.5, 0.7, -0.4, 0.9]],   # no zero
    [[0.5, -1.2, 0.0, 0.8], [1.5, 0.7, -0.4, 0.9]],   # one zero
    [[0.0, -1.2, 0.0, 0.8], [1.5, 0.0, -0.4, 0.9]],   # two zeros in the first row
])
@pytest.mark.parametrize("dim", [None, 1, 0])
def test_prod_and_its_gradient_match_pytorch_with_zeros(torch, values, dim):
    v = np.array(values)
    if dim is None:
        y, (grad,) = _both(torch, lambda a: a.prod(), lambda a: a.prod(), v)
        expected = np.array([[np.prod(np.delete(v.ravel(), i)) for i in range(v.size)]]).reshape(v.shape)
    else:
        y, (grad,) = _both(torch, lambda a: F.prod(a, dim), lambda a: torch.prod(a, dim), v)
        moved = np.moveaxis(v, dim, -1)
        expected = np.moveaxis(np.array([[np.prod(np.delete(row, i)) for i in range(len(row))] for row in moved]), -1,
                               dim)
        np.testing.assert_allclose(y.numpy(), np.prod(v, axis=dim), rtol=1e-13)
    g = np.random.default_rng(1).standard_normal(y.shape)  # the upstream gradient _both used
    g = g if dim is None else np.expand_dims(g, dim)
    np.testing.assert_allclose(grad, g * expected, rtol=1e-12, atol=1e-15)  # dx_k = dy Π_{j≠k} x_j


def test_prod_gradient_is_the_product_of_the_others():
    v = np.array([2.0, 0.0, 3.0, 5.0])
    x = mdl.tensor(v, requires_grad=True)
    x.prod().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 30.0, 0.0, 0.0])


@pytest.mark.parametrize("values", [[0.5, 0.0, 2.0, -1.5], [0.0, 0.7, 0.0, 1.3]])
def test_prod_second_derivative_with_zeros_matches_pytorch(torch, values):
    v = np.array(values)
    x = mdl.tensor(v, requires_grad=True)
    (g,) = mdl.grad([x.prod()], [x], create_graph=True)
    (h,) = mdl.grad([(g * mdl.tensor(np.arange(1.0, 5.0))).sum()], [x])
    t = torch.tensor(v, requires_grad=True)
    (tg,) = torch.autograd.grad(t.prod(), t, create_graph=True)
    (th,) = torch.autograd.grad((tg * torch.arange(1.0, 5.0, dtype=torch.float64)).sum(), t)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-12, atol=1e-15)


def test_prod_over_several_dims_and_keepdim(torch):
    v = _x(2, 3, 4)
    y, _ = _both(torch, lambda a: F.prod(a, axis=(0, 2), keepdims=True),
                 lambda a: a.prod(2, keepdim=True).prod(0, keepdim=True), v)
    np.testing.assert_allclose(y.numpy(), np.prod(v, axis=(0, 2), keepdims=True), rtol=1e-13)


# ---------------------------------------------------------------- scans
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_matches_numpy_and_pytorch(torch, dim):
    v = _x(3, 4)
    y, (grad,) = _both(torch, lambda a: a.cumsum(dim), lambda a: a.cumsum(dim), v)
    np.testing.assert_allclose(y.numpy(), np.cumsum(v, axis=dim), rtol=1e-13)
    g = np.random.default_rng(1).standard_normal(v.shape)  # the upstream gradient _both used
    np.testing.assert_allclose(grad, np.flip(np.cumsum(np.flip(g, dim), axis=dim), dim), rtol=1e-12)


@pytest.mark.parametrize("values", [
    [[0.5, -1.2, 2.0, 0.8], [1.5, 0.7, -0.4, 0.9]],
    [[0.5, -1.2, 0.0, 0.8], [0.0, 0.7, -0.4, 0.9]],    # one zero per row
    [[0.0, -1.2, 0.0, 0.8], [1.5, 0.0, 0.0, 0.0]],     # two and three zeros in a row
])
@pytest.mark.parametrize("dim", [0, 1])
def test_cumprod_and_its_gradient_match_pytorch_with_zeros(torch, values, dim):
    v = np.array(values)
    y, (grad,) = _both(torch, lambda a: F.cumprod(a, dim), lambda a: torch.cumprod(a, dim), v)
    np.testing.assert_allclose(y.numpy(), np.cumprod(v, axis=dim), rtol=1e-13)
    # the formula: dx_k = Σ_{i≥k} dy_i Π_{j≤i, j≠k} x_j, summed by hand
    g = np.random.default_rng(1).standard_normal(v.shape)
    moved, gm = np.moveaxis(v, dim, -1), np.moveaxis(g, dim, -1)
    n = moved.shape[-1]
    expected = np.zeros_like(moved)
    for r in range(moved.shape[0]):
        for k in range(n):
            expected[r, k] = sum(gm[r, i] * np.prod(np.delete(moved[r, :i + 1], k)) for i in range(k, n))
    np.testing.assert_allclose(grad, np.moveaxis(expected, -1, dim), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("values", [[0.5, -1.2, 0.3, 0.8, 1.1], [0.5, -1.2, 0.0, 0.8, 1.1], [0.5, 0.0, 2.0, 0.0, 1.5],
                                    [0.0, 0.0, 2.0, 0.0, 1.5]])
def test_cumprod_second_derivative_with_zeros_matches_pytorch(torch, values):
    v = np.array(values)
    w = np.arange(1.0, 6.0)
    x = mdl.tensor(v, requires_grad=True)
    (g,) = mdl.grad([(F.cumprod(x, 0) * mdl.tensor(w)).sum()], [x], create_graph=True)
    (h,) = mdl.grad([(g * mdl.tensor(w[::-1].copy())).sum()], [x])
    t = torch.tensor(v, requires_grad=True)
    (tg,) = torch.autograd.grad((torch.cumprod(t, 0) * torch.tensor(w)).sum(), t, create_graph=True)
    (th,) = torch.autograd.grad((tg * torch.tensor(w[::-1].copy())).sum(), t)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dim", [0, 1])
def test_logcumsumexp_matches_numpy_and_pytorch(torch, dim):
    v = _x(3, 4) * 3
    y, (grad,) = _both(torch, lambda a: a.logcumsumexp(dim), lambda a: a.logcumsumexp(dim), v)
    np.testing.assert_allclose(y.numpy(), np.log(np.cumsum(np.exp(v), axis=dim)), rtol=1e-12)


def test_logcumsumexp_does_not_overflow_or_underflow():
    v = np.array([-1000.0, 0.0, 1000.0, 999.0])
    y = F.logcumsumexp(mdl.tensor(v), 0)
    np.testing.assert_allclose(y.numpy(), [-1000.0, 0.0, 1000.0, 1000.0 + np.log1p(np.exp(-1.0))], rtol=1e-15)


def test_logcumsumexp_gradient_over_any_range_matches_pytorch(torch):
    v = np.array([[-1000.0, 0.0, 1000.0, 999.0], [5.0, -2.0, 1.0, 0.5], [3000.0, -3000.0, 0.0, 1.0]])
    _, (grad,) = _both(torch, lambda a: F.logcumsumexp(a, 1), lambda a: torch.logcumsumexp(a, 1), v)
    assert np.isfinite(grad).all()


def test_logcumsumexp_gradient_is_the_formula():
    v, g = _x(5), _x(5, seed=1)
    x = mdl.tensor(v, requires_grad=True)
    y = F.logcumsumexp(x, 0)
    y.backward(grad=g)
    yv = np.log(np.cumsum(np.exp(v)))
    expected = [sum(g[i] * np.exp(v[j] - yv[i]) for i in range(j, 5)) for j in range(5)]  # Σ_{i≥j} dy_i e^(x_j − y_i)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_logcumsumexp_second_derivative_matches_pytorch(torch):
    v, w, u = _x(2, 5), _x(2, 5, seed=1), _x(2, 5, seed=2)
    x = mdl.tensor(v, requires_grad=True)
    (g,) = mdl.grad([(F.logcumsumexp(x, 1) * mdl.tensor(w)).sum()], [x], create_graph=True)
    (h,) = mdl.grad([(g * mdl.tensor(u)).sum()], [x])
    t = torch.tensor(v, requires_grad=True)
    (tg,) = torch.autograd.grad((torch.logcumsumexp(t, 1) * torch.tensor(w)).sum(), t, create_graph=True)
    (th,) = torch.autograd.grad((tg * torch.tensor(u)).sum(), t)
    np.testing.assert_allclose(h.numpy(), th.numpy(), rtol=1e-10)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "logcumsumexp"])
def test_scans_need_a_dim_like_pytorch(name):
    with pytest.raises(TypeError, match=f"{name}: dim is required"):
        getattr(F, name)(mdl.zeros(3))


@pytest.mark.parametrize("name", ["std", "prod", "cumsum", "cumprod", "logcumsumexp"])
def test_float32_stays_float32(name):
    x = mdl.tensor([[1.0, 2.5, -1.0], [0.5, 3.0, 2.0]], requires_grad=True)
    y = getattr(F, name)(x, 1)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


@pytest.mark.parametrize("name", ["std", "prod", "cumsum", "cumprod", "logcumsumexp"])
def test_on_device(device, name):
    v = _x(3, 4)
    t = mdl.tensor(v, requires_grad=True, device=device)
    c = mdl.tensor(v, requires_grad=True)
    y = getattr(F, name)(t, 1)
    y.sum().backward()
    getattr(F, name)(c, 1).sum().backward()
    assert t.grad.device == t.device
    np.testing.assert_allclose(y.numpy(), getattr(F, name)(c, 1).numpy(), rtol=1e-10)
    np.testing.assert_allclose(t.grad.numpy(), c.grad.numpy(), rtol=1e-10)
