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

and the tangent rule (forward mode) runs the same steps forwards:

    Ż = s·(Q̇ Kᵀ + Q K̇ᵀ) + Ḃ,   Ṗ = P ⊙ (Ż − Σ_j Ż_j P_j),   Ȯ = (Ṗ ⊙ D) V + (P ⊙ D) V̇

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
from minidl.ops.shape import filled_tangents, reshape, sum_to, swap_last_axes
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ()
# scaled_dot_product_attention takes the tiled path by itself where the probabilities would fill this
TILED_ABOVE_BYTES = 1 << 28


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


def _scores_tangent(q, k, dq, dk, dbias, scale):
    """Ż = s·(Q̇ Kᵀ + Q K̇ᵀ) + Ḃ, the scores' tangent (None when every tangent is)."""
    terms = [a @ swap_last_axes(b) * scale for a, b in ((dq, k), (q, dk)) if a is not None and b is not None]
    if dbias is not None:
        terms.append(dbias)
    if not terms:
        return None
    dz = terms[0]
    for term in terms[1:]:
        dz = dz + term
    return dz


def _as_input(op, name, value):
    x = as_tensor(value)
    if x.dtype.kind not in "fc":  # complex: the analytic continuation, for the complex-step gradcheck
        raise TypeError(f"{op}: {name} must be floating point, got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{op}: {name} must be (..., length, features), at least 2-D, got shape {x.shape}")
    return x


class ScaledDotProductAttention(Function):
    """O = (P ⊙ D) V with P = softmax(s·Q Kᵀ + B);  dV = (P ⊙ D)ᵀ dO,  dZ = P ⊙ (dP − Σ_j dP_j P_j),
    dQ = s·dZ K,  dK = s·dZᵀ Q,  dB = dZ  with dP = (dO Vᵀ) ⊙ D.

    Inputs (Q, K, V) or (Q, K, V, B) for an additive float mask B (which then gets
    a gradient too); a boolean mask (True: the key takes part) and the causal mask
    are constants held by the op (``mask_tensor``: the boolean mask's Tensor, whose version
    backward checks). The backward is the gradient op AttentionGrad.
    """
    saved_arrays = ("mask", "probs", "dead", "dropout")

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

    def jvp(self, dq, dk, dv, dbias=None):
        """Ȯ = (Ṗ ⊙ D) V + (P ⊙ D) V̇  with Ṗ = P ⊙ (Ż − Σ_j Ż_j P_j),  Ż = s·(Q̇ Kᵀ + Q K̇ᵀ) + Ḃ."""
        q, k, v = self.inputs[:3]
        bias = self.inputs[3] if len(self.inputs) == 4 else None
        d = None if self.dropout is None else Tensor(self.dropout)
        p = _probabilities_op(q, k, bias, self.scale, self.mask, self.dead)  # P from Tensor ops: differentiable
        pd = p if d is None else p * d
        dout = None if dv is None else pd @ dv
        dz = _scores_tangent(q, k, dq, dk, dbias, self.scale)
        if dz is not None:
            dp = SoftmaxGrad(-1)(p, dz)
            along_p = (dp if d is None else dp * d) @ v
            dout = along_p if dout is None else dout + along_p
        return dout


class AttentionGrad(Function):
    """The attention gradient as an op of (dO, Q, K, V[, B]), P and D saved by the forward:
    z = (dQ, dK, dV[, dB]) as in ScaledDotProductAttention;  with x̄ the gradient reaching x,
    d(dO) = (P ⊙ D) dV̄ + dP̄ V,  Q̄ = s·(Z̄ K + dZ dK̄),  K̄ = s·(Z̄ᵀ Q + dZᵀ dQ̄),  V̄ = dP̄ᵀ dO,  B̄ = Z̄
    (Z̄ and dP̄ as in backward).

    Its backward recomputes P from (Q, K, B) with differentiable ops, so third
    derivatives work too; the first-order backward never does (it reads the saved P).
    """
    saved_arrays = ("mask", "dead", "probs", "dropout")

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


    def jvp(self, dgy, dq, dk, dv, dbias=None):
        """With Ż and Ṗ as in ScaledDotProductAttention's tangent and dP, dZ as in its backward:

            dV̇ = (Ṗ ⊙ D)ᵀ dO + (P ⊙ D)ᵀ ḋO,   dṖ = (ḋO Vᵀ + dO V̇ᵀ) ⊙ D,
            dŻ = P ⊙ (dṖ − Σ_j dṖ_j P_j) + Ṗ ⊙ (dP − Σ_j dP_j P_j) − P ⊙ Σ_j dP_j Ṗ_j,
            dQ̇ = s·(dŻ K + dZ K̇),  dK̇ = s·(dŻᵀ Q + dZᵀ Q̇),  dḂ = dŻ

        each summed to its input's shape.
        """
        gy, q, k, v = self.inputs[:4]
        bias = self.inputs[4] if len(self.inputs) == 5 else None
        s, d = self.scale, (None if self.dropout is None else Tensor(self.dropout))
        dgy, dq, dk, dv = filled_tangents((dgy, dq, dk, dv), self.inputs[:4])
        p = _probabilities_op(q, k, bias, s, self.mask, self.dead)
        dz = _scores_tangent(q, k, dq, dk, dbias, s)
        dp = SoftmaxGrad(-1)(p, dz)
        masked = (lambda a: a) if d is None else (lambda a: a * d)  # noqa: E731
        gp = masked(gy @ swap_last_axes(v))
        gz = SoftmaxGrad(-1)(p, gp)
        dgp = masked(dgy @ swap_last_axes(v) + gy @ swap_last_axes(dv))
        dgz = (SoftmaxGrad(-1)(p, dgp) + dp * (gp - reduce_sum(gp * p, axis=-1, keepdims=True))
               - p * reduce_sum(gp * dp, axis=-1, keepdims=True))
        tangents = (sum_to((dgz @ k + gz @ dk) * s, q.shape),
                    sum_to((swap_last_axes(dgz) @ q + swap_last_axes(gz) @ dq) * s, k.shape),
                    sum_to(swap_last_axes(masked(dp)) @ gy + swap_last_axes(masked(p)) @ dgy, v.shape))
        return tangents if bias is None else tangents + (sum_to(dgz, bias.shape),)


def _full_mask(mask, causal, q, k):
    """The whole boolean mask a plain op needs: ``mask``, or query i seeing keys j ≤ i (``tril(ones(L, S))``,
    PyTorch's causal mask), which a tiled op makes block by block."""
    if not causal:
        return mask
    return q.xp.tri(q.shape[-2], k.shape[-2], dtype=bool)


def _plain_node(plain, tiled):
    """``plain``, an untiled op of the same function as the recorded node ``tiled``, made to stand
    for it: its forward run on the same inputs (for what it saves), its inputs and outputs those of
    ``tiled``, so that its backward or tangent rule can be used for the tiled op's."""
    plain.forward(*[x.array for x in tiled.inputs])
    plain.inputs, plain.outputs, plain.recorded_at = tiled.inputs, tiled.outputs, tiled.recorded_at
    return plain


def _score_blocks(q, k, scale, mask, causal, block):
    """(start, Z_j) for each block of keys: Z_j = s·Q K_jᵀ, −∞ where the mask leaves a key out."""
    xp = xp_of(q)
    for start in range(0, k.shape[-2], block):
        z = q @ xp.swapaxes(k[..., start:start + block, :], -1, -2)
        z *= scale
        if mask is not None:
            keys = mask if mask.shape[-1] == 1 else mask[..., start:start + block]  # a mask may broadcast over keys
            xp.copyto(z, z.dtype.type(-np.inf), where=~keys)
        if causal:  # query i sees key j ≤ i: this block's columns of tril(ones(L, S))
            later = xp.arange(start, start + z.shape[-1])[None, :] > xp.arange(z.shape[-2])[:, None]
            xp.copyto(z, z.dtype.type(-np.inf), where=later)
        yield start, z


class TiledAttention(Function):
    """FlashAttention's tiling (Dao et al., 2022): O = softmax(s·Q Kᵀ) V computed over blocks of keys
    with an online softmax, keeping per query row only the running maximum m, the running sum ℓ and
    the output; for each block j of keys (k runs over the block's keys, c over the value features):

        Z_j = s·Q K_jᵀ (masked: −∞),  m′ = max(m, max_k Z_jk),  α = e^(m − m′),  P̃_j = e^(Z_j − m′)
        ℓ ← α ℓ + Σ_k P̃_jk,  A ← α A + P̃_j V_j,  m ← m′;   finally O = A / ℓ,  λ = m + log ℓ

    What backward keeps is O and the log-sum-exp λ per row: O(L·Ev + L) numbers, not the L × S
    probabilities. The gradient (TiledAttentionGrad) recomputes each block's P_j = e^(Z_j − λ)
    from them: with Δ = Σ_c (dO ⊙ O)_c,

        dV_j = P_jᵀ dO,   dZ_j = P_j ⊙ (dO V_jᵀ − Δ),   dQ = s·Σ_j dZ_j K_j,   dK_j = s·dZ_jᵀ Q

    the same gradient as ScaledDotProductAttention's (Δ_i = Σ_j dP_ij P_ij, since O = P V).
    Inputs (Q, K, V); a boolean mask is a constant of the op, as there; ``causal`` lets query i see
    keys j ≤ i, each block's part of that mask made as the block is (the n × n mask is never held);
    no float mask and no dropout (the plain op has them). ``block``: keys per block.
    """
    saved_arrays = ("mask", "out", "lse")

    def __init__(self, scale, mask=None, causal=False, block=128, mask_tensor=None):
        self.scale, self.mask, self.causal, self.block = scale, mask, bool(causal), int(block)
        self.saved_indices = () if mask_tensor is None else (mask_tensor,)

    def forward(self, q, k, v):
        xp = xp_of(q)
        lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        rows = lead + (q.shape[-2], 1)
        m = xp.full(rows, -np.inf, dtype=q.dtype)
        total = xp.zeros(rows, dtype=q.dtype)
        acc = xp.zeros(lead + (q.shape[-2], v.shape[-1]), dtype=q.dtype)
        for start, z in _score_blocks(q, k, self.scale, self.mask, self.causal, self.block):
            m_new = xp.maximum(m, z.max(axis=-1, keepdims=True))
            shift = xp.where(m_new == -np.inf, 0, m_new)  # a row masked so far: e^{−∞ − 0} = 0, no NaN
            alpha = xp.exp(m - shift)
            z -= shift
            p = xp.exp(z, out=z)
            total *= alpha
            total += p.sum(axis=-1, keepdims=True)
            acc *= alpha
            acc += p @ v[..., start:start + self.block, :]
            m = m_new
        dead = total == 0  # every key of the row masked: output 0, as the plain op
        self.out = acc / xp.where(dead, 1, total)
        self.lse = xp.where(dead, np.inf, m + xp.log(xp.where(dead, 1, total)))  # e^{Z − ∞} = 0 in backward
        return self.out

    def backward(self, gy):
        q, k, v = self.inputs
        grads = TiledAttentionGrad(self.scale, self.mask, self.causal, self.block, self.out, self.lse)(gy, q, k, v)
        return tuple(g if x.requires_grad else None for g, x in zip(grads, self.inputs))

    def jvp(self, dq, dk, dv):
        """The plain op's tangent (the same function), through a plain node: forward mode here
        holds the L × S probabilities, as the plain op does."""
        plain = ScaledDotProductAttention(self.scale, _full_mask(self.mask, self.causal, *self.inputs[:2]))
        return _plain_node(plain, self).jvp(dq, dk, dv)


class TiledAttentionGrad(Function):
    """(dQ, dK, dV) of TiledAttention as an op of (dO, Q, K, V), over the same blocks of keys, from the O
    and λ that the forward saved:  P_j = e^(Z_j − λ),  Δ = Σ_c (dO ⊙ O)_c,  dV_j = P_jᵀ dO,
    dZ_j = P_j ⊙ (dO V_jᵀ − Δ),  dQ = s·Σ_j dZ_j K_j,  dK_j = s·dZ_jᵀ Q;  AttentionGrad's backward.

    c runs over the value features. It computes the same function as AttentionGrad (no bias, no
    dropout), so its own backward and tangent are AttentionGrad's, taken through a plain node
    (second order holds L × S again).
    """
    saved_arrays = ("mask", "out", "lse")

    def __init__(self, scale, mask, causal, block, out, lse):
        self.scale, self.mask, self.causal, self.block, self.out, self.lse = scale, mask, causal, block, out, lse

    def forward(self, gy, q, k, v):
        xp = xp_of(gy)
        delta = (gy * self.out).sum(axis=-1, keepdims=True)
        gq = xp.zeros(np.broadcast_shapes(gy.shape[:-1] + q.shape[-1:], q.shape), dtype=q.dtype)
        gk_blocks, gv_blocks = [], []
        for start, z in _score_blocks(q, k, self.scale, self.mask, self.causal, self.block):
            z -= self.lse
            p = xp.exp(z, out=z)
            v_j, k_j = v[..., start:start + self.block, :], k[..., start:start + self.block, :]
            gv_blocks.append(xp.swapaxes(p, -1, -2) @ gy)
            gz = gy @ xp.swapaxes(v_j, -1, -2)
            gz -= delta
            gz *= p
            gq += gz @ k_j
            gk_blocks.append(xp.swapaxes(gz, -1, -2) @ q)
        gq *= self.scale
        gk = xp.concatenate(gk_blocks, axis=-2)
        gk *= self.scale
        return _sum_to(gq, q.shape), _sum_to(gk, k.shape), _sum_to(xp.concatenate(gv_blocks, axis=-2), v.shape)

    def _plain(self):
        q, k = self.inputs[1:3]
        mask = _full_mask(self.mask, self.causal, q, k)
        probs, dead = _probabilities(q.array, k.array, None, self.scale, mask)
        return _plain_node(AttentionGrad(self.scale, mask, dead, probs, None), self)

    def backward(self, gq_bar, gk_bar, gv_bar):
        return self._plain().backward(gq_bar, gk_bar, gv_bar)

    def jvp(self, dgy, dq, dk, dv):
        return self._plain().jvp(dgy, dq, dk, dv)


# ---------------------------------------------------------------- the functional form
@autocast_to("float32")  # minidl's fused attention computes on float32 arrays (PyTorch: lower)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False, tiled=None) -> Tensor:
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

    ``tiled`` (minidl's keyword; PyTorch chooses its kernels itself): True computes the
    attention in blocks of keys (:class:`TiledAttention`, FlashAttention's online softmax),
    holding O(L·E) for backward instead of the L × S probabilities; it takes boolean and causal
    masks, not a float mask or dropout. None (the default) takes the tiled path where the
    probabilities would fill ``TILED_ABOVE_BYTES`` and nothing rules it out; False never does.
    """
    op = "scaled_dot_product_attention"
    q, k, v = (_as_input(op, n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    if enable_gqa:
        return _grouped_query_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, tiled)
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
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: pass either attn_mask or is_causal=True, not both (as PyTorch); "
                         "for a causal mask with more, combine them into one attn_mask")
    if attn_mask is not None:
        mask, bias = _mask(op, attn_mask, q, scores)
    mask_tensor = attn_mask if isinstance(attn_mask, Tensor) and mask is not None else None
    if tiled or tiled is None and bias is None and not dropout_p and \
            math.prod(scores) * q.dtype.itemsize >= TILED_ABOVE_BYTES:
        if bias is not None or dropout_p:
            raise ValueError(f"{op}: tiled=True takes a boolean or causal mask and no dropout; got "
                             f"{'a float attn_mask' if bias is not None else f'dropout_p={dropout_p}'}: "
                             "pass tiled=False (or leave it None) for the plain op")
        return TiledAttention(scale, mask, causal=is_causal, mask_tensor=mask_tensor)(q, k, v)
    mask = _full_mask(mask, is_causal, q, k)  # the plain op holds the causal mask whole
    attention = ScaledDotProductAttention(scale, mask, float(dropout_p), mask_tensor)
    return attention(q, k, v) if bias is None else attention(q, k, v, bias)


def _mask(op, attn_mask, q, scores):
    """A boolean mask as an array (a constant), or a float mask as a Tensor of q's dtype (an input)."""
    array = attn_mask.array if isinstance(attn_mask, Tensor) else attn_mask
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
    if array.dtype.kind not in "fc":
        raise TypeError(f"{op}: attn_mask must be boolean (True: take part) or floating point (added to the "
                        f"scores), got dtype {array.dtype}")
    if isinstance(attn_mask, Tensor) and attn_mask.dtype == q.dtype:
        return None, attn_mask  # kept as it is, so that it can get a gradient
    return None, Tensor(backend.to_device(array, q.device).astype(q.dtype))


def _grouped_query_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, tiled):
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
    out = scaled_dot_product_attention(q5, k5, v5, attn_mask, dropout_p, is_causal, scale, tiled=tiled)
    return reshape(out, out.shape[:-4] + (heads,) + out.shape[-2:])
