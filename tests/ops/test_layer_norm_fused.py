"""LayerNormAffine, layer norm as one op: values and each gradient against NumPy, γ/β present or not,
float32 against float64, second order, PyTorch."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn
from minidl.ops.norm import LayerNormAffine, LayerNormWeightGrad, Normalize
from tests.conftest import leaf

# (input shape, normalized_shape): one trailing axis of a 2-D and of a 3-D input, two trailing axes
SHAPES = [((5, 6), (6,)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 4))]
AFFINE = [(True, True), (True, False), (False, True), (False, False)]


def numpy_layer_norm(x, weight, bias, count, eps=1e-5):
    """y, and a backward(dy) -> (dx, dγ, dβ) written with each row's Jacobian as a matrix:
    ∂x̂ᵢ/∂xⱼ = s (δᵢⱼ − 1/n − x̂ᵢ x̂ⱼ / n), so dx = Jᵀ (dy · γ) row by row."""
    lead, features = x.shape[:x.ndim - count], x.shape[x.ndim - count:]
    rows = x.reshape(-1, int(np.prod(features)))
    n = rows.shape[1]
    mu = rows.mean(axis=1, keepdims=True)
    s = 1 / np.sqrt(((rows - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    x_hat = (rows - mu) * s
    w = np.ones(n) if weight is None else weight.reshape(-1)
    b = np.zeros(n) if bias is None else bias.reshape(-1)
    y = (x_hat * w + b).reshape(x.shape)

    def backward(dy):
        dy = dy.reshape(-1, n)
        dx = np.empty_like(dy)
        for r in range(dy.shape[0]):
            jacobian = s[r] * (np.eye(n) - 1 / n - np.outer(x_hat[r], x_hat[r]) / n)
            dx[r] = jacobian.T @ (dy[r] * w)
        dw = (dy * x_hat).sum(axis=0).reshape(features)
        db = dy.sum(axis=0).reshape(features)
        return dx.reshape(lead + features), dw, db
    return y, backward


def _inputs(rng, shape, normalized, has_weight, has_bias, dtype=np.float64):
    x = mdl.tensor((rng.standard_normal(shape) * 2 + 1).astype(dtype), requires_grad=True)
    w = mdl.tensor(rng.standard_normal(normalized).astype(dtype), requires_grad=True) if has_weight else None
    b = mdl.tensor(rng.standard_normal(normalized).astype(dtype), requires_grad=True) if has_bias else None
    return x, w, b


@pytest.mark.parametrize("has_weight, has_bias", AFFINE)
@pytest.mark.parametrize("shape, normalized", SHAPES)
def test_value_and_each_gradient_against_numpy(shape, normalized, has_weight, has_bias):
    rng = np.random.default_rng(11)
    x, w, b = _inputs(rng, shape, normalized, has_weight, has_bias)
    y = F.layer_norm(x, normalized, w, b)
    assert type(y.creator) is (LayerNormAffine if has_weight or has_bias else Normalize)
    want, backward = numpy_layer_norm(x.numpy(), None if w is None else w.numpy(), None if b is None else b.numpy(),
                                      len(normalized))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(shape)
    y.backward(mdl.tensor(dy))
    dx, dw, db = backward(dy)
    np.testing.assert_allclose(x.grad.numpy(), dx, rtol=1e-10, atol=1e-12)
    if w is not None:
        np.testing.assert_allclose(w.grad.numpy(), dw, rtol=1e-12, atol=1e-12)
    if b is not None:
        np.testing.assert_allclose(b.grad.numpy(), db, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("has_weight, has_bias", AFFINE)
@pytest.mark.parametrize("shape, normalized", SHAPES)
def test_gradcheck_and_gradgradcheck(shape, normalized, has_weight, has_bias):
    rng = np.random.default_rng(12)
    x, w, b = _inputs(rng, shape, normalized, has_weight, has_bias)
    inputs = [t for t in (x, w, b) if t is not None]

    def fn(x, *affine):
        affine = list(affine)
        weight = affine.pop(0) if has_weight else None
        return F.layer_norm(x, normalized, weight, affine.pop(0) if has_bias else None)
    assert mdl.gradcheck(fn, inputs)
    assert mdl.gradgradcheck(fn, inputs)


def test_only_the_inputs_that_need_a_gradient_get_one():
    rng = np.random.default_rng(13)
    x, w, b = _inputs(rng, (3, 4), (4,), True, True)
    w.requires_grad = False
    y = F.layer_norm(x, 4, w, b)
    dy = rng.standard_normal((3, 4))
    y.backward(mdl.tensor(dy))
    dx, _, db = numpy_layer_norm(x.numpy(), w.numpy(), b.numpy(), 1)[1](dy)
    assert w.grad is None
    np.testing.assert_allclose(x.grad.numpy(), dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), db, rtol=1e-12, atol=1e-12)


def test_weight_gradient_op_is_the_sum_over_rows_of_dy_times_x_hat():
    rng = np.random.default_rng(14)
    x, gy = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    normalize = Normalize((1, 2), 1e-5)
    x_hat = normalize.forward(x)
    got = LayerNormWeightGrad((1, 2), 1e-5, x_hat, normalize.inv_std)(mdl.tensor(x), mdl.tensor(gy)).numpy()
    want = sum(gy[i] * x_hat[i] for i in range(2))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_forward_keeps_x_hat_apart_from_the_output():
    """Two new arrays: x̂ (kept for backward) and y; changing y in place leaves the gradient right."""
    rng = np.random.default_rng(15)
    x, w, b = _inputs(rng, (4, 5), (5,), True, True)
    y = F.layer_norm(x, 5, w, b)
    op = y.creator
    assert set(op.saved_array_values()) == {"x_hat", "inv_std"}
    assert not np.shares_memory(op.x_hat, y.array)
    want, backward = numpy_layer_norm(x.numpy(), w.numpy(), b.numpy(), 1)
    np.testing.assert_allclose(op.x_hat * w.numpy() + b.numpy(), want, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal((4, 5))
    y.array[...] = 0.0  # the output is not read by the backward
    y.backward(mdl.tensor(dy))
    np.testing.assert_allclose(x.grad.numpy(), backward(dy)[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("has_weight, has_bias", AFFINE)
def test_float32_within_a_few_ulps_of_float64(has_weight, has_bias):
    """Each result differs from the float64 one by at most 10 float32 ulps of the size of its terms (measured:
    at most 4.6, in dx), with
    a = s (|x| + |μ|) (x̂'s size, as x − μ is rounded at |x|'s scale): a |γ| + |β| for y;
    s (|g| + |⟨g⟩|) + a |⟨g x̂⟩| for dx (g = dy γ); Σ |dy| a for dγ; Σ |dy| for dβ (Σ over the rows)."""
    rng = np.random.default_rng(16)
    shape, normalized = (64, 3, 48), (3, 48)
    cast = _inputs(rng, shape, normalized, has_weight, has_bias, np.float32)  # float32 values, exact in float64
    x64, w64, b64 = (None if t is None else mdl.tensor(t.numpy().astype(np.float64), requires_grad=True) for t in cast)
    dy = rng.standard_normal(shape).astype(np.float32).astype(np.float64)
    results = {}
    for name, (x, w, b) in (("64", (x64, w64, b64)), ("32", cast)):
        y = F.layer_norm(x, normalized, w, b)
        y.backward(mdl.tensor(dy.astype(x.dtype)))
        assert y.dtype == x.dtype and x.grad.dtype == x.dtype
        results[name] = [y.numpy(), x.grad.numpy()] + [None if t is None else t.grad.numpy() for t in (w, b)]
    xn, dyn = x64.numpy().reshape(64, -1), dy.reshape(64, -1)
    mu, s = xn.mean(1, keepdims=True), 1 / np.sqrt(xn.var(1, keepdims=True) + 1e-5)
    x_hat, a = (xn - mu) * s, s * (np.abs(xn) + np.abs(mu))
    wn = np.ones(144) if w64 is None else w64.numpy().reshape(-1)
    bn = np.zeros(144) if b64 is None else b64.numpy().reshape(-1)
    g = dyn * wn
    sizes = [a * np.abs(wn) + np.abs(bn),
             s * (np.abs(g) + np.abs(g.mean(1, keepdims=True))) + a * np.abs((g * x_hat).mean(1, keepdims=True)),
             (np.abs(dyn) * a).sum(0), np.abs(dyn).sum(0)]
    ulp = np.finfo(np.float32).eps
    for got, want, size in zip(results["32"], results["64"], sizes):
        if want is None:
            continue
        error = np.abs(got.astype(np.float64) - want).reshape(size.shape) / (ulp * size)
        assert error.max() <= 10, error.max()


@pytest.mark.parametrize("has_weight, has_bias", AFFINE)
def test_matches_torch(torch, has_weight, has_bias):
    rng = np.random.default_rng(17)
    shape, normalized = (3, 2, 5), (2, 5)
    x, w, b = _inputs(rng, shape, normalized, has_weight, has_bias)
    dy = rng.standard_normal(shape)
    y = F.layer_norm(x, normalized, w, b, eps=1e-4)
    y.backward(mdl.tensor(dy))
    tx, tw, tb = (None if t is None else torch.tensor(t.numpy(), requires_grad=True) for t in (x, w, b))
    ty = torch.nn.functional.layer_norm(tx, normalized, tw, tb, eps=1e-4)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((x, tx), (w, tw), (b, tb)):
        if mine is not None:
            np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_layer_norm_module_variants_against_torch(torch, kwargs):
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 3, 4))
    ours, theirs = nn.LayerNorm(4, **kwargs).double(), torch.nn.LayerNorm(4, **kwargs).double()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        values = rng.standard_normal(p.shape)
        p.array[...] = values
        q.data.copy_(torch.tensor(values))
    xm, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    dy = rng.standard_normal(x.shape)
    ym, yt = ours(xm), theirs(xt)
    ym.backward(mdl.tensor(dy))
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(ym.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(xm.grad.numpy(), xt.grad.numpy(), rtol=1e-9, atol=1e-12)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_bias_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match=r"layer_norm: bias must have shape \(2, 3\), got \(3,\)"):
        F.layer_norm(mdl.randn(4, 2, 3), (2, 3), None, mdl.ones(3))


@pytest.mark.parametrize("has_weight, has_bias", AFFINE[:3])
def test_device_equals_cpu(device, has_weight, has_bias):
    """On "cuda" (the GPU, or the stand-in) the values and every gradient are the CPU's."""
    rng = np.random.default_rng(19)
    x, w, b = rng.standard_normal((3, 2, 4)), rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    dy = rng.standard_normal((3, 2, 4))
    results = []
    for where in (device, "cpu"):
        xt = leaf(x, where)
        wt, bt = (leaf(p, where) if present else None for p, present in ((w, has_weight), (b, has_bias)))
        y = F.layer_norm(xt, (2, 4), wt, bt)
        assert y.device == xt.device and type(y.creator) is LayerNormAffine
        y.backward(mdl.tensor(dy, device=where))
        results.append([y.numpy(), xt.grad.numpy()] + [t.grad.numpy() for t in (wt, bt) if t is not None])
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_autocast_runs_it_in_float32():
    """Under autocast a float16 input is normalized in float32 (layer norm's entry in the table)."""
    rng = np.random.default_rng(20)
    x16 = rng.standard_normal((6, 8)).astype(np.float16)
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    x = mdl.tensor(x16, requires_grad=True)
    with mdl.amp.autocast("cpu", dtype=mdl.float16):
        y = F.layer_norm(x, 8, mdl.tensor(w), mdl.tensor(b))
    assert y.dtype == np.float32 and type(y.creator) is LayerNormAffine
    want, _ = numpy_layer_norm(x16.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    y.sum().backward()
    assert x.grad.dtype == np.float16
