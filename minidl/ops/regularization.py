"""Dropout, channel dropout and embedding lookup.

Dropout (inverted): during training each element is kept with probability
1 − p and scaled by 1/(1 − p), so the expected activation is unchanged and
evaluation needs no rescaling. Channel dropout (dropout1d, dropout2d) keeps
or drops whole channels of each sample. The mask comes from minidl's seeded generator
(``minidl.manual_seed``), so a seeded run drops the same units every time.

Embedding: row lookup ``weight[idx]``; its gradient adds each upstream row
into the row it came from, repeated indices adding up.
"""
from __future__ import annotations

import numbers

import numpy as np

from minidl import backend
from minidl.autograd import Function
from minidl.ops.shape import getitem
from minidl.tensor import Tensor, as_tensor


def _check_p(op, p, what="an element"):
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
        raise ValueError(f"{op}: p is the probability of zeroing {what} and must be in [0, 1), got {p!r}")


class Dropout(Function):
    """y = x · m / (1 − p), m_i ~ Bernoulli(1 − p) drawn once per call;  dx = dy · m / (1 − p).

    ``mask_shape`` (default: x's shape) draws fewer m_i and broadcasts them over x: channel
    dropout draws one per (sample, channel), shape (N, C, 1, ..., 1).
    """
    saved_inputs = ()
    saved_arrays = ("scale",)

    def __init__(self, p, mask_shape=None):
        self.p, self.mask_shape = p, mask_shape

    def forward(self, x):
        generator = backend.rng(backend.device_of(x))
        shape = x.shape if self.mask_shape is None else self.mask_shape
        keep = generator.random(shape, dtype=np.float32) >= self.p
        self.scale = keep.astype(x.dtype)  # the saved mask, already scaled: 0 or 1/(1 − p)
        self.scale *= 1 / (1 - self.p)
        return x * self.scale

    def backward(self, gy):
        return gy * Tensor(self.scale)

    def jvp(self, dx):
        """ẏ = ẋ · m / (1 − p), the same mask."""
        return dx * Tensor(self.scale)


def dropout(x, p=0.5, training=True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1 − p) (training only).

    With ``training=False`` or ``p=0`` the input is returned unchanged.
    """
    _check_p("dropout", p)
    if not training or p == 0:
        return x
    return Dropout(float(p))(as_tensor(x))


def _channel_dropout(op, x, p, training, ndims, layouts):
    _check_p(op, p, "a whole channel")
    x = as_tensor(x)
    if x.ndim not in ndims:
        raise ValueError(f"{op}: expected input {layouts}, got shape {x.shape}")
    if not training or p == 0:
        return x
    channel_axes = 1 if x.ndim == ndims[0] else 2  # unbatched (C, ...) or batched (N, C, ...)
    return Dropout(float(p), x.shape[:channel_axes] + (1,) * (x.ndim - channel_axes))(x)


def dropout1d(x, p=0.5, training=True) -> Tensor:
    """Channel dropout of x (N, C, L) or unbatched (C, L): each channel of each sample is zeroed
    whole with probability ``p``, the others scaled by 1/(1 − p) (training only).

    y = x · m / (1 − p), one m_nc ~ Bernoulli(1 − p) per (n, c), the same for every position l;
    dx = dy · m / (1 − p). Neighbouring positions of a feature map are strongly correlated, so
    dropping single elements regularizes little; dropping whole channels does (Tompson et al. 2015).
    """
    return _channel_dropout("dropout1d", x, p, training, (2, 3), "(N, C, L) or unbatched (C, L)")


def dropout2d(x, p=0.5, training=True) -> Tensor:
    """Channel dropout of x (N, C, H, W): each channel of each sample is zeroed whole with probability
    ``p``, the others scaled by 1/(1 − p) (training only): one m_nc per (n, c), as :func:`dropout1d`.

    A 3-D input is read as (N, C, L), one mask value per (n, c), as PyTorch does today
    (with a warning that it may change to unbatched (C, H, W)); other ranks are refused.
    """
    _check_p("dropout2d", p, "a whole channel")
    x = as_tensor(x)
    if x.ndim not in (3, 4):
        raise ValueError(f"dropout2d: expected input (N, C, H, W) or (N, C, L), got shape {x.shape}")
    if not training or p == 0:
        return x
    return Dropout(float(p), x.shape[:2] + (1,) * (x.ndim - 2))(x)


def embedding(idx, weight) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer array ``idx``: shape idx.shape + (dim,).

    dweight = dy added into the rows named by idx (repeated indices add); idx gets no gradient.
    """
    weight = as_tensor(weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), "
                         f"got shape {weight.shape}")
    given = idx
    if isinstance(idx, Tensor):
        idx = idx.array
    elif not hasattr(idx, "dtype"):
        idx = np.asarray(idx)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}; "
                        "convert them first, e.g. idx.astype('int64')")
    count = weight.shape[0]
    # on the host before the copy, or on the GPU without a synchronization (reported at the next read)
    backend.check_range(idx, 0, count - 1, lambda low, high: (
        f"embedding: index {low if low < 0 else high} is out of range for {count} embeddings "
        f"(valid indices are 0..{count - 1})"))
    moved = backend.to_device(idx, weight.device)
    # the caller's Tensor itself when no copy was made, so that getitem checks its version
    return getitem(weight, given if isinstance(given, Tensor) and moved is idx else Tensor(moved))
