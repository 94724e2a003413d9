"""Scaled dot-product attention: one op whose backward keeps only the probabilities P.

Queries Q (…, L, E), keys K (…, S, E) and values V (…, S, Ev); s is the scale
(1/√E unless given) and B the mask written as an additive bias, −∞ where a key
takes no part:

    Z = s·Q Kᵀ + B          the scores, (…, L, S)
    P = softmax(Z)          along the keys; a row whose keys are all masked is 0
    O = (P ⊙ D) V           D: the dropout mask scaled by 1/(1 − p), or all ones

The forward keeps P (and D), and the backward needs nothing else:

    dV = (P ⊙ D)ᵀ dO
    dP = (dO Vᵀ) ⊙ D
    dZ = P ⊙ (dP − Σ_j dP_j P_j)      the softmax Jacobian applied to dP
    dQ = s·dZ K,  dK = s·dZᵀ Q,  dB = dZ

Composed from matmul and softmax, the same computation records five nodes and
keeps Z, P and P ⊙ D; here it is one node keeping P. A fully masked row gives
0 output and 0 gradient, as PyTorch does (its plain softmax would give NaN).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from minidl import backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.activation import SoftmaxGrad, softmax
from minidl.ops.elementwise import where
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import reshape, sum_to, swap_last_axes
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ()


class ScaledDotProductAttention(Function):
    """O = (P ⊙ D) V with P = softmax(s·Q Kᵀ + B);  dV = (P ⊙ D)ᵀ dO,  dZ = P ⊙ (dP − Σ_j dP_j P_j),
    dQ = s·dZ K,  dK = s·dZᵀ Q,  dB = dZ  with dP = (dO Vᵀ) ⊙ D.

    Inputs (Q, K, V) or (Q, K, V, B) for an additive float mask B (which then gets
    a gradient too); a boolean mask (True: the key takes part) and the causal mask
    are constants held by the op (``mask_tensor``: the boolean mask's Tensor, whose version
    backward checks). The backward is the gradient op AttentionGrad.
    """

    def __init__(self, scale, mask=None, dropout_p=0.0, mask_tensor=None):
        self.scale, self.mask, self.dropout_p = scale, mask, dropout_p
        self.saved_indices = () if mask_tensor is None else (mask_tensor,)

    def forward(self, q, k, v, bias=None):
        self.probs, self.dead = _probabilities(q, k, bias, self.scale, self.mask)
        self.dropout = None
        if not self.dropout_p:
            return self.probs @ v
        generator = backend.rng(backend.device_of(q))
        keep = generator.random(self.probs.shape, dtype=np.float32) >= self.dropout_p
        self.dropout = keep.astype(q.dtype)  # the mask D, already scaled: 0 or 1/(1 − p)
        self.dropout *= 1 / (1 - self.dropout_p)
        return (self.probs * self.dropout) @ v

    def backward(self, gy):
        grads = AttentionGrad(self.scale, self.mask, self.dead, self.probs, self.dropout)(gy, *self.inputs)
        return tuple(g if x.requires_grad else None for g, x in zip(grads, self.inputs))


class AttentionGrad(Function):
    """The attention gradient as an op of (dO, Q, K, V[, B]), P and D saved by the forward:
    z = (dQ, dK, dV[, dB]) as in ScaledDotProductAttention;  with x̄ the gradient reaching x,
    d(dO) = (P ⊙ D) dV̄ + dP̄ V,  Q̄ = s·(Z̄ K + dZ dK̄),  K̄ = s·(Z̄ᵀ Q + dZᵀ dQ̄),  V̄ = dP̄ᵀ dO,  B̄ = Z̄
    (Z̄ and dP̄ as in backward).

    Its backward recomputes P from (Q, K, B) with differentiable ops, so third
    derivatives work too; the first-order backward never does (it reads the saved P).
    """

    def __init__(self, scale, mask, dead, probs, dropout):
        self.scale, self.mask, self.dead, self.probs, self.dropout = scale, mask, dead, probs, dropout

    def forward(self, gy, q, k, v, bias=None):
        xp = xp_of(gy)
        p, d = self.probs, self.dropout
        gv = _sum_to(xp.swapaxes(p if d is None else p * d, -1, -2) @ gy, v.shape)
        gz = gy @ xp.swapaxes(v, -1, -2)  # dP, then dZ = P ⊙ (dP − Σ_j dP_j P_j) in place
        if d is not None:
            gz *= d
        gz -= (gz * p).sum(axis=-1, keepdims=True)
        gz *= p
        gq = _sum_to(gz @ k, q.shape)
        gq *= self.scale
        gk = _sum_to(xp.swapaxes(gz, -1, -2) @ q, k.shape)
        gk *= self.scale
        if bias is None:
            return gq, gk, gv
        return gq, gk, gv, _sum_to(gz, bias.shape)

    def backward(self, gq_bar, gk_bar, gv_bar, gb_bar=None):
        """The cotangents x̄ of the outputs, carried back through the forward's own steps:

        dZ = SoftmaxGrad(P, dP) gets dZ̄ = s·(dQ̄ Kᵀ + Q dK̄ᵀ) + dB̄; SoftmaxGrad's backward
        sends P̄ = dZ̄ ⊙ (dP − Σ_j dP_j P_j) − dP ⊙ Σ_j dZ̄_j P_j and dP̄ = SoftmaxGrad(P, dZ̄);
        dV = (P ⊙ D)ᵀ dO adds (dO dV̄ᵀ) ⊙ D to P̄; P = softmax(Z) gives Z̄ = SoftmaxGrad(P, P̄).
        """
        gy, q, k, v = self.inputs[:4]
        bias = self.inputs[4] if len(self.inputs) == 5 else None
        s, d = self.scale, (None if self.dropout is None else Tensor(self.dropout))
        p = _probabilities_op(q, k, bias, s, self.mask, self.dead)
        gp = gy @ swap_last_axes(v)
        if d is not None:
            gp = gp * d
        gz = SoftmaxGrad(-1)(p, gp)
        gz_bar = (gq_bar @ swap_last_axes(k) + q @ swap_last_axes(gk_bar)) * s
        if gb_bar is not None:
            gz_bar = gz_bar + gb_bar
        p_bar = (gz_bar * (gp - reduce_sum(gp * p, axis=-1, keepdims=True))
                 - gp * reduce_sum(gz_bar * p, axis=-1, keepdims=True))
        gp_bar = SoftmaxGrad(-1)(p, gz_bar)
        from_gv = gy @ swap_last_axes(gv_bar)
        if d is not None:
            from_gv, gp_bar = from_gv * d, gp_bar * d
        z_bar = SoftmaxGrad(-1)(p, p_bar + from_gv)
        pd = p if d is None else p * d
        grads = (sum_to(pd @ gv_bar + gp_bar @ v, gy.shape),
                 sum_to((z_bar @ k + gz @ gk_bar) * s, q.shape),
                 sum_to((swap_last_axes(z_bar) @ q + swap_last_axes(gz) @ gq_bar) * s, k.shape),
                 sum_to(swap_last_axes(gp_bar) @ gy, v.shape))
        return grads if bias is None else grads + (sum_to(z_bar, bias.shape),)


def _sum_to(a, shape):
    """The array ``a`` summed down to ``shape`` over the axes broadcasting added or stretched."""
    if a.shape == tuple(shape):
        return a
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and a.shape[lead + i] != 1)
    return a.sum(axis=axes, keepdims=True).reshape(shape)


def _probabilities(q, k, bias, scale, mask):
    """P = softmax(s·Q Kᵀ + B) on arrays, and the rows with every key masked (None without a mask)."""
    xp = xp_of(q)
    z = q @ xp.swapaxes(k, -1, -2)
    z *= scale
    if bias is not None:
        z += bias
    if mask is not None:
        xp.copyto(z, z.dtype.type(-np.inf), where=~mask)
    m = z.max(axis=-1, keepdims=True)
    dead = None
    if bias is not None or mask is not None:
        dead = m == -np.inf
        m = xp.where(dead, 0, m)  # a row of −∞ stays −∞ − 0 (e⁻∞ = 0), not −∞ + ∞ = NaN
    z -= m
    e = xp.exp(z, out=z)  # in place: z is ours, and not needed again
    total = e.sum(axis=-1, keepdims=True)
    e /= total if dead is None else xp.where(dead, 1, total)
    return e, dead


def _probabilities_op(q, k, bias, scale, mask, dead):
    """The same P from differentiable ops (for the second derivative)."""
    z = (q @ swap_last_axes(k)) * scale
    if bias is not None:
        z = z + bias
    if mask is not None:
        z = where(mask, z, -math.inf)
    if dead is None:
        return softmax(z, axis=-1)
    return where(dead, 0.0, softmax(where(dead, 0.0, z), axis=-1))


# ---------------------------------------------------------------- the functional form
def _as_input(op, name, value):
    x = as_tensor(value)
    if x.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be floating point, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{op}: {name} must be (..., length, features), at least 2-D, got shape {x.shape}")
    return x


@autocast_to("float32")  # minidl's fused attention computes on float32 arrays (PyTorch: lower)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False) -> Tensor:
    """softmax(Q Kᵀ · scale + mask) V for Q (…, L, E), K (…, S, E), V (…, S, Ev): output (…, L, Ev).

    ``attn_mask`` broadcasts to (…, L, S): boolean (True: the key takes part) or
    float (added to the scores; −inf masks). ``is_causal`` lets query i see keys
    j ≤ i (the mask ``tril(ones(L, S))``, aligned at the top left, as PyTorch); it
    cannot be combined with ``attn_mask``. ``scale`` defaults to 1/√E.
    ``dropout_p`` > 0 drops attention weights with minidl's seeded generator,
    whenever it is given (as PyTorch: pass 0.0 in evaluation). The leading axes
    broadcast. A query whose keys are all masked gets 0 output, as in PyTorch.
    ``enable_gqa`` (grouped-query attention): Hq query heads (axis −3) share Hk
    key and value heads, query head h using head h // (Hq/Hk), as PyTorch.
    """
    op = "scaled_dot_product_attention"
    q, k, v = (_as_input(op, n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    if enable_gqa:
        return _grouped_query_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"{op}: query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{op}: query {q.shape}, key {k.shape} and value {v.shape} do not fit: query and key "
                         "must share the feature size E (last axis), key and value the length S (axis −2)")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"{op}: the leading axes of query {q.shape}, key {k.shape} and value {v.shape} "
                         "do not broadcast") from None
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0 <= dropout_p < 1:
        raise ValueError(f"{op}: dropout_p is a probability in [0, 1), got {dropout_p!r}")
    scores = np.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask = bias = None
    if is_causal:
        if attn_mask is not None:
            raise ValueError(f"{op}: pass either attn_mask or is_causal=True, not both (as PyTorch); "
                             "for a causal mask with more, combine them into one attn_mask")
        mask = q.xp.tri(q.shape[-2], k.shape[-2], dtype=bool)
    elif attn_mask is not None:
        mask, bias = _mask(op, attn_mask, q, scores)
    mask_tensor = attn_mask if isinstance(attn_mask, Tensor) and mask is not None else None
    attention = ScaledDotProductAttention(scale, mask, float(dropout_p), mask_tensor)
    return attention(q, k, v) if bias is None else attention(q, k, v, bias)


def _mask(op, attn_mask, q, scores):
    """A boolean mask as an array (a constant), or a float mask as a Tensor of q's dtype (an input)."""
    array = attn_mask.data if isinstance(attn_mask, Tensor) else attn_mask
    if not hasattr(array, "dtype"):
        array = np.asarray(array)
    try:
        fits = np.broadcast_shapes(array.shape, scores) == scores
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{op}: attn_mask of shape {tuple(array.shape)} must broadcast to the scores' shape "
                         f"{scores} (..., L, S)")
    if array.dtype == bool:
        return backend.to_device(array, q.device), None
    if array.dtype.kind != "f":
        raise TypeError(f"{op}: attn_mask must be boolean (True: take part) or floating point (added to the "
                        f"scores), got dtype {array.dtype}")
    if isinstance(attn_mask, Tensor) and attn_mask.dtype == q.dtype:
        return None, attn_mask  # kept as it is, so that it can get a gradient
    return None, Tensor(backend.to_device(array, q.device).astype(q.dtype))


def _grouped_query_attention(q, k, v, attn_mask, dropout_p, is_causal, scale):
    """Hq query heads on Hk key/value heads: the heads axis split into (Hk, Hq/Hk), the keys
    broadcast over the groups, the same op on that shape (no copy of K or V), heads merged back."""
    op = "scaled_dot_product_attention"
    if q.ndim < 3 or k.ndim < 3 or v.ndim < 3:
        raise ValueError(f"{op}: enable_gqa needs a heads axis (..., heads, length, features); got query "
                         f"{q.shape}, key {k.shape}, value {v.shape}")
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if v.shape[-3] != kv_heads or heads % kv_heads:
        raise ValueError(f"{op}: enable_gqa needs key and value with the same number of heads (axis −3), "
                         f"dividing the query's: got {heads} query, {kv_heads} key and {v.shape[-3]} value heads")
    group = heads // kv_heads
    q5 = reshape(q, q.shape[:-3] + (kv_heads, group) + q.shape[-2:])
    k5, v5 = (reshape(x, x.shape[:-3] + (kv_heads, 1) + x.shape[-2:]) for x in (k, v))
    if attn_mask is not None:
        mask = as_tensor(attn_mask if hasattr(attn_mask, "dtype") else np.asarray(attn_mask))
        if mask.ndim < 3:
            mask = reshape(mask, (1,) * (3 - mask.ndim) + mask.shape)
        split = {heads: (kv_heads, group), 1: (1, 1)}.get(mask.shape[-3])
        if split is None:
            raise ValueError(f"{op}: attn_mask of shape {mask.shape} has {mask.shape[-3]} heads (axis −3); "
                             f"expected 1 or the query's {heads}")
        mask = reshape(mask, mask.shape[:-3] + split + mask.shape[-2:])
        attn_mask = mask  # a float mask keeps its gradient, a boolean one its version (a view)
    out = scaled_dot_product_attention(q5, k5, v5, attn_mask, dropout_p, is_causal, scale)
    return reshape(out, out.shape[:-4] + (heads,) + out.shape[-2:])
