"""Scales, zero points and observers: how a float range is mapped onto 8-bit integers.

An integer code q in [q_min, q_max] stands for the real value s · (q − z):
``s`` (the scale) is the step between neighbouring codes and ``z`` (the zero
point) the code of the real 0, which is kept exactly representable (a
padded zero or a ReLU's zeros cost no error). From the range [m, M] seen,
widened to hold 0 (m' = min(m, 0), M' = max(M, 0)):

    asymmetric (affine):  s = (M' − m') / (q_max − q_min)
                          z = clip(q_min − round(m' / s), q_min, q_max)
    symmetric:            s = max(−m', M') / ((q_max − q_min) / 2)
                          z = 0 (int8) or 128 (uint8)

and s is at least float32's epsilon (a constant tensor still gets a step).
Quantizing and dequantizing are then

    q = clip(round(x / s) + z, q_min, q_max)        x̂ = s · (q − z)

with an error of at most s/2 inside the range. Symmetric wastes a code
when the data are one-sided (ReLU outputs use only half the codes) but makes
z = 0, which keeps integer matrix products free of zero-point terms: minidl
quantizes weights symmetrically, one scale per output channel (per-channel:
a channel with small weights gets a fine grid of its own), and activations
asymmetrically, one scale per tensor. The equations and the defaults are
PyTorch's observers' (``torch.ao.quantization.MinMaxObserver``), so the
scales agree with theirs.

Observers watch the calibration batches and produce (s, z):

- ``MinMaxObserver``: the smallest and largest values ever seen.
- ``PercentileObserver``: the ``100 − p`` and ``p`` percentiles of each batch,
  averaged over batches; a few outliers no longer stretch the grid for
  everyone (at the price of clipping them).
- ``MovingAverageObserver``: an exponential moving average of each batch's
  min and max, for quantization-aware training, where the range drifts as
  the weights learn.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MinMaxObserver", "MovingAverageObserver", "PercentileObserver", "dequantize", "qparams",
           "qrange", "quantize"]

_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}
_EPS = float(np.finfo(np.float32).eps)


def qrange(dtype: str) -> tuple:
    """(q_min, q_max) of ``"int8"`` (−128, 127) or ``"uint8"`` (0, 255)."""
    if dtype not in _RANGES:
        raise ValueError(f"quantization dtype must be one of {sorted(_RANGES)}, got {dtype!r}")
    return _RANGES[dtype]


def qparams(min_val, max_val, dtype: str = "uint8", symmetric: bool = False) -> tuple:
    """(scale, zero_point) for the range [min_val, max_val]: numbers, or arrays (one per channel).

    Returns float32 scales and int64 zero points of the same shape as the inputs.
    """
    q_min, q_max = qrange(dtype)
    lo = np.minimum(np.asarray(min_val, dtype=np.float32), np.float32(0))
    hi = np.maximum(np.asarray(max_val, dtype=np.float32), np.float32(0))
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"qparams: the range must be finite, got min {min_val!r}, max {max_val!r}")
    if symmetric:
        scale = np.maximum(np.maximum(-lo, hi) / np.float32((q_max - q_min) / 2), np.float32(_EPS))
        zero_point = np.full(scale.shape, 0 if dtype == "int8" else 128, dtype=np.int64)
    else:
        scale = np.maximum((hi - lo) / np.float32(q_max - q_min), np.float32(_EPS))
        zero_point = np.clip(q_min - np.round(lo / scale), q_min, q_max).astype(np.int64)
    return scale.astype(np.float32), zero_point


def _per_channel_shape(scale, ndim: int, axis):
    """The shape that broadcasts per-channel parameters along ``axis`` of an ndim-array."""
    scale = np.asarray(scale)
    if axis is None or scale.ndim == 0:
        return scale
    shape = [1] * ndim
    shape[axis] = -1
    return scale.reshape(shape)


def quantize(x, scale, zero_point, dtype: str = "uint8", axis=None) -> np.ndarray:
    """q = clip(round(x / s) + z, q_min, q_max) as an int8 or uint8 array (per channel along ``axis``)."""
    q_min, q_max = qrange(dtype)
    x = np.asarray(x, dtype=np.float32)
    s = _per_channel_shape(np.asarray(scale, dtype=np.float32), x.ndim, axis)
    z = _per_channel_shape(np.asarray(zero_point, dtype=np.float32), x.ndim, axis)
    return np.clip(np.round(x / s) + z, q_min, q_max).astype(dtype)


def dequantize(q, scale, zero_point, axis=None) -> np.ndarray:
    """x̂ = s · (q − z) as float32 (per channel along ``axis``)."""
    q = np.asarray(q)
    s = _per_channel_shape(np.asarray(scale, dtype=np.float32), q.ndim, axis)
    z = _per_channel_shape(np.asarray(zero_point, dtype=np.int64), q.ndim, axis)
    return ((q.astype(np.int64) - z).astype(np.float32) * s).astype(np.float32)


class MinMaxObserver:
    """The range of every batch seen, per tensor (``axis=None``) or per channel along ``axis``."""

    def __init__(self, dtype: str = "uint8", symmetric: bool = False, axis: int | None = None):
        qrange(dtype)
        self.dtype, self.symmetric, self.axis = dtype, bool(symmetric), axis
        self.min_val = self.max_val = None
        self.batches = 0

    def _reduce(self, x: np.ndarray, fn) -> np.ndarray:
        if self.axis is None:
            return np.asarray(fn(x), dtype=np.float64)
        return fn(np.moveaxis(x, self.axis, 0).reshape(x.shape[self.axis], -1), axis=1).astype(np.float64)

    def _batch_range(self, x):
        return self._reduce(x, np.min), self._reduce(x, np.max)

    def _combine(self, lo, hi):
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
        else:
            self.min_val, self.max_val = np.minimum(self.min_val, lo), np.maximum(self.max_val, hi)

    def update(self, x) -> None:
        """Widen the range by one batch (an array or a Tensor)."""
        x = np.asarray(x.numpy() if hasattr(x, "numpy") else x, dtype=np.float64)
        if x.size == 0:
            return
        self._combine(*self._batch_range(x))
        self.batches += 1

    def qparams(self) -> tuple:
        """(scale, zero_point) of the range seen; a ValueError before any batch."""
        if self.min_val is None:
            raise ValueError(f"{type(self).__name__}: no data observed; run calibration batches through the "
                             "model first (quantizing needs the range of the activations)")
        return qparams(self.min_val, self.max_val, self.dtype, self.symmetric)


class PercentileObserver(MinMaxObserver):
    """The (100 − p)-th and p-th percentiles of each batch, averaged over the batches (p = 99.99 by default)."""

    def __init__(self, percentile: float = 99.99, dtype: str = "uint8", symmetric: bool = False,
                 axis: int | None = None):
        if not 50.0 < percentile <= 100.0:
            raise ValueError(f"PercentileObserver: percentile must be in (50, 100], got {percentile!r}")
        super().__init__(dtype, symmetric, axis)
        self.percentile = float(percentile)

    def _batch_range(self, x):
        lo = self._reduce(x, lambda a, axis=None: np.percentile(a, 100.0 - self.percentile, axis=axis))
        hi = self._reduce(x, lambda a, axis=None: np.percentile(a, self.percentile, axis=axis))
        return lo, hi

    def _combine(self, lo, hi):
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
        else:                                    # running mean over the batches
            n = self.batches
            self.min_val = (self.min_val * n + lo) / (n + 1)
            self.max_val = (self.max_val * n + hi) / (n + 1)


class MovingAverageObserver(MinMaxObserver):
    """min ← (1 − c)·min + c·batch_min, likewise max (c = 0.01), the first batch taken as it is."""

    def __init__(self, averaging_constant: float = 0.01, dtype: str = "uint8", symmetric: bool = False,
                 axis: int | None = None):
        if not 0.0 < averaging_constant <= 1.0:
            raise ValueError(f"MovingAverageObserver: averaging_constant must be in (0, 1], "
                             f"got {averaging_constant!r}")
        super().__init__(dtype, symmetric, axis)
        self.averaging_constant = float(averaging_constant)

    def _combine(self, lo, hi):
        if self.min_val is None:
            self.min_val, self.max_val = lo, hi
        else:
            c = self.averaging_constant
            self.min_val = self.min_val + c * (lo - self.min_val)
            self.max_val = self.max_val + c * (hi - self.max_val)
