"""Sampling integers: multinomial (category indices drawn by weight) and randperm (a random order).

No gradient: the results are integers. Both draw from minidl's seeded generator
of the tensor's device (:func:`minidl.backend.rng`, seeded by ``manual_seed``), or from
the ``generator`` given (a ``numpy.random.Generator``, or CuPy's on the GPU).

With replacement, each draw inverts the cumulative weights: u uniform on [0, 1),
the category is the first k with u · W < w_1 + … + w_k (W the total), so category k
comes up with probability w_k / W. Without replacement the draws are successive
(category k first with probability w_k / W, then the rest renormalized, as PyTorch):
an exponential race gives that in one pass, each category's key E_k / w_k with
E_k ~ Exp(1), the categories taken in increasing order of key (the first to arrive
is k with probability w_k / W, and the race of the rest is again memoryless).
"""
from __future__ import annotations

import operator

import numpy as np

from minidl import backend
from minidl.tensor import Tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("multinomial",)


def _generator(generator, device):
    return backend.rng(device) if generator is None else generator


def multinomial(input, num_samples: int, replacement: bool = False, *, generator=None) -> Tensor:  # noqa: A002
    """Indices of categories drawn by the weights in ``input`` (each row of a 2-D input on its own).

    ``input`` (K,) or (N, K) holds non-negative weights, not necessarily summing to 1;
    the result is int64 of shape (num_samples,) or (N, num_samples). Without
    ``replacement`` no category repeats within a row, so ``num_samples`` is at most
    the number of categories of nonzero weight, as PyTorch requires.
    """
    weights = input if isinstance(input, Tensor) else Tensor(np.asarray(input))
    if weights.ndim not in (1, 2):
        raise ValueError(f"multinomial: input must be 1-D (K,) or 2-D (N, K) weights, got shape {weights.shape}")
    if weights.dtype.kind != "f":
        raise TypeError(f"multinomial: input must hold floating-point weights, got dtype {weights.dtype}")
    n = operator.index(num_samples)
    k = weights.shape[-1]
    if n <= 0:
        raise ValueError(f"multinomial: num_samples must be positive, got {n}")
    if not replacement and n > k:
        raise ValueError(f"multinomial: cannot sample {n} samples without replacement from {k} categories; "
                         "pass replacement=True or ask for at most that many")
    rows = weights.array.reshape(-1, k).astype(np.float64)
    xp = backend.xp_of(rows)
    bad, totals, nonzero = backend.fetch(~xp.isfinite(rows).all() | (rows < 0).any(), rows.sum(axis=1),
                                         (rows > 0).sum(axis=1))
    if bad:
        raise ValueError("multinomial: weights must be finite and non-negative")
    if (totals <= 0).any():
        raise ValueError("multinomial: every row of weights needs a positive sum (got a row of zeros)")
    if not replacement and n > nonzero.min():
        raise ValueError(f"multinomial: cannot sample {n} samples without replacement from a row with only "
                         f"{int(nonzero.min())} categories of nonzero weight")
    rng = _generator(generator, weights.device)
    if replacement:
        samples = _with_replacement(xp, rows, n, rng)
    else:
        with np.errstate(divide="ignore"):  # weight 0: key +inf, never taken
            keys = rng.standard_exponential(rows.shape) / rows
        samples = xp.argsort(keys, axis=1)[:, :n]
    samples = samples.astype(np.int64, copy=False)
    return Tensor(samples.reshape(n) if weights.ndim == 1 else samples)


def _with_replacement(xp, rows, n, rng):
    """n inverse-CDF draws per row: the first k with u · W < w_1 + … + w_k, all rows in one search.

    Row r's cumulative weights, divided by its total, are shifted by r, so that the rows laid
    end to end are one increasing sequence and one searchsorted serves them all.
    """
    count, k = rows.shape
    cumulative = xp.cumsum(rows, axis=1)
    offsets = xp.arange(count, dtype=np.float64)[:, None]
    edges = (cumulative / cumulative[:, -1:] + offsets).reshape(-1)
    u = rng.random((count, n)) + offsets
    found = xp.searchsorted(edges, u.reshape(-1), side="right").reshape(count, n) - offsets.astype(np.int64) * k
    # u · W rounded up to W would land past the end: it belongs to the last category of nonzero weight
    last = k - 1 - xp.argmax(rows[:, ::-1] > 0, axis=1)
    return xp.minimum(found, last[:, None])


def randperm(n: int, *, generator=None, dtype=None, device="cpu", requires_grad=False) -> Tensor:
    """A random permutation of 0 … n − 1 (int64 by default), as ``torch.randperm``.

    The order of n uniform draws (float64): every order equally likely, but for ties among
    the draws, whose chance is below n² / 2⁵⁴.
    """
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"randperm: n must be non-negative, got {n}")
    if requires_grad:
        raise TypeError("randperm: an integer tensor cannot require gradients")
    keys = _generator(generator, device).random(n)
    order = backend.xp_of(keys).argsort(keys).astype(np.dtype(dtype or np.int64), copy=False)
    return Tensor(order)
