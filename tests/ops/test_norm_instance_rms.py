"""instance_norm and rms_norm: NumPy formulas, PyTorch's values and gradients, running statistics, errors."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def t64(shape, rng, grad=True, shift=0.0):
    return mdl.tensor(rng.standard_normal(shape) * 2 + shift, requires_grad=grad)


def instance_formula(x, eps=1e-5):
    axes = tuple(range(2, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps)


def rms_formula(x, n_axes, eps):
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)


# ---------------------------------------------------------------- instance_norm
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 2, 3, 2)])
def test_instance_norm_formula_and_affine(shape):
    rng = np.random.default_rng(0)
    x, w, b = t64(shape, rng, shift=3.0), t64(shape[1:2], rng), t64(shape[1:2], rng)
    y = F.instance_norm(x, weight=w, bias=b)
    bshape = (1, shape[1]) + (1,) * (len(shape) - 2)
    want = instance_formula(x.numpy()) * w.numpy().reshape(bshape) + b.numpy().reshape(bshape)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
    # every (n, c) slice of the unaffine output has mean 0 and variance 1 (up to eps)
    plain = F.instance_norm(x).numpy().reshape(shape[0] * shape[1], -1)
    np.testing.assert_allclose(plain.mean(axis=1), 0, atol=1e-12)
    np.testing.assert_allclose(plain.var(axis=1), 1, rtol=1e-4)
    assert mdl.gradcheck(lambda x, w, b: F.instance_norm(x, weight=w, bias=b), [x, w, b])
    assert mdl.gradgradcheck(lambda x, w, b: F.instance_norm(x, weight=w, bias=b), [x, w, b])


def test_instance_norm_matches_torch_values_gradients_and_running_stats():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 5, 6)) + 1.5
    w, b = rng.standard_normal(4), rng.standard_normal(4)
    gy = rng.standard_normal(x.shape)
    rm, rv = rng.standard_normal(4), rng.random(4) + 0.5
    ours_rm, ours_rv = rm.copy(), rv.copy()
    theirs_rm, theirs_rv = torch.tensor(rm), torch.tensor(rv)
    xo, wo, bo = (mdl.tensor(a, requires_grad=True) for a in (x, w, b))
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    yo = F.instance_norm(xo, ours_rm, ours_rv, wo, bo, True, 0.3, 1e-4)
    yt = torch.nn.functional.instance_norm(xt, theirs_rm, theirs_rv, wt, bt, True, 0.3, 1e-4)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours_rm, theirs_rm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours_rv, theirs_rv.numpy(), rtol=1e-12)
    (yo * mdl.tensor(gy)).sum().backward()
    yt.backward(torch.tensor(gy))
    for ours, theirs in ((xo, xt), (wo, wt), (bo, bt)):
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)
    # running statistics by formula: batch average of the instance means, unbiased instance variances
    inst_mean = x.mean(axis=(2, 3)).mean(axis=0)
    inst_var = x.var(axis=(2, 3), ddof=1).mean(axis=0)
    np.testing.assert_allclose(ours_rm, 0.7 * rm + 0.3 * inst_mean, rtol=1e-12)
    np.testing.assert_allclose(ours_rv, 0.7 * rv + 0.3 * inst_var, rtol=1e-12)


def test_instance_norm_with_running_stats_only_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, rm, rv = rng.standard_normal((2, 3, 7)), rng.standard_normal(3), rng.random(3) + 0.5
    xo = mdl.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    yo = F.instance_norm(xo, rm, rv, use_input_stats=False)
    yt = torch.nn.functional.instance_norm(xt, torch.tensor(rm), torch.tensor(rv), use_input_stats=False)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(yo.numpy(), (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-5), rtol=1e-12)
    yo.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-12)


def test_instance_norm_float32_stays_float32(device):
    x = mdl.randn(2, 3, 8, device=device) * 5 + 2
    y = F.instance_norm(x, weight=mdl.ones(3, device=device), bias=mdl.zeros(3, device=device))
    assert y.dtype == np.float32 and y.device == x.device
    np.testing.assert_allclose(y.numpy(), instance_formula(x.numpy().astype(np.float64)), rtol=1e-4, atol=1e-5)


def test_instance_norm_errors():
    with pytest.raises(ValueError, match="instance_norm.*spatial"):
        F.instance_norm(mdl.randn(4, 3))
    with pytest.raises(ValueError, match="more than one spatial position"):
        F.instance_norm(mdl.randn(4, 3, 1))
    with pytest.raises(ValueError, match="running_mean must have shape"):
        F.instance_norm(mdl.randn(2, 3, 4), np.zeros(2), np.ones(3))
    with pytest.raises(ValueError, match="weight must have shape"):
        F.instance_norm(mdl.randn(2, 3, 4), weight=mdl.ones(4))
    with pytest.raises(ValueError, match="use_input_stats=False"):
        F.instance_norm(mdl.randn(2, 3, 4), use_input_stats=False)


# ---------------------------------------------------------------- rms_norm
@pytest.mark.parametrize("shape,normalized", [((3, 4), (4,)), ((2, 3, 4), (3, 4)), ((5,), 5)])
def test_rms_norm_formula_gradcheck_gradgradcheck(shape, normalized):
    rng = np.random.default_rng(3)
    n_axes = 1 if isinstance(normalized, int) else len(normalized)
    x, w = t64(shape, rng, shift=0.5), t64(shape[len(shape) - n_axes:], rng)
    y = F.rms_norm(x, normalized, w, eps=1e-3)
    np.testing.assert_allclose(y.numpy(), rms_formula(x.numpy(), n_axes, 1e-3) * w.numpy(), rtol=1e-12)
    # eps=None: the machine epsilon of float64
    np.testing.assert_allclose(F.rms_norm(x, normalized).numpy(),
                               rms_formula(x.numpy(), n_axes, np.finfo(np.float64).eps), rtol=1e-12)
    assert mdl.gradcheck(lambda x, w: F.rms_norm(x, normalized, w, 1e-3), [x, w])
    assert mdl.gradgradcheck(lambda x, w: F.rms_norm(x, normalized, w, 1e-3), [x, w])


def test_rms_norm_gradient_by_the_closed_form():
    """dx = s·(dy·γ − x̂ ⟨dy·γ·x̂⟩) with s = (⟨x²⟩ + ε)^(−1/2), x̂ = x·s."""
    rng = np.random.default_rng(4)
    x, w = t64((3, 6), rng), t64((6,), rng)
    gy = rng.standard_normal((3, 6))
    (F.rms_norm(x, 6, w, 1e-2) * mdl.tensor(gy)).sum().backward()
    xa, wa = x.numpy(), w.numpy()
    s = 1 / np.sqrt((xa * xa).mean(axis=1, keepdims=True) + 1e-2)
    x_hat = xa * s
    gx = s * (gy * wa - x_hat * (gy * wa * x_hat).mean(axis=1, keepdims=True))
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-10)
    np.testing.assert_allclose(w.grad.numpy(), (gy * x_hat).sum(axis=0), rtol=1e-10)


@pytest.mark.parametrize("eps", [None, 1e-6])
def test_rms_norm_matches_torch(eps):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x, w, gy = rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 4)), rng.standard_normal((2, 3, 4))
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 2e-6)):
        xo, wo = mdl.tensor(x.astype(dtype), requires_grad=True), mdl.tensor(w.astype(dtype), requires_grad=True)
        xt = torch.tensor(x.astype(dtype), requires_grad=True)
        wt = torch.tensor(w.astype(dtype), requires_grad=True)
        yo, yt = F.rms_norm(xo, (3, 4), wo, eps), torch.nn.functional.rms_norm(xt, (3, 4), wt, eps)
        assert yo.dtype == dtype
        np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=rtol, atol=rtol)
        (yo * mdl.tensor(gy.astype(dtype))).sum().backward()
        yt.backward(torch.tensor(gy.astype(dtype)))
        np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=10 * rtol, atol=10 * rtol)
        np.testing.assert_allclose(wo.grad.numpy(), wt.grad.numpy(), rtol=10 * rtol, atol=10 * rtol)


def test_rms_norm_float32_on_the_device(device):
    x = mdl.randn(4, 8, device=device)
    y = F.rms_norm(x, (8,), mdl.ones(8, device=device))
    assert y.dtype == np.float32 and y.device == x.device
    np.testing.assert_allclose(y.numpy(), rms_formula(x.numpy().astype(np.float64), 1, np.finfo(np.float32).eps),
                               rtol=1e-5)


def test_rms_norm_errors():
    with pytest.raises(ValueError, match="rms_norm: normalized_shape"):
        F.rms_norm(mdl.randn(3, 4), (3,))
    with pytest.raises(ValueError, match="rms_norm: normalized_shape"):
        F.rms_norm(mdl.randn(4), (2, 4))
    with pytest.raises(ValueError, match="rms_norm: weight must have shape"):
        F.rms_norm(mdl.randn(3, 4), (4,), mdl.ones(3))
