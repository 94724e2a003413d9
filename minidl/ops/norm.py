"""Normalization: batch norm, layer norm, group norm, instance norm, RMS norm.

The first four standardize x over some axes and then apply a per-feature
affine map; they differ only in the axes:

    batch norm     over the batch and spatial axes, one statistic per channel
    layer norm     over the trailing ``normalized_shape`` axes of each sample
    group norm     over each group of channels (and space) of each sample
    instance norm  over the spatial axes of each channel of each sample

The standardization is one op, :class:`Normalize`, with the closed-form
gradient; the affine part is ordinary broadcasting arithmetic, except in layer
norm, where standardization and affine map are one op, :class:`LayerNormAffine`
(one node, two new arrays, and its backward one formula). RMS norm only
rescales (no centering): x / √(⟨x²⟩ + ε) · γ over the trailing axes.
"""
from __future__ import annotations

import numpy as np

from minidl import array_kernels
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.reduction import mean
from minidl.ops.shape import broadcast_to, reshape, sum_to
from minidl.tensor import Tensor, as_tensor


def _check_affine(op, weight, bias, expected):
    """Raise a ValueError naming ``op`` unless γ and β (each may be None) have the shape ``expected``."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != tuple(expected):
            raise ValueError(f"{op}: {name} must have shape {tuple(expected)}, got {tuple(p.shape)}")


def _affine(op, y, weight, bias, shape, expected):
    """y · weight + bias, each reshaped to ``shape`` for broadcasting; checked against ``expected``."""
    _check_affine(op, weight, bias, expected)
    if weight is not None:
        y = y * reshape(as_tensor(weight), shape)
    if bias is not None:
        y = y + reshape(as_tensor(bias), shape)
    return y


def _array(value):
    return value.array if isinstance(value, Tensor) else value


def _check_running_stats(op, shape, running_mean, running_var):
    """Each running statistic given holds one value per channel (axis 1 of an input of ``shape``)."""
    channels = shape[1]
    for name, stat in (("running_mean", running_mean), ("running_var", running_var)):
        if stat is not None and tuple(stat.shape) != (channels,):
            raise ValueError(f"{op}: {name} must have shape ({channels},), one value per channel of "
                             f"the input {shape}, got {tuple(stat.shape)}")


def _trailing(axes, ndim) -> int:
    """How many trailing axes ``axes`` names (layer norm's), or 0 when they are not the trailing ones."""
    count = len(axes)
    return count if tuple(a % ndim for a in axes) == tuple(range(ndim - count, ndim)) else 0


def _mean(x, axes):
    """⟨x⟩ over axes, keepdims (trailing axes: one einsum per short row, see minidl.array_kernels)."""
    count = _trailing(axes, x.ndim)
    if count:
        return array_kernels.sum_trailing(x, count) / _size(x, axes)
    return x.mean(axis=axes, keepdims=True)


def _mean_of_product(a, b, axes):
    """⟨a · b⟩ over axes, keepdims, without an a·b temporary where the axes are the trailing ones."""
    count = _trailing(axes, a.ndim)
    if count:
        return array_kernels.dot_trailing(a, b, count) / _size(a, axes)
    return (a * b).mean(axis=axes, keepdims=True)


def _size(x, axes) -> int:
    size = 1
    for a in axes:
        size *= x.shape[a]
    return size


def _standardize(x, axes, eps):
    """(x̂, μ, σ², s) with μ = ⟨x⟩, σ² = ⟨(x − μ)²⟩, s = 1/√(σ² + ε), x̂ = (x − μ) · s over ``axes``.

    One new array: x − μ, scaled in place into x̂. Over trailing axes (layer norm) the
    means are one einsum per row.
    """
    mean = _mean(x, axes)
    centered = x - mean
    var = _mean_of_product(centered, centered, axes)
    inv_std = 1 / xp_of(x).sqrt(var + eps)
    centered *= inv_std
    return centered, mean, var, inv_std


class Normalize(Function):
    """y = x̂ = (x − μ) · s,  μ = ⟨x⟩,  s = 1/√(⟨(x − μ)²⟩ + ε)  (⟨·⟩: mean over ``axes``);
    dx = s · (dy − ⟨dy⟩ − x̂ ⟨dy · x̂⟩)  (a NormalizeGrad).

    The variance is the biased one (divided by n), as every normalization
    layer uses. The backward reuses the saved x̂ and s. Forward writes one new array (x − μ,
    scaled in place into x̂: see _standardize).
    """
    saved_arrays = ("mean", "var", "inv_std")

    def __init__(self, axes, eps):
        self.axes, self.eps = axes, eps

    def forward(self, x):
        x_hat, self.mean, self.var, self.inv_std = _standardize(x, self.axes, self.eps)
        return x_hat

    def backward(self, gy):
        return NormalizeGrad(self.axes, self.eps, self._x_hat(), self.inv_std)(self.inputs[0], gy)

    def jvp(self, dx):
        """ẏ = s · (ẋ − ⟨ẋ⟩ − x̂ ⟨ẋ · x̂⟩)  (the backward's map: the Jacobian is symmetric).

        It follows from ṡ = −s² ⟨x̂ · ẋ⟩ (the variance's tangent is 2⟨(x − μ) ẋ⟩) and
        ẏ = s (ẋ − ⟨ẋ⟩) + (x − μ) ṡ.
        """
        return NormalizeGrad(self.axes, self.eps, self._x_hat(), self.inv_std)(self.inputs[0], dx)

    def _x_hat(self):
        """x̂ as an array: the output, or, when the caller dropped it, recomputed from the saved statistics."""
        x_hat = self.output()
        return (self.inputs[0].array - self.mean) * self.inv_std if x_hat is None else x_hat.array


class NormalizeGrad(Function):
    """Normalize's gradient as an op of (x, dy), with x̂, s and ⟨·⟩ as in Normalize:
    z = s · (dy − ⟨dy⟩ − x̂ ⟨dy · x̂⟩);
    d(dy) = s · (dz − ⟨dz⟩ − x̂ ⟨dz · x̂⟩)  (the map dy → z is symmetric: a NormalizeGrad of dz),
    dx = −s² · (x̂ (⟨dz · (dy − ⟨dy⟩)⟩ − 3 b c) + c (dy − ⟨dy⟩) + b (dz − ⟨dz⟩)),
    with b = ⟨dy · x̂⟩ and c = ⟨dz · x̂⟩.

    dx follows from ∂s/∂x_i = −s² x̂_i / n and ∂⟨u · x̂⟩/∂x_i = s (u_i − ⟨u⟩ − x̂_i ⟨u · x̂⟩) / n.
    The forward uses the x̂ and s that Normalize saved (one new array, changed in place); the
    backward rebuilds them from x with Tensor ops, so that it can be differentiated again.
    """
    saved_arrays = ("x_hat", "inv_std")

    def __init__(self, axes, eps, x_hat, inv_std):
        self.axes, self.eps, self.x_hat, self.inv_std = axes, eps, x_hat, inv_std

    def forward(self, x, gy):
        axes, x_hat = self.axes, self.x_hat
        z = x_hat * _mean_of_product(gy, x_hat, axes)  # x̂ ⟨dy · x̂⟩
        xp_of(z).subtract(gy, z, out=z)
        z -= _mean(gy, axes)
        z *= self.inv_std
        return z

    def backward(self, gz):
        x, gy = self.inputs
        axes = self.axes
        ggy = NormalizeGrad(axes, self.eps, self.x_hat, self.inv_std)(x, gz) if gy.requires_grad else None
        return (self._second_derivative(x, gy, gz) if x.requires_grad else None), ggy

    def jvp(self, dx, dgy):
        """ż = s · (ḋy − ⟨ḋy⟩ − x̂ ⟨ḋy · x̂⟩) + the dx formula of the class with dz replaced by ẋ.

        z is the gradient of the scalar Σ dy · x̂(x) with respect to x, so its
        derivative along x is that scalar's Hessian, symmetric: the map ẋ → ż is the map
        dz → dx, and the dy part is z's own linear map.
        """
        x, gy = self.inputs
        dz = None if dgy is None else NormalizeGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, dgy)
        if dx is not None:
            along_x = self._second_derivative(x, gy, dx)
            dz = along_x if dz is None else dz + along_x
        return dz

    def _second_derivative(self, x, gy, u):
        """−s² · (x̂ (⟨u · (dy − ⟨dy⟩)⟩ − 3 b c) + c (dy − ⟨dy⟩) + b (u − ⟨u⟩)), b = ⟨dy · x̂⟩, c = ⟨u · x̂⟩:
        the Hessian of Σ dy · x̂(x) applied to u, from x with Tensor ops (so it differentiates again)."""
        axes = self.axes
        centered = x - mean(x, axis=axes, keepdims=True)
        inv_std = (mean(centered * centered, axis=axes, keepdims=True) + self.eps) ** -0.5
        x_hat = centered * inv_std
        gy_centered = gy - mean(gy, axis=axes, keepdims=True)
        u_centered = u - mean(u, axis=axes, keepdims=True)
        b = mean(gy * x_hat, axis=axes, keepdims=True)
        c = mean(u * x_hat, axis=axes, keepdims=True)
        e = mean(u * gy_centered, axis=axes, keepdims=True)
        return -(inv_std * inv_std) * (x_hat * (e - 3 * b * c) + c * gy_centered + b * u_centered)


@autocast_to("float32")
def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5) -> Tensor:
    """Batch normalization of x (N, C), (N, C, L) or (N, C, H, W), one statistic per channel.

    Training (or no running statistics): y = (x − μ_B)/√(σ²_B + ε) · γ + β with the
    batch's mean and biased variance, and, in training, the running statistics are
    updated in place (PyTorch's rule, unbiased variance):
        running_mean ← (1 − momentum)·running_mean + momentum·μ_B
        running_var  ← (1 − momentum)·running_var  + momentum·σ²_B · n/(n − 1)
    Evaluation: y = (x − running_mean)/√(running_var + ε) · γ + β.
    ``running_mean``/``running_var`` are Tensors (their ``.array`` is updated) or raw arrays.
    """
    x = as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"batch_norm: input must be (N, C) or (N, C, ...) with a channel axis, "
                         f"got shape {x.shape}")
    channels = x.shape[1]
    _check_running_stats("batch_norm", x.shape, running_mean, running_var)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, channels) + (1,) * (x.ndim - 2)
    if training or running_mean is None or running_var is None:
        count = x.numel() // max(channels, 1)
        if training and count <= 1:
            raise ValueError(f"batch_norm: training needs more than one value per channel to estimate a "
                             f"variance, got input of shape {x.shape}; use a larger batch or eval mode")
        normalize = Normalize(axes, eps)
        y = normalize(x)
        if training:
            _update_running(running_mean, normalize.mean, momentum, 1.0)
            _update_running(running_var, normalize.var, momentum, count / max(count - 1, 1))
    else:
        xp = x.xp
        mean_array = _array(running_mean).reshape(shape).astype(x.dtype, copy=False)
        inv_std = (1 / xp.sqrt(_array(running_var).reshape(shape) + eps)).astype(x.dtype, copy=False)
        y = (x - Tensor(mean_array)) * Tensor(inv_std)
    return _affine("batch_norm", y, weight, bias, shape, (channels,))


def _update_running(stat, batch_value, momentum, correction):
    """stat ← (1 − momentum)·stat + momentum·correction·batch_value, in place."""
    if stat is None:
        return
    array = _array(stat)
    array *= 1 - momentum
    array += (batch_value.reshape(array.shape) * (momentum * correction)).astype(array.dtype, copy=False)


class LayerNormAffine(Function):
    """Layer norm's standardization and affine map as one op of (x, γ, β), γ and β each optional:
    y = x̂ · γ + β,  x̂ = (x − μ) · s as in Normalize, over the trailing ``axes`` (γ and β have their shape);
    dx = s · (g − ⟨g⟩ − x̂ ⟨g · x̂⟩) with g = dy · γ  (a NormalizeGrad of g),
    dγ = Σ dy · x̂  (a LayerNormWeightGrad),  dβ = Σ dy  (Σ: over the leading axes).

    dx is Normalize's gradient of g, since y depends on x only through x̂ and ∂y/∂x̂ = γ.
    Forward writes two new arrays: x − μ, scaled in place into x̂ (kept for backward), and y.
    """
    saved_arrays = ("x_hat", "inv_std")

    def __init__(self, axes, eps, weight=True, bias=True):
        self.axes, self.eps, self.has_weight, self.has_bias = axes, eps, weight, bias
        self.saved_inputs = (0, 1) if weight else (0,)  # x (for the second derivative) and γ; β never

    def forward(self, x, *affine):
        self.x_hat, _, _, self.inv_std = _standardize(x, self.axes, self.eps)
        _, weight, bias = self._split((x,) + affine)
        if weight is None:
            return self.x_hat + bias if bias is not None else self.x_hat.copy()
        y = self.x_hat * weight
        if bias is None:
            return y
        xp = xp_of(y)  # in place unless β is of a wider dtype (then y is of its dtype, as x̂ · γ + β)
        return xp.add(y, bias, out=y) if xp.result_type(y, bias) == y.dtype else y + bias

    def backward(self, gy):
        x, weight, bias = self._split(self.inputs)
        grads = [None if not x.requires_grad else NormalizeGrad(self.axes, self.eps, self.x_hat, self.inv_std)(
            x, gy if weight is None else gy * weight)]
        if weight is not None:
            grads.append(LayerNormWeightGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, gy)
                         if weight.requires_grad else None)
        if bias is not None:
            grads.append(sum_to(gy, bias.shape) if bias.requires_grad else None)
        return tuple(grads)

    def jvp(self, dx, *tangents):
        """ẏ = N'(x)ẋ · γ + x̂ · γ̇ + β̇, with N'(x)ẋ = s · (ẋ − ⟨ẋ⟩ − x̂ ⟨ẋ · x̂⟩) (Normalize's tangent)."""
        x, weight, _ = self._split(self.inputs)
        _, dweight, dbias = self._split((dx,) + tangents)
        y = None
        if dx is not None:
            y = NormalizeGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, dx)
            y = y if weight is None else y * weight
        if dweight is not None:
            y = tangent_sum(y, Normalize(self.axes, self.eps)(x) * dweight)
        if dbias is not None:
            y = tangent_sum(y, broadcast_to(dbias, x.shape) if y is None else dbias)
        return y

    def _split(self, items):
        """(x, γ or None, β or None) from (x, [γ], [β]): inputs, their arrays or their tangents."""
        first, *affine = items
        return first, affine[0] if self.has_weight else None, affine[-1] if self.has_bias else None


class LayerNormWeightGrad(Function):
    """LayerNormAffine's γ gradient as an op of (x, dy), with x̂ and s as Normalize saved them:
    z = Σ dy · x̂  (Σ: over the leading axes, one einsum);
    d(dy) = dz · x̂,  dx = s · (u − ⟨u⟩ − x̂ ⟨u · x̂⟩) with u = dy · dz  (a NormalizeGrad of u).

    z is the gradient of the scalar Σ dz · dy · x̂(x) with respect to dz; its derivative along x
    is Normalize's (symmetric) Jacobian applied to dy · dz. The backward rebuilds x̂ from x
    with a Normalize, so that it can be differentiated again.
    """
    saved_arrays = ("x_hat", "inv_std")

    def __init__(self, axes, eps, x_hat, inv_std):
        self.axes, self.eps, self.x_hat, self.inv_std = axes, eps, x_hat, inv_std

    def forward(self, x, gy):
        features = self.x_hat.shape[self.x_hat.ndim - len(self.axes):]
        rows = self.x_hat.reshape(-1, _size(self.x_hat, self.axes))
        return xp_of(gy).einsum("ri,ri->i", gy.reshape(rows.shape), rows).reshape(features)

    def backward(self, gz):
        x, gy = self.inputs
        gx = (NormalizeGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, gy * gz)
              if x.requires_grad else None)
        return gx, (Normalize(self.axes, self.eps)(x) * gz if gy.requires_grad else None)

    def jvp(self, dx, dgy):
        """ż = Σ ḋy · x̂ + Σ dy · N'(x)ẋ."""
        x, gy = self.inputs
        dz = None if dgy is None else LayerNormWeightGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, dgy)
        if dx is not None:
            along_x = NormalizeGrad(self.axes, self.eps, self.x_hat, self.inv_std)(x, dx)
            dz = tangent_sum(dz, sum_to(gy * along_x, x.shape[x.ndim - len(self.axes):]))
        return dz


@autocast_to("float32")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5) -> Tensor:
    """Layer normalization over the trailing ``normalized_shape`` axes of x (PyTorch's layout).

    y = (x − μ)/√(σ² + ε) · γ + β, μ and σ² over those axes of each sample;
    γ and β have shape ``normalized_shape``. One :class:`LayerNormAffine` (a :class:`Normalize`
    when there is neither γ nor β).
    """
    x = as_tensor(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or x.shape[x.ndim - len(shape):] != shape or len(shape) > x.ndim:
        raise ValueError(f"layer_norm: normalized_shape {shape} must equal the trailing axes of the input, "
                         f"got input of shape {x.shape}")
    _check_affine("layer_norm", weight, bias, shape)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    if weight is None and bias is None:
        return Normalize(axes, eps)(x)
    affine = [as_tensor(p) for p in (weight, bias) if p is not None]
    return LayerNormAffine(axes, eps, weight is not None, bias is not None)(x, *affine)


@autocast_to("float32")
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5) -> Tensor:
    """Group normalization of x (N, C, ...): channels split into ``num_groups`` groups,
    each group of each sample standardized over its channels and spatial positions;
    γ and β have one value per channel (C,).
    """
    x = as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"group_norm: input must be (N, C, ...), got shape {x.shape}")
    channels = x.shape[1]
    if not isinstance(num_groups, int) or num_groups < 1 or channels % num_groups:
        raise ValueError(f"group_norm: num_groups must divide the {channels} channels of the input "
                         f"{x.shape}, got {num_groups!r}")
    grouped = reshape(x, x.shape[0], num_groups, -1)
    y = reshape(Normalize((2,), eps)(grouped), x.shape)
    return _affine("group_norm", y, weight, bias, (1, channels) + (1,) * (x.ndim - 2), (channels,))


@autocast_to("float32")
def instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5) -> Tensor:
    """Instance normalization of x (N, C, ...): each channel of each sample standardized over its
    spatial positions, then a per-channel γ and β (C,).

    use_input_stats (the default): y = (x − μ_nc)/√(σ²_nc + ε) · γ + β, μ_nc and the biased σ²_nc
    over the spatial axes of sample n, channel c; running statistics, when given, are updated
    in place with the average over the batch of each sample's statistics (PyTorch's rule,
    unbiased variance with n = the number of spatial positions):
        running_mean ← (1 − momentum)·running_mean + momentum·⟨μ_nc⟩_n
        running_var  ← (1 − momentum)·running_var  + momentum·⟨σ²_nc⟩_n · n/(n − 1)
    use_input_stats=False: y = (x − running_mean)/√(running_var + ε) · γ + β.
    The standardization is batch norm's :class:`Normalize` over the spatial axes only.
    """
    x = as_tensor(x)
    if x.ndim < 3:
        raise ValueError(f"instance_norm: input must be (N, C, L), (N, C, H, W) or (N, C, ...) with at least "
                         f"one spatial axis, got shape {x.shape}")
    channels = x.shape[1]
    _check_running_stats("instance_norm", x.shape, running_mean, running_var)
    shape = (1, channels) + (1,) * (x.ndim - 2)
    if use_input_stats:
        count = x.numel() // max(x.shape[0] * channels, 1)
        if count <= 1:
            raise ValueError(f"instance_norm: expected more than one spatial position per channel to "
                             f"estimate a variance, got input of shape {x.shape}")
        normalize = Normalize(tuple(range(2, x.ndim)), eps)
        y = normalize(x)
        _update_running(running_mean, normalize.mean.mean(axis=0), momentum, 1.0)
        _update_running(running_var, normalize.var.mean(axis=0), momentum, count / (count - 1))
    else:
        if running_mean is None or running_var is None:
            raise ValueError("instance_norm: use_input_stats=False normalizes with running_mean and "
                             "running_var, got None")
        xp = x.xp
        mean_array = _array(running_mean).reshape(shape).astype(x.dtype, copy=False)
        inv_std = (1 / xp.sqrt(_array(running_var).reshape(shape) + eps)).astype(x.dtype, copy=False)
        y = (x - Tensor(mean_array)) * Tensor(inv_std)
    return _affine("instance_norm", y, weight, bias, shape, (channels,))


@autocast_to("float32")
def rms_norm(x, normalized_shape, weight=None, eps=None) -> Tensor:
    """Root-mean-square normalization over the trailing ``normalized_shape`` axes (Zhang & Sennrich 2019).

    y = x / √(⟨x²⟩ + ε) · γ,  ⟨·⟩ the mean over those axes of each sample, γ of shape
    ``normalized_shape``; no centering and no β. ``eps=None`` takes the machine epsilon
    of x's dtype (PyTorch's default). A composite of differentiable ops: with
    s = (⟨x²⟩ + ε)^(−1/2) and x̂ = x·s, dx = s·(dy·γ − x̂ ⟨dy·γ·x̂⟩).
    """
    x = as_tensor(x)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape):] != shape:
        raise ValueError(f"rms_norm: normalized_shape {shape} must equal the trailing axes of the input, "
                         f"got input of shape {x.shape}")
    if eps is None:
        eps = float(np.finfo(x.dtype).eps) if x.dtype.kind in "fc" else float(np.finfo(np.float32).eps)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    y = x * (mean(x * x, axis=axes, keepdims=True) + eps) ** -0.5
    return _affine("rms_norm", y, weight, None, shape, shape)
