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

import minidl.functional as F
from minidl import backend
from minidl.optim.schedules import LRScheduler
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
    saved_weights = [p.data.copy() for p in params]
    saved_optimizer = optimizer.state_dict()
    ratio = (lr_max / lr_min) ** (1 / (steps - 1))
    schedule = [lr_min * ratio ** i for i in range(steps)]
    lrs, losses = [], []
    try:
        scheduler = LRScheduler(optimizer, lambda t: schedule[min(t, steps - 1)])
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
            backend.xp_of(p.data).copyto(p.data, saved)
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


# ---------------------------------------------------------------- the `minidl lr-find` command
def _mlp(sizes, rng):
    """Linear → ReLU → … → Linear of ``sizes``, He-initialized (Var(w) = 2 / fan_in) from ``rng``, zero biases."""
    from minidl import nn
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        linear = nn.Linear(fan_in, fan_out)
        linear.weight.data[...] = rng.standard_normal((fan_out, fan_in)).astype(np.float32) \
            * np.float32(math.sqrt(2 / fan_in))
        linear.bias.data[...] = 0
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _digits_or_blobs(rng):
    try:
        from minidl.data import digits
        x, y = digits(flatten=True)
        x = (x / 16.0).astype(np.float32)
    except Exception:  # noqa: BLE001 - no dataset bundled: a synthetic 10-class problem instead
        centers = rng.standard_normal((10, 64)).astype(np.float32)
        y = rng.integers(0, 10, 1797)
        x = centers[y] + 0.8 * rng.standard_normal((1797, 64)).astype(np.float32)
    return x.astype(np.float32), np.asarray(y, np.int64)


def lr_find_command(out_path: str = "lr_find.png", steps: int = 100, lr_min: float = 1e-5, lr_max: float = 1.0,
                    batch_size: int = 64, hidden: int = 64, optimizer: str = "sgd", seed: int = 0) -> str:
    """Run the range test for a small MLP on the digits and save the figure (what `minidl lr-find` does).

    Arguments: ``out_path`` the PNG to write; ``steps`` mini-batches in the sweep;
    ``lr_min``/``lr_max`` its ends; ``batch_size``; ``hidden`` units of the MLP
    (64 → hidden → 10); ``optimizer`` "sgd" (momentum 0.9) or "adam"; ``seed``.
    Prints the suggested rate and returns ``out_path``.
    """
    rng = np.random.default_rng(seed)
    x, y = _digits_or_blobs(rng)
    model = _mlp([x.shape[1], hidden, int(y.max()) + 1], rng)
    if optimizer == "adam":
        from minidl.optim.adam import Adam
        opt = Adam(model.parameters(), lr=lr_min)
    elif optimizer == "sgd":
        from minidl.optim.sgd import SGD
        opt = SGD(model.parameters(), lr=lr_min, momentum=0.9)
    else:
        raise ValueError(f"lr-find: optimizer must be 'sgd' or 'adam', got {optimizer!r}")

    def loader():
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch_size + 1, batch_size):
            batch = order[start:start + batch_size]
            yield x[batch], y[batch]

    class Batches:
        def __iter__(self):
            return loader()

    result = lr_range_test(model, F.cross_entropy, Batches(), lr_min=lr_min, lr_max=lr_max, steps=steps,
                           optimizer=opt, plot=out_path)
    print(f"learning-rate range test: {len(result.lrs)} steps from {lr_min:g} to {result.lrs[-1]:.3g}; "
          f"suggested lr {result.suggestion:.3g} (figure: {out_path})")
    return out_path
