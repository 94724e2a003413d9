"""Normalization layers: BatchNorm1d/2d, BatchRenorm1d/2d, LayerNorm, GroupNorm, InstanceNorm1d/2d, RMSNorm.

Each normalizes with a mean μ and variance σ² taken over some axes, then
scales and shifts per channel (or per feature):

    y = (x − μ) / √(σ² + eps) · γ + β

BatchNorm takes μ, σ² over the batch (and spatial axes) while training and
keeps exponential running averages of them in buffers; in evaluation it uses
those running averages, so one example's output does not depend on the rest
of its batch. LayerNorm takes them over each example's last axes, GroupNorm
over groups of channels of each example, InstanceNorm over each channel of
each example: they behave the same in training and evaluation (InstanceNorm
unless asked to track running statistics). RMSNorm only rescales:
y = x / √(⟨x²⟩ + eps) · γ over the last axes.

BatchRenorm (Ioffe 2017) is batch norm for small or non-i.i.d. batches: while
training it corrects the batch's statistics towards the running ones by
r = σ_B/σ and d = (μ_B − μ)/σ (clipped, and held constant in backward), so
that training sees the same normalization evaluation will use.
"""
from __future__ import annotations

import warnings

import numpy as np

import minidl.functional as F
from minidl import backend
from minidl.autograd import no_grad
from minidl.nn import init
from minidl.nn.layers import check_dtype, empty_parameter
from minidl.nn.module import Module
from minidl.tensor import Tensor


def _affine_parameters(module, shape, affine, bias, device, dtype):
    """weight γ = 1 and bias β = 0 of ``shape`` (β only when ``bias``), or None for both without affine."""
    module.register_parameter("weight", init.ones_(empty_parameter(shape, device, dtype)) if affine else None)
    module.register_parameter("bias", empty_parameter(shape, device, dtype) if affine and bias else None)


def _reset_affine(module):
    if module.weight is not None:
        init.ones_(module.weight)
    if module.bias is not None:
        init.zeros_(module.bias)


def _per_channel_state(module, num_features, eps, momentum, affine, track_running_stats, bias, device, dtype):
    """What batch and instance norm share (PyTorch's ``_NormBase``): the per-channel affine
    parameters and, when tracked, the running statistics, as buffers; then their initial values."""
    if num_features <= 0:
        raise ValueError(f"{type(module).__name__}: num_features must be positive, got {num_features}")
    check_dtype(type(module).__name__, dtype)
    module.num_features, module.eps, module.momentum = num_features, eps, momentum
    module.affine, module.track_running_stats = affine, track_running_stats
    _affine_parameters(module, (num_features,), affine, bias, device, dtype)
    if track_running_stats:
        xp = backend.xp_for(device or "cpu")
        float_type = np.dtype(dtype or np.float32)
        module.register_buffer("running_mean", Tensor(xp.zeros(num_features, float_type)))
        module.register_buffer("running_var", Tensor(xp.ones(num_features, float_type)))
        module.register_buffer("num_batches_tracked", Tensor(xp.zeros((), np.int64)))
    else:
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            module.register_buffer(name, None)
    module.reset_parameters()


class _BatchNorm(Module):
    """Shared by BatchNorm1d, 2d and 3d (they differ only in the input shapes they accept)."""

    input_ndims: tuple = ()
    layouts = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        _per_channel_state(self, num_features, eps, momentum, affine, track_running_stats, bias, device, dtype)

    def reset_running_stats(self):
        if self.track_running_stats:
            self.running_mean.array[...] = 0
            self.running_var.array[...] = 1
            self.num_batches_tracked.array[...] = 0

    def reset_parameters(self):
        self.reset_running_stats()
        _reset_affine(self)

    def forward(self, x):
        if x.ndim not in self.input_ndims or x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}): expected input {self.layouts} with "
                             f"C={self.num_features}, got shape {x.shape}")
        momentum = 0.0 if self.momentum is None else self.momentum
        update = self.training and self.track_running_stats
        if update and self.momentum is None:  # a cumulative average of all batches seen so far
            momentum = 1.0 / (int(self.num_batches_tracked.array) + 1)
        # running_mean/var are None without tracking; with it F.batch_norm updates them in
        # place while training and normalizes with them in evaluation.
        y = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         self.training or not self.track_running_stats, momentum, self.eps)
        if update:
            self.num_batches_tracked.array += 1
        return y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) inputs, per channel C.

    Training: μ, σ² over N (and L); running_mean ← (1 − momentum)·running_mean +
    momentum·μ and running_var likewise with the unbiased batch variance
    (momentum=None: a cumulative average). Evaluation: μ, σ² = the running values.
    Defaults: weight γ = 1, bias β = 0, running_mean 0, running_var 1, eps 1e-5, momentum 0.1.
    """

    input_ndims = (2, 3)
    layouts = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) inputs, per channel C (statistics over N, H, W).

    Training uses the batch's statistics and updates the running averages
    (see BatchNorm1d); evaluation uses the running averages.
    Defaults: weight γ = 1, bias β = 0, running_mean 0, running_var 1, eps 1e-5, momentum 0.1.
    """

    input_ndims = (4,)
    layouts = "(N, C, H, W)"


class _BatchRenorm(_BatchNorm):
    """Shared by BatchRenorm1d and BatchRenorm2d: Ioffe (2017), "Batch Renormalization".

    Training, per channel, with μ_B, σ_B² the batch's mean and (biased) variance,
    σ_B = √(σ_B² + eps), and μ, σ = √(running_var + eps) the running values::

        r = clip(σ_B / σ, 1/r_max, r_max)          held constant in backward (no gradient)
        d = clip((μ_B − μ) / σ, −d_max, d_max)      held constant in backward
        x̂ = (x − μ_B) / σ_B · r + d
        y = γ·x̂ + β
        μ ← μ + momentum·(μ_B − μ);  running_var likewise with the unbiased batch variance

    Where neither clip is active, x̂ = (x − μ)/σ: the output is what evaluation
    (which normalizes with μ, σ, as BatchNorm does) will give, while the gradient
    still flows through μ_B and σ_B scaled by r. r_max = 1, d_max = 0 is exactly
    BatchNorm. The paper starts at those values and relaxes them to 3 and 5;
    ``r_max`` and ``d_max`` are plain attributes, so a schedule may change them.
    It uses a smaller momentum than BatchNorm's so that μ, σ average over many batches.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.01, affine: bool = True,
                 r_max: float = 3.0, d_max: float = 5.0, device=None, dtype=None):
        if not (isinstance(momentum, (int, float)) and 0 < momentum <= 1):
            raise ValueError(f"{type(self).__name__}: momentum must be in (0, 1], got {momentum!r}")
        if not (r_max >= 1 and d_max >= 0):
            raise ValueError(f"{type(self).__name__}: needs r_max >= 1 and d_max >= 0 (r_max=1, d_max=0 is "
                             f"BatchNorm), got r_max={r_max}, d_max={d_max}")
        super().__init__(num_features, eps, momentum, affine, True, device, dtype)
        self.r_max, self.d_max = float(r_max), float(d_max)

    def corrections(self, x):
        """(r, d) for the batch ``x`` as arrays shaped to broadcast over it (see the class docstring)."""
        xp = x.xp
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        data = x.array
        mu_b, sigma_b = data.mean(axis=axes), xp.sqrt(data.var(axis=axes) + self.eps)
        sigma = xp.sqrt(self.running_var.array + self.eps)
        r = xp.clip(sigma_b / sigma, 1 / self.r_max, self.r_max)
        d = xp.clip((mu_b - self.running_mean.array) / sigma, -self.d_max, self.d_max)
        return r.astype(data.dtype).reshape(shape), d.astype(data.dtype).reshape(shape)

    def forward(self, x):
        if x.ndim not in self.input_ndims or x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}): expected input {self.layouts} with "
                             f"C={self.num_features}, got shape {x.shape}")
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        n = x.array.size // self.num_features
        if n < 2:
            raise ValueError(f"{type(self).__name__}: training needs more than one value per channel to take a "
                             f"variance, got input shape {x.shape}")
        axes = (0,) + tuple(range(2, x.ndim))
        r, d = self.corrections(x)
        mu_b = x.mean(dim=axes, keepdim=True)
        centred = x - mu_b
        var_b = (centred * centred).mean(dim=axes, keepdim=True)
        y = centred / (var_b + self.eps).sqrt() * Tensor(r) + Tensor(d)
        shape = (1, self.num_features) + (1,) * (x.ndim - 2)
        if self.weight is not None:
            y = y * self.weight.reshape(shape)
        if self.bias is not None:
            y = y + self.bias.reshape(shape)
        with no_grad():
            m = self.momentum
            self.running_mean.array[...] += m * (mu_b.array.reshape(-1) - self.running_mean.array)
            self.running_var.array[...] += m * (var_b.array.reshape(-1) * (n / (n - 1)) - self.running_var.array)
            self.num_batches_tracked.array += 1
        return y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"r_max={self.r_max}, d_max={self.d_max}")


class BatchRenorm1d(_BatchRenorm):
    """Batch renormalization of (N, C) or (N, C, L) inputs, per channel C (see ``_BatchRenorm``).

    ``BatchRenorm1d(num_features, eps=1e-5, momentum=0.01, affine=True, r_max=3.0, d_max=5.0)``.
    """

    input_ndims = (2, 3)
    layouts = "(N, C) or (N, C, L)"


class BatchRenorm2d(_BatchRenorm):
    """Batch renormalization of (N, C, H, W) inputs, per channel C (see ``_BatchRenorm``).

    ``BatchRenorm2d(num_features, eps=1e-5, momentum=0.01, affine=True, r_max=3.0, d_max=5.0)``.
    """

    input_ndims = (4,)
    layouts = "(N, C, H, W)"


class BatchNorm3d(_BatchNorm):
    """Batch normalization of (N, C, D, H, W) inputs (volumes, videos), per channel C (statistics
    over N, D, H, W); training and evaluation as BatchNorm1d, with its defaults.
    """

    input_ndims = (5,)
    layouts = "(N, C, D, H, W)"


class LayerNorm(Module):
    """Normalization over each example's last axes (``normalized_shape``), the same in training and evaluation.

    μ, σ² over the last len(normalized_shape) axes; y = (x − μ)/√(σ² + eps)·γ + β
    with γ, β of shape normalized_shape. Defaults: γ = 1, β = 0, eps 1e-5.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        check_dtype("LayerNorm", dtype)
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        _affine_parameters(self, self.normalized_shape, elementwise_affine, bias, device, dtype)

    def reset_parameters(self):
        _reset_affine(self)

    def forward(self, x):
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape or x.ndim < n:
            raise ValueError(f"LayerNorm{self.normalized_shape}: the input's last axes must have shape "
                             f"{self.normalized_shape}, got input shape {x.shape}")
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")


class GroupNorm(Module):
    """Normalization over groups of channels of each example: (N, C, ...) with C split into num_groups.

    μ, σ² over each group's channels and all spatial positions; then a per-channel
    γ, β. Independent of the batch size (the same in training and evaluation).
    Defaults: γ = 1, β = 0, eps 1e-5.
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True,
                 device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                             f"num_groups ({num_groups})")
        check_dtype("GroupNorm", dtype)
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        _affine_parameters(self, (num_channels,), affine, bias, device, dtype)

    def reset_parameters(self):
        _reset_affine(self)

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}): expected input (N, C, ...) "
                             f"with C={self.num_channels}, got shape {x.shape}")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, "
                f"bias={self.bias is not None}")


class _InstanceNorm(Module):
    """Shared by InstanceNorm1d, 2d and 3d (they differ only in the input shapes they accept)."""

    batched_ndim = 0
    layouts = ""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device=None, dtype=None, *, bias: bool = True):
        super().__init__()
        _per_channel_state(self, num_features, eps, momentum, affine, track_running_stats, bias, device, dtype)

    reset_running_stats = _BatchNorm.reset_running_stats
    reset_parameters = _BatchNorm.reset_parameters

    def forward(self, x):
        layer = type(self).__name__
        if x.ndim not in (self.batched_ndim - 1, self.batched_ndim):
            raise ValueError(f"{layer}({self.num_features}): expected input {self.layouts}, got shape {x.shape}")
        unbatched = x.ndim == self.batched_ndim - 1
        channels = x.shape[0 if unbatched else 1]
        if channels != self.num_features:
            message = (f"{layer}({self.num_features}): expected {self.num_features} channels (input "
                       f"{self.layouts}), got shape {x.shape}")
            if self.affine or self.track_running_stats:
                raise ValueError(message)
            warnings.warn(message + "; without affine parameters or running statistics num_features is "
                          "not used, so the input is normalized anyway", stacklevel=2)
        if unbatched:
            x = F.reshape(x, (1,) + x.shape)
        # As PyTorch: num_batches_tracked is kept in the state but never counted, and
        # momentum=None means 0 (the running statistics stay as they are), not a cumulative average.
        momentum = 0.0 if self.momentum is None else self.momentum
        y = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            self.training or not self.track_running_stats, momentum, self.eps)
        return F.reshape(y, y.shape[1:]) if unbatched else y

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}")


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) or unbatched (C, L) inputs: each channel of each
    example standardized over its L positions (style transfer, small-batch generators).

    y = (x − μ_nc)/√(σ²_nc + eps) · γ + β, μ_nc and σ²_nc over L. PyTorch's defaults:
    ``affine=False`` (no γ, β) and ``track_running_stats=False`` (the same in training and
    evaluation). With tracking, training updates running_mean/var with the batch average of
    the instance statistics (as BatchNorm, momentum 0.1) and evaluation normalizes with them.
    """

    batched_ndim = 3
    layouts = "(N, C, L) or unbatched (C, L)"


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) or unbatched (C, H, W) inputs: each channel of each
    example standardized over its H·W positions. Defaults and running statistics as InstanceNorm1d.
    """

    batched_ndim = 4
    layouts = "(N, C, H, W) or unbatched (C, H, W)"


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of (N, C, D, H, W) or unbatched (C, D, H, W) inputs: each channel of
    each example standardized over its D·H·W positions. Defaults and running statistics as InstanceNorm1d.
    """

    batched_ndim = 5
    layouts = "(N, C, D, H, W) or unbatched (C, D, H, W)"


class RMSNorm(Module):
    """Root-mean-square normalization over each example's last axes (``normalized_shape``).

    y = x / √(⟨x²⟩ + eps) · γ, ⟨·⟩ over the last len(normalized_shape) axes; no centering and
    no bias (Zhang & Sennrich 2019; the norm of LLaMA-style transformers). ``eps=None`` uses the
    machine epsilon of the input's dtype (PyTorch's default). Default γ = 1.
    """

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True,
                 device=None, dtype=None):
        super().__init__()
        check_dtype("RMSNorm", dtype)
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.register_parameter("weight", init.ones_(empty_parameter(self.normalized_shape, device, dtype))
                                if elementwise_affine else None)

    def reset_parameters(self):
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x):
        n = len(self.normalized_shape)
        if x.ndim < n or x.shape[x.ndim - n:] != self.normalized_shape:
            raise ValueError(f"RMSNorm{self.normalized_shape}: the input's last axes must have shape "
                             f"{self.normalized_shape}, got input shape {x.shape}")
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
