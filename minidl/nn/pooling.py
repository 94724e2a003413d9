"""Pooling layers: max, average, unpooling and adaptive pooling, in 1-D and 2-D (max and average in 3-D).

None has parameters; each stores PyTorch's constructor arguments and calls
the function of the same name in :mod:`minidl.functional` (see
:mod:`minidl.ops.pool` for the math). Inputs are (N, C, L), (N, C, H, W) or (N, C, D, H, W).
"""
from __future__ import annotations

import minidl.functional as F
from minidl.nn.module import Module


class _Pool(Module):
    dims = 2

    def _check_input(self, x):
        if x.ndim != self.dims + 2:
            layout = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}[self.dims]
            raise ValueError(f"{type(self).__name__}: expected input {layout}, got shape {x.shape}")

    def extra_repr(self):
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self._shown)


class _MaxPool(_Pool):
    _shown = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride  # PyTorch: stride defaults to the kernel
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        self._check_input(x)
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[self.dims]
        return pool(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices)


class MaxPool1d(_MaxPool):
    """y[n, c, i] = max_p x_pad[n, c, i·stride + p·dilation] over windows of kernel_size (−∞ padding).

    ``stride`` defaults to kernel_size; ``ceil_mode`` keeps a last partial window;
    ``return_indices`` also returns each maximum's position along L (for MaxUnpool1d).
    """

    dims = 1


class MaxPool2d(_MaxPool):
    """y = the maximum over each kernel_size window, moved by ``stride`` (default: kernel_size).

    Padding adds −∞ borders (they never win the maximum); ``dilation`` spaces the
    window's taps; ``ceil_mode`` keeps last partial windows; ``return_indices`` also
    returns each maximum's flat position in its (H, W) plane (for MaxUnpool2d).
    """

    dims = 2


class MaxPool3d(_MaxPool):
    """y = the maximum over each kernel_size window of a volume (N, C, D, H, W), moved by ``stride``
    (default: kernel_size); padding, dilation and ceil_mode as MaxPool2d (``return_indices`` is
    not supported in 3-D).
    """

    dims = 3


class _AvgPool(_Pool):
    _shown = ("kernel_size", "stride", "padding")

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, x):
        self._check_input(x)
        if self.dims == 1:
            return F.avg_pool1d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                                self.count_include_pad)
        pool = F.avg_pool2d if self.dims == 2 else F.avg_pool3d
        return pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                    self.divisor_override)


class AvgPool1d(_AvgPool):
    """y = the mean over each window of kernel_size along L (divisor rules as AvgPool2d)."""

    dims = 1

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad)


class AvgPool2d(_AvgPool):
    """y = the mean over each kernel_size window, moved by ``stride`` (default: kernel_size).

    Zero padding counts in the mean unless ``count_include_pad=False``; ``ceil_mode`` keeps
    last partial windows (divided by what they cover of the padded input);
    ``divisor_override`` replaces every divisor. No parameters.
    """

    dims = 2


class AvgPool3d(_AvgPool):
    """y = the mean over each kernel_size window of a volume (N, C, D, H, W); padding, ceil_mode,
    count_include_pad and divisor_override as AvgPool2d. No parameters.
    """

    dims = 3


class _MaxUnpool(_Pool):
    _shown = ("kernel_size", "stride", "padding")

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding = padding

    def forward(self, x, indices, output_size=None):
        self._check_input(x)
        unpool = F.max_unpool1d if self.dims == 1 else F.max_unpool2d
        return unpool(x, indices, self.kernel_size, self.stride, self.padding, output_size)


class MaxUnpool1d(_MaxUnpool):
    """The partial inverse of MaxPool1d: ``forward(x, indices)`` puts each value back at its index, zeros elsewhere."""

    dims = 1


class MaxUnpool2d(_MaxUnpool):
    """The partial inverse of MaxPool2d: ``forward(x, indices, output_size=None)`` puts each value at its
    flat index in the (H_out, W_out) plane, zeros elsewhere; H_out = (H − 1)·stride − 2·padding + kernel.
    """

    dims = 2


class _Adaptive(_Pool):
    _shown = ("output_size",)

    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices


class AdaptiveAvgPool1d(_Adaptive):
    """Mean over L/O-sized bins so that the output is (N, C, output_size)."""

    dims = 1

    def __init__(self, output_size):
        super().__init__(output_size)

    def forward(self, x):
        self._check_input(x)
        return F.adaptive_avg_pool1d(x, self.output_size)


class AdaptiveAvgPool2d(_Adaptive):
    """Mean over bins so that the output is (N, C, OH, OW); ``output_size`` = 1 is global average pooling.

    Bin (i, j) covers rows ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉ − 1 and likewise columns (PyTorch's bins);
    an entry None keeps that input size.
    """

    dims = 2

    def __init__(self, output_size):
        super().__init__(output_size)

    def forward(self, x):
        self._check_input(x)
        return F.adaptive_avg_pool2d(x, self.output_size)


class AdaptiveMaxPool1d(_Adaptive):
    """Max over adaptive bins of L so that the output is (N, C, output_size); ``return_indices`` as MaxPool1d."""

    dims = 1

    def forward(self, x):
        self._check_input(x)
        return F.adaptive_max_pool1d(x, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_Adaptive):
    """Max over the bins of AdaptiveAvgPool2d; ``return_indices`` as MaxPool2d."""

    dims = 2

    def forward(self, x):
        self._check_input(x)
        return F.adaptive_max_pool2d(x, self.output_size, self.return_indices)
