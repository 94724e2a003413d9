"""The learning-rate range test (Smith 2017): sweep the rate up, watch the loss.

Train for a few hundred mini-batches while the learning rate grows
exponentially from lr_min to lr_max (the book's sweep 10⁻⁵ … 10⁰). The loss
first barely moves (rate too small), then falls fastest, then turns and
explodes (too large). A good rate lies where it falls fastest, or about ten
times below the rate at its minimum. The weights (and the optimizer's
state) are restored afterwards, so the test costs a few hundred steps and
changes nothing.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minidl import backend
from minidl.optim.schedules import ScheduleLR
from minidl.tensor import Tensor, mark_changed


class LRRangeResult(NamedTuple):
    """The sweep: the learning rates tried, the loss at each, and the suggested rate."""
    lrs: list
    losses: list
    suggestion: float


def _as_tensor(x):
    if isinstance(x, Tensor):
        return x
    return Tensor(x if hasattr(x, "dtype") else np.asarray(x))


def smooth(losses, window: int | None = None):
    """Centered moving average of the losses (no lag, unlike an exponential average).

    ``window`` (odd) defaults to about a tenth of the points, at most 15.
    """
    values = np.asarray(losses, dtype=np.float64)
    if window is None:
        window = min(15, max(1, len(values) // 10) | 1)
    kernel = np.ones(window)
    total = np.convolve(values, kernel, mode="same")
    count = np.convolve(np.ones_like(values), kernel, mode="same")  # fewer points at the ends
    return list(total / count)


def suggest_lr(lrs, losses) -> float:
    """The rate where the smoothed loss falls fastest against log(lr), before its minimum."""
    curve = np.asarray(smooth(losses))
    stop = int(np.argmin(curve)) + 1
    if stop < 3:  # the loss rose from the start: the sweep began too high
        return float(lrs[0])
    slopes = np.gradient(curve[:stop], np.log(np.asarray(lrs[:stop])))
    return float(lrs[int(np.argmin(slopes))])


def lr_range_test(model, loss_fn, loader, lr_min: float = 1e-5, lr_max: float = 1.0, steps: int = 100,
                  optimizer=None, diverge: float = 4.0, plot: str | None = None) -> LRRangeResult:
    """Sweep the learning rate from ``lr_min`` to ``lr_max`` over ``steps`` mini-batches.

    ``model`` is callable and has ``parameters()``; ``loss_fn(prediction, y)``
    returns a scalar Tensor; ``loader`` is an iterable of (x, y) batches
    (arrays or Tensors), restarted when it runs out. ``optimizer`` defaults to
    SGD with momentum 0.9 over the model's parameters. The sweep stops early
    once the smoothed loss exceeds ``diverge`` times its minimum (or is not
    finite). Weights and optimizer state are restored. ``plot``, a file path,
    saves the loss-versus-rate figure there.
    """
    if not 0 < lr_min < lr_max:
        raise ValueError(f"lr_range_test: need 0 < lr_min < lr_max, got lr_min={lr_min}, lr_max={lr_max}")
    if steps < 2:
        raise ValueError(f"lr_range_test: steps must be at least 2, got {steps}")
    params = list(model.parameters())
    if optimizer is None:
        from minidl.optim.sgd import SGD
        optimizer = SGD(params, lr=lr_max, momentum=0.9)
    saved_weights = [p.array.copy() for p in params]
    saved_optimizer = optimizer.state_dict()
    ratio = (lr_max / lr_min) ** (1 / (steps - 1))
    schedule = [lr_min * ratio ** i for i in range(steps)]
    lrs, losses = [], []
    try:
        scheduler = ScheduleLR(optimizer, lambda t: schedule[min(t, steps - 1)])
        batches = iter(loader)
        best, average = math.inf, 0.0
        for lr in schedule:
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
            optimizer.zero_grad()
            loss = loss_fn(model(_as_tensor(x)), _as_tensor(y))
            loss.backward()
            optimizer.step()
            scheduler.step()
            lrs.append(lr)
            losses.append(float(loss.item()))
            average = losses[-1] if len(losses) == 1 else 0.8 * average + 0.2 * losses[-1]
            best = min(best, average)
            if not math.isfinite(average) or (len(losses) > 5 and average > diverge * best):
                break
    finally:
        for p, saved in zip(params, saved_weights):
            backend.xp_of(p.array).copyto(p.array, saved)
            p.grad = None
        mark_changed(*params)
        optimizer.load_state_dict(saved_optimizer)
    finite = [i for i, loss in enumerate(losses) if math.isfinite(loss)]
    lrs, losses = [lrs[i] for i in finite], [losses[i] for i in finite]
    result = LRRangeResult(lrs, losses, suggest_lr(lrs, losses) if lrs else lr_min)
    if plot:
        plot_lr_range(result, plot)
    return result


def plot_lr_range(result: LRRangeResult, path: str | None = None, ax=None):
    """Draw loss versus learning rate (log axis), the smoothed curve and the suggestion.

    Saves a PNG to ``path`` when given (written to a temporary file, then renamed). Returns the axes.
    """
    figure = None
    if ax is None and path is not None:  # a bare Figure: no pyplot, no GUI backend, any thread
        from matplotlib.figure import Figure
        figure = Figure(figsize=(6, 4), layout="constrained")  # room for every label, nothing clipped
        ax = figure.subplots()
    elif ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    ax.plot(result.lrs, result.losses, color="0.75", label="loss per batch")
    ax.plot(result.lrs, smooth(result.losses), color="C0", label="smoothed")
    ax.axvline(result.suggestion, color="C3", linestyle="--", label=f"suggestion {result.suggestion:.2g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("learning-rate range test")
    ax.legend()
    if path is not None:
        save_figure(figure if figure is not None else ax.figure, path)
    return ax


def save_figure(figure, path: str, dpi: int = 110) -> str:
    """Write a matplotlib figure as PNG through :func:`minidl.serialization.atomic_write` (a temporary, renamed)."""
    from minidl.serialization import atomic_write
    atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=dpi, format="png"))
    return path
