"""Loss functions, with PyTorch's argument order, layouts and reductions.

reduction: "mean" (the default), "sum", or "none" (one loss per sample).

cross_entropy  ℓ_n = −Σ_c A_nc log softmax(x_n)_c, where the target
               distribution A puts (1 − ε)·w_y on the true class y and ε·w_c/C
               on every class c (ε: label smoothing, w: class weights);
               "mean" divides by Σ_n w_{y_n} (by N without weights), as PyTorch.
nll_loss       ℓ_n = −w_{y_n} · logp_{n, y_n}, the same weighted mean.
mse_loss       ℓ = (x − t)²;   l1_loss  ℓ = |x − t|.
binary_cross_entropy_with_logits
               ℓ = (1 − t)·x + (1 + (p − 1)·t)·softplus(−x), p the pos_weight;
               written with softplus, so it is exact for |x| in the thousands.

Class targets are integer arrays (or Tensors) of class indices; inputs are
(N, C) or (N, C, d1, d2, ...) with targets (N,) or (N, d1, d2, ...).
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.activation import SoftmaxGrad, softmax, softplus
from minidl.ops.reduction import mean
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import getitem, reshape, transpose
from minidl.tensor import Tensor, as_tensor

_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """ℓ_n = −Σ_c A_nc log softmax(x_n)_c for logits x (M, C) and a constant target distribution A (M, C);
    dx_n = dℓ_n · (softmax(x_n) · Σ_c A_nc − A_n)   (= softmax − onehot for plain class targets).
    """

    def __init__(self, coefficients):
        self.coefficients = coefficients

    def forward(self, x):
        xp = xp_of(x)
        # Shift by the row maximum before the log-sum-exp: e^(·) ≤ 1, so logits of ±1000
        # stay finite, and subtracting the shift first keeps float32 exact there.
        shifted = x - x.max(axis=1, keepdims=True)
        log_probs = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        self.probs = xp.exp(log_probs)
        # where A is 0 the term is 0, even for a logit masked to −inf (0 · −inf would be NaN)
        used = xp.where(self.coefficients == 0, 0, log_probs)
        return -(self.coefficients * used).sum(axis=1)

    def backward(self, gy):
        return CrossEntropyGrad(self.probs, self.coefficients)(self.inputs[0], gy)


class CrossEntropyGrad(Function):
    """CrossEntropy's gradient as an op of (x, dℓ), with p = softmax(x) (saved by the forward)
    and T_n = Σ_c A_nc:  z_n = dℓ_n · (p_n T_n − A_n);
    d(dℓ)_n = Σ_c dz_nc (p_nc T_n − A_nc),  dx_n = dℓ_n T_n · p_n ⊙ (dz_n − Σ_c dz_nc p_nc)
    (the softmax Jacobian applied to dz: a SoftmaxGrad).
    """

    def __init__(self, probs, coefficients):
        self.probs, self.coefficients = probs, coefficients
        self.totals = coefficients.sum(axis=1, keepdims=True)

    def forward(self, x, gy):
        return gy.reshape(-1, 1) * (self.probs * self.totals - self.coefficients)

    def backward(self, gz):
        x, gy = self.inputs
        totals, coefficients = Tensor(self.totals), Tensor(self.coefficients)
        probs = softmax(x, axis=1)  # an op of x, so this backward can be differentiated again
        gx = reshape(gy, -1, 1) * totals * SoftmaxGrad(1)(probs, gz) if x.requires_grad else None
        ggy = reduce_sum(gz * (probs * totals - coefficients), axis=1) if gy.requires_grad else None
        return gx, ggy


# ---------------------------------------------------------------- argument checks
def _check_reduction(op, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of 'mean', 'sum', 'none', got {reduction!r}")


def _reduce(losses, reduction, denominator=None):
    if reduction == "none":
        return losses
    if reduction == "sum":
        return reduce_sum(losses)
    if denominator is None:
        return mean(losses)
    return reduce_sum(losses) / denominator


def _class_targets(op, x, target):
    """``target`` as an integer array on x's device, checked against x's (N, C, d1, ...) layout."""
    if isinstance(target, Tensor):
        target = target.data
    elif not hasattr(target, "dtype"):
        target = np.asarray(target)
    if target.dtype.kind not in "iu":
        raise TypeError(f"{op}: target has dtype {target.dtype}; pass integer class indices "
                        "(e.g. target.astype('int64')), one class index per sample")
    if x.ndim < 1:
        raise ValueError(f"{op}: input must be (N, C) or (N, C, d1, ...), got a scalar")
    expected = () if x.ndim == 1 else (x.shape[0],) + x.shape[2:]
    if tuple(target.shape) != expected:
        raise ValueError(f"{op}: input of shape {x.shape} needs a target of shape {expected} "
                         f"(one class index per sample), got target of shape {tuple(target.shape)}")
    target = backend.to_device(target, x.device)
    classes = x.shape[0] if x.ndim == 1 else x.shape[1]
    if target.size:
        low, high = int(target.min()), int(target.max())
        if low < 0 or high >= classes:
            bad = low if low < 0 else high
            raise ValueError(f"{op}: target contains class index {bad}, but the input has {classes} classes "
                             f"(valid targets are 0..{classes - 1})")
    return target


def _classes_last(x):
    """(N, C, d1, ...) → (N·d1·..., C): one row of class scores per sample."""
    if x.ndim == 1:
        return reshape(x, 1, -1)
    if x.ndim == 2:
        return x
    axes = (0,) + tuple(range(2, x.ndim)) + (1,)
    return reshape(transpose(x, axes), -1, x.shape[1])


def _class_weights(op, weight, x, classes):
    if weight is None:
        return None
    array = weight.data if isinstance(weight, Tensor) else weight
    array = backend.to_device(array, x.device).astype(x.dtype, copy=False)
    if tuple(array.shape) != (classes,):
        raise ValueError(f"{op}: weight must have one value per class, shape ({classes},), "
                         f"got {tuple(array.shape)}")
    return array


# ---------------------------------------------------------------- classification
def cross_entropy(logits, target, weight=None, label_smoothing=0.0, reduction="mean") -> Tensor:
    """Softmax cross-entropy of logits (N, C) or (N, C, d1, ...) against integer class targets.

    ``weight`` (C,) rescales each class; ``label_smoothing`` ε mixes the one-hot
    target with the uniform distribution: A = (1 − ε)·onehot + ε/C.
    """
    op = "cross_entropy"
    logits = as_tensor(logits)
    _check_reduction(op, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    target = _class_targets(op, logits, target)
    rows = _classes_last(logits)
    count, classes = rows.shape
    flat = target.reshape(-1)
    xp = logits.xp
    w = _class_weights(op, weight, logits, classes)
    picked = xp.arange(count), flat
    coefficients = xp.zeros((count, classes), logits.dtype)
    coefficients[picked] = (1 - label_smoothing) if w is None else (1 - label_smoothing) * w[flat]
    if label_smoothing:
        coefficients += (label_smoothing / classes) if w is None else (label_smoothing / classes) * w
    losses = CrossEntropy(coefficients)(rows)
    if reduction == "none":
        return reshape(losses, target.shape)
    return _reduce(losses, reduction, None if w is None else Tensor(w[flat].sum()))


def nll_loss(log_probs, target, weight=None, reduction="mean") -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C) or (N, C, d1, ...) at integer class targets."""
    op = "nll_loss"
    log_probs = as_tensor(log_probs)
    _check_reduction(op, reduction)
    target = _class_targets(op, log_probs, target)
    rows = _classes_last(log_probs)
    flat = target.reshape(-1)
    xp = log_probs.xp
    losses = -getitem(rows, (xp.arange(rows.shape[0]), flat))
    w = _class_weights(op, weight, log_probs, rows.shape[1])
    if w is not None:
        losses = losses * Tensor(w[flat])
    if reduction == "none":
        return reshape(losses, target.shape)
    return _reduce(losses, reduction, None if w is None else Tensor(w[flat].sum()))


# ---------------------------------------------------------------- regression and binary targets
def _same_shape_target(op, x, target):
    """``target`` as a Tensor of x's dtype (a Tensor target is kept, so it may carry a gradient)."""
    if not isinstance(target, Tensor):
        array = backend.to_device(target if hasattr(target, "dtype") else np.asarray(target), x.device)
        target = Tensor(array.astype(x.dtype, copy=False))
    elif target.dtype.kind != "f":
        target = Tensor(target.data.astype(x.dtype))
    if target.shape != x.shape:
        raise ValueError(f"{op}: input of shape {x.shape} and target of shape {target.shape} differ; they must "
                         "match exactly (broadcasting here usually hides a bug: reshape one of them)")
    return target


def mse_loss(input, target, reduction="mean") -> Tensor:  # noqa: A002 - PyTorch's name
    """Mean squared error: ℓ = (input − target)²;  d input = 2(input − target)."""
    _check_reduction("mse_loss", reduction)
    input = as_tensor(input)
    diff = input - _same_shape_target("mse_loss", input, target)
    return _reduce(diff * diff, reduction)


def l1_loss(input, target, reduction="mean") -> Tensor:  # noqa: A002
    """Mean absolute error: ℓ = |input − target|;  d input = sign(input − target) (0 at 0)."""
    _check_reduction("l1_loss", reduction)
    input = as_tensor(input)
    return _reduce(abs(input - _same_shape_target("l1_loss", input, target)), reduction)


def _optional_constant(value, x):
    if value is None or isinstance(value, Tensor):
        return value
    array = backend.to_device(value if hasattr(value, "dtype") else np.asarray(value), x.device)
    return Tensor(array.astype(x.dtype, copy=False))


def binary_cross_entropy_with_logits(logits, target, weight=None, pos_weight=None,
                                     reduction="mean") -> Tensor:
    """Sigmoid + binary cross-entropy in one stable expression, for targets t in [0, 1].

    ℓ = (1 − t)·x + (1 + (p − 1)·t)·softplus(−x) with p = ``pos_weight`` (broadcast
    over the last axis, one per class); without it ℓ = softplus(x) − t·x.
    ``weight`` rescales each element's loss. dx = σ(x)·(1 + (p − 1)t) − p·t.
    """
    op = "binary_cross_entropy_with_logits"
    _check_reduction(op, reduction)
    logits = as_tensor(logits)
    t = _same_shape_target(op, logits, target)
    pos_weight = _optional_constant(pos_weight, logits)
    if pos_weight is None:
        losses = softplus(logits) - t * logits
    else:
        losses = (1 - t) * logits + (1 + (pos_weight - 1) * t) * softplus(-logits)
    weight = _optional_constant(weight, logits)
    if weight is not None:
        losses = losses * weight
    return _reduce(losses, reduction)
