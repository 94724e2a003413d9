"""scatter_reduce and scatter(reduce=), cummax/cummin, std_mean/var_mean, diag: against NumPy loops and PyTorch."""
import warnings

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from tests.ops.torch_compare import values_and_gradients


def _both(torch, fn_mdl, fn_torch, *arrays, seed=1):
    return values_and_gradients(torch, fn_mdl, fn_torch, *arrays, seed=seed, rtol=1e-13, atol=1e-15,
                                grad_rtol=1e-12, grad_atol=1e-14)


REDUCE = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}


def _loop(x, dim, index, src, reduce, include_self):
    """scatter_reduce written as its definition: for each place, reduce the values sent there."""
    members = {}
    for pos in np.ndindex(index.shape):
        place = pos[:dim] + (index[pos],) + pos[dim + 1:]
        members.setdefault(place, [x[place]] if include_self else []).append(src[pos])
    y = x.copy()
    for place, values in members.items():
        y[place] = REDUCE[reduce](values)
    return y


@pytest.mark.parametrize("reduce", list(REDUCE))
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_reduce_matches_its_definition_and_pytorch(torch, reduce, include_self, dim):
    rng = np.random.default_rng(3)
    x, src = rng.standard_normal((4, 5)), rng.standard_normal((3, 4))
    x[1, 2], src[0, 1] = 0.0, 0.0  # zeros: prod's gradient must not divide by them
    index = rng.integers(0, x.shape[dim], size=(3, 4))  # repeats, and places reached by none
    ti = torch.tensor(index)
    y, _ = _both(torch, lambda a, s: F.scatter_reduce(a, dim, index, s, reduce, include_self=include_self),
                 lambda a, s: a.scatter_reduce(dim, ti, s, reduce, include_self=include_self), x, src)
    np.testing.assert_allclose(y, _loop(x, dim, index, src, reduce, include_self), rtol=1e-13, atol=1e-15)


def test_scatter_reduce_amax_shares_the_gradient_among_ties_as_pytorch(torch):
    x = np.array([[1.0, 5.0, 2.0]])
    src = np.array([[5.0, 5.0, 3.0]])
    index = np.array([[1, 1, 0]])  # place 1: x = 5 and two src values of 5, a three-way tie
    _, (gx, gsrc) = _both(torch, lambda a, s: a.scatter_reduce(1, index, s, "amax"),
                          lambda a, s: a.scatter_reduce(1, torch.tensor(index), s, "amax"), x, src)
    g = np.random.default_rng(1).standard_normal((1, 3))
    np.testing.assert_allclose(gx[0, 1], g[0, 1] / 3)
    np.testing.assert_allclose(gsrc[0, :2], [g[0, 1] / 3] * 2)


def test_scatter_reduce_without_self_gives_x_no_share_of_a_tie():
    """x_p is not a member with include_self=False, even when it equals the max: the members' gradients
    sum to dy. (PyTorch counts x_p as a tie there and gives src half: a deliberate difference.)"""
    x, src = mdl.tensor([[3.0, 1.0]], dtype="float64", requires_grad=True), \
        mdl.tensor([[3.0, 2.0]], dtype="float64", requires_grad=True)
    y = F.scatter_reduce(x, 1, np.array([[0, 0]]), src, "amax", include_self=False)
    y.sum().backward()
    np.testing.assert_array_equal(y.numpy(), [[3, 1]])
    np.testing.assert_array_equal(src.grad.numpy(), [[1, 0]])
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1]])


def test_scatter_reduce_with_a_larger_src_reads_only_the_index_window():
    x, src = mdl.tensor(-np.ones((2, 3))), mdl.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    y = F.scatter_reduce(x, 0, np.array([[1, 0, 1]]), src, "amax")
    np.testing.assert_array_equal(y.numpy(), [[-1, 1, -1], [0, -1, 2]])
    y.sum().backward()
    np.testing.assert_array_equal(src.grad.numpy(), [[1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize("reduce", ["add", "multiply"])
def test_scatter_with_reduce_matches_pytorch(torch, reduce):
    rng = np.random.default_rng(4)
    x, src = rng.standard_normal((3, 4)), rng.standard_normal((2, 4))
    index = np.array([[2, 0, 1, 0], [2, 2, 1, 1]])
    ti = torch.tensor(index)
    y = mdl.tensor(x).scatter(0, index, mdl.tensor(src), reduce=reduce)
    with warnings.catch_warnings():  # PyTorch deprecates scatter's reduce= for scatter_reduce, and still runs it
        warnings.simplefilter("ignore", UserWarning)
        expected = torch.tensor(x).scatter(0, ti, torch.tensor(src), reduce=reduce)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-14)
    value = F.scatter(mdl.tensor(x), 1, index, 1.5, reduce=reduce)
    np.testing.assert_allclose(value.numpy(), torch.tensor(x).scatter(1, ti, 1.5, reduce=reduce).numpy(), rtol=1e-14)


@pytest.mark.parametrize("call, match", [
    (lambda x, i, s: F.scatter_reduce(x, 0, i, s, "max"), "reduce must be one of"),
    (lambda x, i, s: F.scatter(x, 0, i, s, reduce="sum"), "reduce must be 'add' or 'multiply'"),
    (lambda x, i, s: F.scatter_reduce(x, 0, i, mdl.tensor(s.numpy().astype(np.float32)), "sum"), "dtype"),
    (lambda x, i, s: F.scatter_reduce(x, 0, i + 5, s, "sum"), "out of range"),
])
def test_scatter_reduce_refuses_bad_arguments_clearly(call, match):
    x, src, index = mdl.zeros(2, 2, dtype="float64"), mdl.ones(2, 2, dtype="float64"), np.array([[0, 1], [1, 1]])
    with pytest.raises((ValueError, TypeError), match=match):
        call(x, index, src)


# ---------------------------------------------------------------- cummax and cummin
@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cummax_and_cummin_match_pytorch_with_ties_and_nan(torch, op, dim):
    x = np.random.default_rng(5).integers(0, 4, (4, 7)).astype(float)  # many ties: PyTorch takes the later one
    x[1, 3] = x[3, 0] = x[3, 5] = np.nan  # NaN propagates; a later NaN moves the index
    ours, theirs = getattr(F, op)(mdl.tensor(x), dim), getattr(torch, op)(torch.tensor(x), dim)
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    # the values are what a NumPy running extreme gives, read at the indices
    running = (np.maximum if op == "cummax" else np.minimum).accumulate(x, axis=dim)
    np.testing.assert_array_equal(ours.values.numpy(), running)
    np.testing.assert_array_equal(np.take_along_axis(x, ours.indices.numpy(), axis=dim), running)


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_gradient_goes_to_the_index_found_as_pytorch(torch, op):
    x = np.array([[0.5, 2.0, 2.0, -1.0, 3.0], [1.0, 1.0, 0.0, 1.0, -2.0]])
    _both(torch, lambda a: getattr(a, op)(1).values, lambda a: getattr(a, op)(1).values, x)


def test_cummax_of_a_0d_tensor_is_itself():
    values, indices = F.cummax(mdl.tensor(2.5), 0)
    assert values.item() == 2.5 and indices.item() == 0


# ---------------------------------------------------------------- std_mean, var_mean
@pytest.mark.parametrize("op", ["std_mean", "var_mean"])
@pytest.mark.parametrize("args, kwargs", [((), {}), ((1,), {}), (((0, 1),), {"correction": 0, "keepdim": True}),
                                          ((1, False), {}), ((False,), {})])
def test_std_mean_and_var_mean_match_pytorch(torch, op, args, kwargs):
    x = np.random.default_rng(6).standard_normal((3, 4))
    ours, theirs = getattr(F, op)(mdl.tensor(x), *args, **kwargs), getattr(torch, op)(torch.tensor(x), *args, **kwargs)
    assert len(ours) == 2
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-13, atol=1e-15)
    spread = F.std(mdl.tensor(x), *args, **kwargs) if op == "std_mean" else F.var(mdl.tensor(x), *args, **kwargs)
    np.testing.assert_array_equal(ours[0].numpy(), spread.numpy())


def test_std_mean_gradients_match_pytorch(torch):
    x = np.random.default_rng(7).standard_normal((3, 4))
    _both(torch, lambda a: sum(v.sum() * w for v, w in zip(F.std_mean(a, 1), (1.0, -2.0))).reshape(1),
          lambda a: sum(v.sum() * w for v, w in zip(torch.std_mean(a, 1), (1.0, -2.0))).reshape(1), x)


# ---------------------------------------------------------------- diag
@pytest.mark.parametrize("k", [0, 2, -1])
def test_diag_of_a_vector_is_a_matrix_as_pytorch(torch, k):
    v = np.random.default_rng(8).standard_normal(4)
    y, (gv,) = _both(torch, lambda a: F.diag(a, k), lambda a: torch.diag(a, k), v)
    np.testing.assert_array_equal(y, np.diag(v, k))
    g = np.random.default_rng(1).standard_normal(y.shape)
    np.testing.assert_array_equal(gv, np.diag(g, k))


@pytest.mark.parametrize("k", [0, 1, -2, 5])
def test_diag_of_a_matrix_is_its_diagonal_as_pytorch(torch, k):
    m = np.random.default_rng(9).standard_normal((3, 4))
    y, _ = _both(torch, lambda a: a.diag(k), lambda a: a.diag(k), m)
    np.testing.assert_array_equal(y, np.diag(m, k))


def test_diag_refuses_other_ranks():
    with pytest.raises(ValueError, match=r"diag: expects a vector .* got shape \(2, 2, 2\)"):
        F.diag(mdl.zeros(2, 2, 2))
