"""Knowledge distillation: a small student learns from a large teacher's softened outputs.

    loss_fn = DistillationLoss(teacher, student, temperature=4.0, alpha=0.9)
    Trainer(student, optim.Adam(student.parameters(), 1e-3), train_loader, val_loader, loss_fn=loss_fn).fit(20)

Hinton, Vinyals and Dean (2015). With teacher logits z_t, student logits z_s,
temperature T and weight α, the loss of a batch is

    L = α · T² · KL( softmax(z_t / T) ‖ softmax(z_s / T) ) + (1 − α) · CE(z_s, y)

The temperature softens both distributions so that the teacher's small
probabilities (which wrong classes look like this digit) carry signal; the
T² keeps the soft term's gradient, which shrinks like 1/T², on the scale of
the hard term's as T changes. KL is per sample (``reduction="batchmean"``),
as the formula has it; CE is the mean over the batch. The teacher gets no
gradient.

An ensemble of M teachers (a list of models or of their logits) teaches
through its averaged soft targets, the members' softened distributions
averaged at the same temperature (the guide's recipe for distilling an
ensemble into one model):

    p̄_T = (1/M) Σ_m softmax(z_m / T)        L = α · T² · KL( p̄_T ‖ softmax(z_s / T) ) + (1 − α) · CE(z_s, y)
"""
from __future__ import annotations

import math

import minidl.functional as F
from minidl.autograd import no_grad
from minidl.tensor import Tensor

__all__ = ["DistillationLoss", "distillation_loss", "ensemble_soft_targets"]


def _check(temperature, alpha):
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"distillation_loss: temperature must be a positive number, got {temperature!r}")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"distillation_loss: alpha must be a number in [0, 1], got {alpha!r}")
    return float(temperature), float(alpha)


def distillation_loss(student_logits, teacher_logits, target, temperature: float = 4.0, alpha: float = 0.9,
                      label_smoothing: float = 0.0) -> Tensor:
    """α·T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)) + (1 − α)·CE(z_s, y), a scalar Tensor.

    ``student_logits`` (N, C) carries the gradient; ``teacher_logits`` (N, C) (a Tensor or an
    array, or a list of them: an ensemble's members) is treated as a constant; ``target`` (N,)
    class indices for the cross-entropy, with ``label_smoothing`` passed to it. ``alpha=1``: the
    soft targets alone; ``alpha=0``: plain CE.
    """
    T, alpha = _check(temperature, alpha)
    z_s = student_logits
    members = teacher_logits if isinstance(teacher_logits, (list, tuple)) else [teacher_logits]
    for z_t in members:
        if tuple(z_t.shape) != tuple(z_s.shape):
            raise ValueError(f"distillation_loss: student logits {tuple(z_s.shape)} and teacher logits "
                             f"{tuple(z_t.shape)} must have the same shape (N, C)")
    log_p_student = F.log_softmax(z_s * (1.0 / T), dim=1)
    log_p_teacher = ensemble_soft_targets(members, T).astype(z_s.dtype)
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)
    hard = F.cross_entropy(z_s, target, label_smoothing=label_smoothing)
    return soft * (alpha * T * T) + hard * (1.0 - alpha)


def ensemble_soft_targets(teacher_logits, temperature: float = 1.0) -> Tensor:
    """log p̄_T, p̄_T = (1/M) Σ_m softmax(z_m / T): the averaged soft targets of M teachers' logits, no gradient.

    ``teacher_logits``: one (N, C) Tensor or array, or a list of them. The
    average is of probabilities, as :class:`minidl.train.Ensemble` averages,
    at the temperature T; it is computed as logsumexp_m(log_softmax(z_m / T)) − log M.
    """
    members = teacher_logits if isinstance(teacher_logits, (list, tuple)) else [teacher_logits]
    if not members:
        raise ValueError("ensemble_soft_targets: no teacher logits given")
    T, _ = _check(temperature, 0.0)
    with no_grad():
        logs = [F.log_softmax((z.detach() if isinstance(z, Tensor) else Tensor(z)) * (1.0 / T), dim=1)
                for z in members]
        if len(logs) == 1:
            return logs[0]
        return F.logsumexp(F.stack(logs), dim=0) - math.log(len(logs))


class DistillationLoss:
    """``distillation_loss`` as a Trainer ``loss_fn(student_outputs, targets)``.

    The Trainer hands a loss only the student's outputs and the targets, so this object
    remembers the student's input through a forward hook and runs ``teacher`` on it (in eval
    mode, without gradients); ``teacher`` may be a list of models, an ensemble taught through
    its averaged soft targets (:func:`ensemble_soft_targets`). While the student is in eval mode
    (the Trainer's validation) it returns the plain cross-entropy, so validation losses compare
    with a student trained alone.
    ``remove()`` takes the hook off the student.
    """

    def __init__(self, teacher, student, temperature: float = 4.0, alpha: float = 0.9):
        self.temperature, self.alpha = _check(temperature, alpha)
        self.teacher, self.student = teacher, student
        self._input = None
        self._handle = student.register_forward_hook(self._remember)

    def _remember(self, module, inputs, output):
        self._input = inputs[0]

    def __call__(self, outputs, target, label_smoothing: float = 0.0) -> Tensor:
        if not self.student.training:
            self._input = None
            return F.cross_entropy(outputs, target, label_smoothing=label_smoothing)
        if self._input is None:
            raise RuntimeError("DistillationLoss: the student has not run a forward pass yet; "
                               "call loss_fn(student(x), y)")
        teachers = self.teacher if isinstance(self.teacher, (list, tuple)) else [self.teacher]
        teacher_logits = []
        for teacher in teachers:
            was_training = teacher.training
            teacher.eval()
            try:
                with no_grad():
                    teacher_logits.append(teacher(self._input))
            finally:
                teacher.train(was_training)
        self._input = None
        return distillation_loss(outputs, teacher_logits, target, self.temperature, self.alpha,
                                 label_smoothing=label_smoothing)

    def remove(self) -> None:
        """Take the forward hook off the student."""
        self._handle.remove()
