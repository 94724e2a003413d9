"""Two ways to keep outliers from throwing the weights: clip the gradient at a percentile, or clip the loss.

    trainer = Trainer(model, opt, loader, callbacks=[PercentileClipping(percentile=90)])
    loss = clip_loss(F.cross_entropy(logits, y, reduction="none"), max_loss=5.0)

They do different things to the gradient:

- **Percentile gradient clipping** (the book's "clip at the 90th percentile of
  your typical gradient norms"; AutoClip, Seetharaman, Wichern, Pardo & Le Roux
  2020). The threshold c is the p-th percentile of the global gradient norms of
  the last ``window`` steps, so it follows the scale of the gradients as
  training changes it instead of being tuned by hand. A step whose norm ‖g‖
  exceeds c is rescaled, g ← g·c/‖g‖: the direction is kept, every example
  still contributes, only the length of the step is bounded.
- **Clipping the loss**: ℓᵢ ← min(ℓᵢ, c) per example. Its derivative is 1 below
  c and 0 above, so an example whose loss exceeds c contributes *nothing* to
  the gradient: the outliers (hard or mislabelled examples) are ignored, not
  tempered. The book lists it among training bugs when it is done by accident
  (clipping the loss where the gradient was meant); on purpose it is a crude
  robust loss. PyTorch has neither as a built-in.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.optim import clip_grad_norm_
from minidl.tensor import Tensor
from minidl.train.callbacks import Callback


class PercentileClipping(Callback):
    """Clip the global gradient norm at the ``percentile``-th percentile of the last ``window`` norms.

    ``PercentileClipping(percentile=90, window=1000, warmup=10)``. The first ``warmup``
    steps only record their norms (no history, no threshold). Each step records its
    norm before clipping (a non-finite norm, a step a GradScaler will skip, is neither
    recorded nor clipped). ``history`` holds the recorded norms, ``thresholds`` the
    threshold of every step (None during warm-up), ``clipped`` how many steps were clipped.
    Outside a Trainer, call ``clip_(params)`` between ``backward()`` and ``step()``.
    On a GPU each step reads the norm back to the host (one synchronization).
    """

    def __init__(self, percentile: float = 90.0, window: int = 1000, warmup: int = 10):
        if not (isinstance(percentile, (int, float)) and 0 < percentile <= 100):
            raise ValueError(f"PercentileClipping: percentile must be in (0, 100], got {percentile!r}")
        for name, value, low in (("window", window, 1), ("warmup", warmup, 1)):
            if not (isinstance(value, int) and value >= low):
                raise ValueError(f"PercentileClipping: {name} must be an integer >= {low}, got {value!r}")
        self.percentile, self.window, self.warmup = float(percentile), window, warmup
        self.history: list[float] = []
        self.thresholds: list = []
        self.clipped = 0

    def threshold(self):
        """The clipping threshold for the next step: the percentile of the recorded norms (None in warm-up)."""
        if len(self.history) < self.warmup:
            return None
        return float(np.percentile(self.history[-self.window:], self.percentile))

    def clip_(self, params) -> float:
        """Clip the gradients of ``params`` in place (new ``.grad`` Tensors); returns the norm before clipping."""
        limit = self.threshold()
        norm = float(clip_grad_norm_(params, math.inf if limit is None else limit).array)
        if not math.isfinite(norm):
            self.thresholds.append(None)
            return norm
        self.thresholds.append(limit)
        if limit is not None and norm > limit:
            self.clipped += 1
        self.history.append(norm)
        del self.history[:-self.window]
        return norm

    def on_before_optimizer_step(self, trainer, params):
        self.clip_(params)

    def state_dict(self) -> dict:
        return {"history": list(self.history), "clipped": self.clipped}

    def check_state_dict(self, state, trainer=None) -> None:
        if not (isinstance(state, dict) and set(state) == {"history", "clipped"}
                and isinstance(state["history"], list) and isinstance(state["clipped"], int)):
            raise ValueError("PercentileClipping: expected the {'history': [...], 'clipped': n} that state_dict() "
                             f"returns, got {str(state)[:80]}")

    def load_state_dict(self, state: dict) -> None:
        self.check_state_dict(state)
        self.history, self.clipped = [float(v) for v in state["history"]], int(state["clipped"])


def clip_loss(losses, max_loss: float, reduction: str = "mean"):
    """min(ℓᵢ, max_loss) for each example's loss, then their mean (or sum, or none).

    ``losses`` is the per-example loss (``reduction="none"`` of a loss function).
    An example above ``max_loss`` gets a gradient of exactly zero: it is ignored,
    where gradient clipping would only shorten the whole step (see the module docstring).
    """
    if not isinstance(losses, Tensor) or losses.ndim != 1:
        raise ValueError(f"clip_loss: expected the per-example losses as a 1-D Tensor (a loss with "
                         f"reduction='none'), got {type(losses).__name__} of shape {getattr(losses, 'shape', None)}")
    if not (isinstance(max_loss, (int, float)) and max_loss > 0):
        raise ValueError(f"clip_loss: max_loss must be a positive number, got {max_loss!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"clip_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    clipped = losses.clamp(max=float(max_loss))
    return {"mean": clipped.mean, "sum": clipped.sum}.get(reduction, lambda: clipped)()
