"""Convolutions as one matrix product: im2col, then GEMM.

A 2-D convolution (PyTorch's cross-correlation) of x (N, C, H, W) with
weights W (O, C, KH, KW) is

    y[n, o, i, j] = b[o] + Σ_{c,p,q} W[o, c, p, q] · x_pad[n, c, i·sh + p, j·sw + q]

Gather every window of x_pad into one row of a matrix X_col
(N·OH·OW rows, KH·KW·C columns): the sum above is then the product
Y = X_col Wᵀ with W flattened to (O, KH·KW·C), one call to BLAS. The
gradient follows from the linear layer's (dX_col = dY W, dW = dYᵀ X_col)
and from im2col's own adjoint, col2im, which adds each row of dX_col back
where its window read (overlapping windows add).

im2col and col2im are linear maps and each is the other's transpose, so
the backward of one is the other: differentiating any number of times stays
inside these two ops and the linear layer (second derivatives of a CNN,
Hessian-vector products, all come free).
"""
from __future__ import annotations

from minidl.amp import autocast_to
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.linalg import linear
from minidl.ops.shape import reshape, transpose
from minidl.tensor import Tensor, as_tensor


def as_pair(value, what: str, op: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints as a pair, each at least ``minimum`` (stride 1, padding 0)."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= minimum for v in pair):
        raise ValueError(f"{op}: {what} must be an int ≥ {minimum} or a pair of them, got {value!r}")
    return pair


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Number of window positions along one axis: ⌊(size + 2·padding − kernel) / stride⌋ + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def im2col_array(x, kernel, stride, padding):
    """Windows of x (N, C, H, W) as a contiguous array (N, OH, OW, KH, KW, C).

    No loop: a strided view reads every window in place (the window at (i, j)
    starts i·sh rows and j·sw columns in), and one copy lays them out as rows.
    Channels go last so that the copy moves runs of C contiguous values
    (a conv's output is already channels-last in memory, see conv2d).
    """
    xp = xp_of(x)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    x = x.transpose(0, 2, 3, 1)  # (N, H, W, C): a view
    if ph or pw:
        x = xp.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
    n, h, w, c = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    s_n, s_h, s_w, s_c = x.strides
    windows = xp.lib.stride_tricks.as_strided(
        x, shape=(n, oh, ow, kh, kw, c), strides=(s_n, s_h * sh, s_w * sw, s_h, s_w, s_c))
    return xp.ascontiguousarray(windows)


def col2im_array(cols, in_shape, kernel, stride, padding):
    """The adjoint of im2col: add each window (N, OH, OW, KH, KW, C) back into an (N, C, H, W) image.

    One strided addition per kernel offset (p, q): all windows' entries at that
    offset land on a regular grid of the padded image. The image is built
    channels-last and returned as an (N, C, H, W) view of it.
    """
    xp = xp_of(cols)
    n, c, h, w = in_shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    oh, ow = cols.shape[1], cols.shape[2]
    image = xp.zeros((n, h + 2 * ph, w + 2 * pw, c), cols.dtype)
    for p in range(kh):
        for q in range(kw):
            image[:, p:p + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw] += cols[:, :, :, p, q]
    return image[:, ph:ph + h, pw:pw + w].transpose(0, 3, 1, 2)


class Im2Col(Function):
    """y[n, i, j, p, q, c] = x_pad[n, c, i·sh + p, j·sw + q]  (x_pad: x with zero borders);
    dx = col2im(dy): every window's gradient added back where it was read.
    """
    saved_inputs = ()

    def __init__(self, kernel, stride, padding):
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x):
        self.in_shape = x.shape
        return im2col_array(x, self.kernel, self.stride, self.padding)

    def backward(self, gy):
        return Col2Im(self.in_shape, self.kernel, self.stride, self.padding)(gy)


class Col2Im(Function):
    """y = col2im(x): windows (N, OH, OW, KH, KW, C) summed back into an image (N, C, H, W);
    dx = im2col(dy) (col2im is im2col's transpose, so the two are each other's gradient).
    """
    saved_inputs = ()

    def __init__(self, image_shape, kernel, stride, padding):
        self.image_shape = image_shape
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, cols):
        return col2im_array(cols, self.image_shape, self.kernel, self.stride, self.padding)

    def backward(self, gy):
        return Im2Col(self.kernel, self.stride, self.padding)(gy)


def im2col(x, kernel_size, stride=1, padding=0) -> Tensor:
    """Sliding windows of x (N, C, H, W) as a tensor (N, OH, OW, KH, KW, C), differentiable."""
    kernel = as_pair(kernel_size, "kernel_size", "im2col", 1)
    return Im2Col(kernel, as_pair(stride, "stride", "im2col", 1), as_pair(padding, "padding", "im2col", 0))(x)


# ---------------------------------------------------------------- input checks
def _check_conv(op, x, weight, bias, stride, padding, spatial):
    """Raise a ValueError/TypeError that names ``op`` when the shapes cannot convolve."""
    layout = {1: "(N, C, L)", 2: "(N, C, H, W)"}[spatial]
    w_layout = {1: "(out_channels, in_channels, K)", 2: "(out_channels, in_channels, KH, KW)"}[spatial]
    if x.ndim != spatial + 2:
        raise ValueError(f"{op}: input must be {spatial + 2}-D {layout}, got shape {x.shape}")
    if weight.ndim != spatial + 2:
        raise ValueError(f"{op}: weight must be {spatial + 2}-D {w_layout}, got shape {weight.shape}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: input of shape {x.shape} has {x.shape[1]} channels but weight of shape "
                         f"{weight.shape} expects {weight.shape[1]} (weight is {w_layout})")
    if x.dtype != weight.dtype:
        raise TypeError(f"{op}: input is {x.dtype} but weight is {weight.dtype}; convert one of them "
                        f"(e.g. x.astype('{weight.dtype}')) so that no silent upcast happens")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"{op}: bias must have shape ({weight.shape[0]},), one value per output "
                         f"channel, got {bias.shape}")
    for size, kernel, pad in zip(x.shape[2:], weight.shape[2:], padding[-spatial:]):
        if size + 2 * pad < kernel:
            raise ValueError(f"{op}: kernel of size {tuple(weight.shape[2:])} is larger than the padded "
                             f"input (input {tuple(x.shape[2:])}, padding {padding[-spatial:]}); "
                             "use a smaller kernel or more padding")


def _conv2d(x, weight, bias, stride, padding):
    """The shared core, after the checks: im2col, one GEMM, back to (N, O, OH, OW)."""
    n = x.shape[0]
    o, c, kh, kw = weight.shape
    cols = Im2Col((kh, kw), stride, padding)(x)  # (N, OH, OW, KH, KW, C)
    oh, ow = cols.shape[1], cols.shape[2]
    rows = reshape(cols, n * oh * ow, kh * kw * c)
    flat_weight = reshape(transpose(weight, (0, 2, 3, 1)), o, kh * kw * c)  # columns in im2col's order
    y = linear(rows, flat_weight, bias)  # (N·OH·OW, O): y = X_col Wᵀ + b
    # (N, O, OH, OW) as a view of the channels-last result: no copy, and the next
    # conv's im2col reads it channels-last, which is the fast direction.
    return transpose(reshape(y, n, oh, ow, o), (0, 3, 1, 2))


@autocast_to("lower")
def conv2d(x, weight, bias=None, stride=1, padding=0) -> Tensor:
    """2-D convolution (cross-correlation, as PyTorch): x (N, C, H, W), weight (O, C, KH, KW).

    y[n, o, i, j] = b[o] + Σ_{c,p,q} W[o, c, p, q] · x_pad[n, c, i·sh + p, j·sw + q], computed as
    im2col(x) @ Wᵀ;  dx = col2im(dy W),  dW = dyᵀ im2col(x),  db = Σ dy.
    ``stride`` and ``padding`` (zeros) are ints or (height, width) pairs. The
    output has OH = ⌊(H + 2·ph − KH) / sh⌋ + 1 rows, and likewise OW.
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    stride = as_pair(stride, "stride", "conv2d", 1)
    padding = as_pair(padding, "padding", "conv2d", 0)
    _check_conv("conv2d", x, weight, bias, stride, padding, 2)
    return _conv2d(x, weight, bias, stride, padding)


def _single(value, what, op, minimum):
    single = value[0] if isinstance(value, (tuple, list)) and len(value) == 1 else value
    if not isinstance(single, int) or single < minimum:
        raise ValueError(f"{op}: {what} must be an int ≥ {minimum}, got {value!r}")
    return single


@autocast_to("lower")
def conv1d(x, weight, bias=None, stride=1, padding=0) -> Tensor:
    """1-D convolution: x (N, C, L), weight (O, C, K);
    y[n, o, i] = b[o] + Σ_{c,p} W[o, c, p] x_pad[n, c, i·s + p].

    Computed as a 2-D convolution of height 1, so it shares conv2d's gradient.
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    stride = _single(stride, "stride", "conv1d", 1)
    padding = _single(padding, "padding", "conv1d", 0)
    _check_conv("conv1d", x, weight, bias, (stride,), (padding,), 1)
    (n, c, length), (o, _, k) = x.shape, weight.shape
    y = _conv2d(reshape(x, n, c, 1, length), reshape(weight, o, c, 1, k), bias, (1, stride), (0, padding))
    return reshape(y, n, o, y.shape[-1])
