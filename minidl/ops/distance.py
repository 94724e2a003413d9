"""Norms between vectors: normalize, cosine_similarity, pairwise_distance.

Each is composed from differentiable ops (sums, powers, a maximum), so its
gradient, and the gradient of that gradient, come from theirs. A norm that
is floored at ε is floored inside the power, ‖x‖ = max(Σ|x|ᵖ, εᵖ)^(1/p): the
same value as max(‖x‖, ε), but a zero vector then gets the gradient of the
constant ε (0) instead of √0's infinite one, so x = 0 gives no NaN.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.autocast_mode import autocast_to
from minidl.ops.elementwise import maximum
from minidl.ops.linalg import norm
from minidl.ops.reduction import _normalize_axis
from minidl.ops.reduction import max as reduce_max
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import broadcast_to
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ()


def _check_p(op, p):
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not p > 0:
        raise ValueError(f"{op}: p must be a positive number or math.inf, got {p!r}")


def _p_norm(x: Tensor, p, dim, keepdim, floor=None) -> Tensor:
    """‖x‖_p along ``dim``: (Σ|x|ᵖ)^(1/p), max|x| for p = ∞; ``floor`` ε gives max(‖x‖_p, ε)."""
    if p == math.inf:
        norm = reduce_max(abs(x), axis=dim, keepdims=keepdim)
        return norm if floor is None else maximum(norm, floor)
    if p == 2:
        total = reduce_sum(x * x, axis=dim, keepdims=keepdim)
    elif p == 1:
        total = reduce_sum(abs(x), axis=dim, keepdims=keepdim)
    else:
        total = reduce_sum(abs(x) ** p, axis=dim, keepdims=keepdim)
    if floor is not None:
        total = maximum(total, floor ** p)
    if p == 1:
        return total
    return total.sqrt() if p == 2 else total ** (1 / p)


@autocast_to("float32")
def normalize(input, p=2.0, dim=1, eps=1e-12) -> Tensor:  # noqa: A002 - PyTorch's name
    """y = x / max(‖x‖_p, eps) along ``dim`` (default 1, as PyTorch): unit vectors, zero stays zero.

    p ≤ 0 is PyTorch's too, with :func:`~minidl.ops.linalg.norm`'s meaning of ‖x‖_p: the
    count of nonzeros for p = 0 (no gradient), min |x| for p = −inf, (Σ|x|ᵖ)^(1/p) otherwise
    (0 when x holds a zero); the max with eps is then taken after the norm.
    """
    if isinstance(p, (int, float)) and not isinstance(p, bool) and p <= 0:
        x = as_tensor(input)
        _normalize_axis(dim, x.ndim, "normalize", x.shape)
        return x / maximum(norm(x, p, dim, keepdim=True), eps)
    _check_p("normalize", p)
    x = as_tensor(input)
    _normalize_axis(dim, x.ndim, "normalize", x.shape)
    return x / _p_norm(x, p, dim, keepdim=True, floor=eps)


@autocast_to("float32")
def cosine_similarity(x1, x2, dim=1, eps=1e-8) -> Tensor:
    """cos = Σ (x₁ / max(‖x₁‖, eps)) (x₂ / max(‖x₂‖, eps)) along ``dim``, after broadcasting x₁ with x₂.

    Each norm is floored at eps on its own, as PyTorch does since 1.12 (not their product).
    """
    x1, x2 = as_tensor(x1), as_tensor(x2)
    try:
        shape = tuple(np.broadcast_shapes(x1.shape, x2.shape))
    except ValueError:
        raise ValueError(f"cosine_similarity: shapes {x1.shape} and {x2.shape} do not broadcast "
                         "(NumPy rule: trailing axes must be equal or 1)") from None
    _normalize_axis(dim, len(shape), "cosine_similarity", shape)
    x1, x2 = broadcast_to(x1, shape), broadcast_to(x2, shape)
    unit1 = x1 / _p_norm(x1, 2, dim, keepdim=True, floor=eps)
    unit2 = x2 / _p_norm(x2, 2, dim, keepdim=True, floor=eps)
    return reduce_sum(unit1 * unit2, axis=dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False) -> Tensor:
    """d = ‖x₁ − x₂ + eps‖_p along the last axis (of the broadcast shape), as PyTorch.

    eps is added to every difference (PyTorch's rule), which keeps the norm of
    identical vectors away from 0, where the gradient of the 2-norm is undefined.
    """
    _check_p("pairwise_distance", p)
    x1, x2 = as_tensor(x1), as_tensor(x2)
    diff = x1 - x2 + eps
    if diff.ndim == 0:
        raise ValueError("pairwise_distance: inputs must have at least one axis, got two scalars")
    return _p_norm(diff, p, -1, keepdim)
