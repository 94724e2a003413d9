"""Activation modules of the PyTorch vocabulary: SiLU, Mish, SELU, CELU, ReLU6, Hardtanh, Hardswish,
Hardsigmoid, LogSigmoid, Softsign, Softmin, Softplus, GLU, PReLU, LogSoftmax.

Each keeps PyTorch's constructor and calls the function of the same name in
:mod:`minidl.functional` (the math is in :mod:`minidl.ops.activation`). ReLU,
LeakyReLU, ELU, GELU, Tanh, Sigmoid and Softmax live in :mod:`minidl.nn.layers`.
``inplace=True`` writes the result into the input, as in PyTorch, and is refused
(RuntimeError) when the input requires grad while gradients are recorded:
minidl records no in-place op.
"""
from __future__ import annotations

import minidl.functional as F
from minidl.nn import init as initializers
from minidl.nn.layers import check_dtype, empty_parameter
from minidl.nn.module import Module


class _Pointwise(Module):
    """An activation with only PyTorch's ``inplace`` flag."""
    function = None

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def forward(self, x):
        return type(self).function(x, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class SiLU(_Pointwise):
    """y = x σ(x)."""
    function = staticmethod(F.silu)


class Mish(_Pointwise):
    """y = x tanh(softplus(x))."""
    function = staticmethod(F.mish)


class SELU(_Pointwise):
    """y = λ·elu(x, α), α ≈ 1.6733, λ ≈ 1.0507."""
    function = staticmethod(F.selu)


class ReLU6(_Pointwise):
    """y = min(max(x, 0), 6)."""
    function = staticmethod(F.relu6)


class Hardswish(_Pointwise):
    """y = x · min(max(x + 3, 0), 6) / 6."""
    function = staticmethod(F.hardswish)


class Hardsigmoid(_Pointwise):
    """y = min(max(x + 3, 0), 6) / 6."""
    function = staticmethod(F.hardsigmoid)


class CELU(Module):
    """y = x for x > 0, α(e^(x/α) − 1) otherwise."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__()
        if alpha == 0:
            raise ValueError("CELU: alpha cannot be 0 (the formula divides by it)")
        self.alpha, self.inplace = alpha, inplace

    def forward(self, x):
        return F.celu(x, self.alpha, self.inplace)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class Hardtanh(Module):
    """y = min(max(x, min_val), max_val)."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False):
        super().__init__()
        if not max_val > min_val:
            raise ValueError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, x):
        return F.hardtanh(x, self.min_val, self.max_val, self.inplace)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class LogSigmoid(Module):
    """y = ln σ(x), finite for any x."""

    def forward(self, x):
        return F.logsigmoid(x)


class Softsign(Module):
    """y = x / (1 + |x|)."""

    def forward(self, x):
        return F.softsign(x)


class Softplus(Module):
    """y = ln(1 + e^(βx)) / β, and x where βx > threshold."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x):
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class _AlongDim(Module):
    """A softmax-like function along ``dim``; dim=None is allowed for inputs of at most 2 axes
    (the last axis, which is PyTorch's implicit choice there) and refused for more."""
    function = None

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return type(self).function(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Softmin(_AlongDim):
    """y = softmax(−x) along ``dim``."""
    function = staticmethod(F.softmin)


class LogSoftmax(_AlongDim):
    """y = log softmax(x) along ``dim``."""
    function = staticmethod(F.log_softmax)


class GLU(Module):
    """x split in halves a, b along ``dim``;  y = a · σ(b)."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return F.glu(x, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class PReLU(Module):
    """y = x for x > 0, a·x otherwise, with learned slopes a: ``weight`` of shape (num_parameters,),
    one slope shared by all channels (num_parameters=1) or one per channel (axis 1 of the input).

    Initialization (PyTorch's): every slope = ``init`` (0.25). Weight decay on a
    slope pulls it toward 0 (a plain ReLU); PyTorch's docs advise leaving it out.
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None):
        super().__init__()
        if num_parameters <= 0:
            raise ValueError(f"PReLU: num_parameters must be positive, got {num_parameters}")
        check_dtype("PReLU", dtype)
        self.num_parameters, self.init = num_parameters, init
        self.weight = empty_parameter((num_parameters,), device, dtype)
        self.reset_parameters()

    def reset_parameters(self):
        initializers.constant_(self.weight, self.init)

    def forward(self, x):
        return F.prelu(x, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"
