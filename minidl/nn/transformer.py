"""Transformer layers: MultiheadAttention, the encoder and decoder layers and stacks, Transformer.

PyTorch's constructor signatures, forward arguments, parameter names and
initializations, so a state dict moves between the two libraries unchanged:

    attn = nn.MultiheadAttention(embed_dim=64, num_heads=4, batch_first=True)
    out, weights = attn(x, x, x, key_padding_mask=pad, need_weights=True)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256, norm_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=6)
    model = nn.Transformer(d_model=64, nhead=4, batch_first=True)    # encoder + decoder
    out = model(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.shape[1]))

Multi-head attention projects the queries, keys and values H times into
E/H-dimensional subspaces, attends in each (softmax(Q Kᵀ/√(E/H)) V, one
:func:`~minidl.functional.scaled_dot_product_attention` call for all heads),
and mixes the heads' outputs with one more projection:

    headᵢ = Attention(Q W_Qᵢ, K W_Kᵢ, V W_Vᵢ),   out = concat(head₁ … head_H) W_O

Masks, as in PyTorch: ``attn_mask`` (L, S) or (N·H, L, S) and
``key_padding_mask`` (N, S) are boolean with True where a position is *not*
attended (the opposite of ``scaled_dot_product_attention``'s boolean mask),
or float and added to the scores.
"""
from __future__ import annotations

import copy
import math

import numpy as np

import minidl.functional as F
from minidl import backend
from minidl.nn import init
from minidl.nn.containers import ModuleList
from minidl.nn.layers import Dropout, Linear, check_dtype, empty_parameter
from minidl.nn.module import Module
from minidl.nn.norm import LayerNorm
from minidl.tensor import Tensor

__all__ = ["MultiheadAttention", "Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerEncoderLayer"]


class MultiheadAttention(Module):
    """``MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
    add_zero_attn=False, kdim=None, vdim=None, batch_first=False)``: PyTorch's layer.

    Parameters (PyTorch's names): ``in_proj_weight`` (3E, E), the query, key and
    value projections stacked (``q_proj_weight``, ``k_proj_weight``,
    ``v_proj_weight`` instead when ``kdim`` or ``vdim`` differ from E);
    ``in_proj_bias`` (3E,); ``out_proj`` a Linear(E, E); ``bias_k``, ``bias_v``
    (1, 1, E) with ``add_bias_kv``. Initialization (PyTorch's): the input
    projections Xavier-uniform, their bias and ``out_proj.bias`` zero,
    ``out_proj.weight`` a Linear's default, ``bias_k``/``bias_v`` Xavier-normal.

    ``forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False)`` returns
    ``(output, weights)``: output (L, N, E), or (N, L, E) with ``batch_first``,
    or (L, E) for unbatched input; weights (N, L, S) averaged over the heads
    (N, H, L, S with ``average_attn_weights=False``; after dropout, as
    PyTorch), or None when ``need_weights=False``, which takes the one-op path.
    ``is_causal=True`` without ``attn_mask`` applies the causal mask (PyTorch
    requires the mask itself and treats the flag as a hint). A query whose
    keys are all masked gets a zero output and zero weights.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"MultiheadAttention: embed_dim and num_heads must be positive, got "
                             f"embed_dim={embed_dim}, num_heads={num_heads}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads}); each head gets embed_dim // num_heads features")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiheadAttention: dropout is a probability in [0, 1), got {dropout}")
        check_dtype("MultiheadAttention", dtype)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout, self.batch_first, self.add_zero_attn = float(dropout), bool(batch_first), bool(add_zero_attn)
        # Registered in PyTorch's order, so parameters() and the optimizer's state line up with torch's.
        if self._qkv_same_embed_dim:
            self.in_proj_weight = empty_parameter((3 * embed_dim, embed_dim), device, dtype)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = empty_parameter((embed_dim, embed_dim), device, dtype)
            self.k_proj_weight = empty_parameter((embed_dim, self.kdim), device, dtype)
            self.v_proj_weight = empty_parameter((embed_dim, self.vdim), device, dtype)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = empty_parameter((3 * embed_dim,), device, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        if add_bias_kv:
            self.bias_k = empty_parameter((1, 1, embed_dim), device, dtype)
            self.bias_v = empty_parameter((1, 1, embed_dim), device, dtype)
        else:
            self.bias_k = self.bias_v = None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self._reset_parameters()

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
            init.xavier_normal_(self.bias_v)

    # ------------------------------------------------------------ forward
    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False):
        query, key, value = (_as_tensor(t) for t in (query, key, value))
        batched = query.ndim == 3
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"MultiheadAttention: query, key and value must all be 3-D (batched) or 2-D "
                             f"(unbatched), got shapes {query.shape}, {key.shape}, {value.shape}")
        if not batched:  # one sequence: a batch of one, removed again at the end
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _array(key_padding_mask)[None]
        elif not self.batch_first:  # the work below is done batch first: (N, L, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        n, length, e = query.shape
        self._check_shapes(query, key, value)
        q, k, v = self._project(query, key, value)  # (N, L, E), (N, S, E), (N, S, E)
        masks = _Masks(self, n, length, key.shape[1], attn_mask, key_padding_mask, is_causal, query)
        if self.bias_k is not None:  # one learned key and value appended to every sequence
            k = F.cat([k, self.bias_k.expand(n, 1, e)], dim=1)
            v = F.cat([v, self.bias_v.expand(n, 1, e)], dim=1)
            masks.add_key()
        q, k, v = (self._split_heads(t) for t in (q, k, v))  # (N, H, ·, E/H)
        if self.add_zero_attn:  # one all-zero key and value appended, after the projections
            zeros = Tensor(q.xp.zeros((n, self.num_heads, 1, self.head_dim), dtype=q.dtype))
            k, v = F.cat([k, zeros], dim=2), F.cat([v, zeros], dim=2)
            masks.add_key()
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = self._attention_with_weights(q, k, v, masks.combined(), p)
        else:
            mask, causal = masks.for_sdpa()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
            weights = None
        out = self.out_proj(out.transpose(1, 2).reshape(n * length, e)).reshape(n, length, e)
        if not batched:
            out = out[0]
            weights = None if weights is None else weights[0]
        elif not self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=-3)
        return out, weights

    def _check_shapes(self, query, key, value):
        n, _, e = query.shape
        if e != self.embed_dim or key.shape[-1] != self.kdim or value.shape[-1] != self.vdim:
            raise ValueError(f"MultiheadAttention(embed_dim={self.embed_dim}, kdim={self.kdim}, vdim={self.vdim}): "
                             f"got query, key, value with features {e}, {key.shape[-1]}, {value.shape[-1]}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != n:
            raise ValueError(f"MultiheadAttention: key {tuple(key.shape)} and value {tuple(value.shape)} must share "
                             f"their batch and length, and the batch of query {tuple(query.shape)}")

    def _project(self, query, key, value):
        e, b = self.embed_dim, self.in_proj_bias
        bq, bk, bv = (None, None, None) if b is None else (b[:e], b[e:2 * e], b[2 * e:])
        if self._qkv_same_embed_dim:
            if query is key and key is value:  # self-attention: one matrix product for all three
                return _linear(query, self.in_proj_weight, b).split(e, dim=-1)
            w = self.in_proj_weight
            wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        return _linear(query, wq, bq), _linear(key, wk, bk), _linear(value, wv, bv)

    def _split_heads(self, x):
        n, length, _ = x.shape
        return x.reshape(n, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _attention_with_weights(self, q, k, v, bias, p):
        """The composed path: the weights P are needed, so they are made as a tensor of their own."""
        scores = (q @ k.mT) * (1.0 / math.sqrt(self.head_dim))
        if bias is not None:
            scores = scores + Tensor(bias)
            dead = q.xp.isneginf(bias).all(axis=-1, keepdims=True)
            if dead.any():  # rows with every key masked: 0 instead of softmax's NaN, as the one-op path
                scores = F.where(Tensor(dead), 0.0, scores)
                weights = F.where(Tensor(dead), 0.0, F.softmax(scores, dim=-1))
            else:
                weights = F.softmax(scores, dim=-1)
        else:
            weights = F.softmax(scores, dim=-1)
        if p:
            weights = F.dropout(weights, p, True)
        return weights @ v, weights

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"batch_first={self.batch_first}")


class _Masks:
    """attn_mask, key_padding_mask and is_causal of one call, as one additive float mask or one boolean mask."""

    def __init__(self, layer, n, length, keys, attn_mask, key_padding_mask, is_causal, query):
        owner, h, self.xp, self.dtype = "MultiheadAttention", layer.num_heads, query.xp, query.dtype
        self.parts = []  # arrays broadcasting to (N, H, L, S): bool (True: masked) or float (added)
        if attn_mask is not None:
            mask = _array(attn_mask, query.device)
            if mask.shape == (length, keys):
                self.parts.append(mask)
            elif mask.shape == (n * h, length, keys):
                self.parts.append(mask.reshape(n, h, length, keys))
            else:
                raise ValueError(f"{owner}: attn_mask must have shape (L, S) = {(length, keys)} or "
                                 f"(N·num_heads, L, S) = {(n * h, length, keys)}, got {tuple(mask.shape)}")
        elif is_causal:
            self.parts.append(~self.xp.tri(length, keys, dtype=bool))
        if key_padding_mask is not None:
            mask = _array(key_padding_mask, query.device)
            if mask.shape != (n, keys):
                raise ValueError(f"{owner}: key_padding_mask must have shape (N, S) = {(n, keys)}, "
                                 f"got {tuple(mask.shape)}")
            self.parts.append(mask[:, None, None, :])
        for part in self.parts:
            if part.dtype != bool and part.dtype.kind != "f":
                raise TypeError(f"{owner}: masks must be boolean (True: not attended) or floating point "
                                f"(added to the scores), got dtype {part.dtype}")
        self.only_causal = is_causal and attn_mask is None and key_padding_mask is None

    def add_key(self):
        """One more key at the end of every sequence, attended by every query."""
        self.parts = [self.xp.concatenate([m, self.xp.zeros(m.shape[:-1] + (1,), dtype=m.dtype)], axis=-1)
                      for m in self.parts]
        self.only_causal = False

    def combined(self):
        """The additive float mask (−inf where masked), or None when nothing is masked."""
        total = None
        for m in self.parts:
            m = self.xp.where(m, -self.xp.inf, 0.0).astype(self.dtype) if m.dtype == bool else m.astype(self.dtype)
            total = m if total is None else total + m
        return total

    def for_sdpa(self):
        """(attn_mask, is_causal) for scaled_dot_product_attention, whose boolean mask means "attended"."""
        if self.only_causal:
            return None, True
        if not self.parts:
            return None, False
        if all(m.dtype == bool for m in self.parts):
            masked = self.parts[0]
            for m in self.parts[1:]:
                masked = masked | m
            return ~masked, False
        return self.combined(), False


class TransformerEncoderLayer(Module):
    """``TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
    layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True)``: PyTorch's layer.

    Self-attention and a two-layer feed-forward block, each with a residual
    connection and a LayerNorm: after the sum (post-norm, the original
    Transformer) or, with ``norm_first=True``, before the block (pre-norm,
    GPT-2's choice, which keeps the residual path an identity and trains deep
    stacks without warmup tricks)::

        post-norm:  x = norm1(x + SA(x));   x = norm2(x + FF(x))
        pre-norm:   x = x + SA(norm1(x));   x = x + FF(norm2(x))

    ``activation`` is "relu", "gelu" or a callable. ``forward(src, src_mask=None,
    src_key_padding_mask=None, is_causal=False)`` with the masks of
    :class:`MultiheadAttention`.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            device=device, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.activation = _activation("TransformerEncoderLayer", activation)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = _as_tensor(src)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        rows = x.reshape(-1, x.shape[-1])  # one 2-D product per Linear (BLAS is slower batched over N)
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(rows))))).reshape(x.shape)


def _stack(owner: str, name: str, layer: Module, num_layers: int) -> ModuleList:
    """``num_layers`` independent copies of ``layer`` (PyTorch's deep copies), the arguments checked first."""
    if not isinstance(layer, Module):
        raise TypeError(f"{owner}: {name} must be a Module, got {type(layer).__name__}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"{owner}: num_layers must be a positive int, got {num_layers!r}")
    return ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])


class TransformerEncoder(Module):
    """``TransformerEncoder(encoder_layer, num_layers, norm=None)``: ``num_layers`` copies of the layer.

    Each copy has its own parameters (deep copies of ``encoder_layer``, as
    PyTorch's ``layers.0``, ``layers.1``…); ``norm`` (a LayerNorm, say) is
    applied after the last one. ``forward(src, mask=None,
    src_key_padding_mask=None, is_causal=None)`` passes the masks to every layer.
    PyTorch's ``enable_nested_tensor`` and ``mask_check`` are accepted; they
    select PyTorch's inference fast paths, which minidl does not have.
    """

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        self.layers = _stack("TransformerEncoder", "encoder_layer", encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        out = _as_tensor(src)
        for layer in self.layers:
            out = layer(out, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return out if self.norm is None else self.norm(out)


class TransformerDecoderLayer(Module):
    """``TransformerDecoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
    layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True)``: PyTorch's layer.

    Self-attention over the target, attention from the target to the encoder's output
    (``memory``: the queries are the target's, the keys and values memory's), then the
    feed-forward block; each with a residual connection and a LayerNorm, after the sum
    or (``norm_first=True``) before the block::

        post-norm:  x = norm1(x + SA(x));   x = norm2(x + MHA(x, m));   x = norm3(x + FF(x))
        pre-norm:   x = x + SA(norm1(x));   x = x + MHA(norm2(x), m);   x = x + FF(norm3(x))

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False)``, masks as
    in :class:`MultiheadAttention`. Parameters named as PyTorch's (``self_attn``,
    ``multihead_attn``, ``linear1``, ``linear2``, ``norm1``..``norm3``).
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        attention = dict(dropout=dropout, bias=bias, batch_first=batch_first, device=device, dtype=dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, **attention)
        self.multihead_attn = MultiheadAttention(d_model, nhead, **attention)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, device=device, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, device=device, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _activation("TransformerDecoderLayer", activation)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False, memory_is_causal: bool = False):
        x, memory = _as_tensor(tgt), _as_tensor(memory)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    _sa_block = TransformerEncoderLayer._sa_block  # the same self-attention sub-block (its dropout1)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        rows = x.reshape(-1, x.shape[-1])
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(rows))))).reshape(x.shape)


class TransformerDecoder(Module):
    """``TransformerDecoder(decoder_layer, num_layers, norm=None)``: ``num_layers`` copies of the layer
    (``layers.0``, ``layers.1``…, each its own parameters), then ``norm`` if given.

    ``forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)`` passes
    the same memory and masks to every layer.
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = _stack("TransformerDecoder", "decoder_layer", decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        out = _as_tensor(tgt)
        for layer in self.layers:
            out = layer(out, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                        tgt_key_padding_mask=tgt_key_padding_mask, memory_key_padding_mask=memory_key_padding_mask,
                        tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return out if self.norm is None else self.norm(out)


class Transformer(Module):
    """``Transformer(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
    dropout=0.1, activation="relu", custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
    batch_first=False, norm_first=False, bias=True)``: PyTorch's encoder–decoder model.

    ``encoder`` is a TransformerEncoder of ``num_encoder_layers`` layers with a final
    LayerNorm (``encoder.norm``), ``decoder`` a TransformerDecoder likewise: the same
    parameter names as PyTorch's, so its state dict loads unchanged. Every parameter
    of two or more dims is initialized Xavier-uniform (PyTorch's ``_reset_parameters``).

    ``forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
    src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
    src_is_causal=None, tgt_is_causal=None, memory_is_causal=False)``: the encoder reads
    src (S, N, E) (or (N, S, E) with ``batch_first``), the decoder reads tgt (T, N, E) and
    the encoder's output; returns (T, N, E). The masks are MultiheadAttention's; a causal
    target mask is :meth:`generate_square_subsequent_mask`.
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", custom_encoder: Module | None = None, custom_decoder: Module | None = None,
                 layer_norm_eps: float = 1e-5, batch_first: bool = False, norm_first: bool = False,
                 bias: bool = True, device=None, dtype=None):
        super().__init__()
        layer = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                     layer_norm_eps=layer_norm_eps, batch_first=batch_first, norm_first=norm_first, bias=bias,
                     device=device, dtype=dtype)
        norm = dict(eps=layer_norm_eps, bias=bias, device=device, dtype=dtype)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(TransformerEncoderLayer(d_model, nhead, **layer), num_encoder_layers,
                                              LayerNorm(d_model, **norm))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(TransformerDecoderLayer(d_model, nhead, **layer), num_decoder_layers,
                                              LayerNorm(d_model, **norm))
        self.d_model, self.nhead, self.batch_first = d_model, nhead, bool(batch_first)
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal: bool | None = None,
                tgt_is_causal: bool | None = None, memory_is_causal: bool = False):
        src, tgt = _as_tensor(src), _as_tensor(tgt)
        batch = 0 if self.batch_first else 1
        if src.ndim != tgt.ndim or (src.ndim == 3 and src.shape[batch] != tgt.shape[batch]):
            raise ValueError(f"Transformer: src {tuple(src.shape)} and tgt {tuple(tgt.shape)} must have the same "
                             f"batch size (dim {batch}{', batch_first' if self.batch_first else ''})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"Transformer: the feature number of src and tgt must equal d_model={self.d_model}, "
                             f"got {src.shape[-1]} and {tgt.shape[-1]}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """The (sz, sz) causal mask, float: 0 on and below the diagonal, −inf above (position i sees j ≤ i)."""
        xp = backend.xp_for(device or "cpu")
        mask = xp.triu(xp.full((sz, sz), -xp.inf, dtype=np.dtype(dtype or np.float32)), k=1)
        return Tensor(mask)


def _activation(layer, activation):
    """"relu", "gelu" or a callable, as the function the feed-forward block applies."""
    if isinstance(activation, str):
        functions = {"relu": F.relu, "gelu": F.gelu}
        if activation not in functions:
            raise ValueError(f"{layer}: activation should be relu/gelu, not {activation}")
        return functions[activation]
    if not callable(activation):
        raise TypeError(f"{layer}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


def _linear(x, weight, bias):
    """F.linear on (N, L, in) as one 2-D product: BLAS runs it several times faster than batched over N."""
    n, length, _ = x.shape
    return F.linear(x.reshape(n * length, x.shape[-1]), weight, bias).reshape(n, length, weight.shape[0])


def _as_tensor(x):
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        return Tensor(x)
    raise TypeError(f"transformer layers take minidl Tensors or NumPy/CuPy arrays, got {type(x).__name__}")


def _array(mask, device=None):
    array = mask.array if isinstance(mask, Tensor) else mask
    if not hasattr(array, "dtype"):
        array = np.asarray(array)
    return array if device is None else backend.to_device(array, device)

