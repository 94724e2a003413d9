"""Resampling: interpolate (nearest, linear, bilinear, trilinear, area) and pixel_shuffle.

Every mode here is separable: resizing an image is resizing its rows, then
its columns, and along one axis each output position reads one or two
input positions at fixed weights,

    nearest:  y[i] = x[src(i)]
    linear:   y[i] = (1 − λᵢ)·x[i₀] + λᵢ·x[i₁]

so y is a gather (or two gathers and a weighted sum) of x: differentiable by
the gather's own backward (dx = dy scattered back to where it was read,
repeats adding). The source positions follow PyTorch's index rules exactly
(see :func:`interpolate`), so ported code samples the same pixels.

pixel_shuffle only moves values: (C·r², H, W) → (C, H·r, W·r) is a reshape
and a transpose, and its gradient is the inverse move.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.backend import xp_of
from minidl.ops.pool import adaptive_avg_pool1d, adaptive_avg_pool2d
from minidl.ops.shape import getitem, reshape, transpose
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods (PyTorch has none).
TENSOR_METHODS = ()

_SPATIAL = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "linear": (1,), "bilinear": (2,), "trilinear": (3,),
            "area": (1, 2)}


def _output_sizes(op, x, size, scale_factor, recompute_scale_factor, spatial):
    """(output sizes, scales for the index rules): PyTorch's ⌊in · scale⌋ and its choice of scale."""
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor, got size={size!r}, "
                         f"scale_factor={scale_factor!r}")
    if size is not None:
        if recompute_scale_factor:
            raise ValueError(f"{op}: recompute_scale_factor is only for scale_factor, not size")
        sizes = (size,) * spatial if isinstance(size, int) else tuple(size)
        if len(sizes) != spatial or not all(isinstance(s, int) and s >= 1 for s in sizes):
            raise ValueError(f"{op}: size must be an int ≥ 1 or {spatial} of them for a {x.ndim}-D input, "
                             f"got {size!r}")
        return sizes, (None,) * spatial
    scales = (scale_factor,) * spatial if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if len(scales) != spatial or not all(isinstance(s, (int, float)) and s > 0 for s in scales):
        raise ValueError(f"{op}: scale_factor must be a positive number or {spatial} of them for a "
                         f"{x.ndim}-D input, got {scale_factor!r}")
    sizes = tuple(int(math.floor(float(n) * s)) for n, s in zip(x.shape[2:], scales))
    if any(s < 1 for s in sizes):
        raise ValueError(f"{op}: scale_factor {scale_factor!r} leaves an empty output for input {x.shape}")
    # With recompute_scale_factor the index rules use in/out, as if ``size`` had been given.
    return sizes, ((None,) * spatial if recompute_scale_factor else tuple(float(s) for s in scales))


def _scale(in_size, out_size, scale, dtype):
    """PyTorch's compute_scales_value: 1/scale_factor when one was given, else in/out (in ``dtype``)."""
    if scale is not None and scale > 0:
        return dtype.type(1.0 / scale)
    return dtype.type(in_size) / dtype.type(out_size)


def _nearest_sources(in_size, out_size, scale, exact, one_d=False, double=False):
    """src(i) = min(⌊i·s⌋, in − 1), or ⌊(i + ½)·s⌋ for 'nearest-exact' (s as in _scale).

    PyTorch's rounding, which decides the index where i·s lands within an ulp of an
    integer: s and i·s in float32 ((i + ½)·s in float64, then float32). Its 1-D kernel
    differs: on float64 input it forms s and i·s in float64 (``double``), and given a
    scale_factor it skips the shortcuts (out = in: identity, out = 2·in: i // 2).
    """
    i = np.arange(out_size)
    if not exact and (scale is None or not one_d):
        if out_size == in_size:
            return i
        if out_size == 2 * in_size:
            return i >> 1
    s = _scale(in_size, out_size, scale, np.dtype(np.float64 if double else np.float32))
    if exact or double:
        where = ((i + 0.5) if exact else i) * np.float64(s)
    else:
        where = i.astype(np.float32) * s
    return np.minimum(np.floor(where.astype(np.float32)).astype(np.int64), in_size - 1)


def _linear_sources(in_size, out_size, scale, align_corners, dtype):
    """(i₀, i₁, λ) per output position, PyTorch's area_pixel_compute_source_index:

    align_corners: src = i·(in − 1)/(out − 1) (corners map to corners);
    otherwise:     src = max((i + ½)·s − ½, 0) (pixel centers map to centers);
    i₀ = min(⌊src⌋, in − 1),  i₁ = min(i₀ + 1, in − 1),  λ = clip(src − i₀, 0, 1).
    """
    i = np.arange(out_size)
    if align_corners:
        s = dtype.type(in_size - 1) / dtype.type(out_size - 1) if out_size > 1 else dtype.type(0)
        src = i.astype(dtype) * s
    else:
        s = _scale(in_size, out_size, scale, dtype)
        src = np.maximum(((i + 0.5) * np.float64(s) - 0.5).astype(dtype), 0)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    lam = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    return i0, i1, lam


def _take(x, axis, index):
    """x with ``index`` (a NumPy int array) gathered along ``axis`` (a negative axis)."""
    key = (slice(None),) * (x.ndim + axis) + (xp_of(x.array).asarray(index),) + (slice(None),) * (-1 - axis)
    return getitem(x, key)


def _lerp(x, axis, i0, i1, lam):
    """(1 − λ)·x[i₀] + λ·x[i₁] along ``axis``: one linear resampling of one axis."""
    xp = xp_of(x.array)
    shape = (-1,) + (1,) * (-1 - axis)
    w0 = Tensor(xp.asarray((1 - lam).reshape(shape)))
    w1 = Tensor(xp.asarray(lam.reshape(shape)))
    return _take(x, axis, i0) * w0 + _take(x, axis, i1) * w1


def interpolate(x, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False) -> Tensor:
    """Resize x (N, C, L), (N, C, H, W) or (N, C, D, H, W) to ``size`` or by ``scale_factor``, as PyTorch's.

    Output size: ``size``, or ⌊in · scale_factor⌋ per axis. Along each axis, with
    s = 1/scale_factor when given (unless ``recompute_scale_factor``) or in/out:
    nearest:       y[i] = x[min(⌊i·s⌋, in − 1)]
    nearest-exact: y[i] = x[min(⌊(i + ½)·s⌋, in − 1)]
    linear, bilinear: y[i] = (1 − λ)·x[i₀] + λ·x[i₁], the source position
        src = (i + ½)·s − ½ (clamped at 0), or i·(in − 1)/(out − 1) with ``align_corners``;
        i₀ = ⌊src⌋, i₁ = i₀ + 1 (both clamped to the input), λ = src − i₀;
        bilinear does this along H, then along W; trilinear along D, H, then W.
    area:          adaptive_avg_pool to the output size (1-D and 2-D).
    dx: dy scattered back to the positions each output read, times the same weights.
    Mode 'bicubic' and ``antialias`` are not implemented (they raise).
    """
    x = as_tensor(x)
    op = "interpolate"
    if mode not in _SPATIAL:
        known = "', '".join(_SPATIAL)
        if mode == "bicubic":
            raise NotImplementedError(f"{op}: mode {mode!r} is not implemented in minidl (only '{known}')")
        raise ValueError(f"{op}: mode must be one of '{known}', got {mode!r}")
    if antialias:
        raise NotImplementedError(f"{op}: antialias=True is not implemented in minidl")
    spatial = x.ndim - 2
    if spatial not in _SPATIAL[mode]:
        need = " or ".join(f"{s + 2}-D" for s in _SPATIAL[mode])
        raise ValueError(f"{op}: mode {mode!r} needs a {need} input (N, C, ...), got shape {x.shape}")
    linear = mode in ("linear", "bilinear", "trilinear")
    if align_corners is not None and not linear:
        raise ValueError(f"{op}: align_corners can only be set with the interpolating modes 'linear', "
                         f"'bilinear' and 'trilinear', got mode {mode!r}")
    sizes, scales = _output_sizes(op, x, size, scale_factor, recompute_scale_factor, spatial)
    if mode == "area":
        return adaptive_avg_pool1d(x, sizes) if spatial == 1 else adaptive_avg_pool2d(x, sizes)
    if linear and x.dtype.kind != "f":
        raise TypeError(f"{op}: mode {mode!r} needs a floating-point input, got dtype {x.dtype}")
    y = x
    for axis, in_size, out_size, scale in zip(range(-spatial, 0), x.shape[2:], sizes, scales):
        if linear:
            if out_size == in_size and (align_corners or scale is None or scale == 1.0):
                continue  # the identity: every source position is an integer
            y = _lerp(y, axis, *_linear_sources(in_size, out_size, scale, align_corners, x.dtype))
        elif out_size != in_size or scale not in (None, 1.0):
            index = _nearest_sources(in_size, out_size, scale, mode == "nearest-exact", spatial == 1,
                                     spatial == 1 and x.dtype == np.float64)
            y = _take(y, axis, index)
    return y


def _factor(op, what, value):
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{op}: {what} must be an int ≥ 1, got {value!r}")
    return value


def pixel_shuffle(x, upscale_factor: int) -> Tensor:
    """(*, C·r², H, W) → (*, C, H·r, W·r):  y[..., c, h·r + i, w·r + j] = x[..., c·r² + i·r + j, h, w];
    dx = pixel_unshuffle(dy, r) (a permutation's gradient is its inverse).
    """
    x = as_tensor(x)
    r = _factor("pixel_shuffle", "upscale_factor", upscale_factor)
    if x.ndim < 3 or x.shape[-3] % (r * r):
        raise ValueError(f"pixel_shuffle: input must be (*, C·r², H, W) with r = {r}, so its channels divisible "
                         f"by {r * r}; got shape {x.shape}")
    *lead, c, h, w = x.shape
    lead, c, b = tuple(lead), c // (r * r), len(lead)
    y = reshape(x, lead + (c, r, r, h, w))
    y = transpose(y, tuple(range(b)) + (b, b + 3, b + 1, b + 4, b + 2))  # (*, C, H, r, W, r)
    return reshape(y, lead + (c, h * r, w * r))


def pixel_unshuffle(x, downscale_factor: int) -> Tensor:
    """(*, C, H·r, W·r) → (*, C·r², H, W), the inverse of pixel_shuffle:
    y[..., c·r² + i·r + j, h, w] = x[..., c, h·r + i, w·r + j];  dx = pixel_shuffle(dy, r).
    """
    x = as_tensor(x)
    r = _factor("pixel_unshuffle", "downscale_factor", downscale_factor)
    if x.ndim < 3 or x.shape[-2] % r or x.shape[-1] % r:
        raise ValueError(f"pixel_unshuffle: input must be (*, C, H·r, W·r) with r = {r}, so H and W divisible "
                         f"by {r}; got shape {x.shape}")
    *lead, c, h, w = x.shape
    lead, h, w, b = tuple(lead), h // r, w // r, len(lead)
    y = reshape(x, lead + (c, h, r, w, r))
    y = transpose(y, tuple(range(b)) + (b, b + 2, b + 4, b + 1, b + 3))  # (*, C, r, r, H, W)
    return reshape(y, lead + (c * r * r, h, w))
