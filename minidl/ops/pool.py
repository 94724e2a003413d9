"""Pooling over sliding windows of an image (N, C, H, W) or a signal (N, C, L).

max: y = max over each window;  the gradient goes to the window's maximum
     (the first one on ties, as PyTorch), and windows that overlap add.
avg: y = sum over each window / its divisor;  dx = col2im(dy / divisor).
adaptive: the windows are chosen so that the output has a given size.

Window positions along an axis of size H (kernel K, stride s, padding p,
dilation d): OH = ⌊(H + 2p − d(K − 1) − 1) / s⌋ + 1, or with ``ceil_mode`` the
ceiling instead, dropping a last window that would start in the right-hand
padding (PyTorch's rule). The stride defaults to the kernel size
(non-overlapping windows). 1-D pooling is 2-D pooling of height 1.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import Function
from minidl.backend import is_floating, xp_of
from minidl.ops.conv import Im2Col, _sides, _single, as_pair
from minidl.ops.linalg import matmul
from minidl.ops.reduction import mean
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import GetItemGrad, getitem, reshape, transpose
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods (PyTorch has none).
TENSOR_METHODS = ()


def _channels_last(x) -> bool:
    """True when x (N, C, H, W) is a view of a contiguous (N, H, W, C) array (C > 1)."""
    return x.shape[1] > 1 and x.transpose(0, 2, 3, 1).flags.c_contiguous and not x.flags.c_contiguous


def _padded(x, sides, last, value):
    """x (N, C, H, W) in the work's layout ((N, H, W, C) if ``last``), padded with ``value``."""
    xp = xp_of(x)
    x = x.transpose(0, 2, 3, 1) if last else x
    (pt, pb), (pl, pr) = sides
    if not (pt or pb or pl or pr):
        return x
    widths = ((0, 0), (pt, pb), (pl, pr), (0, 0)) if last else ((0, 0), (0, 0), (pt, pb), (pl, pr))
    return xp.pad(x, widths, constant_values=value)


# ---------------------------------------------------------------- arguments
def _windows_along(op, size, k, s, p, d, ceil_mode):
    """(number of windows, (pad before, pad after)) along one axis; ceil_mode pads further after.

    With ``ceil_mode`` a kernel wider than the padded axis by less than a stride still
    gives one window (PyTorch's rule), running past the end into the padding.
    """
    span = size + 2 * p - d * (k - 1) - 1
    count = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (count - 1) * s >= size + p:  # a last window starting in the right padding is dropped
        count -= 1
    if count < 1:
        return None
    return count, (p, max(p, (count - 1) * s + d * (k - 1) + 1 - size - p))


def _pool_args(op, x, kernel_size, stride, padding, dilation=1, ceil_mode=False, spatial=2):
    """kernel, stride, dilation, output size and padding sides (all pairs) of a 2-D pooling, checked."""
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    if spatial == 1:
        kernel = (1, _single(kernel_size, "kernel_size", op, 1))
        stride = kernel if stride is None else (1, _single(stride, "stride", op, 1))
        padding, dilation = (0, _single(padding, "padding", op, 0)), (1, _single(dilation, "dilation", op, 1))
    else:
        kernel = as_pair(kernel_size, "kernel_size", op, 1)
        stride = kernel if stride is None or stride == () else as_pair(stride, "stride", op, 1)
        padding, dilation = as_pair(padding, "padding", op, 0), as_pair(dilation, "dilation", op, 1)
    shown = (lambda v: v[1]) if spatial == 1 else (lambda v: v)  # noqa: E731
    if any(2 * p > k for p, k in zip(padding, kernel)):
        raise ValueError(f"{op}: padding {shown(padding)} must be at most half the kernel size {shown(kernel)}, "
                         "so that every window holds at least one input element")
    sizes = x.shape[2:] if spatial == 2 else (1,) + x.shape[2:]
    axes = [_windows_along(op, *args, ceil_mode) for args in zip(sizes, kernel, stride, padding, dilation)]
    if None in axes:
        raise ValueError(f"{op}: kernel {shown(kernel)} is larger than the padded input (input "
                         f"{tuple(x.shape[2:])}, padding {shown(padding)}, dilation {shown(dilation)})")
    (oh, sides_h), (ow, sides_w) = axes
    return kernel, stride, dilation, (oh, ow), (sides_h, sides_w)


def _as_image(x, spatial):
    """(N, C, L) as (N, C, 1, L) for the 1-D forms."""
    return x if spatial == 2 else reshape(x, x.shape[0], x.shape[1], 1, x.shape[2])


def _as_signal(y, spatial):
    return y if spatial == 2 else reshape(y, y.shape[0], y.shape[1], y.shape[3])


# ---------------------------------------------------------------- max pooling
def _max_pool(op, x, kernel_size, stride, padding, dilation, ceil_mode, return_indices, spatial):
    x = as_tensor(x)
    kernel, stride, dilation, _, sides = _pool_args(op, x, kernel_size, stride, padding, dilation, ceil_mode,
                                                    spatial)
    if not is_floating(x.dtype):
        raise TypeError(f"{op}: input must be floating point, got dtype {x.dtype}")
    pool = MaxPool2d(kernel, stride, sides, dilation)
    y = _as_signal(pool(_as_image(x, spatial)), spatial)
    if not return_indices:
        return y
    return y, Tensor(pool.local.reshape(y.shape))  # in 1-D, i·W + j is the position j along L


class MaxPool2d(Function):
    """y[n, c, i, j] = max_{p,q} x_pad[n, c, i·sh + p·dh, j·sw + q·dw]  (x_pad: x with −inf borders);
    dx = dy routed to each window's argmax (MaxPoolScatter), windows that overlap adding.

    Forward records which window offset k = p·KW + q won, one small integer per output
    (``choice``), rather than flat positions: the backward then needs no index arithmetic
    and no scatter, only KH·KW strided additions. ``padding`` is (ph, pw) or
    ((top, bottom), (left, right)) (ceil_mode pads the bottom/right further). After forward,
    ``local`` is each maximum's flat position i·W + j in its (H, W) plane: PyTorch's
    ``return_indices``.
    """
    saved_inputs = ()
    saved_arrays = ("choice",)

    def __init__(self, kernel, stride, padding, dilation=(1, 1)):
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, _sides(padding), dilation

    def forward(self, x):
        xp = xp_of(x)
        self.in_shape = x.shape
        # Work in x's memory order: a conv's output is an (N, C, H, W) view of a channels-last
        # array, and mixing its strides with a fresh (N, C, H, W) array would make every
        # pass below cache-hostile.
        self.last = _channels_last(x)
        image = _padded(x, self.padding, self.last, -xp.inf)
        (kh, kw), oh, ow = self.kernel, *self._out_size(image)
        self.out_hw = oh, ow
        # A running maximum over the KH·KW window offsets, each offset one strided view of
        # the image: no window array is built. Only a strictly larger value replaces the
        # best so far, so ties keep the first maximum, as PyTorch.
        best, choice = None, None
        for k in range(kh * kw):
            view = image[self.window_view(k, oh, ow)]
            if best is None:
                best, choice = view.copy(), xp.zeros(view.shape, xp.int8 if kh * kw < 128 else xp.int32)
                continue
            choice += (view > best) * (k - choice)  # arithmetic: NumPy's masked writes are 10× slower
            xp.maximum(best, view, out=best)
        self.choice = choice
        return best.transpose(0, 3, 1, 2) if self.last else best  # (N, C, OH, OW), a view if channels-last

    def backward(self, gy):
        return MaxPoolScatter(self)(gy)

    def jvp(self, dx):
        """ẏ = ẋ read at each window's argmax (MaxPoolGather): where the maximum is unique, a small
        change of x moves y only through the winner."""
        return MaxPoolGather(self)(dx)

    # ------------------------------------------------------------ the routing both gradients share
    def _out_size(self, image):
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        hp, wp = image.shape[1:3] if self.last else image.shape[2:]
        return (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1

    def window_view(self, k, oh, ow):
        """The index of the strided view of the padded image that window offset k reads."""
        (_, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        p, q = divmod(k, kw)
        rows = slice(p * dh, p * dh + sh * (oh - 1) + 1, sh)
        cols = slice(q * dw, q * dw + sw * (ow - 1) + 1, sw)
        return (slice(None), rows, cols) if self.last else (slice(None), slice(None), rows, cols)

    def in_layout(self, a):
        """An (N, C, ·, ·) array as it is laid out in the work: (N, ·, ·, C) if channels-last."""
        return a.transpose(0, 2, 3, 1) if self.last else a

    @property
    def local(self):
        """Each maximum's flat position i·W + j in its (H, W) plane, (N, C, OH, OW) int64."""
        xp = xp_of(self.choice)
        (_, kw), (sh, sw), (dh, dw) = self.kernel, self.stride, self.dilation
        (pt, _), (pl, _) = self.padding
        h, w = self.in_shape[2:]
        oh, ow = self.out_hw
        choice = self.choice.transpose(0, 3, 1, 2) if self.last else self.choice
        p, q = xp.divmod(choice.astype(xp.int64), kw)
        rows = xp.arange(oh).reshape(oh, 1) * sh + p * dh - pt
        cols = xp.arange(ow) * sw + q * dw - pl
        # a window always holds a real element (padding ≤ kernel/2); the clip only guards
        # windows made of −inf alone
        return xp.clip(rows * w + cols, 0, h * w - 1)


class MaxPoolScatter(Function):
    """Max pooling's gradient as an op of dy, the winners fixed:
    z = zeros like x, with dy[i, j] added at window (i, j)'s argmax;  d(dy) = dz read at the argmaxes.

    For each window offset k, the outputs whose maximum sat at offset k add their dy into
    one strided view of the (padded) image: KH·KW additions, each a regular grid. Windows
    that do not overlap (stride ≥ dilated kernel) write their views instead of adding.
    """
    saved_inputs = ()

    def __init__(self, pool):
        self.pool = pool

    def forward(self, gy):
        pool, xp = self.pool, xp_of(gy)
        (n, c, h, w), (pt, pb), (pl, pr) = pool.in_shape, *pool.padding
        shape = (n, h + pt + pb, w + pl + pr, c) if pool.last else (n, c, h + pt + pb, w + pl + pr)
        image = xp.zeros(shape, gy.dtype)
        gy = pool.in_layout(gy)
        disjoint = all(s >= d * (k - 1) + 1 for s, d, k in zip(pool.stride, pool.dilation, pool.kernel))
        for k in range(pool.kernel[0] * pool.kernel[1]):
            view = image[pool.window_view(k, *pool.out_hw)]
            if disjoint:
                xp.multiply(gy, pool.choice == k, out=view)
            else:
                view += gy * (pool.choice == k)
        inside = (slice(None), slice(pt, pt + h), slice(pl, pl + w))
        return image[inside].transpose(0, 3, 1, 2) if pool.last else image[(slice(None),) + inside]

    def backward(self, gz):
        return MaxPoolGather(self.pool)(gz)

    def jvp(self, dgy):
        """ż = the same routing of the tangent ḋy (z is linear in dy)."""
        return MaxPoolScatter(self.pool)(dgy)


class MaxPoolGather(Function):
    """z[n, c, i, j] = x at window (i, j)'s recorded argmax (no new maximum is taken);
    dx = dz routed back there (MaxPoolScatter): the two are each other's transpose.
    """
    saved_inputs = ()

    def __init__(self, pool):
        self.pool = pool

    def forward(self, x):
        pool, xp = self.pool, xp_of(x)
        image = _padded(x, pool.padding, pool.last, 0)
        z = xp.zeros(pool.choice.shape, x.dtype)
        for k in range(pool.kernel[0] * pool.kernel[1]):
            z += image[pool.window_view(k, *pool.out_hw)] * (pool.choice == k)
        return z.transpose(0, 3, 1, 2) if pool.last else z

    def backward(self, gz):
        return MaxPoolScatter(self.pool)(gz)

    def jvp(self, dx):
        """ż = ẋ at the same argmaxes."""
        return MaxPoolGather(self.pool)(dx)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over each KH×KW window of x (N, C, H, W); ``stride`` defaults to ``kernel_size``.

    y[n, c, i, j] = max_{p,q} x_pad[n, c, i·sh + p·dh, j·sw + q·dw] (−inf padding);
    dx = dy scattered to each window's argmax. With ``return_indices`` also returns
    each maximum's flat position in its (H, W) plane (int64), for max_unpool2d.
    """
    return _max_pool("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 2)


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max over each window of length K of x (N, C, L); y[n, c, i] = max_p x_pad[n, c, i·s + p·d].

    The indices (``return_indices``) are positions along L.
    """
    return _max_pool("max_pool1d", x, kernel_size, stride, padding, dilation, ceil_mode, return_indices, 1)


def _max_unpool(op, x, indices, kernel_size, stride, padding, output_size, spatial):
    x = as_tensor(x)
    index = indices.array if isinstance(indices, Tensor) else indices
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    if tuple(index.shape) != x.shape or getattr(index.dtype, "kind", None) not in "iu":
        raise ValueError(f"{op}: indices must be integers of the input's shape {x.shape} (from max_pool's "
                         f"return_indices), got {getattr(index, 'dtype', type(index))} of shape {tuple(index.shape)}")
    if spatial == 1:
        kernel = (1, _single(kernel_size, "kernel_size", op, 1))
        stride = kernel if stride is None else (1, _single(stride, "stride", op, 1))
        padding = (0, _single(padding, "padding", op, 0))
    else:
        kernel = as_pair(kernel_size, "kernel_size", op, 1)
        stride = kernel if stride is None else as_pair(stride, "stride", op, 1)
        padding = as_pair(padding, "padding", op, 0)
    n, c = x.shape[:2]
    sizes = x.shape[2:] if spatial == 2 else (1,) + x.shape[2:]
    default = tuple((s - 1) * st - 2 * p + k for s, st, p, k in zip(sizes, stride, padding, kernel))
    if output_size is None:
        out = default
    else:
        out = tuple(output_size)[-spatial:]
        out = out if spatial == 2 else (1,) + out
        if any(not (d - st < o < d + st) for o, d, st in zip(out, default, stride)):
            raise ValueError(f"{op}: output_size {tuple(output_size)} must be within a stride of the default "
                             f"{default[-spatial:]}")
    xp = xp_of(index)
    plane = out[0] * out[1]
    if bool(((index < 0) | (index >= plane)).any()):
        raise ValueError(f"{op}: indices must lie in [0, {plane}) for an output of size {out[-spatial:]}, "
                         f"got values from {int(index.min())} to {int(index.max())}")
    flat = (xp.arange(n * c).reshape((n, c) + (1,) * spatial) * plane + index).reshape(-1)
    # Overlapping windows can share one maximum, so an index may repeat: each copy is
    # weighted 1/copies, so the place receives their mean (the maximum itself).
    copies = xp.bincount(flat, minlength=n * c * plane)[flat]
    values = reshape(x, -1) * Tensor((1.0 / copies).astype(x.dtype))
    y = GetItemGrad(flat, (n * c * plane,))(values)  # y.flat[index] = x / copies; dx = dy.flat[index] / copies
    return reshape(y, (n, c) + out[-spatial:])


def max_unpool2d(x, indices, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of max_pool2d: zeros, with x[n, c, i, j] put at position indices[n, c, i, j]
    of its (H_out, W_out) plane;  dx = dy read at the same positions.

    H_out = (H − 1)·sh − 2·ph + KH unless ``output_size`` says otherwise (likewise W_out).
    An index that repeats (overlapping windows with one maximum) receives the mean of its
    values, which is that maximum; each copy's gradient is then dy / (number of copies).
    """
    return _max_unpool("max_unpool2d", x, indices, kernel_size, stride, padding, output_size, 2)


def max_unpool1d(x, indices, kernel_size, stride=None, padding=0, output_size=None) -> Tensor:
    """The partial inverse of max_pool1d: x[n, c, i] put at position indices[n, c, i] of zeros (N, C, L_out);
    L_out = (L − 1)·s − 2·p + K.
    """
    return _max_unpool("max_unpool1d", x, indices, kernel_size, stride, padding, output_size, 1)


# ---------------------------------------------------------------- average pooling
def _avg_divisors(size, k, s, p, count, count_include_pad):
    """PyTorch's divisor along one axis: the window clipped to the padded input, or to the input itself."""
    start = np.arange(count) * s - p
    end = np.minimum(start + k, size + p)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(op, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, spatial):
    x = as_tensor(x)
    kernel, stride, _, (oh, ow), sides = _pool_args(op, x, kernel_size, stride, padding, 1, ceil_mode, spatial)
    image = _as_image(x, spatial)
    windows = Im2Col(kernel, stride, sides)(image)  # (N, OH, OW, KH, KW, C)
    if divisor_override is not None:
        if not isinstance(divisor_override, int) or divisor_override < 1:
            raise ValueError(f"{op}: divisor_override must be a positive int, got {divisor_override!r}")
        y = reduce_sum(windows, axis=(3, 4)) * (1.0 / divisor_override)
    else:
        rows = _avg_divisors(image.shape[2], kernel[0], stride[0], sides[0][0], oh, count_include_pad)
        cols = _avg_divisors(image.shape[3], kernel[1], stride[1], sides[1][0], ow, count_include_pad)
        divisor = rows[:, None] * cols[None, :]
        if (divisor == kernel[0] * kernel[1]).all():  # every window whole: a plain mean
            y = mean(windows, axis=(3, 4))
        else:
            xp = xp_of(x.array)
            y = reduce_sum(windows, axis=(3, 4)) * Tensor(xp.asarray((1.0 / divisor)[:, :, None], dtype=x.dtype))
    return _as_signal(transpose(y, (0, 3, 1, 2)), spatial)


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None) -> Tensor:
    """Mean over each KH×KW window of x (N, C, H, W);  y = Σ_window x_pad / divisor,  dx = col2im(dy / divisor).

    The divisor is KH·KW, except: a window that ceil_mode lets run past the padded
    input counts only what lies inside it; with ``count_include_pad=False`` only the
    input elements count; ``divisor_override`` replaces it everywhere (PyTorch's rules).
    Built from im2col, a sum and a product, all differentiable, so second derivatives work.
    """
    return _avg_pool("avg_pool2d", x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2)


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True) -> Tensor:
    """Mean over each window of length K of x (N, C, L); divisor rules as avg_pool2d."""
    return _avg_pool("avg_pool1d", x, kernel_size, stride, padding, ceil_mode, count_include_pad, None, 1)


# ---------------------------------------------------------------- adaptive pooling
def _adaptive_sizes(op, x, output_size, spatial):
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    sizes = (output_size,) * spatial if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(sizes) != spatial:
        raise ValueError(f"{op}: output_size must be an int or {spatial} of them, got {output_size!r}")
    sizes = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(sizes))  # None keeps the input's size
    if not all(isinstance(s, int) and s >= 1 for s in sizes):
        raise ValueError(f"{op}: output sizes must be ints ≥ 1 (or None), got {output_size!r}")
    return sizes


def _bins(size, out):
    """PyTorch's adaptive windows: bin i covers [⌊i·size/out⌋, ⌈(i + 1)·size/out⌉)."""
    return [((i * size) // out, -(-((i + 1) * size) // out)) for i in range(out)]


def _averaging_matrix(size, out, like):
    """A (out, size) matrix whose row i averages bin i: A[i, a:b] = 1/(b − a)."""
    m = np.zeros((out, size))
    for i, (a, b) in enumerate(_bins(size, out)):
        m[i, a:b] = 1.0 / (b - a)
    return Tensor(xp_of(like.array).asarray(m, dtype=like.dtype))


def adaptive_avg_pool2d(x, output_size) -> Tensor:
    """Mean over adaptive bins so that the output is (N, C, OH, OW): bin (i, j) covers rows
    [⌊i·H/OH⌋, ⌈(i+1)·H/OH⌉) and columns likewise.

    A rectangle's mean is a row mean of column means, so y = A_H x A_Wᵀ with A the
    (out, in) averaging matrices;  dx = A_Hᵀ dy A_W (two matmuls' gradients).
    """
    x = as_tensor(x)
    oh, ow = _adaptive_sizes("adaptive_avg_pool2d", x, output_size, 2)
    if (oh, ow) == (1, 1):  # global average pooling
        return mean(x, axis=(2, 3), keepdims=True)
    h, w = x.shape[2:]
    y = x if oh == h else matmul(_averaging_matrix(h, oh, x), x)
    return y if ow == w else matmul(y, transpose(_averaging_matrix(w, ow, x)))


def adaptive_avg_pool1d(x, output_size) -> Tensor:
    """Mean over adaptive bins of x (N, C, L): bin i covers [⌊i·L/O⌋, ⌈(i+1)·L/O⌉);  y = x A_Lᵀ."""
    x = as_tensor(x)
    (out,) = _adaptive_sizes("adaptive_avg_pool1d", x, output_size, 1)
    return x if out == x.shape[2] else matmul(x, transpose(_averaging_matrix(x.shape[2], out, x)))


def _adaptive_max(op, x, output_size, return_indices, spatial):
    x = as_tensor(x)
    sizes = _adaptive_sizes(op, x, output_size, spatial)
    if not is_floating(x.dtype):
        raise TypeError(f"{op}: input must be floating point, got dtype {x.dtype}")
    image = _as_image(x, spatial)
    (n, c, h, w), (oh, ow) = image.shape, (1,) + sizes if spatial == 1 else sizes
    if h % oh == 0 and w % ow == 0:  # equal bins: plain max pooling
        pool = MaxPool2d((h // oh, w // ow), (h // oh, w // ow), (0, 0))
        y = _as_signal(pool(image), spatial)
        local = pool.local
    else:  # one argmax per bin (first maximum, as PyTorch), then a gather: dx = dy scattered back
        xp = xp_of(x.array)
        data = image.array
        local = xp.empty((n, c, oh, ow), xp.int64)
        for i, (r0, r1) in enumerate(_bins(h, oh)):
            for j, (c0, c1) in enumerate(_bins(w, ow)):
                best = data[:, :, r0:r1, c0:c1].reshape(n, c, -1).argmax(axis=-1)
                local[:, :, i, j] = (r0 + best // (c1 - c0)) * w + c0 + best % (c1 - c0)
        flat = (xp.arange(n * c).reshape(n, c, 1, 1) * (h * w) + local).reshape(-1)
        y = reshape(getitem(reshape(x, -1), flat), (n, c) + sizes)
    if not return_indices:
        return y
    return y, Tensor(local.reshape(y.shape))


def adaptive_max_pool2d(x, output_size, return_indices=False):
    """Max over adaptive bins (those of adaptive_avg_pool2d);  dx = dy at each bin's argmax.

    With ``return_indices`` also returns each maximum's flat position in its (H, W) plane.
    """
    return _adaptive_max("adaptive_max_pool2d", x, output_size, return_indices, 2)


def adaptive_max_pool1d(x, output_size, return_indices=False):
    """Max over adaptive bins of x (N, C, L);  dx = dy at each bin's argmax (indices along L)."""
    return _adaptive_max("adaptive_max_pool1d", x, output_size, return_indices, 1)
