"""Pooling over sliding windows of an image (N, C, H, W).

max: y = max over each window;  the gradient goes to the window's maximum
     (the first one on ties, as PyTorch), and windows that overlap add.
avg: y = mean over each window, zero padding counted (PyTorch's
     count_include_pad=True);  dx = col2im(dy / (KH·KW)).

The output has OH = ⌊(H + 2·ph − KH) / sh⌋ + 1 rows (likewise OW); the stride
defaults to the kernel size (non-overlapping windows).
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import is_floating, xp_of
from minidl.ops.conv import Im2Col, as_pair
from minidl.ops.reduction import mean
from minidl.ops.shape import GetItemGrad, reshape, transpose
from minidl.tensor import Tensor, as_tensor


class MaxPool2d(Function):
    """y[n, c, i, j] = max_{p,q} x_pad[n, c, i·sh + p, j·sw + q]  (x_pad: x with −inf borders);
    dx = dy added at each window's argmax (flat indices saved in forward).
    """
    saved_inputs = ()

    def __init__(self, kernel, stride, padding):
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x):
        xp = xp_of(x)
        n, c, h, w = self.in_shape = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        if ph or pw:
            x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-xp.inf)
        oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
        # A running maximum over the KH·KW window offsets, each offset one strided view
        # of the image: no window array is built. Only a strictly larger value replaces
        # the best so far, so ties keep the first maximum, as PyTorch. ``arg`` records
        # where the winner sits relative to its window's corner, as a flat offset in x.
        best, arg = None, xp.zeros((n, c, oh, ow), xp.int64)
        for p in range(kh):
            for q in range(kw):
                view = x[:, :, p:p + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw]
                if best is None:
                    best = view.copy()
                    arg += (p - ph) * w + (q - pw)
                    continue
                better = view > best
                arg += better * ((p - ph) * w + (q - pw) - arg)  # arithmetic beats masked writes
                xp.maximum(best, view, out=best)
        corners = (xp.arange(oh) * (sh * w)).reshape(oh, 1) + xp.arange(ow) * sw
        local = corners + arg  # flat position inside each (H, W) plane
        if ph or pw:  # a window always holds a real element (padding ≤ kernel/2); the clip
            local = xp.clip(local, 0, h * w - 1)  # only guards windows made of −inf alone
        planes = xp.arange(n * c).reshape(n, c, 1, 1) * (h * w)
        self.index = (planes + local).reshape(-1)
        return best

    def backward(self, gy):
        n, c, h, w = self.in_shape
        # a scatter-add into the flat image; its own gradient is the matching gather
        flat = GetItemGrad(self.index, (n * c * h * w,))(reshape(gy, -1))
        return reshape(flat, self.in_shape)


def _pool_args(op, x, kernel_size, stride, padding):
    if x.ndim != 4:
        raise ValueError(f"{op}: input must be 4-D (N, C, H, W), got shape {x.shape}")
    kernel = as_pair(kernel_size, "kernel_size", op, 1)
    stride = kernel if stride is None else as_pair(stride, "stride", op, 1)
    padding = as_pair(padding, "padding", op, 0)
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {padding} must be at most half the kernel size {kernel}, "
                         "so that every window holds at least one input element")
    for size, k, p in zip(x.shape[2:], kernel, padding):
        if size + 2 * p < k:
            raise ValueError(f"{op}: kernel {kernel} is larger than the padded input "
                             f"(input {tuple(x.shape[2:])}, padding {padding})")
    return kernel, stride, padding


def max_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """Max over each KH×KW window of x (N, C, H, W); ``stride`` defaults to ``kernel_size``."""
    x = as_tensor(x)
    kernel, stride, padding = _pool_args("max_pool2d", x, kernel_size, stride, padding)
    if not is_floating(x.dtype):
        raise TypeError(f"max_pool2d: input must be floating point, got dtype {x.dtype}")
    return MaxPool2d(kernel, stride, padding)(x)


def avg_pool2d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """Mean over each KH×KW window of x (N, C, H, W), zero padding counted in the mean.

    Built from im2col and a mean, both differentiable, so second derivatives work.
    """
    x = as_tensor(x)
    kernel, stride, padding = _pool_args("avg_pool2d", x, kernel_size, stride, padding)
    windows = Im2Col(kernel, stride, padding)(x)  # (N, OH, OW, KH, KW, C)
    return transpose(mean(windows, axis=(3, 4)), (0, 3, 1, 2))

