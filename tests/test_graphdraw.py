"""mdl.draw_graph: the graph that made a tensor, drawn from the engine's own records."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.autograd import topological_order
from minidl.graphdraw import graph_nodes

pytest.importorskip("matplotlib")


def small_graph():
    a = mdl.tensor(np.array([1.5, -0.5]), requires_grad=True)
    b = mdl.tensor(np.array([2.0, 1.0]), requires_grad=True)
    c = (a * b + a.exp()).sum()
    return a, b, c


def texts(figure):
    return [t.get_text() for t in figure.axes[0].texts]


def test_graph_nodes_are_the_recorded_graph():
    a, b, c = small_graph()
    tensors, functions, edges = graph_nodes(c)
    assert sorted(type(fn).__name__ for fn in functions) == ["Add", "Exp", "Mul", "Sum"]
    assert len(tensors) == 6  # a, b, a·b, eᵃ, their sum, c
    assert all(any(t is x for t in tensors) for x in (a, b, c))
    # every op has an edge from each input and one to its output; a feeds two ops
    assert len(edges) == sum(len(fn.inputs) for fn in functions) + len(functions)
    assert sum(1 for source, _ in edges if source is a) == 2


def test_drawn_with_names_shapes_and_the_backward_order():
    a, b, c = small_graph()
    figure = mdl.draw_graph(c, names={"a": a, "b": b}, order=True)
    labels = texts(figure)
    assert {"a\n2", "b\n2", "Mul", "Exp", "Add", "Sum", "scalar"} <= set(labels)
    walk = topological_order({c.creator})  # the engine's own visit order
    for step, fn in enumerate(walk, start=1):
        name = type(fn).__name__
        assert labels[labels.index(name) + 1] == f"backward #{step}"  # the note right under the op
    assert [type(fn).__name__ for fn in walk][0] == "Sum"


def test_parameters_are_marked_and_named():
    x = mdl.tensor(np.ones((5, 3)))
    layer = mdl.nn.Linear(3, 2)
    loss = F.relu(layer(x)).mean()
    figure = mdl.draw_graph(loss, params=dict(layer.named_parameters()))
    boxes = {label: patch for label, patch in zip(texts(figure), figure.axes[0].patches)}
    assert "weight\n2×3" in boxes and "bias\n2" in boxes and "5×3" in boxes
    green, grey = boxes["weight\n2×3"].get_facecolor(), boxes["5×3"].get_facecolor()
    assert green != grey and boxes["bias\n2"].get_facecolor() == green


def test_memory_panel_matches_the_memory_tracker():
    """The bytes held before the walk equal what minidl.memory counts for the same forward; the walk frees
    them all, step by step, never going up."""
    from minidl.memory import track
    rng = np.random.default_rng(0)
    w = mdl.tensor(rng.standard_normal((16, 8)), requires_grad=True)
    with track() as tracker:
        x = mdl.tensor(rng.standard_normal((32, 16)))
        loss = F.gelu(x @ w).tanh().sum()
        figure = mdl.draw_graph(loss, order=True, memory=True)
    held = figure.axes[1].lines[0].get_ydata()
    assert held[0] == tracker.peak_bytes > 0
    assert held[-1] == 0 and np.all(np.diff(held) <= 0)
    assert len(held) == len(graph_nodes(loss)[1]) + 1
    assert any(t.startswith("backward #1\nholds ") for t in texts(figure))


def test_a_checkpointed_segment_is_marked_as_recomputed():
    from minidl.checkpoint import checkpoint
    x = mdl.tensor(np.linspace(-1, 1, 6), requires_grad=True)
    y = checkpoint(lambda t: (t.tanh() * 2).exp(), x).sum()
    figure = mdl.draw_graph(y, order=True)
    labels = texts(figure)
    assert "CheckpointFunction" in labels and "recomputed at step 2" in labels
    hatched = [p for p in figure.axes[0].patches if p.get_hatch()]
    assert len(hatched) == 1


def test_draw_graph_writes_a_png_and_refuses_a_freed_graph(tmp_path):
    a, b, c = small_graph()
    mdl.draw_graph(c, path=tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    c.backward()
    with pytest.raises(RuntimeError, match="freed by backward"):
        mdl.draw_graph(c)
    with pytest.raises(TypeError, match="expected the Tensor"):
        mdl.draw_graph(np.ones(3))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")
