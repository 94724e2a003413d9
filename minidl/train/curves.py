"""Training curves as a PNG: loss, metric and learning rate against the optimizer step.

    plot_curves(trainer.history, "runs/exp/curves.png", steps=trainer.steps)

Three panels, the ones to look at after every run:

- loss: the training loss of every step (faint) and its mean since the
  previous point (an epoch, or ``eval_every`` steps: the legend says which),
  with the validation loss. A validation loss that turns up while the
  training loss goes on down is overfitting; both flat and high is
  underfitting (or a learning rate that is too small). The axis is
  logarithmic where the losses span a decade or more, else linear;
- accuracy and F1: training accuracy, validation accuracy and the other
  validation metrics (F1 dashed, so it never hides accuracy), and the test
  accuracy of the final weights as a star when ``test`` is given;
- learning rate: what the schedule did.

A run with no metric (a language model, a regression) gets the loss and
learning-rate panels only.

Drawn with matplotlib's Agg backend (no display needed) and written
atomically, so a half-written PNG never replaces a good one.
"""
from __future__ import annotations

import functools
import io
import math
import os

from minidl.serialization import atomic_write


@functools.lru_cache(maxsize=None)
def _figure_class():
    """A matplotlib Figure that shows itself as a PNG in a notebook (IPython calls ``_repr_png_``).

    matplotlib is imported here, on first use, so that ``import minidl.train`` stays light.
    """
    from matplotlib.figure import Figure

    class CurvesFigure(Figure):
        def _repr_png_(self):
            return _png_bytes(self)

    return CurvesFigure


def _new_figure(**kwargs):
    """A Figure drawn by the Agg canvas, whatever backend pyplot uses (none needed, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = _figure_class()(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


FEW_POINTS = 30  # a per-step series this short is drawn with a marker at each step


def _series(history, key):
    points = [(r["step"], r[key]) for r in history if key in r and r[key] is not None]
    return [p[0] for p in points], [p[1] for p in points]


METRIC_STYLES = {  # accuracy solid with dots, F1 dashed with open squares: both visible where they coincide
    "train_accuracy": dict(color="tab:blue", marker="o", markersize=3, linestyle="-"),
    "val_accuracy": dict(color="tab:orange", marker="o", markersize=4, linestyle="-", linewidth=2),
    "val_f1": dict(color="tab:green", marker="s", markersize=5, markerfacecolor="none", linestyle="--"),
}


def _two_three_five(value, _position=None) -> str:
    """Minor log ticks labelled at 2, 3 and 5 times a power of ten only, so they never crowd."""
    if value <= 0:
        return ""
    leading = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if any(abs(leading - d) < 1e-6 for d in (2, 3, 5)) else ""


def _metric_label(keys) -> str:
    names = list(dict.fromkeys(k.split("_", 1)[1] for k in keys))
    words = {"accuracy": "accuracy", "f1": "F1", "precision": "precision", "recall": "recall"}
    return " / ".join(words.get(n, n) for n in names) or "metric"


def _train_loss_label(history, x) -> str:
    """What a train_loss point averages: an epoch, a fixed number of steps (``eval_every``), or the steps since the
    previous point."""
    if all(float(r.get("epoch", 0.5)).is_integer() for r in history if "train_loss" in r):
        return "train loss (epoch mean)"
    gaps = {b - a for a, b in zip([0] + x[:-2], x[:-1])}  # the last point may close a shorter stretch
    if len(gaps) == 1:
        return f"train loss (mean over {gaps.pop()} steps)"
    return "train loss (mean since the previous point)"


def make_figure(history: list[dict], steps: dict | None = None, title: str | None = None,
                test: dict | None = None):
    """A matplotlib Figure with the loss, metric and learning-rate panels (not shown, not saved).

    ``test``: the test-set result (``{"accuracy": ..., "f1": ...}``) of the weights at
    the last step, drawn as stars at that step.
    """
    metric_keys = []
    if history:
        val_metrics = [k for k in history[-1] if k.startswith("val_") and k != "val_loss"]
        metric_keys = (["train_accuracy"] if any("train_accuracy" in r for r in history) else []) + val_metrics
    has_metric = bool(metric_keys) or bool(test and test.get("accuracy") is not None)
    if has_metric:
        fig = _new_figure(figsize=(13, 3.8), layout="constrained")
        ax_loss, ax_metric, ax_lr = fig.subplots(1, 3)
    else:  # a language model or a regression: no metric panel, rather than an empty one
        fig = _new_figure(figsize=(9, 3.8), layout="constrained")
        (ax_loss, ax_lr), ax_metric = fig.subplots(1, 2), None

    # A line through one point draws nothing, and a few points joined by lines hide where the data are:
    # a short run's per-step series gets a marker at each point.
    few = bool(steps and steps.get("step")) and len(steps["step"]) <= FEW_POINTS
    each_step = dict(marker="o", markersize=4) if few else {}
    if steps and steps.get("step"):
        ax_loss.plot(steps["step"], steps["loss"], color="tab:blue", alpha=0.6 if few else 0.25, linewidth=0.8,
                     label="train (each step)", **each_step)
    for key, style in (("train_loss", dict(color="tab:blue", marker="o", markersize=3)),
                       ("val_loss", dict(color="tab:orange", marker="o", markersize=3))):
        x, y = _series(history, key)
        if x:
            label = _train_loss_label(history, x) if key == "train_loss" else "validation loss"
            ax_loss.plot(x, y, label=label, **style)
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    losses = [v for v in list((steps or {}).get("loss", [])) + [r.get(k) for r in history
                                                             for k in ("train_loss", "val_loss")]
              if v is not None and math.isfinite(v) and v > 0]
    if losses and max(losses) >= 10 * min(losses):  # a log scale over a decade or more; within one, linear
        from matplotlib.ticker import FuncFormatter
        ax_loss.set_yscale("log")
        ax_loss.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.3, 2: not 3×10⁻¹, 2×10⁰
        ax_loss.yaxis.set_minor_formatter(FuncFormatter(_two_three_five))

    for i, key in enumerate(metric_keys):
        x, y = _series(history, key)
        if x:
            style = METRIC_STYLES.get(key, dict(color=f"C{(i + 4) % 10}", marker="^", markersize=4, linestyle=":"))
            ax_metric.plot(x, y, label=key.replace("_", " ").replace("f1", "F1"), **style)
    last_step = history[-1]["step"] if history else 0
    if test and test.get("accuracy") is not None:
        ax_metric.plot([last_step], [test["accuracy"]], marker="*", markersize=13, color="tab:red", linestyle="none",
                       markeredgecolor="black", markeredgewidth=0.5, zorder=5,
                       label=f"test accuracy {test['accuracy']:.3f} (final weights)")
        metric_keys.append("test_accuracy")
    if ax_metric is not None:
        label = _metric_label(metric_keys)
        ax_metric.set(xlabel="step", ylabel=label, title=label)

    if steps and steps.get("step"):
        ax_lr.plot(steps["step"], steps["lr"], color="tab:green", **each_step)
    else:
        x, y = _series(history, "lr")
        ax_lr.plot(x, y, color="tab:green", marker="o", markersize=3)
    ax_lr.set(xlabel="step", ylabel="learning rate", title="learning rate")
    ax_lr.set_ylim(bottom=0)  # the absolute scale: a constant rate is a flat line, not magnified noise
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))

    for ax in (ax for ax in (ax_loss, ax_metric) if ax is not None):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
        ax.grid(alpha=0.3)
    ax_lr.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def plot_curves(history: list[dict], path, steps: dict | None = None, title: str | None = None,
                test: dict | None = None) -> str:
    """Draw the curves of a run and write them to ``path`` as a PNG (atomically). Returns the path.

    ``test``: the test result of the final weights, drawn in the accuracy panel.
    """
    if not history and not (steps and steps.get("step")):
        raise ValueError("plot_curves: nothing to plot; the history is empty (train at least one step)")
    png = _png_bytes(make_figure(history, steps, title, test=test))

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(png)

    atomic_write(path, write)
    return os.fspath(path)
