"""Convolution and pooling layers: Conv1d, Conv2d, MaxPool2d, AvgPool2d.

Layouts are PyTorch's: inputs (N, C, L) or (N, C, H, W); a Conv2d weight is
(out_channels, in_channels / groups, kH, kW). The arithmetic lives in
:func:`minidl.functional.conv1d` / ``conv2d`` / ``max_pool2d`` / ``avg_pool2d``.
"""
from __future__ import annotations

import math

import minidl.functional as F
from minidl.nn import init
from minidl.nn.layers import check_dtype, empty_parameter, fan_in_uniform_
from minidl.nn.module import Module


def _tuple(value, n: int, name: str, layer: str) -> tuple:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) != n or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{layer}: {name} must be an int or {n} ints, got {value}")
    return value


class _ConvNd(Module):
    """Shared by Conv1d and Conv2d: parameters, default initialization, groups and padding, repr."""

    dims = 0
    conv = None  # F.conv1d or F.conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, device=None, dtype=None):
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
        self.padding = padding if isinstance(padding, str) else _tuple(padding, self.dims, "padding", layer)
        self.dilation = _tuple(dilation, self.dims, "dilation", layer)
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ValueError(f"{layer}: padding must be ints, 'same' or 'valid', got {padding!r}")
        if padding == "same" and any(s != 1 for s in self.stride):
            raise ValueError(f"{layer}: padding='same' needs stride 1 (as in PyTorch), got stride {stride}")
        if any(d != 1 for d in self.dilation):
            raise NotImplementedError(f"{layer}: dilation {dilation} is not supported (only dilation=1); "
                                      "a larger kernel or stride covers a wider field")
        self.weight = empty_parameter((out_channels, in_channels // groups) + self.kernel_size, device, dtype)
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

    def forward(self, x):
        self._check_input(x)
        return self._convolve(type(self).conv, x)

    def _check_input(self, x):
        if x.ndim != self.dims + 2 or x.shape[1] != self.in_channels:
            layout = "(N, C, L)" if self.dims == 1 else "(N, C, H, W)"
            raise ValueError(f"{type(self).__name__}: expected input {layout} with C={self.in_channels}, "
                             f"got shape {x.shape}")

    def _padded(self, x):
        """(input, symmetric padding): 'same' pads the input itself when the kernel is even (unequal sides)."""
        if self.padding == "valid":
            return x, (0,) * self.dims
        if self.padding != "same":
            return x, self.padding
        before = tuple((k - 1) // 2 for k in self.kernel_size)
        after = tuple(k - 1 - b for k, b in zip(self.kernel_size, before))
        if before == after:
            return x, before
        widths = tuple(w for b, a in zip(before[::-1], after[::-1]) for w in (b, a))  # F.pad: last dim first
        return F.pad(x, widths), (0,) * self.dims

    def _convolve(self, conv, x):
        """conv(x, weight, bias, stride, padding), one call per group when groups > 1."""
        x, padding = self._padded(x)
        stride = self.stride if self.dims > 1 else self.stride[0]
        padding = padding if self.dims > 1 else padding[0]
        if self.groups == 1:
            return conv(x, self.weight, self.bias, stride, padding)
        cin, cout = self.in_channels // self.groups, self.out_channels // self.groups
        outs = []
        for g in range(self.groups):  # each group sees its own input channels and owns its own filters
            bias = None if self.bias is None else self.bias[g * cout:(g + 1) * cout]
            outs.append(conv(x[:, g * cin:(g + 1) * cin], self.weight[g * cout:(g + 1) * cout], bias,
                             stride, padding))
        return F.concatenate(outs, axis=1)

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * self.dims:
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * self.dims:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Conv1d(_ConvNd):
    """1-D convolution over (N, C_in, L) → (N, C_out, L_out); weight (C_out, C_in/groups, k).

    L_out = ⌊(L + 2·padding − k) / stride⌋ + 1. ``padding`` may also be 'valid' (0) or
    'same' (stride 1); ``groups`` splits the channels into independent convolutions;
    dilation must be 1.
    Default initialization (PyTorch's): weight kaiming_uniform_(a=√5), i.e.
    U(−1/√fan_in, 1/√fan_in) with fan_in = C_in/groups · k; bias from the same range.
    """

    dims = 1
    conv = staticmethod(F.conv1d)


class Conv2d(_ConvNd):
    """2-D convolution over (N, C_in, H, W) → (N, C_out, H_out, W_out); weight (C_out, C_in/groups, kH, kW).

    H_out = ⌊(H + 2·padding − kH) / stride⌋ + 1 (W likewise). ``padding`` may also be
    'valid' (0) or 'same' (stride 1); ``groups`` splits the channels into independent
    convolutions; dilation must be 1.
    Default initialization (PyTorch's): weight kaiming_uniform_(a=√5), i.e.
    U(−1/√fan_in, 1/√fan_in) with fan_in = C_in/groups · kH · kW; bias from the same range.
    """

    dims = 2
    conv = staticmethod(F.conv2d)


class _Pool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, **unsupported):
        super().__init__()
        layer = type(self).__name__
        for name, (value, default) in unsupported.items():
            if value != default:
                raise NotImplementedError(f"{layer}: {name}={value!r} is not supported (only {name}={default!r})")
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride  # PyTorch: stride defaults to the kernel
        self.padding = padding
        _tuple(kernel_size, 2, "kernel_size", layer)
        _tuple(self.stride, 2, "stride", layer)
        _tuple(padding, 2, "padding", layer)

    def forward(self, x):
        self._check_input(x)
        return self._convolve(type(self).conv, x)

    def _check_input(self, x):
        if x.ndim != 4:
            raise ValueError(f"{type(self).__name__}: expected input (N, C, H, W), got shape {x.shape}")

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """y = the maximum over each kernel_size window, moved by ``stride`` (default: kernel_size).

    Padding adds −∞ borders (they never win the maximum). No parameters. PyTorch's
    dilation, return_indices and ceil_mode are accepted at their defaults only.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__(kernel_size, stride, padding, dilation=(dilation, 1),
                         return_indices=(return_indices, False), ceil_mode=(ceil_mode, False))

    def forward(self, x):
        self._check_input(x)
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    """y = the mean over each kernel_size window, moved by ``stride`` (default: kernel_size).

    Zero padding counts in the mean (PyTorch's count_include_pad=True). No parameters.
    PyTorch's ceil_mode and count_include_pad are accepted at their defaults only.
    """

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode=(ceil_mode, False),
                         count_include_pad=(count_include_pad, True))

    def forward(self, x):
        self._check_input(x)
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding)
