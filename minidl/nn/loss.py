"""Loss functions as modules: ``criterion = nn.CrossEntropyLoss(); loss = criterion(logits, target)``.

Each holds its options and calls the function of :mod:`minidl.functional`
of the same name, whose docstring gives the formula. Constructor arguments are
PyTorch's; PyTorch's deprecated ``size_average`` and ``reduce`` are left out, so
the options after the first are keyword-only. Class weights and ``pos_weight``
are buffers, as in PyTorch: saved in the state dict and moved by ``.to()``.
"""
from __future__ import annotations

import minidl.functional as F
from minidl.nn.module import Module
from minidl.ops.loss import _REDUCTIONS, _check_reduction
from minidl.tensor import Tensor, tensor


def _buffer(value):
    """A weight as a Tensor buffer (a copy, float32 for Python numbers), or None."""
    if value is None or isinstance(value, Tensor):
        return value
    return tensor(value)


class _Loss(Module):
    reductions = _REDUCTIONS

    def __init__(self, reduction="mean"):
        super().__init__()
        _check_reduction(type(self).__name__, reduction, self.reductions)
        self.reduction = reduction

    def extra_repr(self):
        return f"reduction={self.reduction!r}"


class _WeightedLoss(_Loss):
    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.register_buffer("weight", _buffer(weight))


class CrossEntropyLoss(_WeightedLoss):
    """F.cross_entropy: softmax cross-entropy of logits (N, C, ...) against class indices or probabilities."""

    def __init__(self, weight=None, *, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(weight, reduction)
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing

    def forward(self, input, target):  # noqa: A002 - PyTorch's name
        return F.cross_entropy(input, target, self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction, label_smoothing=self.label_smoothing)

    def extra_repr(self):
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}"


class NLLLoss(_WeightedLoss):
    """F.nll_loss: −input[n, y_n] for log-probabilities (after log_softmax)."""

    def __init__(self, weight=None, *, ignore_index=-100, reduction="mean"):
        super().__init__(weight, reduction)
        self.ignore_index = ignore_index

    def forward(self, input, target):  # noqa: A002
        return F.nll_loss(input, target, self.weight, ignore_index=self.ignore_index, reduction=self.reduction)

    def extra_repr(self):
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class MSELoss(_Loss):
    """F.mse_loss: (input − target)²."""

    def __init__(self, *, reduction="mean"):
        super().__init__(reduction)

    def forward(self, input, target):  # noqa: A002
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(_Loss):
    """F.l1_loss: |input − target|."""

    def __init__(self, *, reduction="mean"):
        super().__init__(reduction)

    def forward(self, input, target):  # noqa: A002
        return F.l1_loss(input, target, reduction=self.reduction)


class BCELoss(_WeightedLoss):
    """F.binary_cross_entropy: for probabilities in [0, 1] (after a sigmoid)."""

    def __init__(self, weight=None, *, reduction="mean"):
        super().__init__(weight, reduction)

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy(input, target, self.weight, reduction=self.reduction)


class BCEWithLogitsLoss(_WeightedLoss):
    """F.binary_cross_entropy_with_logits: sigmoid and binary cross-entropy in one stable expression."""

    def __init__(self, weight=None, *, reduction="mean", pos_weight=None):
        super().__init__(weight, reduction)
        self.register_buffer("pos_weight", _buffer(pos_weight))

    def forward(self, input, target):  # noqa: A002
        return F.binary_cross_entropy_with_logits(input, target, self.weight, reduction=self.reduction,
                                                  pos_weight=self.pos_weight)


class KLDivLoss(_Loss):
    """F.kl_div: t·(ln t − input) for log-probabilities input; reduction='batchmean' is the KL divergence."""
    reductions = _REDUCTIONS + ("batchmean",)

    def __init__(self, *, reduction="mean", log_target=False):
        super().__init__(reduction)
        self.log_target = log_target

    def forward(self, input, target):  # noqa: A002
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)

    def extra_repr(self):
        return f"reduction={self.reduction!r}, log_target={self.log_target}"


class HuberLoss(_Loss):
    """F.huber_loss: ½d² where |d| < delta, else delta·(|d| − ½delta)."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        if not delta > 0:
            raise ValueError(f"HuberLoss: delta must be positive, got {delta!r}")
        self.delta = delta

    def forward(self, input, target):  # noqa: A002
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)

    def extra_repr(self):
        return f"reduction={self.reduction!r}, delta={self.delta}"


class SmoothL1Loss(_Loss):
    """F.smooth_l1_loss: ½d²/beta where |d| < beta, else |d| − ½beta."""

    def __init__(self, *, reduction="mean", beta=1.0):
        super().__init__(reduction)
        if beta < 0:
            raise ValueError(f"SmoothL1Loss: beta must be non-negative, got {beta!r}")
        self.beta = beta

    def forward(self, input, target):  # noqa: A002
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)

    def extra_repr(self):
        return f"reduction={self.reduction!r}, beta={self.beta}"
