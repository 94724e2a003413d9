"""Volumes (N, C, D, H, W): 3-D convolution and pooling, composed from the 2-D ops along depth.

A 3-D window is a stack of KD 2-D windows, one per depth offset kd, so each 3-D op
is its 2-D op run on depth slices and combined over kd:

    conv3d:     y[:, :, d] = Σ_kd conv2d(x_pad[:, :, d·sd + kd·dd], W[:, :, kd])
    max_pool3d: y[:, :, d] = max over kd of max_pool2d(x_pad[:, :, d·sd + kd·dd])
    avg_pool3d: y[:, :, d] = Σ_kd (window sums of x_pad[:, :, d·sd + kd]) / divisor

The depth slices of one kd, taken for every output depth d at once, are a strided
view of x folded into the batch, so each kd is one call of the 2-D op; the
transposed convolution spreads the 2-D results back to depth d·sd + kd·dd the same
way. Every step is a differentiable op, so the gradients, and theirs, come from the
2-D ops' own (and ties in max pooling go to the first maximum in (d, h, w) order,
as in PyTorch: the first within each slice, then the first slice).
"""
from __future__ import annotations

import math

import numpy as np

from minidl.autocast_mode import autocast_to
from minidl.ops.conv import conv2d, conv_transpose2d
from minidl.ops.pool import _avg_divisors, _windows_along, avg_pool2d, max_pool2d
from minidl.ops.reduction import max as reduce_max
from minidl.ops.shape import concatenate, pad, permute, reshape, stack
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods (PyTorch has none).
TENSOR_METHODS = ()


def _triple(value, what, op, minimum):
    """An int or three ints, each at least ``minimum``, as a 3-tuple."""
    values = (value,) * 3 if isinstance(value, (int, np.integer)) else tuple(value)
    if len(values) != 3 or not all(isinstance(v, (int, np.integer)) and v >= minimum for v in values):
        raise ValueError(f"{op}: {what} must be an int ≥ {minimum} or three of them, got {value!r}")
    return tuple(int(v) for v in values)


def _check_volume(op, x):
    if x.ndim != 5:
        raise ValueError(f"{op}: input must be 5-D (N, C, D, H, W), got shape {x.shape}")


def _depth_slices(x, start, step, count):
    """x[:, :, start + step·d] for d < count, folded into the batch: (N·count, C, H, W)."""
    n, c, _, h, w = x.shape
    slab = x[:, :, start:start + step * (count - 1) + 1:step]
    return reshape(permute(slab, 0, 2, 1, 3, 4), n * count, c, h, w)


def _unfold_depth(y, n, count):
    """(N·count, C, H, W) back to (N, C, count, H, W)."""
    return permute(reshape(y, n, count, *y.shape[1:]), 0, 2, 1, 3, 4)


def _pad_depth(x, before, after, value=0.0):
    if not (before or after):
        return x
    return pad(x, (0, 0, 0, 0, before, after), value=value)


# ---------------------------------------------------------------- convolution
def _conv3d_padding(op, padding, kernel, dilation, stride):
    """(before, after) per axis; 'same' puts the odd pixel after, as PyTorch."""
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * 3
        if padding != "same":
            raise ValueError(f"{op}: padding must be ints, 'same' or 'valid', got {padding!r}")
        if stride != (1, 1, 1):
            raise ValueError(f"{op}: padding='same' needs stride 1 (as in PyTorch), got stride {stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in _triple(padding, "padding", op, 0))


@autocast_to("lower")
def conv3d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """3-D convolution: x (N, C_in, D, H, W), weight (C_out, C_in/groups, KD, KH, KW) (PyTorch's layouts).

    y[:, :, d] = Σ_kd conv2d(x_pad[:, :, d·sd + kd·dd], W[:, :, kd]) + b: KD 2-D convolutions
    of depth slices (see the module docstring). D_out = ⌊(D + 2·pd − dd·(KD − 1) − 1) / sd⌋ + 1,
    and H_out, W_out likewise; ``padding`` may also be 'valid' or 'same' (stride 1).
    """
    op = "conv3d"
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    _check_volume(op, x)
    if weight.ndim != 5:
        raise ValueError(f"{op}: weight must be 5-D (out_channels, in_channels/groups, KD, KH, KW), "
                         f"got shape {weight.shape}")
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups or x.shape[1] // groups != weight.shape[1]:
        raise ValueError(f"{op}: input of shape {x.shape} with groups={groups} needs a weight with "
                         f"{x.shape[1]} / groups channels in its dim 1, got weight of shape {weight.shape}")
    stride, dilation = _triple(stride, "stride", op, 1), _triple(dilation, "dilation", op, 1)
    sides = _conv3d_padding(op, padding, weight.shape[2:], dilation, stride)
    n, kd = x.shape[0], weight.shape[2]
    (before, after), sd, dd = sides[0], stride[0], dilation[0]
    depth = (x.shape[2] + before + after - dd * (kd - 1) - 1) // sd + 1
    if depth < 1:
        raise ValueError(f"{op}: kernel depth {kd} (dilation {dd}) is larger than the padded input depth "
                         f"{x.shape[2] + before + after} (input of shape {x.shape})")
    x = _pad_depth(x, before, after)
    plane_padding = padding if isinstance(padding, str) else (sides[1][0], sides[2][0])
    total = None
    for k in range(kd):
        plane = conv2d(_depth_slices(x, k * dd, sd, depth), weight[:, :, k], None, stride[1:], plane_padding,
                       dilation[1:], groups)
        total = plane if total is None else total + plane
    y = _unfold_depth(total, n, depth)
    return y if bias is None else y + reshape(bias, 1, -1, 1, 1, 1)


@autocast_to("lower")
def conv_transpose3d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1) -> Tensor:
    """Transposed 3-D convolution: x (N, C_in, D, H, W), weight (C_in, C_out/groups, KD, KH, KW).

    The adjoint of conv3d: each depth slice d of x adds conv_transpose2d(x[:, :, d], W[:, :, kd])
    at output depth d·sd + kd·dd − pd, for each kd. D_out = (D − 1)·sd − 2·pd + dd·(KD − 1) +
    output_padding + 1, and H_out, W_out likewise.
    """
    op = "conv_transpose3d"
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    _check_volume(op, x)
    if weight.ndim != 5 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"{op}: weight must be 5-D (in_channels={x.shape[1]}, out_channels/groups, KD, KH, KW), "
                         f"got shape {weight.shape} for input of shape {x.shape}")
    stride, dilation = _triple(stride, "stride", op, 1), _triple(dilation, "dilation", op, 1)
    padding, output_padding = _triple(padding, "padding", op, 0), _triple(output_padding, "output_padding", op, 0)
    n, _, d_in = x.shape[:3]
    kd, sd, dd, pd = weight.shape[2], stride[0], dilation[0], padding[0]
    if output_padding[0] >= max(sd, dd):
        raise ValueError(f"{op}: output_padding {output_padding} must be smaller than the stride {stride} "
                         f"or the dilation {dilation} (as in PyTorch)")
    full = (d_in - 1) * sd + dd * (kd - 1) + 1  # every depth an input slice reaches, before padding is cut
    depth = full - 2 * pd + output_padding[0]
    if depth < 1:
        raise ValueError(f"{op}: padding {padding} leaves no output depth for input of shape {x.shape} "
                         f"and kernel {tuple(weight.shape[2:])}")
    slices = _depth_slices(x, 0, 1, d_in)
    spread = (d_in - 1) * sd + 1
    total = None
    for k in range(kd):
        plane = conv_transpose2d(slices, weight[:, :, k], None, stride[1:], padding[1:], output_padding[1:],
                                 groups, dilation[1:])
        plane = _unfold_depth(plane, n, d_in)  # (N, O, D, OH, OW)
        if sd > 1:  # input slice d lands at depth d·sd: sd − 1 empty depths after each
            zeros = Tensor(plane.xp.zeros(plane.shape[:2] + (d_in, sd - 1) + plane.shape[3:], plane.dtype))
            plane = reshape(concatenate([reshape(plane, *plane.shape[:2], d_in, 1, *plane.shape[3:]), zeros],
                                        axis=3), *plane.shape[:2], d_in * sd, *plane.shape[3:])
            plane = plane[:, :, :spread]
        plane = _pad_depth(plane, k * dd, full - k * dd - spread)
        total = plane if total is None else total + plane
    y = _pad_depth(total, -pd, depth - (full - pd))  # cut the padding; output_padding may add depth
    return y if bias is None else y + reshape(bias, 1, -1, 1, 1, 1)


# ---------------------------------------------------------------- pooling
def _pool3d_args(op, x, kernel_size, stride, padding, dilation, ceil_mode):
    _check_volume(op, x)
    kernel = _triple(kernel_size, "kernel_size", op, 1)
    stride = kernel if stride is None or stride == () else _triple(stride, "stride", op, 1)
    padding, dilation = _triple(padding, "padding", op, 0), _triple(dilation, "dilation", op, 1)
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half the kernel size {kernel}, "
                         "so that every window holds at least one input element")
    axes = [_windows_along(op, *args, ceil_mode) for args in zip(x.shape[2:], kernel, stride, padding, dilation)]
    if None in axes:
        raise ValueError(f"{op}: kernel {kernel} is larger than the padded input (input {tuple(x.shape[2:])}, "
                         f"padding {padding}, dilation {dilation})")
    return kernel, stride, padding, dilation, axes


def max_pool3d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False) -> Tensor:
    """Max over each KD×KH×KW window of x (N, C, D, H, W); ``stride`` defaults to ``kernel_size``.

    y[:, :, d] = max over kd of max_pool2d(x_pad[:, :, d·sd + kd·dd]) (−inf padding); the
    gradient goes to the first maximum of each window in (d, h, w) order, as PyTorch's.
    """
    op = "max_pool3d"
    x = as_tensor(x)
    if return_indices:
        raise ValueError(f"{op}: return_indices is not supported for 3-D pooling; take the max with "
                         "return_indices=False (max_unpool3d does not exist in minidl either)")
    kernel, stride, padding, dilation, axes = _pool3d_args(op, x, kernel_size, stride, padding, dilation, ceil_mode)
    (depth, (before, after)) = axes[0]
    x = _pad_depth(x, before, after, value=-math.inf)
    planes = [max_pool2d(_depth_slices(x, k * dilation[0], stride[0], depth), kernel[1:], stride[1:], padding[1:],
                         dilation[1:], ceil_mode) for k in range(kernel[0])]
    y = planes[0] if len(planes) == 1 else reduce_max(stack(planes, axis=0), 0).values  # the first kd on ties
    return _unfold_depth(y, x.shape[0], depth)


def avg_pool3d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None) -> Tensor:
    """Mean over each KD×KH×KW window of x (N, C, D, H, W);  y = Σ_window x_pad / divisor.

    The window sums are avg_pool2d's (with divisor 1) added over kd; the divisor follows
    :func:`~minidl.ops.pool.avg_pool2d`'s rules on each of the three axes (PyTorch's).
    """
    op = "avg_pool3d"
    x = as_tensor(x)
    kernel, stride, padding, _, axes = _pool3d_args(op, x, kernel_size, stride, padding, 1, ceil_mode)
    (depth, (before, after)) = axes[0]
    n, sizes = x.shape[0], x.shape[2:]
    x = _pad_depth(x, before, after)
    total = None
    for k in range(kernel[0]):
        plane = avg_pool2d(_depth_slices(x, k, stride[0], depth), kernel[1:], stride[1:], padding[1:], ceil_mode,
                           True, 1)  # divisor 1: the window sums
        total = plane if total is None else total + plane
    y = _unfold_depth(total, n, depth)
    if divisor_override is not None:
        if not isinstance(divisor_override, int) or divisor_override < 1:
            raise ValueError(f"{op}: divisor_override must be a positive int, got {divisor_override!r}")
        return y * (1.0 / divisor_override)
    d, h, w = (_avg_divisors(size, k, s, p, count, count_include_pad)
               for size, k, s, p, (count, _) in zip(sizes, kernel, stride, padding, axes))
    divisor = d[:, None, None] * h[None, :, None] * w[None, None, :]
    return y * Tensor(y.xp.asarray(1.0 / divisor, dtype=y.dtype))
