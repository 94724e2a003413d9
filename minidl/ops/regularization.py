"""Dropout and embedding lookup.

Dropout (inverted): during training each element is kept with probability
1 − p and scaled by 1/(1 − p), so the expected activation is unchanged and
evaluation needs no rescaling. The mask comes from minidl's seeded generator
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


class Dropout(Function):
    """y = x · m / (1 − p), m_i ~ Bernoulli(1 − p) drawn once per call;  dx = dy · m / (1 − p)."""
    saved_inputs = ()

    def __init__(self, p):
        self.p = p

    def forward(self, x):
        generator = backend.rng(backend.device_of(x))
        keep = generator.random(x.shape, dtype=np.float32) >= self.p
        self.scale = keep.astype(x.dtype)  # the saved mask, already scaled: 0 or 1/(1 − p)
        self.scale *= 1 / (1 - self.p)
        return x * self.scale

    def backward(self, gy):
        return gy * Tensor(self.scale)


def dropout(x, p=0.5, training=True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1 − p) (training only).

    With ``training=False`` or ``p=0`` the input is returned unchanged.
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p < 1:
        raise ValueError(f"dropout: p is the probability of zeroing an element and must be in [0, 1), "
                         f"got {p!r}")
    if not training or p == 0:
        return x
    return Dropout(float(p))(as_tensor(x))


def embedding(idx, weight) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by the integer array ``idx``: shape idx.shape + (dim,).

    dweight = dy added into the rows named by idx (repeated indices add); idx gets no gradient.
    """
    weight = as_tensor(weight)
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), "
                         f"got shape {weight.shape}")
    if isinstance(idx, Tensor):
        idx = idx.data
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
    idx = backend.to_device(idx, weight.device)
    return getitem(weight, idx)
