"""Every figure minidl draws, rendered: nothing (labels, titles, legends, tick labels) falls off the canvas.

The check: the tight bounding box of all the figure's artists, as the Agg renderer
lays them out, lies within the figure's own box. A clipped axis label or a
legend pushed past the edge makes it stick out.
"""
import json
import pathlib

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLACK = 0.005  # inches (half a pixel at 100 dpi): the descender of a "g" sticking out by 2 pixels counts


def assert_nothing_clipped(fig, what):
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    width, height = fig.get_size_inches()
    assert box.x0 >= -SLACK and box.y0 >= -SLACK and box.x1 <= width + SLACK and box.y1 <= height + SLACK, (
        f"{what}: its artists span ({box.x0:.2f}, {box.y0:.2f})-({box.x1:.2f}, {box.y1:.2f}) inches, "
        f"outside the {width:.2f} x {height:.2f} canvas: something is clipped")


def test_the_check_catches_a_clipped_label():
    from matplotlib.figure import Figure
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    fig.subplots_adjust(left=0.0, bottom=0.0)  # no room for the tick labels and axis labels
    ax.set_xlabel("learning rate")
    with pytest.raises(AssertionError, match="clipped"):
        assert_nothing_clipped(fig, "squeezed")


def _history():
    return [{"step": 10 * i, "epoch": float(i), "train_loss": 1 / i, "train_accuracy": 1 - 0.5 / i,
             "val_loss": 1.2 / i, "val_accuracy": 0.9 - 0.1 / i, "val_f1": 0.9 - 0.1 / i, "lr": 0.1}
            for i in range(1, 6)]


def test_curves():
    from minidl.train.curves import make_figure
    steps = {"step": list(range(1, 51)), "loss": list(np.linspace(2, 0.1, 50)), "lr": list(np.linspace(0.1, 0, 50))}
    fig = make_figure(_history(), steps, title="mlp on digits", test={"accuracy": 0.95, "f1": 0.94, "loss": 0.2})
    assert_nothing_clipped(fig, "curves.png")
    assert "train loss (epoch mean)" in [line.get_label() for line in fig.axes[0].get_lines()]  # whole epochs
    middle = fig.axes[1]
    assert middle.get_title() == middle.get_ylabel() == "accuracy / F1"
    lines = {line.get_label(): line for line in middle.get_lines()}
    # validation accuracy and F1 are equal here: F1 is dashed and hollow, so accuracy shows through
    assert lines["val accuracy"].get_linestyle() == "-" and lines["val F1"].get_linestyle() == "--"
    assert lines["val F1"].get_markerfacecolor() == "none"
    (test,) = [line for label, line in lines.items() if label.startswith("test accuracy 0.950")]
    assert list(test.get_xdata()) == [50] and list(test.get_ydata()) == [0.95]
    assert fig.axes[2].get_ylabel() == "learning rate"


def test_curves_of_a_run_without_a_metric_have_no_empty_panel():
    """A language model's run (the GPT's loss.png): validation loss, no accuracy: two panels, all labelled."""
    from minidl.train.curves import make_figure
    history = [{"step": 4 * i, "epoch": 0.1 * i, "train_loss": 3 / i, "val_loss": 3.2 / i, "lr": 1e-3}
               for i in range(1, 4)]
    steps = {"step": list(range(1, 13)), "loss": list(np.linspace(4, 1, 12)), "lr": list(np.linspace(1e-3, 1e-4, 12))}
    fig = make_figure(history, steps, title="GPT")
    assert_nothing_clipped(fig, "loss.png")
    assert [ax.get_title() for ax in fig.axes] == ["loss", "learning rate"]
    assert all(ax.get_xlabel() == "step" and ax.get_ylabel() for ax in fig.axes)
    loss = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(loss) == {"train (each step)", "train loss (mean over 4 steps)", "validation loss"}
    assert list(loss["validation loss"].get_xdata()) == [4, 8, 12]
    assert not fig.axes[0].texts and not fig.axes[1].texts  # no "no metric" placeholder
    # losses from 4 down to 1, within one decade: a linear axis with several labelled ticks, not one lone "3"
    assert fig.axes[0].get_yscale() == "linear"
    assert len([t for t in fig.axes[0].get_yticklabels() if t.get_text()]) >= 4


def test_optimizers_grid(tmp_path):
    from matplotlib.figure import Figure

    from minidl.optim import trajectories
    fig = Figure(figsize=(16, 10.8), layout="constrained")
    axes = trajectories.draw_all(fig, trajectories.all_trajectories(steps=20))
    assert_nothing_clipped(fig, "optimizers.png")
    for row in axes:
        for ax in row:
            assert ax.get_xlabel() == "x" and ax.get_ylabel() == "y"
    legend = axes[-1][0].get_legend()
    assert legend is not None and legend.get_texts()[0].get_fontsize() >= 8
    styles = [(line.get_linestyle(), line.get_linewidth()) for line in axes[0][0].get_lines()
              if not line.get_label().startswith("_")]
    assert len(set(styles)) == len(styles)  # each path its own dash and width: none hides another
    path = trajectories.optimizers_command(str(tmp_path / "optimizers.png"), steps=200)
    assert pathlib.Path(path).stat().st_size < 700_000  # it was 1 MB


def test_lr_find(tmp_path):
    from matplotlib.figure import Figure

    from minidl.optim.lr_finder import LRRangeResult, plot_lr_range
    lrs = list(np.geomspace(1e-5, 1, 60))
    result = LRRangeResult(lrs, list(2.3 - np.log10(np.array(lrs) / 1e-5) * 0.3), 1e-2)
    ax = plot_lr_range(result, str(tmp_path / "lr.png"))
    assert_nothing_clipped(ax.figure, "lr_find.png")
    assert isinstance(ax.figure, Figure) and ax.get_xlabel() == "learning rate"


@pytest.fixture(scope="module")
def bench_results():
    return json.loads((ROOT / "benchmarks" / "results" / "cpu-2core.json").read_text())


@pytest.mark.parametrize("name", ["roofline_figure", "batch_sweep_figure", "step_profile_figure"])
def test_bench_figures(bench_results, name):
    import matplotlib.pyplot as plt

    from minidl.roofline import figures
    fig = getattr(figures, name)(bench_results)
    try:
        assert_nothing_clipped(fig, name)
        if name == "batch_sweep_figure":
            left = fig.axes[0]
            labels = [t.get_text() for t in left.get_yticklabels() if t.get_text()]
            assert labels and not any("10^" in t or "times" in t or "×" in t for t in labels), labels
            assert all(float(t) > 0 for t in labels)  # plain numbers: 20, 50, 100
    finally:
        plt.close(fig)


def test_pipeline_timeline():
    from matplotlib.figure import Figure

    from minidl.parallel.pipeline import draw_timeline, simulate
    fig = Figure(figsize=(8, 2.2), layout="tight")
    draw_timeline(simulate("1f1b", 4, 6), ax=fig.add_subplot())
    assert_nothing_clipped(fig, "the pipeline timeline")


def test_landscape_and_inspection_figures():
    import matplotlib.pyplot as plt

    import minidl as mdl
    import minidl.functional as F
    from minidl import nn
    from minidl.train import loss_landscape, plot_mispredictions, show_batch
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 16)).astype(np.float32), rng.integers(0, 3, 40)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))
    for directions in (1, 2):
        fig = plt.figure(figsize=(4.5, 3.5), layout="constrained")
        ax = loss_landscape(model, F.cross_entropy, (x, y), directions=directions, steps=5).plot(fig.subplots())
        assert_nothing_clipped(ax.figure, f"{directions}-D loss landscape")
        plt.close(ax.figure)
    for fig in (show_batch([(x, y)], n=10), plot_mispredictions(model, x, y, k=10)):
        assert_nothing_clipped(fig, "image grid")
        plt.close(fig)


def test_error_sweep():
    from minidl.gradcheck import error_sweep, plot_error_sweep
    from minidl.tensor import Tensor
    x = Tensor(np.linspace(-1, 1, 6), requires_grad=True)
    assert_nothing_clipped(plot_error_sweep(error_sweep(lambda t: t.tanh(), [x], name="tanh")), "sweep_tanh.png")


def test_draw_graph():
    import minidl as mdl
    import minidl.functional as F
    x = mdl.tensor(np.ones((4, 3)))
    w = mdl.tensor(np.ones((2, 3)), requires_grad=True)
    loss = F.softmax(F.linear(x, w)).sum()
    assert_nothing_clipped(mdl.draw_graph(loss, params={"w": w}, order=True, memory=True), "draw_graph")
