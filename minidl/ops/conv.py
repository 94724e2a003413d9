"""Convolutions as one matrix product: im2col, then GEMM.

A 2-D convolution (PyTorch's cross-correlation) of x (N, C, H, W) with
weights W (O, C, KH, KW), stride s, dilation d and zero padding is

    y[n, o, i, j] = b[o] + Σ_{c,p,q} W[o, c, p, q] · x_pad[n, c, i·sh + p·dh, j·sw + q·dw]

Gather every window of x_pad into one row of a matrix X_col
(N·OH·OW rows, KH·KW·C columns): the sum above is then the product
Y = X_col Wᵀ with W flattened to (O, KH·KW·C), one call to BLAS. The
gradient follows from the matrix product's (dX_col = dY W, dWᵀ = X_colᵀ dY)
and from im2col's own adjoint, col2im, which adds each row of dX_col back
where its window read (overlapping windows add). A 1×1 convolution
(stride 1, no padding) skips the windows: y[n] = W x[n], one batched product.

Memory: X_col holds KH·KW copies of the input. Above IM2COL_LIMIT_BYTES
(32 MiB) the batch is split into chunks that each fit, convolved in turn
and joined, so no single column buffer exceeds the limit.

With ``groups`` = G the channels split into G independent convolutions
(input channels g·C/G … (g+1)·C/G − 1 feed output channels g·O/G …); the
G products run as one batched matmul. A depthwise convolution is G = C.

The transposed convolution is the adjoint of a convolution (its gradient
with respect to the input): y = col2im(x W), each input pixel spreading a
weighted copy of the kernel over the output.

im2col and col2im are linear maps and each is the other's transpose, so
the backward of one is the other: differentiating any number of times stays
inside these two ops and the matrix products (second derivatives of a CNN,
Hessian-vector products, all come free).
"""
from __future__ import annotations

from minidl import backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.linalg import matmul
from minidl.ops.rearrange import flip
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import concatenate, reshape, split, transpose
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods (PyTorch has none).
TENSOR_METHODS = ()

# The largest column buffer (bytes) one conv call builds at once: above it the batch is split into
# chunks of as many samples as fit (at least one), convolved one after the other and joined.
# 32 MiB is also glibc's largest mmap threshold: a smaller buffer is recycled by malloc, while a
# larger one is mapped afresh each call and page-faulted in (measured 1.5-4× slower under load).
IM2COL_LIMIT_BYTES = 32 * 2 ** 20


def as_pair(value, what: str, op: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints as a pair, each at least ``minimum`` (stride 1, padding 0)."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= minimum for v in pair):
        raise ValueError(f"{op}: {what} must be an int ≥ {minimum} or a pair of them, got {value!r}")
    return pair


def output_size(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    """Number of window positions along one axis: ⌊(size + 2·padding − dilation·(kernel − 1) − 1) / stride⌋ + 1."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _sides(padding):
    """((top, bottom), (left, right)) from (ph, pw) or from pairs already."""
    return tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)


def channels_last(x, sides=((0, 0), (0, 0))):
    """x (N, C, H, W) as a contiguous (N, H + top + bottom, W + left + right, C) array with zero borders.

    One copy, but a transposing one: for each pixel it reads C values one (H, W) plane apart.
    When that distance is a multiple of 4 KiB (32×32 float32 planes, say) all C reads fall into
    the same cache set and the copy runs about 3× slower than it should, so on the CPU such an
    input is first copied plainly into planes 16 values longer, which breaks the alignment.
    """
    xp = xp_of(x)
    n, c, h, w = x.shape
    (pt, pb), (pl, pr) = sides
    out = xp.empty((n, h + pt + pb, w + pl + pr, c), x.dtype)
    for border in (out[:, :pt], out[:, pt + h:], out[:, pt:pt + h, :pl], out[:, pt:pt + h, pl + w:]):
        border[...] = 0
    if not backend.is_device_array(x) and x.flags.c_contiguous and c > 1 and (h * w * x.itemsize) % 4096 == 0:
        staged = xp.empty((n, c, h * w + 16), x.dtype)
        staged[:, :, :h * w] = x.reshape(n, c, h * w)
        x = staged[:, :, :h * w].reshape(n, c, h, w)
    out[:, pt:pt + h, pl:pl + w] = x.transpose(0, 2, 3, 1)
    return out


def im2col_array(x, kernel, stride, padding, dilation=(1, 1), out_size=None):
    """Windows of x (N, C, H, W) as a contiguous array (N, OH, OW, KH, KW, C).

    No loop: a strided view reads every window in place (the window at (i, j)
    starts i·sh rows and j·sw columns in, its taps dh rows and dw columns
    apart), and one copy lays them out as rows. Channels go last so that the
    copy moves runs of C contiguous values: an input that is not channels-last
    already (a conv's output is, see conv2d) is first copied so, with its zero
    borders. ``padding`` is (ph, pw) or ((top, bottom), (left, right));
    ``out_size`` keeps only the first (OH, OW) windows (col2im's adjoint may
    need fewer than fit).
    """
    xp = xp_of(x)
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    sides = _sides(padding)
    nhwc = x.transpose(0, 2, 3, 1)  # a view
    if any(any(pair) for pair in sides) or (x.shape[1] > 1 and not nhwc.flags.c_contiguous):
        nhwc = channels_last(x, sides)
    n, h, w, c = nhwc.shape
    oh, ow = out_size or ((h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1)
    s_n, s_h, s_w, s_c = nhwc.strides
    windows = xp.lib.stride_tricks.as_strided(
        nhwc, shape=(n, oh, ow, kh, kw, c), strides=(s_n, s_h * sh, s_w * sw, s_h * dh, s_w * dw, s_c))
    return xp.ascontiguousarray(windows)


def col2im_array(cols, in_shape, kernel, stride, padding, dilation=(1, 1)):
    """The adjoint of im2col: add each window (N, OH, OW, KH, KW, C) back into an (N, C, H, W) image.

    One strided addition per kernel offset (p, q): all windows' entries at that
    offset land on a regular grid of the padded image. The image is built
    channels-last and returned as an (N, C, H, W) view of it.
    """
    xp = xp_of(cols)
    n, c, h, w = in_shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    (pt, pb), (pl, pr) = _sides(padding)
    oh, ow = cols.shape[1], cols.shape[2]
    image = xp.zeros((n, h + pt + pb, w + pl + pr, c), cols.dtype)
    for p in range(kh):
        for q in range(kw):
            image[:, p * dh:p * dh + sh * (oh - 1) + 1:sh, q * dw:q * dw + sw * (ow - 1) + 1:sw] += cols[:, :, :, p, q]
    return image[:, pt:pt + h, pl:pl + w].transpose(0, 3, 1, 2)


class Im2Col(Function):
    """y[n, i, j, p, q, c] = x_pad[n, c, i·sh + p·dh, j·sw + q·dw]  (x_pad: x with zero borders);
    dx = col2im(dy): every window's gradient added back where it was read.
    """
    saved_inputs = ()

    def __init__(self, kernel, stride, padding, dilation=(1, 1), out_size=None):
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        self.out_size = out_size

    def forward(self, x):
        self.in_shape = x.shape
        return im2col_array(x, self.kernel, self.stride, self.padding, self.dilation, self.out_size)

    def backward(self, gy):
        return Col2Im(self.in_shape, self.kernel, self.stride, self.padding, self.dilation)(gy)

    def jvp(self, dx):
        """ẏ = im2col(ẋ) (linear)."""
        return Im2Col(self.kernel, self.stride, self.padding, self.dilation, self.out_size)(dx)


def im2col(x, kernel_size, stride=1, padding=0, dilation=1) -> Tensor:
    """Sliding windows of x (N, C, H, W) as a tensor (N, OH, OW, KH, KW, C), differentiable."""
    kernel = as_pair(kernel_size, "kernel_size", "im2col", 1)
    return Im2Col(kernel, as_pair(stride, "stride", "im2col", 1), as_pair(padding, "padding", "im2col", 0),
                  as_pair(dilation, "dilation", "im2col", 1))(x)


class Col2Im(Function):
    """y = col2im(x): windows (N, OH, OW, KH, KW, C) summed back into an image (N, C, H, W);
    dx = im2col(dy) (col2im is im2col's transpose, so the two are each other's gradient).
    """
    saved_inputs = ()

    def __init__(self, image_shape, kernel, stride, padding, dilation=(1, 1)):
        self.image_shape = image_shape
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation

    def forward(self, cols):
        self.out_size = cols.shape[1:3]
        return col2im_array(cols, self.image_shape, self.kernel, self.stride, self.padding, self.dilation)

    def backward(self, gy):
        return Im2Col(self.kernel, self.stride, self.padding, self.dilation, self.out_size)(gy)

    def jvp(self, dx):
        """ẏ = col2im(ẋ) (linear)."""
        return Col2Im(self.image_shape, self.kernel, self.stride, self.padding, self.dilation)(dx)


class ChannelsLast(Function):
    """y = x (N, C, H, W) as a contiguous (N, H, W, C) array: x's own memory when it is laid out so
    already (a conv's output is), else the channels_last copy;  dx = dy viewed as (N, C, H, W).
    """
    saved_inputs = ()

    def forward(self, x):
        last = x.transpose(0, 2, 3, 1)
        return last if last.flags.c_contiguous else channels_last(x)

    def backward(self, gy):
        return transpose(gy, (0, 3, 1, 2))

    def jvp(self, dx):
        """ẏ = ẋ laid out alike."""
        return ChannelsLast()(dx)


# ---------------------------------------------------------------- arguments and input checks
def _padding_sides(op, padding, kernel, stride, dilation):
    """Padding as ((top, bottom), (left, right)); 'valid' is none, 'same' keeps the size (stride 1).

    'same' pads d·(k − 1) in all, ⌊d·(k − 1)/2⌋ before and the rest after, as PyTorch.
    """
    if isinstance(padding, str):
        if padding == "valid":
            return tuple((0, 0) for _ in kernel)
        if padding != "same":
            raise ValueError(f"{op}: padding must be an int, a pair of ints, 'same' or 'valid', got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding='same' needs stride 1 (as in PyTorch), got stride {stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return _sides(as_pair(padding, "padding", op, 0))


def _check_conv(op, x, weight, bias, padding, dilation, groups, spatial):
    """Raise a ValueError/TypeError that names ``op`` when the shapes cannot convolve."""
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    w_layout = {1: "(out_channels, in_channels/groups, K)", 2: "(out_channels, in_channels/groups, KH, KW)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    if weight.ndim != spatial + 2:
        raise ValueError(f"{op}: weight must be {spatial + 2}-D {w_layout}, got shape {weight.shape}")
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{op}: groups must be an int ≥ 1, got {groups!r}")
    if weight.shape[0] % groups:
        raise ValueError(f"{op}: weight of shape {weight.shape} has {weight.shape[0]} output channels, "
                         f"not divisible by groups={groups}")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"{op}: input of shape {x.shape} has {x.shape[1]} channels but weight of shape "
                         f"{weight.shape} expects {weight.shape[1] * groups} (weight is {w_layout}, "
                         f"groups={groups})")
    if x.dtype != weight.dtype:
        raise TypeError(f"{op}: input is {x.dtype} but weight is {weight.dtype}; convert one of them "
                        f"(e.g. x.astype('{weight.dtype}')) so that no silent upcast happens")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape ({weight.shape[0]},), one value per output "
                         f"channel, got {bias.shape}")
    sides, dilation = padding[-spatial:], dilation[-spatial:]
    for size, kernel, (before, after), d in zip(x.shape[2:], weight.shape[2:], sides, dilation):
        if size + before + after < d * (kernel - 1) + 1:
            raise ValueError(f"{op}: kernel of size {tuple(weight.shape[2:])} (dilation {dilation}) is larger "
                             f"than the padded input (input {tuple(x.shape[2:])}, padding {sides}); "
                             "use a smaller kernel or more padding")


def batch_chunk(x_shape, weight_shape, stride, padding, dilation, itemsize) -> int:
    """Samples per im2col buffer: all of them unless the columns exceed IM2COL_LIMIT_BYTES,
    else the batch split into the fewest chunks of (nearly) equal size that fit."""
    n, _, h, w = x_shape
    _, c, kh, kw = weight_shape
    (pt, pb), (pl, pr) = padding
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    per_sample = oh * ow * kh * kw * c * (x_shape[1] // c) * itemsize
    most = max(1, IM2COL_LIMIT_BYTES // max(per_sample, 1))
    chunks = -(-n // most)
    return -(-n // chunks)  # chunks of equal size (the last one may be smaller)


def _conv2d(x, weight, bias, stride, padding, dilation=(1, 1), groups=1):
    """The shared core, after the checks: im2col, one GEMM (G batched ones with groups), back to (N, O, OH, OW).

    A batch whose column matrix would pass IM2COL_LIMIT_BYTES is convolved in chunks of samples
    (y = [conv(x[0:k]), conv(x[k:2k]), ...]), so the buffer built at once stays under the limit.
    """
    n, c, h, w = x.shape
    o = weight.shape[0]
    if weight.shape[2:] == (1, 1) and stride == (1, 1) and padding == ((0, 0), (0, 0)) and groups == 1:
        # A 1×1 convolution mixes channels only: y[n] = W x[n] with x[n] as a (C, H·W) matrix.
        # A batched product on x's own layout: no column buffer and no transposes either way.
        y = matmul(reshape(weight, o, c), reshape(x, n, c, h * w))  # (N, O, H·W)
        y = reshape(y, n, o, h, w)
        return y if bias is None else y + reshape(bias, 1, o, 1, 1)
    chunk = batch_chunk(x.shape, weight.shape, stride, padding, dilation, x.dtype.itemsize)
    if chunk < n:
        return concatenate([_conv2d_columns(part, weight, bias, stride, padding, dilation, groups)
                            for part in split(x, chunk, 0)], axis=0)
    return _conv2d_columns(x, weight, bias, stride, padding, dilation, groups)


def _conv2d_columns(x, weight, bias, stride, padding, dilation, groups):
    """One im2col buffer for the whole of x, then the GEMM."""
    if _stride1_fits(stride, padding, dilation, weight.shape[2:], groups):
        return Conv2dStride1(padding, dilation)(x, weight) if bias is None else \
            Conv2dStride1(padding, dilation)(x, weight, bias)
    n = x.shape[0]
    o, c, kh, kw = weight.shape  # c = C / groups
    cols = Im2Col((kh, kw), stride, padding, dilation)(x)  # (N, OH, OW, KH, KW, C)
    oh, ow = cols.shape[1], cols.shape[2]
    if groups == 1:
        rows = reshape(cols, n * oh * ow, kh * kw * c)
        flat_weight = reshape(transpose(weight, (2, 3, 1, 0)), kh * kw * c, o)  # rows in im2col's order
        # (N·OH·OW, O): y = X_col Wᵀ + b. A matmul, not a linear: its weight gradient X_colᵀ dY
        # is the GEMM orientation OpenBLAS runs steadily (dYᵀ X_col, with a long inner
        # dimension and few output rows, stalls for 10× its time on a busy machine).
        y = matmul(rows, flat_weight)
        if bias is not None:
            y = y + bias
    else:  # group g: its own C/G columns of every window times its own O/G filters, one batched matmul
        g, og, m = groups, o // groups, n * oh * ow
        rows = reshape(transpose(reshape(cols, m, kh * kw, g, c), (2, 0, 1, 3)), g, m, kh * kw * c)
        grouped = reshape(transpose(reshape(weight, g, og, c, kh, kw), (0, 3, 4, 2, 1)), g, kh * kw * c, og)
        y = reshape(transpose(matmul(rows, grouped), (1, 0, 2)), m, o)  # (G, M, O/G) → (M, O)
        if bias is not None:
            y = y + bias
    # (N, O, OH, OW) as a view of the channels-last result: no copy, and the next
    # conv's im2col reads it channels-last, which is the fast direction.
    return transpose(reshape(y, n, oh, ow, o), (0, 3, 1, 2))


def _stride1_fits(stride, padding, dilation, kernel, groups) -> bool:
    """Conv2dStride1 applies: stride 1, one group, and no side padded more than d·(k − 1)."""
    return stride == (1, 1) and groups == 1 and all(
        side <= d * (k - 1) for sides, d, k in zip(padding, dilation, kernel) for side in sides)


class Conv2dStride1(Function):
    """y = im2col(x) W_colᵀ + b  (stride 1, one group, padding ≤ d·(k − 1) on every side);
    dx = im2col(dy) V_colᵀ;  dW = dYᵀ im2col(x),  db = Σ dy.

    V is W flipped in both spatial axes with its two channel axes swapped,
    V[c, o, p, q] = W[o, c, KH − 1 − p, KW − 1 − q], and dy is padded by d·(k − 1) minus the
    forward padding of each side. The input gradient of a stride-1 correlation is the correlation
    of dy with the flipped kernel, channels swapped: x[u] met W[p] in y[u + p_top − p·d], so
    dx[u] = Σ_p dy[u + p_top − p·d] W[p]. Computed so, it is im2col of dy and one GEMM with inner
    dimension KH·KW·O, instead of a GEMM with inner dimension O writing KH·KW copies of dx that
    col2im then adds up (2 to 4 times faster for small O). Only x and W are kept; dW rebuilds x's
    columns.
    """

    def __init__(self, padding, dilation):
        self.padding, self.dilation = padding, dilation

    def forward(self, x, weight, bias=None):
        n, o, (kh, kw) = x.shape[0], weight.shape[0], weight.shape[2:]
        cols = im2col_array(x, (kh, kw), (1, 1), self.padding, self.dilation)  # (N, OH, OW, KH, KW, C)
        oh, ow = cols.shape[1:3]
        flat_weight = weight.transpose(2, 3, 1, 0).reshape(-1, o)  # (KH·KW·C, O), rows in im2col's order
        y = backend.matmul(cols.reshape(n * oh * ow, -1), flat_weight)
        if bias is not None:
            y += bias
        return y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)  # (N, O, OH, OW), channels-last in memory

    def backward(self, gy):
        x, weight = self.inputs[0], self.inputs[1]
        (o, c, kh, kw), (dh, dw) = weight.shape, self.dilation
        (pt, pb), (pl, pr) = self.padding
        gy_nhwc = ChannelsLast()(gy)  # (N, OH, OW, O), contiguous: dy laid out once for all three
        g_rows = reshape(gy_nhwc, -1, o)
        gx = gw = gb = None
        if x.requires_grad:
            flipped = transpose(flip(weight, dims=(2, 3)), (1, 0, 2, 3))  # (C, O, KH, KW)
            sides = ((dh * (kh - 1) - pt, dh * (kh - 1) - pb), (dw * (kw - 1) - pl, dw * (kw - 1) - pr))
            gx = _conv2d(transpose(gy_nhwc, (0, 3, 1, 2)), flipped, None, (1, 1), sides, self.dilation)
        if weight.requires_grad:
            rows = reshape(Im2Col((kh, kw), (1, 1), self.padding, self.dilation)(x), -1, kh * kw * c)
            gw = transpose(reshape(matmul(transpose(rows), g_rows), kh, kw, c, o), (3, 2, 0, 1))
        if len(self.inputs) == 3 and self.inputs[2].requires_grad:
            gb = reduce_sum(g_rows, axis=0)
        return gx, gw, gb

    def jvp(self, dx, dweight, dbias=None):
        """ẏ = conv(ẋ, W) + conv(x, Ẇ) + ḃ  (y is linear in x, in W and in b)."""
        x, weight = self.inputs[0], self.inputs[1]
        (n, _, h, w), (o, _, kh, kw) = x.shape, weight.shape
        (pt, pb), (pl, pr), (dh, dw) = *self.padding, self.dilation
        dy = Tensor(x.xp.zeros((n, o, h + pt + pb - dh * (kh - 1), w + pl + pr - dw * (kw - 1)), x.dtype))
        if dx is not None:
            dy = dy + Conv2dStride1(self.padding, self.dilation)(dx, weight)
        if dweight is not None:
            dy = dy + Conv2dStride1(self.padding, self.dilation)(x, dweight)
        if dbias is not None:
            dy = dy + reshape(dbias, 1, o, 1, 1)
        return dy


@autocast_to("lower")
def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """2-D convolution (cross-correlation, as PyTorch): x (N, C, H, W), weight (O, C/groups, KH, KW).

    y[n, o, i, j] = b[o] + Σ_{c,p,q} W[o, c, p, q] · x_pad[n, g·C/G + c, i·sh + p·dh, j·sw + q·dw]
    (g = the group of output channel o), computed as im2col(x) @ Wᵀ;
    dx = col2im(dy W),  dW = dyᵀ im2col(x),  db = Σ dy.
    ``stride``, ``padding`` (zeros) and ``dilation`` are ints or (height, width) pairs;
    ``padding`` may also be 'valid' (none) or 'same' (output as large as the input; stride 1).
    The output has OH = ⌊(H + 2·ph − dh·(KH − 1) − 1) / sh⌋ + 1 rows, and likewise OW.

    A call takes one of three routes (see ``_conv2d``), each with its backward elsewhere:

    - a 1×1 kernel, stride 1, no padding, one group: y[n] = W x[n], one batched matmul on
      x's own layout, no columns; its gradient is MatMul's (ops/linalg.py) and Reshape's.
    - stride 1, one group, no side padded more than dh·(KH − 1) (dw·(KW − 1)): one
      :class:`Conv2dStride1` node, whose backward (above) computes dx as a stride-1
      convolution of dy with the flipped kernel and rebuilds x's columns for dW.
    - anything else (strides, groups, wide padding): :class:`Im2Col`, then one GEMM (a
      batched one per group) and the transposes back; its gradient is composed from
      Im2Col's (a :class:`Col2Im`, this module), MatMul's and the shape ops'.

    A batch whose columns would pass IM2COL_LIMIT_BYTES is split into chunks, each
    taking the second or third route, and joined (Split's and Concatenate's gradients).
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    stride = as_pair(stride, "stride", "conv2d", 1)
    dilation = as_pair(dilation, "dilation", "conv2d", 1)
    kernel = weight.shape[2:] if weight.ndim == 4 else (1, 1)
    padding = _padding_sides("conv2d", padding, kernel, stride, dilation)
    _check_conv("conv2d", x, weight, bias, padding, dilation, groups, 2)
    return _conv2d(x, weight, bias, stride, padding, dilation, groups)


def _single(value, what, op, minimum):
    single = value[0] if isinstance(value, (tuple, list)) and len(value) == 1 else value
    if not isinstance(single, int) or single < minimum:
        raise ValueError(f"{op}: {what} must be an int ≥ {minimum}, got {value!r}")
    return single


@autocast_to("lower")
def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    """1-D convolution: x (N, C, L), weight (O, C/groups, K);
    y[n, o, i] = b[o] + Σ_{c,p} W[o, c, p] x_pad[n, g·C/G + c, i·s + p·d].

    Computed as a 2-D convolution of height 1, so it shares conv2d's gradient.
    ``padding`` may be an int, 'valid' or 'same' (stride 1).
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    stride = _single(stride, "stride", "conv1d", 1)
    dilation = _single(dilation, "dilation", "conv1d", 1)
    kernel = weight.shape[2:] if weight.ndim == 3 else (1,)
    if isinstance(padding, str):
        (sides,) = _padding_sides("conv1d", padding, kernel, (stride,), (dilation,))
    else:
        sides = (_single(padding, "padding", "conv1d", 0),) * 2
    _check_conv("conv1d", x, weight, bias, (sides,), (dilation,), groups, 1)
    (n, c, length), (o, cg, k) = x.shape, weight.shape
    y = _conv2d(reshape(x, n, c, 1, length), reshape(weight, o, cg, 1, k), bias, (1, stride), ((0, 0), sides),
                (1, dilation), groups)
    return reshape(y, n, o, y.shape[-1])


# ---------------------------------------------------------------- transposed convolution
def _conv_transpose2d(x, weight, bias, stride, padding, output_padding, dilation, groups):
    """y = col2im(x W) + b: each input pixel adds its channels' kernels, weighted, into the output."""
    n, cin, h, w = x.shape
    _, og, kh, kw = weight.shape  # (C_in, C_out/G, KH, KW)
    g, o, c = groups, weight.shape[1] * groups, cin // groups
    out_h = (h - 1) * stride[0] - sum(padding[0]) + dilation[0] * (kh - 1) + output_padding[0] + 1
    out_w = (w - 1) * stride[1] - sum(padding[1]) + dilation[1] * (kw - 1) + output_padding[1] + 1
    m = n * h * w
    rows = reshape(transpose(x, (0, 2, 3, 1)), m, cin)  # one row per input pixel
    if g == 1:
        cols = matmul(rows, reshape(transpose(weight, (0, 2, 3, 1)), cin, kh * kw * og))  # (M, KH·KW·O)
    else:
        grouped_rows = transpose(reshape(rows, m, g, c), (1, 0, 2))  # (G, M, C/G)
        grouped = reshape(transpose(reshape(weight, g, c, og, kh, kw), (0, 1, 3, 4, 2)), g, c, kh * kw * og)
        cols = transpose(reshape(matmul(grouped_rows, grouped), g, m, kh * kw, og), (1, 2, 0, 3))
    cols = reshape(cols, n, h, w, kh, kw, o)
    y = Col2Im((n, o, out_h, out_w), (kh, kw), stride, padding, dilation)(cols)
    return y if bias is None else y + reshape(bias, 1, o, 1, 1)


def _check_conv_transpose(op, x, weight, bias, stride, padding, output_padding, dilation, groups, spatial):
    layout = {1: "(N, C_in, L)", 2: "(N, C_in, H, W)"}[spatial]
    w_layout = {1: "(in_channels, out_channels/groups, K)", 2: "(in_channels, out_channels/groups, KH, KW)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    if weight.ndim != spatial + 2:
        raise ValueError(f"{op}: weight must be {spatial + 2}-D {w_layout}, got shape {weight.shape}")
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"{op}: groups must be an int ≥ 1 dividing the {x.shape[1]} input channels, got {groups!r}")
    if x.shape[1] != weight.shape[0]:
        raise ValueError(f"{op}: input of shape {x.shape} has {x.shape[1]} channels but weight of shape "
                         f"{weight.shape} expects {weight.shape[0]} (weight is {w_layout})")
    if x.dtype != weight.dtype:
        raise TypeError(f"{op}: input is {x.dtype} but weight is {weight.dtype}; convert one of them "
                        "so that no silent upcast happens")
    out_channels = weight.shape[1] * groups
    if bias is not None and bias.shape != (out_channels,):
        raise ValueError(f"{op}: bias must have shape ({out_channels},), one value per output channel, "
                         f"got {bias.shape}")
    for op_, s, d in zip(output_padding[-spatial:], stride[-spatial:], dilation[-spatial:]):
        if op_ >= max(s, d):
            raise ValueError(f"{op}: output_padding {output_padding[-spatial:]} must be smaller than the stride "
                             f"{stride[-spatial:]} or the dilation {dilation[-spatial:]} (as in PyTorch)")
    for size, k, (before, after), s, d, extra in zip(x.shape[2:], weight.shape[2:], padding[-spatial:],
                                                     stride[-spatial:], dilation[-spatial:],
                                                     output_padding[-spatial:]):
        if (size - 1) * s - before - after + d * (k - 1) + extra + 1 < 1:
            raise ValueError(f"{op}: padding {tuple(p[0] for p in padding[-spatial:])} leaves no output for "
                             f"input {tuple(x.shape[2:])} and kernel {tuple(weight.shape[2:])}")


@autocast_to("lower")
def conv_transpose2d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1) -> Tensor:
    """Transposed 2-D convolution: x (N, C_in, H, W), weight (C_in, C_out/groups, KH, KW) (PyTorch's layout).

    The adjoint of conv2d: y = col2im(x W) + b, i.e.
    y[n, o, i·sh + p·dh − ph, j·sw + q·dw − pw] += Σ_c x[n, c, i, j] · W[c, o, p, q];
    dx = im2col(dy) W ᵀ (a conv2d of dy with W),  dW = xᵀ im2col(dy),  db = Σ dy.
    Output: H_out = (H − 1)·sh − 2·ph + dh·(KH − 1) + output_padding + 1 (likewise W_out);
    ``output_padding`` adds rows at the bottom/right only (it picks among the input
    sizes that a stride-s conv maps to the same output size).
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    op = "conv_transpose2d"
    stride, dilation = as_pair(stride, "stride", op, 1), as_pair(dilation, "dilation", op, 1)
    padding = _sides(as_pair(padding, "padding", op, 0))
    output_padding = as_pair(output_padding, "output_padding", op, 0)
    _check_conv_transpose(op, x, weight, bias, stride, padding, output_padding, dilation, groups, 2)
    return _conv_transpose2d(x, weight, bias, stride, padding, output_padding, dilation, groups)


@autocast_to("lower")
def conv_transpose1d(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1) -> Tensor:
    """Transposed 1-D convolution: x (N, C_in, L), weight (C_in, C_out/groups, K);
    y[n, o, i·s + p·d − pad] += Σ_c x[n, c, i] W[c, o, p];  L_out = (L − 1)·s − 2·pad + d·(K − 1) + output_padding + 1.

    Computed as a transposed 2-D convolution of height 1.
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    op = "conv_transpose1d"
    stride, dilation = _single(stride, "stride", op, 1), _single(dilation, "dilation", op, 1)
    padding, output_padding = _single(padding, "padding", op, 0), _single(output_padding, "output_padding", op, 0)
    _check_conv_transpose(op, x, weight, bias, (stride,), ((padding, padding),), (output_padding,), (dilation,),
                          groups, 1)
    (n, c, length), (_, og, k) = x.shape, weight.shape
    y = _conv_transpose2d(reshape(x, n, c, 1, length), reshape(weight, c, og, 1, k), bias, (1, stride),
                          ((0, 0), (padding, padding)), (0, output_padding), (1, dilation), groups)
    return reshape(y, n, y.shape[1], y.shape[-1])
