"""Convolution by the fast Fourier transform: the convolution theorem as an op.

A correlation of an image with a kernel is, in the frequency domain, a product: with X and
W the discrete Fourier transforms of the zero-padded image and kernel on the same H × W grid,

    (x ⋆ w)[i, j] = Σ_{p,q} w[p, q] · x[i + p, j + q]  =  IDFT( conj(W) · X )[i, j],

exact for every (i, j) where the kernel does not wrap around the grid's edge, that is for the
whole "valid" output. Summed over input channels, that is a convolution layer:

    y[n, o] = b[o] + IDFT( Σ_c conj(W[o, c]) · X[n, c] ),   cropped to OH × OW.

The cost: three FFTs of O(H·W·log(H·W)) each per image and channel, and a product over the
channels at every frequency (a batched matrix product, one per frequency), against im2col's
N·O·OH·OW·C·KH·KW multiply–adds. The FFT's cost does not depend on the kernel's size, im2col's
grows with KH·KW: small kernels favour im2col (and a tuned BLAS), large kernels on large
images the FFT (Mathieu, Henaff & LeCun 2014, "Fast Training of Convolutional Networks through
FFTs"). ``benchmarks/bench_fft_conv.py`` finds the crossover on this machine
(docs/performance.md).

Stride 1, no dilation, one group, zero padding of at most kernel − 1 on each side (the
input gradient's padding, kernel − 1 − padding, must not be negative). Both gradients are
correlations too, so the backward is this op again: ``dx`` correlates dy with the kernel
flipped and its channel axes swapped, ``dW`` correlates the padded image with dy (a kernel
as large as the output: the FFT does not mind). Every derivative order follows.
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.rearrange import flip
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import pad, reshape, transpose
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ()


def _spectrum_product(xs, ws):
    """Σ_c xs[n, c, f] · ws[o, c, f] for every frequency f: one batched matrix product over the frequencies."""
    xp = xp_of(xs)
    n, c = xs.shape[:2]
    o, grid = ws.shape[0], xs.shape[2:]
    frequencies = grid[0] * grid[1]
    a = xs.reshape(n, c, frequencies).transpose(2, 0, 1)  # (F, N, C)
    b = ws.reshape(o, c, frequencies).transpose(2, 1, 0)  # (F, C, O)
    return xp.matmul(a, b).transpose(1, 2, 0).reshape(n, o, *grid)


class FFTConv2d(Function):
    """y_no = b_o + crop(IDFT(Σ_c conj(DFT(w_oc)) · DFT(x_nc)))  (the 2-D DFT of the padded grid; stride 1);
    dx = conv(dy, flip(w)ᵀ),  dW = conv(xᵀ, dyᵀ)ᵀ,  db = Σ dy  (conv: this op; ᵀ swaps the first two axes).

    The input gradient pads dy by k − 1 − p on each side; the weight gradient pads x by p and takes dy as
    its kernel.
    """

    def __init__(self, padding):
        self.padding = padding  # (rows, columns) of zeros on each side

    def forward(self, x, weight, bias=None):
        xp = xp_of(x)
        (ph, pw), (kh, kw) = self.padding, weight.shape[2:]
        if ph or pw:
            x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        grid = x.shape[2:]
        spectrum = _spectrum_product(xp.fft.rfft2(x, s=grid), xp.fft.rfft2(weight, s=grid).conj())
        y = xp.fft.irfft2(spectrum, s=grid)[..., : grid[0] - kh + 1, : grid[1] - kw + 1]
        y = xp.ascontiguousarray(y, dtype=x.dtype)
        if bias is not None:
            y += bias.reshape(1, -1, 1, 1)
        return y

    def backward(self, gy):
        x, weight = self.inputs[0], self.inputs[1]
        (ph, pw), (kh, kw) = self.padding, weight.shape[2:]
        gx = gw = gb = None
        if x.requires_grad:  # dx[u] = Σ_p dy[u + p_pad − p] w[p]: dy correlated with the flipped kernel
            flipped = transpose(flip(weight, dims=(2, 3)), (1, 0, 2, 3))
            gx = FFTConv2d((kh - 1 - ph, kw - 1 - pw))(gy, flipped)
        if weight.requires_grad:  # dW[o, c, p, q] = Σ_{n,i,j} x_pad[n, c, i + p, j + q] dy[n, o, i, j]
            padded = pad(x, (pw, pw, ph, ph)) if ph or pw else x
            gw = transpose(FFTConv2d((0, 0))(transpose(padded, (1, 0, 2, 3)), transpose(gy, (1, 0, 2, 3))),
                           (1, 0, 2, 3))
        if len(self.inputs) == 3 and self.inputs[2].requires_grad:
            gb = reduce_sum(gy, axis=(0, 2, 3))
        return gx, gw, gb

    def jvp(self, dx, dweight, dbias=None):
        """ẏ = conv(ẋ, W) + conv(x, Ẇ) + ḃ  (y is linear in x, in W and in b)."""
        x, weight = self.inputs[0], self.inputs[1]
        dy = None
        for term in ((dx, weight), (x, dweight)):
            if term[0] is not None and term[1] is not None:
                part = FFTConv2d(self.padding)(*term)
                dy = part if dy is None else dy + part
        if dbias is not None:
            shift = reshape(dbias, 1, -1, 1, 1)
            dy = shift if dy is None else dy + shift
        return dy


def fft_conv2d(x, weight, bias=None, padding=0) -> Tensor:
    """2-D convolution (cross-correlation, as :func:`minidl.functional.conv2d`) computed by FFTs.

    x (N, C, H, W), weight (O, C, KH, KW), bias (O,); ``padding`` an int or a (rows, columns)
    pair of zeros on each side, at most KH − 1 and KW − 1. Stride 1, no dilation, one group: for
    anything else use ``conv2d``. Equal to ``conv2d`` to rounding (the FFT's error grows like
    log(H·W)·ε, not like the number of products). It computes in its inputs' dtype, under autocast
    too (an FFT in 16 bits loses too much), so it is not in autocast's table.
    """
    x, weight = as_tensor(x), as_tensor(weight)
    bias = None if bias is None else as_tensor(bias)
    if x.ndim != 4 or weight.ndim != 4 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"fft_conv2d: expects x (N, C, H, W) and weight (O, C, KH, KW) with the same C, "
                         f"got x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"fft_conv2d: bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(f"fft_conv2d: input is {x.dtype} but weight is {weight.dtype}; convert one of them")
    ph, pw = (padding, padding) if isinstance(padding, int) else tuple(padding)
    kh, kw = weight.shape[2:]
    if not (0 <= ph <= kh - 1 and 0 <= pw <= kw - 1):
        raise ValueError(f"fft_conv2d: padding must be between 0 and kernel − 1 ({kh - 1}, {kw - 1}) on each "
                         f"side, got ({ph}, {pw}); pad x yourself (F.pad) for wider margins")
    if x.shape[2] + 2 * ph < kh or x.shape[3] + 2 * pw < kw:
        raise ValueError(f"fft_conv2d: kernel {kh}×{kw} is larger than the padded image "
                         f"{x.shape[2] + 2 * ph}×{x.shape[3] + 2 * pw}")
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return FFTConv2d((ph, pw))(*inputs)
