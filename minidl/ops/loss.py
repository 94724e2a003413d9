"""Loss functions, with PyTorch's names, keywords, layouts and reductions.

reduction: "mean" (the default), "sum", or "none" (one loss per sample);
kl_div also takes "batchmean". The keywords after the first few positions
are keyword-only (PyTorch's deprecated ``size_average`` and ``reduce`` sit
there), so a positional PyTorch call fails loudly instead of meaning
something else.

cross_entropy  ℓ_n = −Σ_c A_nc log softmax(x_n)_c, where the target
               distribution A puts (1 − ε)·w_y on the true class y and ε·w_c/C
               on every class c (ε: label smoothing, w: class weights);
               "mean" divides by Σ_n w_{y_n} over the samples not ignored
               (by their count without weights), as PyTorch. With class
               probabilities t as the target, A = w ⊙ ((1 − ε)·t + ε/C) and
               "mean" divides by the number of samples.
nll_loss       ℓ_n = −w_{y_n} · logp_{n, y_n}, the same weighted mean.
binary_cross_entropy
               ℓ = −(t·max(ln x, −100) + (1 − t)·max(ln(1 − x), −100)) for
               probabilities x (PyTorch's clamp keeps ℓ finite at 0 and 1).
binary_cross_entropy_with_logits
               ℓ = (1 − t)·x + (1 + (p − 1)·t)·softplus(−x), p the pos_weight;
               written with softplus, so it is exact for |x| in the thousands.
kl_div         ℓ = t·(ln t − x) for log-probabilities x (0 where t = 0), or
               eᵗ·(t − x) with log_target=True.
mse_loss       ℓ = (x − t)²;   l1_loss  ℓ = |x − t|;   with ``weight`` w,
               "mean" is Σ w ℓ / Σ w, as PyTorch (huber_loss: Σ w ℓ / count).
smooth_l1_loss ℓ = ½d²/β where |d| < β, else |d| − ½β  (d = x − t).
huber_loss     ℓ = ½d² where |d| < δ, else δ·(|d| − ½δ)  (β · smooth_l1).
one_hot        the class indices as int64 rows of 0s and a 1 (no gradient).

Class targets are integer arrays (or Tensors) of class indices; inputs are
(N, C) or (N, C, d1, d2, ...) with targets (N,) or (N, d1, d2, ...).
Samples whose target is ``ignore_index`` (default −100) add nothing.
"""
from __future__ import annotations

import numpy as np

from minidl import array_kernels, backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.activation import SoftmaxGrad, log_softmax, softmax, softplus
from minidl.ops.elementwise import clamp, exp, log, maximum, where
from minidl.ops.reduction import mean
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import GetItem, reshape, transpose
from minidl.tensor import Tensor, as_tensor

_REDUCTIONS = ("mean", "sum", "none")
# PyTorch's floor on x(1 − x) in binary_cross_entropy's gradient: finite at x = 0 and x = 1.
_BCE_EPSILON = 1e-12


# ---------------------------------------------------------------- argument checks
def _check_reduction(op, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        names = ", ".join(repr(r) for r in allowed)
        raise ValueError(f"{op}: reduction must be one of {names}, got {reduction!r}")


def _reduce(losses, reduction, denominator=None):
    if reduction == "none":
        return losses
    if reduction == "sum":
        return reduce_sum(losses)
    if denominator is None:
        return mean(losses)
    with np.errstate(invalid="ignore"):  # every sample ignored: 0/0 = NaN, as PyTorch
        return reduce_sum(losses) / denominator


def _as_array(value):
    if isinstance(value, Tensor):
        return value.array
    return value if hasattr(value, "dtype") else np.asarray(value)


def _class_targets(op, x, target, ignore_index=None):
    """``target`` as an integer array on x's device, checked against x's (N, C, d1, ...) layout,
    and the mask of the samples not ignored (None when none is)."""
    target = _as_array(target)
    if target.dtype.kind not in "iu":
        probabilities = f", or class probabilities of the input's shape {x.shape}" if op == "cross_entropy" else ""
        raise TypeError(f"{op}: target has dtype {target.dtype} and shape {tuple(target.shape)} (the input "
                        f"has shape {x.shape}); pass integer class indices "
                        f"(e.g. target.astype('int64')), one class index per sample{probabilities}")
    if x.ndim < 1:
        raise ValueError(f"{op}: input must be (N, C) or (N, C, d1, ...), got a scalar")
    expected = () if x.ndim == 1 else (x.shape[0],) + x.shape[2:]
    if tuple(target.shape) != expected:
        raise ValueError(f"{op}: input of shape {x.shape} needs a target of shape {expected} "
                         f"(one class index per sample), got target of shape {tuple(target.shape)}")
    # Checked where the target is: on the host before the copy (free), on a GPU without a
    # synchronization (backend.check_range reports at the next host read).
    on_host = backend.xp_of(target) is np
    keep = None
    if ignore_index is not None:
        keep = target != ignore_index
        if on_host and bool(keep.all()):
            keep = None
    classes = x.shape[0] if x.ndim == 1 else x.shape[1]
    checked = target if keep is None else target[keep] if on_host else backend.xp_of(target).where(keep, target, 0)
    backend.check_range(checked, 0, classes - 1, lambda low, high: (
        f"{op}: target contains class index {low if low < 0 else high}, but the input has {classes} classes "
        f"(valid targets are 0..{classes - 1}, or ignore_index={ignore_index})"))
    target = backend.to_device(target, x.device)
    keep = None if keep is None else backend.to_device(keep, x.device)
    return target, keep


def _classes_last(x):
    """(N, C, d1, ...) → (N·d1·..., C): one row of class scores per sample (a Tensor or an array)."""
    if x.ndim == 1:
        return x.reshape(1, -1) if not isinstance(x, Tensor) else reshape(x, 1, -1)
    if x.ndim == 2:
        return x
    axes = (0,) + tuple(range(2, x.ndim)) + (1,)
    if not isinstance(x, Tensor):
        return x.transpose(axes).reshape(-1, x.shape[1])
    return reshape(transpose(x, axes), -1, x.shape[1])


def _class_weights(op, weight, x, classes):
    if weight is None:
        return None
    array = weight.array if isinstance(weight, Tensor) else weight
    array = backend.to_device(array, x.device).astype(x.dtype, copy=False)
    if tuple(array.shape) != (classes,):
        raise ValueError(f"{op}: weight must have one value per class, shape ({classes},), "
                         f"got {tuple(array.shape)}")
    return array


def _class_denominator(w, flat, keep, dtype):
    """What "mean" divides by: Σ w_{y_n} (or the count) over the samples not ignored; None for a plain mean."""
    if w is None and keep is None:
        return None
    xp = xp_of(flat)
    used = w[flat] if w is not None else xp.ones(flat.shape, dtype)
    if keep is not None:
        used = used * keep.reshape(-1)
    return Tensor(used.sum(dtype=dtype))


def _is_probabilities(target, x):
    """A floating-point target of the input's own shape holds class probabilities (PyTorch's rule)."""
    return getattr(target, "dtype", np.dtype(int)).kind == "f" and tuple(target.shape) == x.shape


# ---------------------------------------------------------------- classification
class ClassTargets(Function):
    """A_nc = w_{y_n}·((1 − ε)·[c = y_n]) + ε·w_c/C, a zero row where y_n is ``ignore_index``, from
    class indices y (any shape, flattened to M rows): cross_entropy's target distribution, and,
    when the mean is weighted or skips samples, its denominator Σ_n w_{y_n} over the kept samples.

    An op of the targets (not a constructor argument of CrossEntropy) so that a traced step
    (:mod:`minidl.tracing`) computes it from each new batch. No gradient flows to class indices.
    ``masks``: whether some sample was found ignored when the call was made (on the host); a
    replay that meets an ignored sample where its recording met none raises, since the mean's
    denominator would change.
    """
    saved_inputs = ()
    saved_arrays = ("weight",)

    def __init__(self, classes, dtype, smoothing, ignore_index, weight, masks):
        self.classes, self.dtype, self.smoothing = classes, dtype, smoothing
        self.ignore_index, self.weight, self.masks = ignore_index, weight, masks

    def forward(self, target):
        xp, w, eps, classes = xp_of(target), self.weight, self.smoothing, self.classes
        flat = target.reshape(-1)
        keep = None
        if self.masks:
            keep = flat != self.ignore_index
            flat = xp.where(keep, flat, 0)  # an ignored sample picks class 0, then its row is zeroed
        elif self.ignore_index is not None and xp is np and bool((flat == self.ignore_index).any()):
            raise RuntimeError(f"cross_entropy: this batch has targets equal to ignore_index={self.ignore_index} "
                               "but the traced step was recorded on a batch without any, so its mean divides "
                               "by the wrong count; record it on such a batch, or run it eagerly")
        count = flat.shape[0]
        coefficients = xp.zeros((count, classes), self.dtype)
        coefficients[xp.arange(count), flat] = (1 - eps) if w is None else (1 - eps) * w[flat]
        if eps:
            coefficients += (eps / classes) if w is None else (eps / classes) * w
        if keep is not None:
            coefficients *= keep.reshape(-1, 1)
        if w is None and keep is None:
            return coefficients
        return coefficients, _class_denominator(w, flat, keep, self.dtype).array

    def jvp(self, dt):
        """No tangent: the distribution is piecewise constant in the class indices (it has no backward
        either: no gradient reaches integer targets)."""
        return None


class CrossEntropy(Function):
    """ℓ_n = −Σ_c A_nc log softmax(x_n)_c for logits x (M, C) and a target distribution A (M, C),
    an input that gets no gradient;  dx_n = dℓ_n · (softmax(x_n) · Σ_c A_nc − A_n)
    (= softmax − onehot for plain class targets).

    ``target`` is the Tensor A was made from (class indices or probabilities): backward
    does not read it, but PyTorch's does, so a change to it in place is refused alike.
    """
    saved_arrays = ("probs",)

    def __init__(self, target=None):
        self.saved_indices = () if target is None else (target,)

    def forward(self, x, coefficients):
        xp = xp_of(x)
        # Shift by the row maximum before the log-sum-exp: e^(·) ≤ 1, so logits of ±1000
        # stay finite, and subtracting the shift first keeps float32 exact there. One exp:
        # the probabilities are e / Σe, the log-probabilities shifted − ln Σe (in place).
        log_probs = x - x.max(axis=1, keepdims=True)
        self.probs = xp.exp(log_probs)
        total = array_kernels.sum_trailing(self.probs, 1)
        self.probs /= total
        log_probs -= xp.log(total)
        # where A is 0 the term is 0, even for a logit masked to −inf (0 · −inf would be NaN)
        used = xp.where(coefficients == 0, 0, log_probs)
        return -array_kernels.dot_trailing(coefficients, used, 1)[:, 0]

    def backward(self, gy):
        x, coefficients = self.inputs
        return CrossEntropyGrad(self.probs)(x, gy, coefficients), None

    def jvp(self, dx, dcoefficients=None):
        """ℓ̇_n = Σ_c ẋ_nc (softmax(x_n)_c · Σ_c' A_nc' − A_nc)   (the same row, dotted with the tangent)."""
        if dx is None:
            return None
        x, coefficients = self.inputs
        probs = softmax(x, axis=1)  # an op of x, so this rule can be differentiated again
        return reduce_sum(dx * (probs * reduce_sum(coefficients, axis=1, keepdims=True) - coefficients), axis=1)


class CrossEntropyGrad(Function):
    """CrossEntropy's gradient as an op of (x, dℓ, A), with p = softmax(x) (saved by the forward)
    and T_n = Σ_c A_nc:  z_n = dℓ_n · (p_n T_n − A_n);
    d(dℓ)_n = Σ_c dz_nc (p_nc T_n − A_nc),  dx_n = dℓ_n T_n · p_n ⊙ (dz_n − Σ_c dz_nc p_nc)
    (the softmax Jacobian applied to dz: a SoftmaxGrad); A gets no gradient.
    """
    saved_arrays = ("probs",)

    def __init__(self, probs):
        self.probs = probs

    def forward(self, x, gy, coefficients):
        z = self.probs * coefficients.sum(axis=1, keepdims=True)
        z -= coefficients
        z *= gy.reshape(-1, 1)
        return z

    def backward(self, gz):
        x, gy, coefficients = self.inputs
        totals = reduce_sum(coefficients, axis=1, keepdims=True)
        probs = softmax(x, axis=1)  # an op of x, so this backward can be differentiated again
        gx = reshape(gy, -1, 1) * totals * SoftmaxGrad(1)(probs, gz) if x.requires_grad else None
        ggy = reduce_sum(gz * (probs * totals - coefficients), axis=1) if gy.requires_grad else None
        return gx, ggy, None

    def jvp(self, dx, dgy, dcoefficients=None):
        """ż_n = ḋℓ_n · (p_n T_n − A_n) + dℓ_n T_n · p_n ⊙ (ẋ_n − Σ_c ẋ_nc p_nc)
        (ṗ: the softmax Jacobian on ẋ)."""
        x, gy, coefficients = self.inputs
        totals = reduce_sum(coefficients, axis=1, keepdims=True)
        probs = softmax(x, axis=1)
        dz = None if dgy is None else reshape(dgy, -1, 1) * (probs * totals - coefficients)
        if dx is not None:
            along_x = reshape(gy, -1, 1) * totals * SoftmaxGrad(1)(probs, dx)
            dz = along_x if dz is None else dz + along_x
        return dz


@autocast_to("float32")
def cross_entropy(input, target, weight=None, *, ignore_index=-100, reduction="mean",  # noqa: A002
                  label_smoothing=0.0) -> Tensor:
    """Softmax cross-entropy of logits (N, C) or (N, C, d1, ...) against class targets.

    ``target`` holds integer class indices (N,) or (N, d1, ...), or class
    probabilities of the input's own shape (soft labels, floating point).
    ``weight`` (C,) rescales each class; ``label_smoothing`` ε mixes the target
    with the uniform distribution: A = (1 − ε)·onehot + ε/C. Samples whose class
    index is ``ignore_index`` add nothing and are left out of the mean.
    A probability target that requires grad gets its gradient −log softmax(x)
    (times the smoothing and the weights), as in PyTorch.
    """
    op = "cross_entropy"
    x = as_tensor(input)
    _check_reduction(op, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    if not isinstance(target, Tensor) and not hasattr(target, "dtype"):
        target = np.asarray(target)
    given = _target_tensor(target)
    rows = _classes_last(x)
    count, classes = rows.shape
    w = _class_weights(op, weight, x, classes)
    if _is_probabilities(target, x):
        if ignore_index != -100:
            raise ValueError(f"{op}: ignore_index={ignore_index} applies to class-index targets only, and the "
                             f"target holds class probabilities (floating point, shape {tuple(target.shape)}); "
                             "give ignored samples a zero row of probabilities instead, as PyTorch asks")
        return _soft_cross_entropy(x, rows, target, w, label_smoothing, reduction, given)
    target, keep = _class_targets(op, x, target, ignore_index)
    # the target distribution is an op of the targets (a traced step recomputes it per batch)
    made = ClassTargets(classes, x.dtype, label_smoothing, ignore_index, w, keep is not None)(
        given if given.array is target else Tensor(target))
    coefficients, denominator = made if isinstance(made, tuple) else (made, None)
    losses = CrossEntropy(given)(rows, coefficients)
    if reduction == "none":
        return reshape(losses, target.shape)
    return _reduce(losses, reduction, denominator)


def _target_tensor(target) -> Tensor:
    """The target as a Tensor sharing its memory, so the loss's node can check its version."""
    return target if isinstance(target, Tensor) else Tensor(target)


def _soft_cross_entropy(x, rows, target, w, label_smoothing, reduction, given):
    """cross_entropy against class probabilities: A = w ⊙ ((1 − ε)·t + ε/C); "mean" over the samples."""
    classes = rows.shape[1]
    if isinstance(target, Tensor) and target.requires_grad:  # the target is differentiated too
        a = _classes_last(target)
        if label_smoothing:
            a = a * (1 - label_smoothing) + label_smoothing / classes
        if w is not None:
            a = a * Tensor(w)
        losses = -reduce_sum(a * log_softmax(rows, axis=1), axis=1)
    else:
        a = _classes_last(backend.to_device(_as_array(target), x.device)).astype(x.dtype)  # a copy
        if label_smoothing:
            a = a * (1 - label_smoothing) + label_smoothing / classes
        if w is not None:
            a = a * w
        losses = CrossEntropy(given)(rows, Tensor(a))
    if reduction == "none":
        return reshape(losses, () if x.ndim == 1 else (x.shape[0],) + x.shape[2:])
    return _reduce(losses, reduction)


@autocast_to("float32")
def nll_loss(input, target, weight=None, *, ignore_index=-100, reduction="mean") -> Tensor:  # noqa: A002
    """Negative log-likelihood of log-probabilities (N, C) or (N, C, d1, ...) at integer class targets.

    ℓ_n = −w_{y_n} · input_{n, y_n}; a sample whose target is ``ignore_index`` adds
    nothing and is left out of the mean, which divides by Σ w_{y_n} (the count without weights).
    """
    op = "nll_loss"
    x = as_tensor(input)
    _check_reduction(op, reduction)
    given = _target_tensor(_as_array(target) if not isinstance(target, Tensor) else target)
    target, keep = _class_targets(op, x, target, ignore_index)
    rows = _classes_last(x)
    xp = x.xp
    flat = target.reshape(-1)
    if keep is not None:
        flat = xp.where(keep.reshape(-1), flat, 0)
    # the target's version is checked
    losses = -GetItem((xp.arange(rows.shape[0]), flat), index_tensors=(given,))(rows)
    w = _class_weights(op, weight, x, rows.shape[1])
    if w is not None or keep is not None:
        scale = w[flat] if w is not None else xp.ones(flat.shape, x.dtype)
        losses = losses * Tensor(scale if keep is None else scale * keep.reshape(-1))
    if reduction == "none":
        return reshape(losses, target.shape)
    return _reduce(losses, reduction, _class_denominator(w, flat, keep, x.dtype))


def one_hot(tensor, num_classes=-1) -> Tensor:
    """Integer class indices of any shape → int64 rows of that shape + (num_classes,), a 1 at each index.

    ``num_classes=-1`` takes the largest index + 1. The result carries no gradient.
    """
    idx = _as_array(tensor)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"one_hot: indices must be integers, got dtype {idx.dtype}; "
                        "convert them first, e.g. idx.astype('int64')")
    if num_classes == -1:
        if idx.size == 0:
            raise ValueError("one_hot: cannot infer num_classes from an empty tensor; pass num_classes")
        num_classes = int(idx.max()) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be a non-negative integer or -1, got {num_classes!r}")
    backend.check_range(idx, 0, num_classes - 1, lambda low, high: (
        f"one_hot: class indices must be non-negative, got {low}" if low < 0 else
        f"one_hot: class index {high} does not fit num_classes={num_classes} "
        f"(valid indices are 0..{num_classes - 1})"))
    xp = xp_of(idx)
    return Tensor((idx[..., None] == xp.arange(num_classes)).astype(np.int64))


# ---------------------------------------------------------------- regression and binary targets
def _same_shape_target(op, x, target):
    """``target`` as a Tensor of x's dtype (a Tensor target is kept, so it may carry a gradient)."""
    if not isinstance(target, Tensor):
        array = backend.to_device(target if hasattr(target, "dtype") else np.asarray(target), x.device)
        target = Tensor(array.astype(x.dtype, copy=False))
    elif target.dtype.kind != "f" or (target.dtype != x.dtype and not target.requires_grad):
        target = Tensor(target.array.astype(x.dtype))  # a constant target never upcasts the loss
    if target.shape != x.shape:
        raise ValueError(f"{op}: input of shape {x.shape} and target of shape {target.shape} differ; they must "
                         "match exactly (broadcasting here usually hides a bug: reshape one of them)")
    return target


def _optional_constant(value, x):
    """A weight as a Tensor of x's dtype; a Tensor that requires grad is kept as it is (it gets its gradient)."""
    if value is None or (isinstance(value, Tensor) and (value.requires_grad or value.dtype == x.dtype)):
        return value
    value = value.array if isinstance(value, Tensor) else value
    array = backend.to_device(value if hasattr(value, "dtype") else np.asarray(value), x.device)
    return Tensor(array.astype(x.dtype, copy=False))


def _weighted_reduce(op, losses, weight, x, reduction, mean_over_weights=True):
    """Elementwise ``weight`` (the input's shape): w ⊙ ℓ, Σ w ℓ, or for "mean" Σ w ℓ / Σ w
    (PyTorch's mse_loss and l1_loss; its huber_loss divides by the count instead)."""
    if weight is None:
        return _reduce(losses, reduction)
    weight = _optional_constant(weight, x)
    if weight.shape != x.shape:
        raise ValueError(f"{op}: weight of shape {weight.shape} must have the input's shape {x.shape}")
    losses = losses * weight
    if reduction == "mean" and mean_over_weights:
        return reduce_sum(losses) / reduce_sum(weight)
    return _reduce(losses, reduction)


@autocast_to("float32")
def mse_loss(input, target, *, reduction="mean", weight=None) -> Tensor:  # noqa: A002 - PyTorch's name
    """Mean squared error: ℓ = (input − target)²;  d input = 2(input − target)."""
    _check_reduction("mse_loss", reduction)
    input = as_tensor(input)
    diff = input - _same_shape_target("mse_loss", input, target)
    return _weighted_reduce("mse_loss", diff * diff, weight, input, reduction)


@autocast_to("float32")
def l1_loss(input, target, *, reduction="mean", weight=None) -> Tensor:  # noqa: A002
    """Mean absolute error: ℓ = |input − target|;  d input = sign(input − target) (0 at 0)."""
    _check_reduction("l1_loss", reduction)
    input = as_tensor(input)
    losses = abs(input - _same_shape_target("l1_loss", input, target))
    return _weighted_reduce("l1_loss", losses, weight, input, reduction)


class SmoothL1Loss(Function):
    """ℓ = s · h(d) per element, summed, averaged or kept ("none"), for d = x − t, with
    h(d) = ½d²/β where |d| < β, else |d| − ½β (β > 0) and a scale s;
    dx = dℓ · s · clip(d/β, −1, 1) / n,  dt = −dx   (a SmoothL1LossGrad; n = the count for "mean", else 1).

    smooth_l1_loss is s = 1; huber_loss is β = δ, s = δ (ℓ = ½d² inside, δ(|d| − ½δ) outside).
    One op for the whole loss: forward keeps d, and the reduction is part of it, so a
    regression step records one node for its loss instead of seven and a mean.
    """
    saved_arrays = ("diff",)

    def __init__(self, beta, scale, reduction):
        self.beta, self.scale, self.reduction = beta, scale, reduction

    def forward(self, x, t):
        xp = xp_of(x)
        self.diff = d = x - t
        magnitude = xp.abs(d)
        inside = magnitude < self.beta
        losses = xp.where(inside, d * d * (0.5 / self.beta), magnitude - 0.5 * self.beta)
        if self.scale != 1:
            losses *= self.scale
        if self.reduction == "none":
            return losses
        total = backend.sum(losses)
        return total / losses.size if self.reduction == "mean" else total

    def backward(self, gy):
        x, t = self.inputs
        gx = SmoothL1LossGrad(self.beta, self.scale, self.reduction, self.diff)(x, t, gy)
        return gx if x.requires_grad else None, -gx if t.requires_grad else None

    def jvp(self, dx, dt):
        """ℓ̇ = Σ s · clip(d/β, −1, 1) · (ẋ − ṫ) / n (elementwise for "none")."""
        x, t = self.inputs
        per_element = _difference_tangent(dx, dt) * _smooth_l1_slope(x, t, self)
        if self.reduction == "none":
            return per_element
        total = reduce_sum(per_element)
        return total / per_element.array.size if self.reduction == "mean" else total


def _difference_tangent(dx, dt):
    """The tangent of x − t from those of x and t (None: a zero tangent)."""
    return dx if dt is None else (-dt if dx is None else dx - dt)


def _smooth_l1_slope(x, t, op):
    """s · clip((x − t)/β, −1, 1) as Tensor ops (differentiable: 1/β inside, 0 outside)."""
    return clamp((x - t) * (op.scale / op.beta), -op.scale, op.scale)


class SmoothL1LossGrad(Function):
    """SmoothL1Loss's gradient as an op of (x, t, dℓ):  z = dℓ · s · clip(d/β, −1, 1) / n,  d = x − t;
    dx = dz · dℓ · s · [|d| < β] / (β n),  dt = −dx,  d(dℓ) = Σ dz · s · clip(d/β, −1, 1) / n
    (the sum over every element for "mean" and "sum"; elementwise for "none").
    ``diff`` is d as the loss's forward computed it, for this same x and t.
    """
    saved_arrays = ("diff",)

    def __init__(self, beta, scale, reduction, diff=None):
        self.beta, self.scale, self.reduction, self.diff = beta, scale, reduction, diff

    def forward(self, x, t, gy):
        xp = xp_of(x)
        d = x - t if self.diff is None else self.diff
        z = xp.multiply(d, self.scale / self.beta, out=xp.empty_like(d))  # a new array, also for a 0-d d
        xp.clip(z, -self.scale, self.scale, out=z)
        z *= gy
        if self.reduction == "mean":
            z /= d.size
        return z

    def backward(self, gz):
        x, t, gy = self.inputs
        count = x.array.size if self.reduction == "mean" else 1
        gx = None
        if x.requires_grad or t.requires_grad:
            inside = Tensor((xp_of(x.array).abs(x.array - t.array) < self.beta).astype(gz.dtype))
            gx = gz * gy * inside * (self.scale / (self.beta * count))
        ggy = None
        if gy.requires_grad:
            terms = gz * _smooth_l1_slope(x, t, self)
            ggy = terms / count if self.reduction == "none" else reduce_sum(terms) / count
        return (gx if x.requires_grad else None, -gx if t.requires_grad else None, ggy)

    def jvp(self, dx, dt, dgy):
        """ż = ḋℓ · s · clip(d/β, −1, 1) / n + dℓ · s · [|d| < β] (ẋ − ṫ) / (β n)."""
        x, t, gy = self.inputs
        count = x.array.size if self.reduction == "mean" else 1
        terms = []
        if dgy is not None:
            terms.append(dgy * _smooth_l1_slope(x, t, self) / count)
        if dx is not None or dt is not None:
            dd = _difference_tangent(dx, dt)
            inside = Tensor((xp_of(x.array).abs(x.array - t.array) < self.beta).astype(dd.dtype))
            terms.append(dd * gy * inside * (self.scale / (self.beta * count)))
        return tangent_sum(*terms)


@autocast_to("float32")
def smooth_l1_loss(input, target, *, reduction="mean", beta=1.0) -> Tensor:  # noqa: A002
    """ℓ = ½d²/β where |d| < β, else |d| − ½β, with d = input − target;  d input = clip(d/β, −1, 1).

    Quadratic near 0 and linear beyond β, so a few large errors do not dominate;
    β = 0 is l1_loss (as PyTorch). One op (:class:`SmoothL1Loss`), reduction included.
    """
    op = "smooth_l1_loss"
    _check_reduction(op, reduction)
    if beta < 0:
        raise ValueError(f"{op}: beta must be non-negative, got {beta!r}")
    input = as_tensor(input)
    target = _same_shape_target(op, input, target)
    if beta == 0:
        return _reduce(abs(input - target), reduction)
    return SmoothL1Loss(float(beta), 1.0, reduction)(input, target)


@autocast_to("float32")
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None) -> Tensor:  # noqa: A002
    """ℓ = ½d² where |d| < δ, else δ·(|d| − ½δ), with d = input − target;  d input = clip(d, −δ, δ).

    δ = ``delta`` > 0. Equals δ · smooth_l1_loss with β = δ: the same op, :class:`SmoothL1Loss`.
    ``weight`` (the input's shape) weighs each element; "mean" still divides by the count, as
    PyTorch's huber_loss does (its mse_loss and l1_loss divide by Σ w).
    """
    op = "huber_loss"
    _check_reduction(op, reduction)
    if not delta > 0:
        raise ValueError(f"{op}: delta must be positive, got {delta!r}")
    input = as_tensor(input)
    target = _same_shape_target(op, input, target)
    if weight is None:
        return SmoothL1Loss(float(delta), float(delta), reduction)(input, target)
    losses = SmoothL1Loss(float(delta), float(delta), "none")(input, target)
    return _weighted_reduce(op, losses, weight, input, reduction, mean_over_weights=False)


@autocast_to("float32")
def kl_div(input, target, *, reduction="mean", log_target=False) -> Tensor:  # noqa: A002
    """Kullback–Leibler divergence of the target t from log-probabilities ``input``:
    ℓ = t·(ln t − input) (0 where t = 0), or with ``log_target`` (t given as ln t) ℓ = eᵗ·(t − input).

    reduction "batchmean" divides the sum by the batch size (input.shape[0]): the
    KL divergence per sample. "mean" divides by the number of elements, as PyTorch
    (which warns that "batchmean" is the mathematical definition).
    """
    op = "kl_div"
    _check_reduction(op, reduction, _REDUCTIONS + ("batchmean",))
    input = as_tensor(input)
    t = _same_shape_target(op, input, target)
    if log_target:
        losses = exp(t) * (t - input)
    else:
        empty = t.array == 0  # t ln t → 0 as t → 0 (PyTorch's xlogy)
        losses = where(empty, 0.0, t * log(where(empty, 1.0, t))) - t * input
    if reduction == "batchmean":
        return reduce_sum(losses) / (input.shape[0] if input.ndim else 1)
    return _reduce(losses, reduction)


class BinaryCrossEntropy(Function):
    """ℓ = −(t·max(ln x, −100) + (1 − t)·max(ln(1 − x), −100));
    dx = dℓ · (x − t) / max(x(1 − x), ε),  dt = dℓ · (ln(1 − x) − ln x)   (ε = 1e-12).

    The clamp at −100 and the floor ε are PyTorch's: a probability of exactly 0
    or 1 gives a loss of at most 100 and a large but finite gradient. dx is the
    clamp-free derivative −t/x + (1 − t)/(1 − x) written over one denominator,
    as PyTorch writes it; dt is unclamped too, as in PyTorch.
    """

    def forward(self, x, t):
        xp = xp_of(x)
        with np.errstate(divide="ignore"):  # ln 0 = −inf is expected here: the clamp takes it
            log_x = xp.maximum(xp.log(x), -100)
            log_1mx = xp.maximum(xp.log(1 - x), -100)
        return -(t * log_x + (1 - t) * log_1mx)

    def backward(self, gy):
        x, t = self.inputs
        gx = gy * (x - t) / maximum(x * (1 - x), _BCE_EPSILON) if x.requires_grad else None
        gt = gy * (log(1 - x) - log(x)) if t.requires_grad else None
        return gx, gt

    def jvp(self, dx, dt):
        """ℓ̇ = ẋ · (x − t) / max(x(1 − x), ε) + ṫ · (ln(1 − x) − ln x)   (the same derivatives)."""
        x, t = self.inputs
        dl = None if dx is None else dx * (x - t) / maximum(x * (1 - x), _BCE_EPSILON)
        if dt is not None:
            along_t = dt * (log(1 - x) - log(x))
            dl = along_t if dl is None else dl + along_t
        return dl


@autocast_to("float32")
def binary_cross_entropy(input, target, weight=None, *, reduction="mean") -> Tensor:  # noqa: A002
    """Binary cross-entropy of probabilities ``input`` in [0, 1] against targets t in [0, 1]:
    ℓ = −w·(t·ln x + (1 − t)·ln(1 − x)), each log clamped at −100 (PyTorch's).

    ``weight`` broadcasts against the input. For logits, binary_cross_entropy_with_logits
    is exact where sigmoid followed by this loss would round to 0 or 1.
    """
    op = "binary_cross_entropy"
    _check_reduction(op, reduction)
    x = as_tensor(input)
    t = _same_shape_target(op, x, target)
    backend.check_range(x.array, 0, 1, lambda low, high: (
        f"{op}: every element of the input must be a probability in [0, 1], got values "
        f"from {low} to {high} (for logits use binary_cross_entropy_with_logits)"))
    losses = BinaryCrossEntropy()(x, t)
    weight = _optional_constant(weight, x)
    if weight is not None:
        try:
            fits = np.broadcast_shapes(weight.shape, x.shape) == x.shape
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{op}: weight of shape {weight.shape} does not broadcast to the input's shape {x.shape}")
        losses = losses * weight
    return _reduce(losses, reduction)


@autocast_to("float32")
def binary_cross_entropy_with_logits(input, target, weight=None, *, reduction="mean",  # noqa: A002
                                     pos_weight=None) -> Tensor:
    """Sigmoid + binary cross-entropy in one stable expression, for targets t in [0, 1].

    ℓ = (1 − t)·x + (1 + (p − 1)·t)·softplus(−x) with p = ``pos_weight`` (broadcast
    over the last axis, one per class); without it ℓ = softplus(x) − t·x.
    ``weight`` rescales each element's loss. dx = σ(x)·(1 + (p − 1)t) − p·t.
    """
    op = "binary_cross_entropy_with_logits"
    _check_reduction(op, reduction)
    logits = as_tensor(input)
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
