"""Convolution layers: Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d.

Layouts are PyTorch's: inputs (N, C, L), (N, C, H, W) or (N, C, D, H, W); a Conv2d weight is
(out_channels, in_channels / groups, kH, kW), a ConvTranspose2d weight
(in_channels, out_channels / groups, kH, kW). The arithmetic lives in
:func:`minidl.functional.conv2d` / ``conv_transpose2d`` (and the 1-D forms).
The pooling layers live in :mod:`minidl.nn.pooling` (importable from here too).
"""
from __future__ import annotations

import math

import minidl.functional as F
from minidl.nn import init
from minidl.nn.layers import check_dtype, empty_parameter, fan_in_uniform_
from minidl.nn.module import Module
from minidl.nn.pooling import AvgPool2d, MaxPool2d  # noqa: F401 - their old import path

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _tuple(value, n: int, name: str, layer: str) -> tuple:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{layer}: {name} must be an int or {n} ints, got {value}")
    return value


class _ConvNd(Module):
    """Shared by the convolution layers: parameters, default initialization, arguments, repr."""

    dims = 0
    transposed = False

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None,
                 output_padding=0):
        super().__init__()
        layer = type(self).__name__
        if in_channels <= 0 or out_channels <= 0:
            raise ValueError(f"{layer}: channel counts must be positive, got {in_channels}, {out_channels}")
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{layer}: in_channels ({in_channels}) and out_channels ({out_channels}) "
                             f"must both be divisible by groups ({groups})")
        check_dtype(layer, dtype)
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _tuple(kernel_size, self.dims, "kernel_size", layer)
        self.stride = _tuple(stride, self.dims, "stride", layer)
        self.dilation = _tuple(dilation, self.dims, "dilation", layer)
        self.output_padding = _tuple(output_padding, self.dims, "output_padding", layer)
        if isinstance(padding, str):
            if self.transposed or padding not in ("same", "valid"):
                allowed = "ints" if self.transposed else "ints, 'same' or 'valid'"
                raise ValueError(f"{layer}: padding must be {allowed}, got {padding!r}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{layer}: padding='same' needs stride 1 (as in PyTorch), got stride {stride}")
            self.padding = padding
        else:
            self.padding = _tuple(padding, self.dims, "padding", layer)
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"{layer}: padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        if padding_mode != "zeros":
            raise NotImplementedError(
                f"{layer}: padding_mode={padding_mode!r} is not implemented (only 'zeros'); pad the input "
                f"yourself with F.pad(x, ..., mode={padding_mode!r}) and use padding=0")
        self.padding_mode = padding_mode
        shape = (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        self.weight = empty_parameter(shape + self.kernel_size, device, dtype)
        if bias:
            self.bias = empty_parameter((out_channels,), device, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            fan_in_uniform_(self.bias, fan_in)

    def _check_input(self, x):
        if x.ndim != self.dims + 2 or x.shape[1] != self.in_channels:
            layout = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}[self.dims]
            raise ValueError(f"{type(self).__name__}: expected input {layout} with C={self.in_channels}, "
                             f"got shape {x.shape}")

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * self.dims:
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.output_padding != (0,) * self.dims:
            text += f", output_padding={self.output_padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class _Conv(_ConvNd):
    conv = None  # F.conv1d or F.conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype)

    def forward(self, x):
        self._check_input(x)
        return type(self).conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv1d(_Conv):
    """1-D convolution over (N, C_in, L) → (N, C_out, L_out); weight (C_out, C_in/groups, k).

    L_out = ⌊(L + 2·padding − dilation·(k − 1) − 1) / stride⌋ + 1. ``padding`` may also be
    'valid' (0) or 'same' (stride 1); ``groups`` splits the channels into independent
    convolutions (groups = C_in: depthwise); only padding_mode='zeros' is implemented.
    Default initialization (PyTorch's): weight kaiming_uniform_(a=√5), i.e.
    U(−1/√fan_in, 1/√fan_in) with fan_in = C_in/groups · k; bias from the same range.
    """

    dims = 1
    conv = staticmethod(F.conv1d)


class Conv2d(_Conv):
    """2-D convolution over (N, C_in, H, W) → (N, C_out, H_out, W_out); weight (C_out, C_in/groups, kH, kW).

    H_out = ⌊(H + 2·padding − dilation·(kH − 1) − 1) / stride⌋ + 1 (W likewise). ``padding`` may
    also be 'valid' (0) or 'same' (stride 1); ``groups`` splits the channels into independent
    convolutions (groups = C_in: depthwise); only padding_mode='zeros' is implemented.
    Default initialization (PyTorch's): weight kaiming_uniform_(a=√5), i.e.
    U(−1/√fan_in, 1/√fan_in) with fan_in = C_in/groups · kH · kW; bias from the same range.
    """

    dims = 2
    conv = staticmethod(F.conv2d)


class Conv3d(_Conv):
    """3-D convolution over (N, C_in, D, H, W) → (N, C_out, D_out, H_out, W_out); weight
    (C_out, C_in/groups, kD, kH, kW).

    D_out = ⌊(D + 2·padding − dilation·(kD − 1) − 1) / stride⌋ + 1 (H, W likewise); padding,
    groups and the default initialization as Conv2d (fan_in = C_in/groups · kD · kH · kW).
    """

    dims = 3
    conv = staticmethod(F.conv3d)


class _ConvTranspose(_ConvNd):
    transposed = True
    conv = None  # F.conv_transpose1d or F.conv_transpose2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, padding_mode: str = "zeros", device=None,
                 dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device, dtype, output_padding)

    def _output_padding(self, x, output_size):
        """The output_padding that gives ``output_size`` (PyTorch's rule: within a stride of the smallest)."""
        if output_size is None:
            return self.output_padding
        wanted = tuple(output_size)[-self.dims:]
        smallest = tuple((n - 1) * s - 2 * p + d * (k - 1) + 1 for n, s, p, d, k in zip(
            x.shape[2:], self.stride, self.padding, self.dilation, self.kernel_size))
        extra = tuple(w - m for w, m in zip(wanted, smallest))
        if len(wanted) != self.dims or any(not 0 <= e < s for e, s in zip(extra, self.stride)):
            largest = tuple(m + s - 1 for m, s in zip(smallest, self.stride))
            raise ValueError(f"{type(self).__name__}: output_size {tuple(output_size)} must lie between "
                             f"{smallest} and {largest} for an input of shape {x.shape}")
        return extra

    def forward(self, x, output_size=None):
        self._check_input(x)
        output_padding = self._output_padding(x, output_size)
        return type(self).conv(x, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups,
                               self.dilation)


class ConvTranspose1d(_ConvTranspose):
    """Transposed 1-D convolution (N, C_in, L) → (N, C_out, L_out); weight (C_in, C_out/groups, k).

    L_out = (L − 1)·stride − 2·padding + dilation·(k − 1) + output_padding + 1; the adjoint
    (input gradient) of a Conv1d with the same arguments. ``forward(x, output_size)`` picks
    output_padding from a wanted size. Default initialization (PyTorch's):
    kaiming_uniform_(a=√5) on the weight, whose fan_in is C_out/groups · k; bias U(±1/√fan_in).
    """

    dims = 1
    conv = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTranspose):
    """Transposed 2-D convolution (N, C_in, H, W) → (N, C_out, H_out, W_out); weight (C_in, C_out/groups, kH, kW).

    H_out = (H − 1)·stride − 2·padding + dilation·(kH − 1) + output_padding + 1 (W likewise);
    the adjoint (input gradient) of a Conv2d with the same arguments, used to upsample.
    ``forward(x, output_size)`` picks output_padding from a wanted size. Default
    initialization (PyTorch's): kaiming_uniform_(a=√5) on the weight, whose fan_in is
    C_out/groups · kH · kW; bias U(±1/√fan_in).
    """

    dims = 2
    conv = staticmethod(F.conv_transpose2d)


class ConvTranspose3d(_ConvTranspose):
    """Transposed 3-D convolution (N, C_in, D, H, W) → (N, C_out, D_out, H_out, W_out); weight
    (C_in, C_out/groups, kD, kH, kW).

    D_out = (D − 1)·stride − 2·padding + dilation·(kD − 1) + output_padding + 1 (H, W likewise);
    the adjoint of a Conv3d with the same arguments; ``output_size`` and initialization as
    ConvTranspose2d.
    """

    dims = 3
    conv = staticmethod(F.conv_transpose3d)
