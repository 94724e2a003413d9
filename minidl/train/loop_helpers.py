"""The parts of the training loop that are not the loop: errors, seeding, batches, settings.

Kept apart from :mod:`minidl.train.trainer` so that the loop itself reads in one go.
"""
from __future__ import annotations

import random

import numpy as np

from minidl import backend
from minidl.tensor import Tensor
from minidl.train.metrics import METRICS

NON_FINITE_HINT = ("Try a learning rate 10x lower, clip the gradients (max_grad_norm=1.0; "
                   "--clip-norm 1.0 on the command line), check the inputs for NaN or huge values, "
                   "and run one step under minidl.detect_anomaly() to find the op that produced it.")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped :meth:`Trainer.fit`: ``step`` is where it stopped, ``checkpoint`` the last checkpoint this
    trainer wrote or resumed from (a path, or None when there is none yet) and ``checkpoint_step`` its step.

    A KeyboardInterrupt, so code that catches Ctrl-C still does; its message says where the run can go on from.
    """

    def __init__(self, step: int, checkpoint: str | None, checkpoint_step: int | None):
        self.step, self.checkpoint, self.checkpoint_step = step, checkpoint, checkpoint_step
        if checkpoint is None:
            where = "no checkpoint was written yet (the first is written at the first validation or epoch end)"
        else:
            where = f"the last checkpoint is {checkpoint} (step {checkpoint_step})"
        super().__init__(f"training stopped (Ctrl-C) at step {step}; {where}")


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; raised before the update, so the weights are those of the last good step."""

    def __init__(self, message: str, step: int, loss: float):
        super().__init__(message)
        self.step, self.loss = step, loss


def non_finite_error(what: str, value: float, step: int, epoch: int, lr: float, best=None) -> NonFiniteLossError:
    """The error for a NaN/inf ``what`` at ``step``: where, what was kept, and what to try."""
    saved = f" The best checkpoint is intact: {best.best_path} (step {best.best_step})." if best else ""
    return NonFiniteLossError(
        f"training stopped: the {what} is {value} at step {step} (epoch {epoch + 1}), learning rate {lr:g}. "
        f"The update was not applied, so the weights are those after step {step - 1}.{saved} "
        + NON_FINITE_HINT, step=step, loss=value)


def seed_everything(seed: int) -> None:
    """One seed for every random source: minidl's generators, NumPy's global one and Python's ``random``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    backend.manual_seed(int(seed))
    np.random.seed(int(seed) % 2**32)
    random.seed(int(seed))


def default_loss(logits, target, label_smoothing=0.0):
    from minidl.ops.loss import cross_entropy  # late import: the loss module is optional until used
    return cross_entropy(logits, target, label_smoothing=label_smoothing)


def batch_to_tensors(batch, device: str, dtype=None):
    """A loader batch ``(x, y)`` (Tensors or arrays) as Tensors on ``device``; float arrays cast to ``dtype``."""
    if not isinstance(batch, (tuple, list)) or len(batch) < 2:
        size = len(batch) if hasattr(batch, "__len__") else "?"
        raise ValueError(f"Trainer: every batch must be a tuple (inputs, targets); got {type(batch).__name__} "
                         f"of length {size}")
    out = []
    for value in batch[:2]:
        array = value.array if isinstance(value, Tensor) else value
        array = backend.to_device(array if hasattr(array, "dtype") else np.asarray(array), device)
        if dtype is not None and array.dtype.kind == "f" and array.dtype != dtype:
            array = array.astype(dtype)
        # A loader's Tensor already on the device, in the dtype, goes in as it is.
        out.append(value if isinstance(value, Tensor) and array is value.array else Tensor(array))
    return out[0], out[1]


def progress_bar(loader, epoch: int, epochs: int):
    """A tqdm bar over one epoch of ``loader``, starting at the loader's position (after a resume)."""
    from tqdm.auto import tqdm
    try:
        total = len(loader)
    except TypeError:
        total = None
    initial = 0
    if total is not None and callable(getattr(loader, "state_dict", None)):
        batch = loader.state_dict()["batch"]
        initial = batch if batch < total else 0
    return tqdm(total=total, initial=initial, desc=f"epoch {epoch + 1}/{epochs}", unit="batch",
                leave=True, dynamic_ncols=True)


def fresh_running() -> dict:
    return {"loss": 0.0, "count": 0, "correct": 0, "classified": 0, "batch_loss": 0.0, "batches": 0}


def is_classification(y: Tensor, out: Tensor) -> bool:
    return y.dtype.kind in "iu" and y.ndim == 1 and out.ndim == 2


def check_positive_int(value, name: str, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"Trainer: {name} must be an int >= {low}, got {value!r}")


def metric_functions(metrics) -> dict:
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        return dict(metrics)
    if isinstance(metrics, str):
        metrics = (metrics,)
    out = {}
    for name in metrics:
        if name not in METRICS:
            raise ValueError(f"Trainer: unknown metric {name!r}; choose from {sorted(METRICS)} "
                             "or pass {name: fn(y_true, scores)}")
        out[name] = METRICS[name]
    return out


def needs_create_graph(optimizer) -> bool:
    """AdaHessian differentiates the gradient again, so its backward must record the graph."""
    if getattr(optimizer, "requires_create_graph", False):
        return True
    try:
        from minidl.optim import AdaHessian
    except ImportError:
        return False
    return isinstance(optimizer, AdaHessian)


def as_scheduler(scheduler, optimizer):
    """A scheduler as given, or a plain schedule f(t) wrapped in an optim.ScheduleLR."""
    if scheduler is None or callable(getattr(scheduler, "step", None)):
        return scheduler
    if callable(scheduler):
        from minidl.optim import ScheduleLR
        return ScheduleLR(optimizer, scheduler)
    raise TypeError(f"Trainer: scheduler must be a scheduler (optim.ScheduleLR...) or a function f(t) -> lr, "
                    f"got {type(scheduler).__name__}")
