"""Indexing and sorting ops against NumPy formulas and PyTorch (values, indices and gradients)."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.ops.torch_compare import values_and_gradients


def _both(torch, fn_mdl, fn_torch, *arrays, seed=1):
    """Values (equal) and gradients (under the upstream gradient g drawn from ``seed``) of one function in minidl
    and in PyTorch: (value, g, gradients)."""
    y, grads = values_and_gradients(torch, fn_mdl, fn_torch, *arrays, seed=seed, rtol=0, atol=0, grad_rtol=1e-12,
                                    grad_atol=1e-14)
    return mdl.tensor(y), np.random.default_rng(seed).standard_normal(y.shape), grads


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# ---------------------------------------------------------------- gather and scatter
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_gather_matches_pytorch_and_the_index_formula(torch, dim):
    v = _x(3, 4)
    index = np.random.default_rng(2).integers(0, v.shape[dim], size=(3, 4) if dim == 0 else (3, 6))
    if dim == 0:
        index = index[:2]  # smaller than the input outside dim, as PyTorch allows
    ti = torch.tensor(index)
    y, g, (grad,) = _both(torch, lambda a: F.gather(a, dim, index), lambda a: torch.gather(a, dim, ti), v)
    d = dim % 2
    for i, j in np.ndindex(index.shape):
        where = (index[i, j], j) if d == 0 else (i, index[i, j])
        assert y.numpy()[i, j] == v[where]
    expected = np.zeros_like(v)
    for i, j in np.ndindex(index.shape):  # repeats add up
        expected[(index[i, j], j) if d == 0 else (i, index[i, j])] += g[i, j]
    np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_gather_is_a_tensor_method_and_takes_an_index_tensor():
    x = mdl.tensor([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(x.gather(1, mdl.tensor(np.array([[1, 1], [0, 1]]))).numpy(), [[2, 2], [3, 4]])


@pytest.mark.parametrize("bad, match", [
    (np.array([[0, 5]]), "out of range"), (np.array([[-1, 0]]), "out of range"),
    (np.array([0, 1]), "as many dims"), (np.array([[0.0, 1.0]]), "integers"),
    (np.ones((4, 2), dtype=int), "larger than the input"),
])
def test_gather_rejects_bad_indices_clearly(bad, match):
    with pytest.raises((ValueError, TypeError), match=f"gather: .*{match}"):
        F.gather(mdl.zeros(3, 4), 1, bad)


def test_scatter_add_matches_pytorch_with_repeated_indices(torch):
    v, src = _x(3, 4), _x(2, 4, seed=1)
    index = np.array([[2, 0, 1, 0], [1, 2, 2, 1]])
    ti = torch.tensor(index)
    y, g, (gx, gsrc) = _both(torch, lambda a, s: F.scatter_add(a, 0, index, s),
                             lambda a, s: a.scatter_add(0, ti, s), v, src)
    expected = v.copy()
    for i, j in np.ndindex(index.shape):
        expected[index[i, j], j] += src[i, j]
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-13)
    np.testing.assert_array_equal(gx, g)
    np.testing.assert_array_equal(gsrc, [[g[index[i, j], j] for j in range(4)] for i in range(2)])


def test_scatter_add_reads_only_the_index_window_of_a_larger_src(torch):
    v, src = _x(3, 4), _x(2, 5, seed=1)
    index = np.array([[2, 0, 1, 0], [1, 2, 2, 1]])
    s = mdl.tensor(src, requires_grad=True)
    y = F.scatter_add(mdl.tensor(v), 0, index, s)
    theirs = torch.tensor(v).scatter_add(0, torch.tensor(index), torch.tensor(src))
    np.testing.assert_array_equal(y.numpy(), theirs.numpy())
    y.sum().backward()
    np.testing.assert_array_equal(s.grad.numpy(), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]])


def test_scatter_with_a_tensor_and_with_a_value_matches_pytorch(torch):
    v, src = _x(3, 4), _x(3, 2, seed=1)
    index = np.array([[3, 0], [1, 2], [0, 1]])
    ti = torch.tensor(index)
    y, g, (gx, gsrc) = _both(torch, lambda a, s: a.scatter(1, index, s), lambda a, s: a.scatter(1, ti, s), v, src)
    written = np.zeros(v.shape, bool)
    for i, j in np.ndindex(index.shape):
        written[i, index[i, j]] = True
        assert y.numpy()[i, index[i, j]] == src[i, j]
    np.testing.assert_array_equal(gx, np.where(written, 0.0, g))
    _both(torch, lambda a: F.scatter(a, 1, index, value=0.5), lambda a: a.scatter(1, ti, 0.5), v)
    _both(torch, lambda a: F.scatter(a, 1, index, 0.5), lambda a: a.scatter(1, ti, 0.5), v)


def test_scatter_needs_src_or_value():
    with pytest.raises(TypeError, match="scatter: pass exactly one of src"):
        F.scatter(mdl.zeros(2, 2), 0, np.zeros((1, 1), int))
    with pytest.raises(ValueError, match="scatter_add: src of shape \\(2,\\) must have as many dims"):
        F.scatter_add(mdl.zeros(2, 2), 0, np.zeros((1, 1), int), mdl.zeros(2))


# ---------------------------------------------------------------- index_select, masked_fill, masked_select
@pytest.mark.parametrize("dim", [0, 1])
def test_index_select_matches_pytorch(torch, dim):
    v = _x(3, 4)
    index = np.array([2, 0, 2])
    y, g, _ = _both(torch, lambda a: a.index_select(dim, index),
                    lambda a: a.index_select(dim, torch.tensor(index)), v)
    np.testing.assert_array_equal(y.numpy(), np.take(v, index, axis=dim))


def test_index_select_rejects_negative_indices_as_pytorch_does():
    with pytest.raises(ValueError, match="index_select: .*out of range"):
        F.index_select(mdl.zeros(3), 0, [-1])


def test_masked_fill_matches_pytorch(torch):
    v = _x(3, 4)
    mask = np.random.default_rng(3).random((4,)) > 0.5  # broadcast over the rows
    y, g, (grad,) = _both(torch, lambda a: a.masked_fill(mask, -2.5),
                          lambda a: a.masked_fill(torch.tensor(mask), -2.5), v)
    np.testing.assert_array_equal(y.numpy(), np.where(mask, -2.5, v))
    np.testing.assert_array_equal(grad, np.where(mask, 0.0, g))


def test_masked_fill_checks_the_mask():
    with pytest.raises(TypeError, match="masked_fill: mask must be a boolean"):
        F.masked_fill(mdl.zeros(2, 2), np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="masked_fill: mask of shape \\(3,\\)"):
        F.masked_fill(mdl.zeros(2, 2), np.ones(3, bool), 1.0)


def test_masked_select_matches_pytorch(torch):
    v = _x(3, 4)
    mask = np.random.default_rng(4).random((3, 4)) > 0.4
    y, g, (grad,) = _both(torch, lambda a: F.masked_select(a, mask),
                          lambda a: torch.masked_select(a, torch.tensor(mask)), v)
    np.testing.assert_array_equal(y.numpy(), v[mask])
    expected = np.zeros_like(v)
    expected[mask] = g
    np.testing.assert_array_equal(grad, expected)
    _both(torch, lambda a: a.masked_select(mask[0]), lambda a: a.masked_select(torch.tensor(mask[0])), v)


# ---------------------------------------------------------------- sort, argsort, topk
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_matches_pytorch(torch, dim, descending):
    v = _x(4, 5)
    x, t = mdl.tensor(v, requires_grad=True), torch.tensor(v, requires_grad=True)
    ours, theirs = x.sort(dim, descending), t.sort(dim, descending)
    values, indices = ours
    np.testing.assert_array_equal(values.numpy(), theirs.values.detach().numpy())
    np.testing.assert_array_equal(indices.numpy(), theirs.indices.numpy())
    sorted_v = np.sort(v, axis=dim)
    np.testing.assert_array_equal(values.numpy(), np.flip(sorted_v, dim) if descending else sorted_v)
    assert indices.dtype == np.int64 and not indices.requires_grad
    g = _x(4, 5, seed=7)
    values.backward(grad=g)
    theirs.values.backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())
    np.testing.assert_array_equal(F.argsort(x, dim, descending).numpy(), indices.numpy())


@pytest.mark.parametrize("descending", [False, True])
def test_sort_is_stable_like_pytorchs_stable_sort(torch, descending):
    v = np.array([2.0, 1.0, 2.0, 0.0, 1.0, 2.0, np.nan, 0.0])
    ours = F.sort(mdl.tensor(v), descending=descending)
    theirs = torch.sort(torch.tensor(v), descending=descending, stable=True)
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, -1])
def test_topk_matches_pytorch(torch, largest, dim):
    v = _x(4, 5)
    x, t = mdl.tensor(v, requires_grad=True), torch.tensor(v, requires_grad=True)
    ours, theirs = x.topk(3, dim, largest), t.topk(3, dim, largest)
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.detach().numpy())
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    ordered = np.sort(v, axis=dim)
    ordered = np.flip(ordered, dim) if largest else ordered
    np.testing.assert_array_equal(ours.values.numpy(), np.take(ordered, range(3), axis=dim))
    g = np.random.default_rng(0).standard_normal(ours.values.shape)
    ours.values.backward(grad=g)
    theirs.values.backward(torch.tensor(g))
    np.testing.assert_array_equal(x.grad.numpy(), t.grad.numpy())


def test_topk_k_out_of_range():
    with pytest.raises(ValueError, match="topk: k = 6 is out of range for size 5"):
        F.topk(mdl.zeros(5), 6)


# ---------------------------------------------------------------- nonzero
def test_nonzero_matches_pytorch(torch):
    v = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    x, t = mdl.tensor(v), torch.tensor(v)
    ours = x.nonzero()
    assert ours.dtype == np.int64 and ours.shape == (3, 2)
    np.testing.assert_array_equal(ours.numpy(), t.nonzero().numpy())
    np.testing.assert_array_equal(ours.numpy(), np.argwhere(v))
    for a, b in zip(F.nonzero(x, as_tuple=True), torch.nonzero(t, as_tuple=True)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---------------------------------------------------------------- dtypes and devices
@pytest.mark.parametrize("name", ["gather", "sort", "topk", "scatter_add", "index_select", "masked_select"])
def test_float32_stays_float32_and_runs_on_device(device, name):
    x = mdl.tensor(_x(3, 4).astype(np.float32), requires_grad=True, device=device)
    index = np.array([[1, 0], [2, 2], [0, 3]])
    calls = {
        "gather": lambda: F.gather(x, 1, index),
        "sort": lambda: F.sort(x, 1).values,
        "topk": lambda: F.topk(x, 2).values,
        "scatter_add": lambda: F.scatter_add(x, 1, index, x),
        "index_select": lambda: F.index_select(x, 1, [3, 1]),
        "masked_select": lambda: F.masked_select(x, np.eye(3, 4, dtype=bool)),
    }
    y = calls[name]()
    assert y.dtype == np.float32 and y.device == x.device
    y.sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.device == x.device
