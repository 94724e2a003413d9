"""Losses: plain NumPy formulas, finite differences, PyTorch, stability at extreme logits, errors."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def t64(shape, rng, grad=True):
    return mdl.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=grad)


def log_softmax_np(x, axis=1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def cross_entropy_np(x, t, w=None, eps=0.0, reduction="mean"):
    """PyTorch's definition written out with a loop over samples (x: (N, C), t: (N,))."""
    n, c = x.shape
    w = np.ones(c) if w is None else w
    logp = log_softmax_np(x)
    losses = np.array([-(1 - eps) * w[t[i]] * logp[i, t[i]] - eps / c * (w * logp[i]).sum() for i in range(n)])
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / w[t].sum()


# ---------------------------------------------------------------- cross_entropy
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_formula(weighted, eps, reduction):
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((6, 4)) * 3, rng.integers(0, 4, 6)
    w = rng.random(4) + 0.5 if weighted else None
    got = F.cross_entropy(mdl.tensor(x), t, None if w is None else mdl.tensor(w), label_smoothing=eps,
                          reduction=reduction).numpy()
    np.testing.assert_allclose(got, cross_entropy_np(x, t, w, eps, reduction), rtol=1e-12)


@pytest.mark.parametrize("weighted, eps, reduction", [(False, 0.0, "mean"), (True, 0.1, "mean"),
                                                      (False, 0.3, "none"), (True, 0.0, "sum")])
def test_cross_entropy_gradcheck_and_gradgradcheck(weighted, eps, reduction):
    rng = np.random.default_rng(2)
    x, t = t64((4, 3), rng), rng.integers(0, 3, 4)
    w = rng.random(3) + 0.5 if weighted else None
    fn = lambda x: F.cross_entropy(x, t, w, label_smoothing=eps, reduction=reduction)  # noqa: E731
    assert mdl.gradcheck(fn, [x])
    assert mdl.gradgradcheck(fn, [x])


def test_cross_entropy_gradient_is_softmax_minus_onehot_over_n():
    rng = np.random.default_rng(3)
    x, t = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    xt = mdl.tensor(x, requires_grad=True)
    F.cross_entropy(xt, t).backward()
    onehot = np.eye(4)[t]
    np.testing.assert_allclose(xt.grad.numpy(), (np.exp(log_softmax_np(x)) - onehot) / 5, rtol=1e-12)


def test_cross_entropy_is_exact_at_extreme_logits():
    x = mdl.tensor(np.array([[1000.0, -1000.0], [-1000.0, 1000.0], [1000.0, 1000.0]]), requires_grad=True)
    loss = F.cross_entropy(x, np.array([0, 0, 1]), reduction="none")
    np.testing.assert_allclose(loss.numpy(), [0.0, 2000.0, np.log(2)], rtol=1e-12)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0], [-1, 1], [0.5, -0.5]], atol=1e-12)
    x32 = mdl.tensor(np.array([[1000.0, -1000.0, 0.0]]), dtype="float32", requires_grad=True)
    loss32 = F.cross_entropy(x32, [1])
    assert loss32.dtype == np.float32 and np.isfinite(loss32.item()) and loss32.item() == 2000.0
    loss32.backward()
    assert np.isfinite(x32.grad.numpy()).all()


def test_cross_entropy_with_masked_logits_matches_torch():
    """A logit of −inf (a masked class) contributes nothing, as in PyTorch: the loss stays finite."""
    x = np.array([[2.0, -np.inf, 0.5], [-np.inf, 1.0, 3.0]])
    xt = mdl.tensor(x, requires_grad=True)
    loss = F.cross_entropy(xt, np.array([0, 2]), reduction="none")
    want = [-log_softmax_np(x[:1, [0, 2]])[0, 0], -log_softmax_np(x[1:, [1, 2]])[0, 1]]
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-12)
    loss.sum().backward()
    assert np.isfinite(xt.grad.numpy()).all() and xt.grad.numpy()[0, 1] == 0.0
    torch = pytest.importorskip("torch")
    tloss = torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor([0, 2]), reduction="none")
    np.testing.assert_allclose(loss.numpy(), tloss.numpy(), rtol=1e-12)


def test_cross_entropy_float32_keeps_precision_near_1000():
    x = mdl.tensor(np.array([[1000.0, 999.0, -1000.0]]), dtype="float32")
    want = 1 + np.log1p(np.exp(-1.0))  # −log softmax at the 999 logit
    assert abs(F.cross_entropy(x, [1]).item() - want) < 1e-6


def test_cross_entropy_spatial_targets_gradcheck():
    """Logits (N, C, d1, d2) with targets (N, d1, d2), as for segmentation."""
    rng = np.random.default_rng(4)
    x, t = t64((2, 3, 2, 2), rng), rng.integers(0, 3, (2, 2, 2))
    rows = x.numpy().transpose(0, 2, 3, 1).reshape(-1, 3)
    want = cross_entropy_np(rows, t.reshape(-1), reduction="none").reshape(2, 2, 2)
    np.testing.assert_allclose(F.cross_entropy(x, t, reduction="none").numpy(), want, rtol=1e-12)
    assert mdl.gradcheck(lambda x: F.cross_entropy(x, t, label_smoothing=0.1), [x])


def test_cross_entropy_float32_on_device(device):
    x = mdl.randn(8, 5, device=device, requires_grad=True)
    t = mdl.tensor(np.arange(8) % 5, device=device)
    loss = F.cross_entropy(x, t, weight=np.ones(5), label_smoothing=0.1)
    assert loss.dtype == np.float32 and loss.device.startswith(device)
    want = cross_entropy_np(x.numpy().astype(np.float64), np.arange(8) % 5, eps=0.1)
    np.testing.assert_allclose(loss.item(), want, rtol=1e-5)
    loss.backward()
    assert x.grad.dtype == np.float32


@pytest.mark.parametrize("kwargs", [{}, {"label_smoothing": 0.15}, {"reduction": "sum"},
                                    {"weight": True}, {"weight": True, "label_smoothing": 0.3},
                                    {"reduction": "none", "label_smoothing": 0.05}])
@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 2, 3)])
def test_cross_entropy_matches_torch(kwargs, shape):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape) * 2
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    kwargs = dict(kwargs)
    if kwargs.get("weight"):
        kwargs["weight"] = rng.random(shape[1]) + 0.2
    xt = mdl.tensor(x, requires_grad=True)
    loss = F.cross_entropy(xt, t, **kwargs)
    g = rng.standard_normal(loss.shape)
    loss.backward(mdl.tensor(g))
    tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in kwargs.items()}
    tx = torch.tensor(x, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tx, torch.tensor(t), **tkw)
    tloss.backward(torch.tensor(g))
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_cross_entropy_errors_speak_to_the_user():
    x = mdl.randn(4, 3)
    with pytest.raises(TypeError, match=r"cross_entropy: target has dtype float32 and shape \(4,\) \(the input "
                                         r"has shape \(4, 3\)\); pass integer class indices"):
        F.cross_entropy(x, np.zeros(4, dtype=np.float32))
    with pytest.raises(TypeError, match=r"target has dtype float64"):
        F.cross_entropy(x, mdl.tensor(np.zeros(4)))
    with pytest.raises(ValueError, match=r"cross_entropy: target contains class index 3, but the input has 3 classes"):
        F.cross_entropy(x, np.array([0, 1, 3, 2]))
    with pytest.raises(ValueError, match=r"target contains class index -1"):
        F.cross_entropy(x, np.array([0, -1, 1, 2]))
    with pytest.raises(ValueError, match=r"cross_entropy: input of shape \(4, 3\) needs a target of shape \(4,\)"):
        F.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"cross_entropy: reduction must be one of 'mean', 'sum', 'none', got 'avg'"):
        F.cross_entropy(x, np.array([0, 1, 2, 0]), reduction="avg")
    with pytest.raises(ValueError, match=r"cross_entropy: weight must have one value per class, shape \(3,\)"):
        F.cross_entropy(x, np.array([0, 1, 2, 0]), weight=np.ones(2))
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\]"):
        F.cross_entropy(x, np.array([0, 1, 2, 0]), label_smoothing=1.5)


# ---------------------------------------------------------------- nll_loss
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_matches_torch_and_gradchecks(weighted, reduction):
    rng = np.random.default_rng(6)
    x = log_softmax_np(rng.standard_normal((5, 4)))
    t = rng.integers(0, 4, 5)
    w = rng.random(4) + 0.5 if weighted else None
    xt = mdl.tensor(x, requires_grad=True)
    got = F.nll_loss(xt, t, w, reduction=reduction)
    wt = np.ones(4) if w is None else w
    losses = -wt[t] * x[np.arange(5), t]
    want = {"none": losses, "sum": losses.sum(), "mean": losses.sum() / wt[t].sum()}[reduction]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    assert mdl.gradcheck(lambda x: F.nll_loss(x, t, w, reduction=reduction), [xt])
    torch = pytest.importorskip("torch")
    tw = None if w is None else torch.tensor(w)
    tloss = torch.nn.functional.nll_loss(torch.tensor(x), torch.tensor(t), weight=tw, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), tloss.numpy(), rtol=1e-12)


def test_nll_of_log_softmax_equals_cross_entropy():
    rng = np.random.default_rng(7)
    x, t = t64((3, 4, 2), rng), rng.integers(0, 4, (3, 2))
    a = F.nll_loss(F.log_softmax(x, axis=1), t).numpy()
    b = F.cross_entropy(x, t).numpy()
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_nll_loss_errors():
    with pytest.raises(TypeError, match=r"nll_loss: target has dtype float64"):
        F.nll_loss(mdl.randn(2, 3), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"nll_loss: target contains class index 5"):
        F.nll_loss(mdl.randn(2, 3), np.array([0, 5]))


# ---------------------------------------------------------------- regression losses
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(name, reduction):
    rng = np.random.default_rng(8)
    x, y = t64((3, 4), rng), rng.standard_normal((3, 4))
    loss = getattr(F, name)
    elementwise = (x.numpy() - y) ** 2 if name == "mse_loss" else np.abs(x.numpy() - y)
    want = {"none": elementwise, "sum": elementwise.sum(), "mean": elementwise.mean()}[reduction]
    np.testing.assert_allclose(loss(x, y, reduction=reduction).numpy(), want, rtol=1e-12)
    assert mdl.gradcheck(lambda x: loss(x, y, reduction=reduction), [x])
    if name == "mse_loss":
        assert mdl.gradgradcheck(lambda x: loss(x, y, reduction=reduction), [x])


def test_regression_losses_match_torch_with_a_differentiable_target():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    for name in ("mse_loss", "l1_loss"):
        at, bt = mdl.tensor(a, requires_grad=True), mdl.tensor(b, requires_grad=True)
        loss = getattr(F, name)(at, bt)
        loss.backward()
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        tloss = getattr(torch.nn.functional, name)(ta, tb)
        tloss.backward()
        np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(at.grad.numpy(), ta.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(bt.grad.numpy(), tb.grad.numpy(), rtol=1e-12)


def test_regression_losses_float32_and_errors(device):
    x = mdl.randn(5, 2, device=device, requires_grad=True)
    loss = F.mse_loss(x, np.zeros((5, 2)))  # a float64 constant target does not upcast
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss.item(), (x.numpy().astype(np.float64) ** 2).mean(), rtol=1e-5)
    with pytest.raises(ValueError, match=r"mse_loss: input of shape \(5, 2\) and target of shape \(5,\) differ"):
        F.mse_loss(x, np.zeros(5))
    with pytest.raises(ValueError, match=r"l1_loss: reduction must be one of"):
        F.l1_loss(x, np.zeros((5, 2)), reduction="max")


# ---------------------------------------------------------------- binary cross-entropy with logits
def bce_np(x, t, w=None, pw=None):
    p = 1 / (1 + np.exp(-x))
    pw = 1.0 if pw is None else pw
    losses = -(pw * t * np.log(p) + (1 - t) * np.log(1 - p))
    return losses if w is None else losses * w


@pytest.mark.parametrize("weighted, pos_weighted", [(False, False), (True, False), (False, True), (True, True)])
def test_bce_with_logits_formula_gradcheck_gradgradcheck(weighted, pos_weighted):
    rng = np.random.default_rng(10)
    x, t = t64((4, 3), rng), rng.random((4, 3))
    w = rng.random((4, 3)) if weighted else None
    pw = rng.random(3) + 0.5 if pos_weighted else None
    got = F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw, reduction="none").numpy()
    np.testing.assert_allclose(got, bce_np(x.numpy(), t, w, pw), rtol=1e-10)
    fn = lambda x: F.binary_cross_entropy_with_logits(x, t, w, pos_weight=pw)  # noqa: E731
    assert mdl.gradcheck(fn, [x])
    assert mdl.gradgradcheck(fn, [x])


def test_bce_with_logits_is_exact_at_extreme_logits():
    x = mdl.tensor(np.array([1000.0, -1000.0, 1000.0, -1000.0]), requires_grad=True)
    t = np.array([1.0, 0.0, 0.0, 1.0])
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    np.testing.assert_allclose(loss.numpy(), [0.0, 0.0, 1000.0, 1000.0], rtol=1e-12, atol=1e-300)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.0, 1.0, -1.0], atol=1e-12)
    pos = F.binary_cross_entropy_with_logits(x, t, pos_weight=np.array(3.0), reduction="none")
    np.testing.assert_allclose(pos.numpy(), [0.0, 0.0, 1000.0, 3000.0], rtol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce_with_logits_matches_torch(reduction):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x, t = rng.standard_normal((5, 3)) * 4, (rng.random((5, 3)) > 0.5).astype(np.float64)
    w, pw = rng.random((5, 3)), rng.random(3) + 0.5
    xt = mdl.tensor(x, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(xt, t, w, pos_weight=pw, reduction=reduction)
    g = rng.standard_normal(loss.shape)
    loss.backward(mdl.tensor(g))
    tx = torch.tensor(x, requires_grad=True)
    tloss = torch.nn.functional.binary_cross_entropy_with_logits(
        tx, torch.tensor(t), torch.tensor(w), pos_weight=torch.tensor(pw), reduction=reduction)
    tloss.backward(torch.tensor(g))
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-14)


def test_bce_with_logits_float32_integer_targets_and_errors(device):
    x = mdl.randn(6, device=device, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(x, np.array([0, 1, 1, 0, 1, 0]))  # 0/1 integers are fine
    assert loss.dtype == np.float32
    want = bce_np(x.numpy().astype(np.float64), np.array([0, 1, 1, 0, 1, 0.0])).mean()
    np.testing.assert_allclose(loss.item(), want, rtol=1e-5)
    with pytest.raises(ValueError, match=r"binary_cross_entropy_with_logits: input of shape \(6,\) and target"):
        F.binary_cross_entropy_with_logits(x, np.zeros((6, 1)))
    with pytest.raises(ValueError, match=r"reduction must be one of"):
        F.binary_cross_entropy_with_logits(x, np.zeros(6), reduction=None)


def test_cross_entropy_refuses_ignore_index_with_probability_targets():
    x, p = mdl.randn(3, 4), mdl.tensor(np.full((3, 4), 0.25))
    with pytest.raises(ValueError, match=r"cross_entropy: ignore_index=1 applies to class-index targets only.*"
                                         r"shape \(3, 4\)"):
        F.cross_entropy(x, p, ignore_index=1)
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="ignore_index is not supported for floating point target"):
        torch.nn.functional.cross_entropy(torch.randn(3, 4), torch.full((3, 4), 0.25), ignore_index=1)


def test_a_probability_target_of_the_wrong_shape_names_both_shapes():
    with pytest.raises(TypeError, match=r"target has dtype float64 and shape \(3, 5\) \(the input has shape "
                                        r"\(3, 4\)\).*class probabilities of the input's shape \(3, 4\)"):
        F.cross_entropy(mdl.randn(3, 4), np.full((3, 5), 0.2))
