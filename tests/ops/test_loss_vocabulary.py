"""The losses of the PyTorch vocabulary: ignore_index, soft targets, BCE on probabilities, KL,
smooth L1 and Huber, weights, one_hot. Each against a NumPy formula and against PyTorch (values and gradients)."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def log_softmax_np(x, axis=1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def reduce_np(losses, reduction, denominator=None):
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / (losses.size if denominator is None else denominator)


def compare_with_torch(torch, fn, tfn, arrays, grad_of=(0,), rtol=1e-10):
    """fn(*mdl tensors) and tfn(*torch tensors): the same values and the same gradients for a random upstream."""
    xs = [mdl.tensor(a, requires_grad=i in grad_of) for i, a in enumerate(arrays)]
    ts = [torch.tensor(a, requires_grad=i in grad_of) for i, a in enumerate(arrays)]
    got, want = fn(*xs), tfn(*ts)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol, atol=1e-12)
    g = np.random.default_rng(0).standard_normal(got.shape)
    got.backward(mdl.tensor(g))
    want.backward(torch.tensor(g))
    for i in grad_of:
        np.testing.assert_allclose(xs[i].grad.numpy(), ts[i].grad.numpy(), rtol=rtol, atol=1e-12)


# ---------------------------------------------------------------- cross_entropy and nll_loss: ignore_index
def cross_entropy_ignore_np(x, t, ignore, w=None, eps=0.0, reduction="mean"):
    """PyTorch's definition with a loop over samples: ignored samples add 0 and leave the mean's denominator."""
    c = x.shape[1]
    w = np.ones(c) if w is None else w
    logp = log_softmax_np(x)
    losses = np.zeros(len(t))
    denominator = 0.0
    for i, y in enumerate(t):
        if y == ignore:
            continue
        losses[i] = -(1 - eps) * w[y] * logp[i, y] - eps / c * (w * logp[i]).sum()
        denominator += w[y]
    return reduce_np(losses, reduction, denominator)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("eps", [0.0, 0.25])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_ignore_index_matches_formula_and_torch(torch, weighted, eps, reduction):
    rng = np.random.default_rng(1)
    x, t = rng.standard_normal((7, 4)) * 2, np.array([0, -100, 3, 2, -100, 1, 3])
    w = rng.random(4) + 0.5 if weighted else None
    got = F.cross_entropy(mdl.tensor(x), t, w, label_smoothing=eps, reduction=reduction).numpy()
    np.testing.assert_allclose(got, cross_entropy_ignore_np(x, t, -100, w, eps, reduction), rtol=1e-12)
    tw = None if w is None else torch.tensor(w)
    compare_with_torch(
        torch, lambda x: F.cross_entropy(x, t, w, label_smoothing=eps, reduction=reduction),
        lambda x: torch.nn.functional.cross_entropy(x, torch.tensor(t), tw, label_smoothing=eps, reduction=reduction),
        [x])


def test_cross_entropy_ignore_index_inside_the_classes_and_spatial(torch):
    rng = np.random.default_rng(2)
    x, t = rng.standard_normal((2, 3, 2, 2)), rng.integers(0, 3, (2, 2, 2))
    for kwargs in ({"ignore_index": 1}, {"ignore_index": 2, "weight": rng.random(3) + 0.1, "label_smoothing": 0.1}):
        tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in kwargs.items()}
        compare_with_torch(torch, lambda x: F.cross_entropy(x, t, **kwargs),
                           lambda x: torch.nn.functional.cross_entropy(x, torch.tensor(t), **tkw), [x])
    got = F.cross_entropy(mdl.tensor(x), t, ignore_index=1, reduction="none").numpy()
    assert (got[t == 1] == 0).all() and (got[t != 1] > 0).all()


def test_cross_entropy_every_sample_ignored_is_nan_as_torch(torch):
    x, t = np.random.default_rng(3).standard_normal((3, 4)), np.full(3, -100)
    xt = mdl.tensor(x, requires_grad=True)
    loss = F.cross_entropy(xt, t)
    assert np.isnan(loss.item())
    assert np.isnan(torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(t)).item())
    assert F.cross_entropy(xt, t, reduction="sum").item() == 0.0
    assert np.isnan(F.nll_loss(xt, t).item())


def test_ignored_targets_may_be_out_of_range_but_others_may_not():
    x = mdl.randn(3, 4)
    F.cross_entropy(x, np.array([0, -100, 3]))  # -100 is ignored, so not a bad class
    with pytest.raises(ValueError, match=r"cross_entropy: target contains class index -5.*ignore_index=-100"):
        F.cross_entropy(x, np.array([0, -5, 3]))
    with pytest.raises(ValueError, match=r"nll_loss: target contains class index 4"):
        F.nll_loss(x, np.array([0, -100, 4]))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_ignore_index_matches_torch(torch, weighted, reduction):
    rng = np.random.default_rng(4)
    x, t = log_softmax_np(rng.standard_normal((6, 5))), np.array([4, 0, -1, 2, 2, -1])
    w = rng.random(5) + 0.5 if weighted else None
    wt = np.ones(5) if w is None else w
    kept = t != -1
    losses = np.where(kept, -wt[np.where(kept, t, 0)] * x[np.arange(6), np.where(kept, t, 0)], 0.0)
    want = reduce_np(losses, reduction, (wt[t[kept]]).sum())
    np.testing.assert_allclose(F.nll_loss(x, t, w, ignore_index=-1, reduction=reduction).numpy(), want, rtol=1e-12)
    tw = None if w is None else torch.tensor(w)
    compare_with_torch(torch, lambda x: F.nll_loss(x, t, w, ignore_index=-1, reduction=reduction),
                       lambda x: torch.nn.functional.nll_loss(x, torch.tensor(t), tw, ignore_index=-1,
                                                              reduction=reduction), [x])


# ---------------------------------------------------------------- cross_entropy: probability targets
@pytest.mark.parametrize("kwargs", [{}, {"label_smoothing": 0.3}, {"weight": True}, {"reduction": "sum"},
                                    {"weight": True, "label_smoothing": 0.1, "reduction": "none"}])
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 2, 2), (4,)])
def test_cross_entropy_probability_targets_match_formula_and_torch(torch, kwargs, shape):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(shape) * 2
    p = np.moveaxis(rng.dirichlet(np.ones(shape[min(1, len(shape) - 1)]), size=(shape[0],) + shape[2:]), -1,
                    min(1, len(shape) - 1)) if len(shape) > 1 else rng.dirichlet(np.ones(shape[0]))
    kwargs = dict(kwargs)
    classes = shape[1] if len(shape) > 1 else shape[0]
    if kwargs.get("weight"):
        kwargs["weight"] = rng.random(classes) + 0.5
    eps, w = kwargs.get("label_smoothing", 0.0), kwargs.get("weight", np.ones(classes))
    axis = 1 if len(shape) > 1 else 0
    a = (p * (1 - eps) + eps / classes) * w.reshape((-1,) + (1,) * (len(shape) - 1 - axis))
    losses = -(a * log_softmax_np(x, axis=axis)).sum(axis=axis)
    want = reduce_np(losses, kwargs.get("reduction", "mean"))
    np.testing.assert_allclose(F.cross_entropy(mdl.tensor(x), p, **kwargs).numpy(), want, rtol=1e-12)
    tkw = {k: torch.tensor(v) if k == "weight" else v for k, v in kwargs.items()}
    compare_with_torch(torch, lambda x, p: F.cross_entropy(x, p, **kwargs),
                       lambda x, p: torch.nn.functional.cross_entropy(x, p, **tkw), [x, p], grad_of=(0, 1))


def test_cross_entropy_probability_target_as_constant_tensor_and_float32(torch):
    rng = np.random.default_rng(6)
    x = mdl.tensor(rng.standard_normal((3, 4)), dtype="float32", requires_grad=True)
    p = mdl.tensor(rng.dirichlet(np.ones(4), size=3))  # float64 constant: no upcast of the loss
    loss = F.cross_entropy(x, p, label_smoothing=0.1)
    assert loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32 and p.grad is None
    want = torch.nn.functional.cross_entropy(torch.tensor(x.numpy()), torch.tensor(p.numpy()).float(),
                                             label_smoothing=0.1)
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-6)


def test_cross_entropy_float_target_of_another_shape_is_an_error():
    with pytest.raises(TypeError, match=r"cross_entropy: target has dtype float64.*or class probabilities of the "
                                        r"input's shape \(4, 3\)"):
        F.cross_entropy(mdl.randn(4, 3), np.zeros((4, 2)))


def test_pytorch_positional_deprecated_arguments_fail_loudly():
    """PyTorch's 4th positional argument is size_average: here the options after weight are keyword-only."""
    x, t = mdl.randn(4, 3), np.array([0, 1, 2, 0])
    with pytest.raises(TypeError):
        F.cross_entropy(x, t, None, 0.1)
    with pytest.raises(TypeError):
        F.nll_loss(x, t, None, "sum")
    with pytest.raises(TypeError):
        F.mse_loss(x, x, "sum")
    with pytest.raises(TypeError):
        F.binary_cross_entropy_with_logits(x, np.zeros((4, 3)), None, np.ones(3))


# ---------------------------------------------------------------- binary_cross_entropy
def bce_np(x, t, w=None):
    with np.errstate(divide="ignore"):
        losses = -(t * np.maximum(np.log(x), -100) + (1 - t) * np.maximum(np.log(1 - x), -100))
    return losses if w is None else losses * w


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropy_matches_formula_and_torch(torch, reduction):
    rng = np.random.default_rng(7)
    x, t, w = rng.uniform(0.02, 0.98, (4, 3)), rng.random((4, 3)), rng.random(3) + 0.5
    got = F.binary_cross_entropy(mdl.tensor(x), t, w, reduction=reduction).numpy()
    np.testing.assert_allclose(got, reduce_np(bce_np(x, t, w), reduction), rtol=1e-12)
    compare_with_torch(torch, lambda x, t: F.binary_cross_entropy(x, t, w, reduction=reduction),
                       lambda x, t: torch.nn.functional.binary_cross_entropy(x, t, torch.tensor(w),
                                                                             reduction=reduction),
                       [x, t], grad_of=(0, 1))


def test_binary_cross_entropy_at_0_and_1_is_pytorch_clamp(torch):
    x, t = np.array([0.0, 1.0, 0.0, 1.0, 1e-50]), np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    xt = mdl.tensor(x, requires_grad=True)
    loss = F.binary_cross_entropy(xt, t, reduction="none")
    np.testing.assert_allclose(loss.numpy(), [100.0, 100.0, 0.0, 0.0, 100.0])
    loss.sum().backward()
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.binary_cross_entropy(tx, torch.tensor(t), reduction="none").sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-8)  # PyTorch's ε is float32(1e-12)
    assert np.isfinite(xt.grad.numpy()).all() and xt.grad.numpy()[0] == -1e12


def test_binary_cross_entropy_errors_and_float32():
    x = mdl.tensor(np.array([0.2, 0.7]), dtype="float32", requires_grad=True)
    loss = F.binary_cross_entropy(x, np.array([0.0, 1.0]))
    assert loss.dtype == np.float32
    np.testing.assert_allclose(loss.item(), bce_np(np.array([0.2, 0.7]), np.array([0.0, 1.0])).mean(), rtol=1e-6)
    with pytest.raises(ValueError, match=r"binary_cross_entropy: every element of the input must be a probability"):
        F.binary_cross_entropy(mdl.tensor(np.array([0.5, 1.5])), np.ones(2))
    with pytest.raises(ValueError, match=r"binary_cross_entropy: input of shape \(2,\) and target of shape \(1,\)"):
        F.binary_cross_entropy(x, np.ones(1))
    with pytest.raises(ValueError, match=r"weight of shape \(3,\) does not broadcast"):
        F.binary_cross_entropy(x, np.ones(2), np.ones(3))


# ---------------------------------------------------------------- kl_div
@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_matches_formula_and_torch(torch, reduction, log_target):
    rng = np.random.default_rng(8)
    x = log_softmax_np(rng.standard_normal((3, 4)))
    p = rng.dirichlet(np.ones(4), size=3)
    p[0, 2] = 0.0  # a zero probability: contributes 0 (not 0 · −inf)
    t = np.log(np.where(p > 0, p, 1e-30)) if log_target else p
    pointwise = np.exp(t) * (t - x) if log_target else np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - x), 0)
    want = pointwise.sum() / 3 if reduction == "batchmean" else reduce_np(pointwise, reduction)
    got = F.kl_div(mdl.tensor(x), t, reduction=reduction, log_target=log_target).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns about reduction='mean'
        compare_with_torch(torch, lambda x, t: F.kl_div(x, t, reduction=reduction, log_target=log_target),
                           lambda x, t: torch.nn.functional.kl_div(x, t, reduction=reduction, log_target=log_target),
                           [x, t], grad_of=(0, 1) if log_target else (0,))


def test_kl_div_target_gradient_matches_torch(torch):
    rng = np.random.default_rng(12)
    x, p = log_softmax_np(rng.standard_normal((3, 4))), rng.dirichlet(np.ones(4), size=3)
    compare_with_torch(torch, lambda x, p: F.kl_div(x, p, reduction="batchmean"),
                       lambda x, p: torch.nn.functional.kl_div(x, p, reduction="batchmean"), [x, p], grad_of=(0, 1))


def test_kl_div_of_a_distribution_from_itself_is_zero_and_errors():
    p = np.random.default_rng(9).dirichlet(np.ones(5), size=2)
    assert abs(F.kl_div(mdl.tensor(np.log(p)), p, reduction="batchmean").item()) < 1e-15
    with pytest.raises(ValueError, match=r"kl_div: reduction must be one of 'mean', 'sum', 'none', 'batchmean'"):
        F.kl_div(mdl.tensor(np.log(p)), p, reduction="avg")


# ---------------------------------------------------------------- smooth_l1_loss, huber_loss, weights
def smooth_l1_np(d, beta):
    return np.where(np.abs(d) < beta, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_smooth_l1_and_huber_match_formula_and_torch(torch, beta, reduction):
    rng = np.random.default_rng(10)
    x, y = rng.standard_normal((4, 5)) * 2, rng.standard_normal((4, 5))
    d = x - y
    got = F.smooth_l1_loss(mdl.tensor(x), y, reduction=reduction, beta=beta).numpy()
    want = np.abs(d) if beta == 0 else smooth_l1_np(d, beta)
    np.testing.assert_allclose(got, reduce_np(want, reduction), rtol=1e-12)
    compare_with_torch(torch, lambda x, y: F.smooth_l1_loss(x, y, reduction=reduction, beta=beta),
                       lambda x, y: torch.nn.functional.smooth_l1_loss(x, y, reduction=reduction, beta=beta),
                       [x, y], grad_of=(0, 1))
    if beta:
        huber = F.huber_loss(mdl.tensor(x), y, reduction, beta).numpy()
        np.testing.assert_allclose(huber, reduce_np(beta * smooth_l1_np(d, beta), reduction), rtol=1e-12)
        compare_with_torch(torch, lambda x, y: F.huber_loss(x, y, reduction, beta),
                           lambda x, y: torch.nn.functional.huber_loss(x, y, reduction, beta), [x, y], grad_of=(0, 1))


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_elementwise_weight_is_pytorch_weighted_mean(torch, name, reduction):
    rng = np.random.default_rng(11)
    x, y, w = rng.standard_normal((3, 4)) * 2, rng.standard_normal((3, 4)), rng.random((3, 4))
    pointwise = {"mse_loss": (x - y) ** 2, "l1_loss": np.abs(x - y), "huber_loss": smooth_l1_np(x - y, 1.0)}[name]
    want = reduce_np(pointwise * w, reduction, None if name == "huber_loss" else w.sum())  # PyTorch's rules
    got = getattr(F, name)(mdl.tensor(x), y, reduction=reduction, weight=w).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    compare_with_torch(torch, lambda x: getattr(F, name)(x, y, reduction=reduction, weight=w),
                       lambda x: getattr(torch.nn.functional, name)(x, torch.tensor(y), reduction=reduction,
                                                                    weight=torch.tensor(w)), [x])
    with pytest.raises(ValueError, match=rf"{name}: weight of shape \(4,\) must have the input's shape \(3, 4\)"):
        getattr(F, name)(mdl.tensor(x), y, weight=w[0])


def test_smooth_l1_and_huber_errors():
    x = mdl.randn(3)
    with pytest.raises(ValueError, match=r"smooth_l1_loss: beta must be non-negative, got -1"):
        F.smooth_l1_loss(x, np.zeros(3), beta=-1)
    with pytest.raises(ValueError, match=r"huber_loss: delta must be positive, got 0"):
        F.huber_loss(x, np.zeros(3), delta=0)
    assert F.huber_loss(x, np.zeros(3)).dtype == np.float32


# ---------------------------------------------------------------- one_hot
def test_one_hot_matches_numpy_and_torch(torch):
    idx = np.array([[0, 2, 1], [3, 3, 0]])
    got = F.one_hot(idx)
    assert got.dtype == np.int64 and got.shape == (2, 3, 4) and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), np.eye(4, dtype=np.int64)[idx])
    np.testing.assert_array_equal(F.one_hot(mdl.tensor(idx), 6).numpy(),
                                  torch.nn.functional.one_hot(torch.tensor(idx), 6).numpy())
    np.testing.assert_array_equal(F.one_hot(np.array(2), 3).numpy(), [0, 0, 1])
    assert F.one_hot(np.zeros(0, dtype=np.int64), 3).shape == (0, 3)


def test_one_hot_errors():
    with pytest.raises(TypeError, match=r"one_hot: indices must be integers, got dtype float64"):
        F.one_hot(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"one_hot: class indices must be non-negative, got -1"):
        F.one_hot(np.array([-1, 2]))
    with pytest.raises(ValueError, match=r"one_hot: class index 3 does not fit num_classes=3"):
        F.one_hot(np.array([0, 3]), 3)
    with pytest.raises(ValueError, match=r"one_hot: cannot infer num_classes from an empty tensor"):
        F.one_hot(np.zeros(0, dtype=np.int64))
