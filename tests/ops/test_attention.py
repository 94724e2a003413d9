"""scaled_dot_product_attention: the one-op version against attention composed from matmul and softmax,
against PyTorch (values, gradients, second derivatives), masks, causality, dropout, errors."""
import math

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.ops.attention import AttentionGrad, ScaledDotProductAttention


def composed_attention(q, k, v, bias=None, scale=None):
    """The teaching version: five recorded ops (matmul, scale, add the mask, softmax, matmul)."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.mT) * scale
    if bias is not None:
        scores = scores + bias
    return F.softmax(scores, dim=-1) @ v


def additive(mask):
    """A boolean mask (True: take part) as the additive bias it stands for."""
    return np.where(mask, 0.0, -np.inf)


def randn(rng, *shape, grad=True):
    return mdl.tensor(rng.standard_normal(shape), requires_grad=grad)


def grads_of(fn, inputs, seed=0):
    out = fn(*inputs)
    g = np.random.default_rng(seed).standard_normal(out.shape)
    gs = mdl.grad([out], [x for x in inputs if x.requires_grad], grad_outputs=[mdl.tensor(g)])
    return out.numpy(), [x.numpy() for x in gs]


@pytest.mark.parametrize("case", ["plain", "causal", "causal_wide", "causal_tall", "bool_mask", "float_mask",
                                  "broadcast_batch", "two_dimensional"])
def test_attention_equals_the_composed_reference(case):
    rng = np.random.default_rng(1)
    shapes = {"broadcast_batch": ((2, 3, 4, 5), (1, 3, 6, 5), (2, 1, 6, 7)),
              "two_dimensional": ((4, 5), (6, 5), (6, 3)), "causal": ((2, 5, 4), (2, 5, 4), (2, 5, 3)),
              "causal_wide": ((2, 3, 4), (2, 6, 4), (2, 6, 3)),
              "causal_tall": ((2, 6, 4), (2, 3, 4), (2, 3, 3))}.get(case, ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7)))
    q, k, v = (randn(rng, *s) for s in shapes)
    length, keys = q.shape[-2], k.shape[-2]
    kwargs, bias = {}, None
    if case.startswith("causal"):
        kwargs["is_causal"] = True
        bias = additive(np.tril(np.ones((length, keys), dtype=bool)))  # upper-left aligned, as PyTorch
    elif case == "bool_mask":
        kwargs["attn_mask"] = rng.random((3, length, keys)) > 0.3
        kwargs["attn_mask"][..., 0] = True
        bias = additive(kwargs["attn_mask"])
    elif case == "float_mask":
        kwargs["attn_mask"] = bias = rng.standard_normal((length, keys))
    got, got_grads = grads_of(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), [q, k, v])
    want, want_grads = grads_of(lambda q, k, v: composed_attention(q, k, v, bias), [q, k, v])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_second_derivatives_equal_the_composed_reference():
    """Hessian-vector products through the op (AttentionGrad's backward) equal those of the composed ops."""
    rng = np.random.default_rng(2)
    q, k, v = randn(rng, 2, 3, 4), randn(rng, 2, 5, 4), randn(rng, 2, 5, 2)
    bias = mdl.tensor(np.where(rng.random((3, 5)) > 0.3, rng.standard_normal((3, 5)), -np.inf), requires_grad=True)
    bias.array[:, 0] = 0.5
    g, r = rng.standard_normal((2, 3, 2)), [rng.standard_normal(x.shape) for x in (q, k, v, bias)]

    def hvp(fn):
        out = fn(q, k, v, bias)
        first = mdl.grad([out], [q, k, v, bias], grad_outputs=[mdl.tensor(g)], create_graph=True)
        inner = sum((gi * mdl.tensor(ri)).sum() for gi, ri in zip(first, r))
        return [x.numpy() for x in mdl.grad([inner], [q, k, v, bias])]

    for a, b in zip(hvp(F.scaled_dot_product_attention), hvp(composed_attention)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_attention_matches_torch_values_gradients_and_second_derivatives(torch, mask):
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 2, 4, 8)), rng.standard_normal((2, 2, 6, 8)), rng.standard_normal((2, 2, 6, 5))
    arrays = [q, k, v]
    kwargs = {"scale": 0.4} if mask is None else {}
    if mask == "bool":
        m = rng.random((2, 1, 4, 6)) > 0.4
        m[..., 2] = True
        kwargs["attn_mask"] = m
    elif mask == "causal":
        kwargs["is_causal"] = True
    elif mask == "float":
        arrays.append(rng.standard_normal((4, 6)))  # an additive mask that gets a gradient too
    xs = [mdl.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    tkw = {key: torch.tensor(val) if key == "attn_mask" else val for key, val in kwargs.items()}
    if mask == "float":
        kwargs["attn_mask"], tkw["attn_mask"] = xs[3], ts[3]
    out = F.scaled_dot_product_attention(*xs[:3], **kwargs)
    tout = torch.nn.functional.scaled_dot_product_attention(*ts[:3], **tkw)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(out.shape)
    first = mdl.grad([out], xs, grad_outputs=[mdl.tensor(g)], create_graph=True)
    tfirst = torch.autograd.grad(tout, ts, torch.tensor(g), create_graph=True)
    for a, b in zip(first, tfirst):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-10, atol=1e-12)
    r = [rng.standard_normal(x.shape) for x in xs]
    second = mdl.grad([sum((a * mdl.tensor(b)).sum() for a, b in zip(first, r))], xs)
    tsecond = torch.autograd.grad(sum((a * torch.tensor(b)).sum() for a, b in zip(tfirst, r)), ts)
    for a, b in zip(second, tsecond):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zero_output_and_zero_gradient_as_torch(torch, kind):
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 6))
    keep = np.ones((3, 5), dtype=bool)
    keep[1] = False
    mask = keep if kind == "bool" else additive(keep)
    xs = [mdl.tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*xs, attn_mask=mask)
    out.sum().backward()
    assert (out.numpy()[:, 1] == 0).all() and (xs[0].grad.numpy()[:, 1] == 0).all()
    assert all(np.isfinite(x.grad.numpy()).all() for x in xs)
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    tout = torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=torch.tensor(mask))
    tout.sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_the_op_keeps_only_the_probabilities():
    """One node; backward reads the saved P (no recomputation of Q Kᵀ), through the gradient op AttentionGrad."""
    rng = np.random.default_rng(5)
    q, k, v = randn(rng, 2, 3, 4), randn(rng, 2, 5, 4), randn(rng, 2, 5, 6)
    out = F.scaled_dot_product_attention(q, k, v)
    node = out.creator
    assert isinstance(node, ScaledDotProductAttention) and node.inputs == (q, k, v)
    scores = (q.numpy() @ k.numpy().swapaxes(-1, -2)) / 2
    p = np.exp(scores - scores.max(-1, keepdims=True))
    np.testing.assert_allclose(node.probs, p / p.sum(-1, keepdims=True), rtol=1e-12)
    arrays = [a for a in vars(node).values() if hasattr(a, "shape") and getattr(a, "size", 0) > 1]
    assert len(arrays) == 1 and arrays[0] is node.probs
    grads = node.backward(mdl.tensor(np.ones(out.shape)))
    assert len(grads) == 3 and all(isinstance(g.creator, AttentionGrad) for g in grads)


def test_dropout_drops_attention_weights_with_the_seeded_generator():
    rng = np.random.default_rng(6)
    q, k, v = randn(rng, 2, 3, 4), randn(rng, 2, 5, 4), randn(rng, 2, 5, 6)
    mdl.manual_seed(7)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    d = out.creator.dropout
    assert set(np.unique(d)) <= {0.0, 1 / 0.6} and 0 < (d == 0).mean() < 1
    want = (out.creator.probs * d) @ v.numpy()
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12)
    mdl.manual_seed(7)
    again = F.scaled_dot_product_attention(q, k, v, dropout_p=0.4)
    np.testing.assert_array_equal(again.numpy(), out.numpy())  # the same seed drops the same weights
    # the gradient of the dropped attention is the composed one with the same mask D
    g = rng.standard_normal(out.shape)
    got = mdl.grad([out], [q, k, v], grad_outputs=[mdl.tensor(g)])
    weights = F.softmax((q @ k.mT) * 0.5, dim=-1) * mdl.tensor(d)
    want = mdl.grad([weights @ v], [q, k, v], grad_outputs=[mdl.tensor(g)])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-11, atol=1e-13)
    mdl.manual_seed(0)
    large = F.scaled_dot_product_attention(*(mdl.randn(4, 64, 8, requires_grad=True) for _ in range(3)),
                                           dropout_p=0.25)
    assert abs((large.creator.dropout == 0).mean() - 0.25) < 0.02


def test_float32_stays_float32(device):
    q, k, v = (mdl.randn(2, 3, 4, device=device, requires_grad=True) for _ in range(3))
    mask = np.tril(np.ones((3, 3))) - 1.0  # a float64 additive mask does not upcast
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out.dtype == np.float32
    out.sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == np.float32
    reference = composed_attention(*(mdl.tensor(x.numpy().astype(np.float64)) for x in (q, k, v)), mask)
    np.testing.assert_allclose(out.numpy(), reference.numpy(), rtol=1e-5, atol=1e-6)


def test_errors_speak_to_the_user():
    q, k, v = mdl.randn(2, 3, 4), mdl.randn(2, 5, 4), mdl.randn(2, 5, 6)
    op = "scaled_dot_product_attention"
    with pytest.raises(ValueError, match=rf"{op}: pass either attn_mask or is_causal=True, not both"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 5), bool), is_causal=True)
    with pytest.raises(ValueError, match=rf"{op}: query \(2, 3, 4\), key \(2, 5, 3\) and value \(2, 5, 6\) do not fit"):
        F.scaled_dot_product_attention(q, mdl.randn(2, 5, 3), v)
    with pytest.raises(ValueError, match=r"do not fit"):
        F.scaled_dot_product_attention(q, k, mdl.randn(2, 4, 6))
    with pytest.raises(ValueError, match=rf"{op}: attn_mask of shape \(3, 4\) must broadcast to the scores' shape "
                                         r"\(2, 3, 5\)"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 4), bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 3, 5\) must broadcast"):  # it would grow the output
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((4, 3, 5), bool))
    with pytest.raises(TypeError, match=rf"{op}: attn_mask must be boolean .* got dtype int64"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=np.ones((3, 5), np.int64))
    with pytest.raises(ValueError, match=rf"{op}: dropout_p is a probability in \[0, 1\), got 1"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1)
    with pytest.raises(ValueError, match=rf"{op}: query must be \(..., length, features\), at least 2-D"):
        F.scaled_dot_product_attention(mdl.randn(4), k, v)
    with pytest.raises(ValueError, match=r"leading axes .* do not broadcast"):
        F.scaled_dot_product_attention(mdl.randn(3, 3, 4), k, v)


@pytest.mark.parametrize("mask", [None, "bool_per_head", "float", "causal"])
def test_grouped_query_attention_matches_torch(torch, mask):
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal((2, 6, 3, 4)), rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 3))]
    kwargs = {}
    if mask == "bool_per_head":
        m = rng.random((6, 3, 5)) > 0.4
        m[..., 0] = True
        kwargs["attn_mask"] = m
    elif mask == "float":
        arrays.append(rng.standard_normal((3, 5)))
    elif mask == "causal":
        kwargs["is_causal"] = True
    xs = [mdl.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    tkw = {key: torch.tensor(val) if key == "attn_mask" else val for key, val in kwargs.items()}
    if mask == "float":
        kwargs["attn_mask"], tkw["attn_mask"] = xs[3], ts[3]
    out = F.scaled_dot_product_attention(*xs[:3], enable_gqa=True, **kwargs)
    tout = torch.nn.functional.scaled_dot_product_attention(*ts[:3], enable_gqa=True, **tkw)
    assert out.shape == (2, 6, 3, 3)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(out.shape)
    out.backward(mdl.tensor(g))
    tout.backward(torch.tensor(g))
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_grouped_query_attention_errors():
    q, k = mdl.randn(1, 6, 3, 4), mdl.randn(1, 4, 5, 4)
    with pytest.raises(ValueError, match=r"enable_gqa needs key and value with the same number of heads"):
        F.scaled_dot_product_attention(q, k, mdl.randn(1, 4, 5, 2), enable_gqa=True)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 3, 5\) has 3 heads"):
        F.scaled_dot_product_attention(q, mdl.randn(1, 3, 5, 4), mdl.randn(1, 3, 5, 2),
                                       attn_mask=np.ones((3, 3, 5), bool), enable_gqa=True)
    with pytest.raises(ValueError, match=r"do not broadcast"):  # without enable_gqa the heads must broadcast
        F.scaled_dot_product_attention(q, mdl.randn(1, 3, 5, 4), mdl.randn(1, 3, 5, 2))
