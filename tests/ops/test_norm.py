"""batch_norm / layer_norm / group_norm: plain NumPy formulas, finite differences, PyTorch."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def t64(shape, rng, grad=True, shift=0.0):
    return mdl.tensor(rng.standard_normal(shape) + shift, dtype="float64", requires_grad=grad)


def standardize(x, axes, eps=1e-5):
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


# ---------------------------------------------------------------- batch norm
@pytest.mark.parametrize("shape", [(4, 3), (3, 2, 4), (2, 3, 2, 3)])
def test_batch_norm_training_matches_formula(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 3 + 1
    c = shape[1]
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    axes = (0,) + tuple(range(2, len(shape)))
    bshape = (1, c) + (1,) * (len(shape) - 2)
    got = F.batch_norm(mdl.tensor(x), None, None, mdl.tensor(w), mdl.tensor(b), training=True).numpy()
    want = standardize(x, axes) * w.reshape(bshape) + b.reshape(bshape)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 4), (2, 2, 3, 2)])
def test_batch_norm_training_gradcheck_and_gradgradcheck(shape):
    rng = np.random.default_rng(2)
    x, w, b = t64(shape, rng), t64(shape[1], rng), t64(shape[1], rng)
    fn = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    assert mdl.gradcheck(fn, [x, w, b])
    assert mdl.gradgradcheck(fn, [x, w, b])


def test_batch_norm_eval_uses_running_stats_and_gradchecks():
    rng = np.random.default_rng(3)
    x, w, b = t64((4, 3, 2), rng), t64(3, rng), t64(3, rng)
    rm, rv = rng.standard_normal(3), rng.random(3) + 0.5
    rm_before, rv_before = rm.copy(), rv.copy()
    got = F.batch_norm(x, rm, rv, w, b, training=False).numpy()
    shape = (1, 3, 1)
    want = (x.numpy() - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-5) * w.numpy().reshape(shape) \
        + b.numpy().reshape(shape)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    fn = lambda x, w, b: F.batch_norm(x, rm, rv, w, b, training=False)  # noqa: E731
    assert mdl.gradcheck(fn, [x, w, b])
    np.testing.assert_array_equal(rm, rm_before)  # eval reads the statistics and leaves them alone
    np.testing.assert_array_equal(rv, rv_before)


def test_batch_norm_running_stats_update_in_place():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 2, 3)) * 2 + 5
    rm = mdl.tensor(np.array([0.5, -1.0]), dtype="float64")
    rv_array = np.array([2.0, 0.25])
    rm_before, rv_before = rm.numpy().copy(), rv_array.copy()
    rm_buffer = rm.array
    F.batch_norm(mdl.tensor(x), rm, rv_array, training=True, momentum=0.3)
    batch_mean = x.mean(axis=(0, 2))
    n = 4 * 3
    unbiased = ((x - batch_mean.reshape(1, 2, 1)) ** 2).sum(axis=(0, 2)) / (n - 1)
    np.testing.assert_allclose(rm.numpy(), 0.7 * rm_before + 0.3 * batch_mean, rtol=1e-12)
    np.testing.assert_allclose(rv_array, 0.7 * rv_before + 0.3 * unbiased, rtol=1e-12)
    assert rm.array is rm_buffer  # updated in place, not replaced
    # eval mode reads them and leaves them alone
    frozen = rv_array.copy()
    F.batch_norm(mdl.tensor(x), rm, rv_array, training=False)
    np.testing.assert_array_equal(rv_array, frozen)


def test_batch_norm_float32_stays_float32(device):
    x = mdl.randn(8, 4, 3, 3, device=device, requires_grad=True)
    w = mdl.ones(4, device=device, requires_grad=True)
    b = mdl.zeros(4, device=device, requires_grad=True)
    rm, rv = mdl.zeros(4, device=device), mdl.ones(4, device=device)
    y = F.batch_norm(x, rm, rv, w, b, training=True)
    assert y.dtype == np.float32 and rm.dtype == rv.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == w.grad.dtype == np.float32
    # a standardized batch: per-channel mean 0, biased variance 1 (up to ε)
    yn = y.numpy()
    np.testing.assert_allclose(yn.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(yn.var(axis=(0, 2, 3)), 1, atol=1e-3)


def test_batch_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((6, 3, 4, 2)), rng.standard_normal(3), rng.standard_normal(3)
    g = rng.standard_normal(x.shape)
    rm, rv = np.zeros(3), np.ones(3)
    trm, trv = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    xt, wt, bt = (mdl.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.batch_norm(xt, rm, rv, wt, bt, training=True, momentum=0.2, eps=1e-3)
    y.backward(mdl.tensor(g))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.batch_norm(tx, trm, trv, tw, tb, training=True, momentum=0.2, eps=1e-3)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((xt, tx), (wt, tw), (bt, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rm, trm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(rv, trv.numpy(), rtol=1e-12)
    evaluated = F.batch_norm(mdl.tensor(x), rm, rv, mdl.tensor(w), mdl.tensor(b), training=False).numpy()
    t_eval = torch.nn.functional.batch_norm(torch.tensor(x), trm, trv, torch.tensor(w), torch.tensor(b))
    np.testing.assert_allclose(evaluated, t_eval.numpy(), rtol=1e-10, atol=1e-12)


def test_batch_norm_errors():
    x = mdl.randn(4, 3, 2)
    with pytest.raises(ValueError, match=r"batch_norm: running_mean must have shape \(3,\)"):
        F.batch_norm(x, np.zeros(2), np.ones(3))
    with pytest.raises(ValueError, match=r"batch_norm: weight must have shape \(3,\), got \(4,\)"):
        F.batch_norm(x, None, None, mdl.ones(4), training=True)
    with pytest.raises(ValueError, match=r"more than one value per channel"):
        F.batch_norm(mdl.randn(1, 3), np.zeros(3), np.ones(3), training=True)
    with pytest.raises(ValueError, match=r"batch_norm: input must be \(N, C\)"):
        F.batch_norm(mdl.randn(3), None, None)


# ---------------------------------------------------------------- layer norm
@pytest.mark.parametrize("shape, normalized", [((3, 4), 4), ((2, 3, 4), (3, 4)), ((2, 2, 5), (5,))])
def test_layer_norm_formula_gradcheck_gradgradcheck(shape, normalized):
    rng = np.random.default_rng(6)
    norm_shape = (normalized,) if isinstance(normalized, int) else normalized
    x, w, b = t64(shape, rng, shift=2.0), t64(norm_shape, rng), t64(norm_shape, rng)
    axes = tuple(range(len(shape) - len(norm_shape), len(shape)))
    got = F.layer_norm(x, normalized, w, b).numpy()
    np.testing.assert_allclose(got, standardize(x.numpy(), axes) * w.numpy() + b.numpy(), rtol=1e-12, atol=1e-12)
    fn = lambda x, w, b: F.layer_norm(x, normalized, w, b)  # noqa: E731
    assert mdl.gradcheck(fn, [x, w, b])
    assert mdl.gradgradcheck(fn, [x, w, b])


def test_layer_norm_without_affine_and_float32(device):
    x = mdl.randn(4, 6, device=device, requires_grad=True)
    y = F.layer_norm(x, 6)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), standardize(x.numpy().astype(np.float64), (1,)), atol=1e-5)
    y.backward(mdl.randn(4, 6, device=device))
    assert x.grad.dtype == np.float32


def test_layer_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x, w, b, g = (rng.standard_normal(s) for s in ((3, 2, 5), (2, 5), (2, 5), (3, 2, 5)))
    xt, wt, bt = (mdl.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.layer_norm(xt, (2, 5), wt, bt, eps=1e-4)
    y.backward(mdl.tensor(g))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.layer_norm(tx, (2, 5), tw, tb, eps=1e-4)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((xt, tx), (wt, tw), (bt, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_layer_norm_errors():
    with pytest.raises(ValueError, match=r"layer_norm: normalized_shape \(3,\) must equal the trailing axes"):
        F.layer_norm(mdl.randn(2, 4), 3)
    with pytest.raises(ValueError, match=r"layer_norm: weight must have shape \(4,\), got \(3,\)"):
        F.layer_norm(mdl.randn(2, 4), 4, mdl.ones(3))


# ---------------------------------------------------------------- group norm
@pytest.mark.parametrize("shape, groups", [((2, 4, 3), 2), ((2, 6, 2, 2), 3), ((3, 4), 4)])
def test_group_norm_formula_gradcheck_gradgradcheck(shape, groups):
    rng = np.random.default_rng(8)
    c = shape[1]
    x, w, b = t64(shape, rng, shift=-1.0), t64(c, rng), t64(c, rng)
    xg = x.numpy().reshape(shape[0], groups, -1)
    bshape = (1, c) + (1,) * (len(shape) - 2)
    want = standardize(xg, (2,)).reshape(shape) * w.numpy().reshape(bshape) + b.numpy().reshape(bshape)
    np.testing.assert_allclose(F.group_norm(x, groups, w, b).numpy(), want, rtol=1e-12, atol=1e-12)
    fn = lambda x, w, b: F.group_norm(x, groups, w, b)  # noqa: E731
    assert mdl.gradcheck(fn, [x, w, b])
    assert mdl.gradgradcheck(fn, [x, w, b])


def test_group_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w, b, g = (rng.standard_normal(s) for s in ((2, 6, 3, 2), (6,), (6,), (2, 6, 3, 2)))
    xt, wt, bt = (mdl.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.group_norm(xt, 3, wt, bt)
    y.backward(mdl.tensor(g))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.group_norm(tx, 3, tw, tb)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((xt, tx), (wt, tw), (bt, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_group_norm_errors():
    with pytest.raises(ValueError, match=r"group_norm: num_groups must divide the 6 channels"):
        F.group_norm(mdl.randn(2, 6, 3), 4)
    with pytest.raises(ValueError, match=r"group_norm: bias must have shape \(6,\)"):
        F.group_norm(mdl.randn(2, 6, 3), 3, None, mdl.zeros(3))
