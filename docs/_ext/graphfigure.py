"""Draw the graph minidl records for a two-layer network, from the graph itself.

At the start of every build this extension runs a two-layer classifier's
forward pass with minidl and draws the recorded graph with ``mdl.draw_graph``
(which walks each Tensor's ``creator`` and each Function's ``inputs``) into
``docs/_generated/two_layer_graph.svg``, which engine.md shows. The numbers on
the ops are the order in which ``loss.backward()`` visits them, taken from
the engine's own topological sort: if the engine changes, the figure does.
"""
from __future__ import annotations

from pathlib import Path

OUTPUT = Path(__file__).resolve().parent.parent / "_generated" / "two_layer_graph.svg"


def record_two_layer_net():
    """(loss, every tensor of the forward pass by name) for a 3-8-4 classifier on a batch of 5."""
    import numpy as np

    import minidl as mdl
    import minidl.functional as F

    mdl.manual_seed(0)
    named = {
        "x": mdl.randn(5, 3),
        "W1": mdl.randn(8, 3, requires_grad=True), "b1": mdl.zeros(8, requires_grad=True),
        "W2": mdl.randn(4, 8, requires_grad=True), "b2": mdl.zeros(4, requires_grad=True),
    }
    named["a1"] = F.linear(named["x"], named["W1"], named["b1"])
    named["h"] = F.relu(named["a1"])
    named["logits"] = F.linear(named["h"], named["W2"], named["b2"])
    targets = np.array([0, 3, 1, 2, 0])
    named["ℓ"] = F.cross_entropy(named["logits"], targets, reduction="none")
    named["loss"] = named["ℓ"].mean()
    for name, tensor in named.items():
        tensor.name = name
    return named["loss"], named


def draw(path: Path = OUTPUT) -> Path:
    """Draw the graph with ``mdl.draw_graph`` (the function users call on their own models) into ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from minidl.graphdraw import draw_graph

    loss, named = record_two_layer_net()
    figure = draw_graph(loss, params={name: named[name] for name in ("W1", "b1", "W2", "b2")}, order=True,
                        title="")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight", metadata={"Date": None})  # no date: the same graph, the same file
    plt.close(figure)
    return path


SWEEP = OUTPUT.parent / "error_sweep.svg"


def draw_sweep(path: Path = SWEEP) -> Path:
    """The error against the step for tanh(layer_norm(x)), as ``minidl gradcheck --sweep`` draws it."""
    import matplotlib
    matplotlib.use("Agg")
    import numpy as np
    from matplotlib.figure import Figure

    import minidl as mdl
    import minidl.functional as F
    from minidl.gradcheck import error_sweep, plot_error_sweep

    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.standard_normal((4, 6)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal(6), requires_grad=True)
    sweep = error_sweep(lambda x, w: F.layer_norm(x, (6,), weight=w).tanh(), [x, w], name="tanh(layer_norm(x))")
    figure = Figure(figsize=(8.6, 4.4), layout="constrained")
    plot_error_sweep(sweep, ax=figure.subplots())
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, metadata={"Date": None})
    return path


def _on_builder_inited(app):
    draw()
    draw_sweep()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
