"""Draw the graph minidl records for a two-layer network, from the graph itself.

At the start of every build this extension runs a two-layer classifier's
forward pass with minidl, walks the recorded graph (each Tensor's
``creator``, each Function's ``inputs``) and draws it with matplotlib into
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


def layout(loss):
    """Positions {node: (column, row)}: the loss on the right, each op one column left of its output,
    its first input on the same row and the other inputs above and below it."""
    positions, edges = {}, []

    def place_tensor(tensor, column, row):
        positions[tensor] = (column, row)
        fn = tensor.creator
        if fn is None or fn in positions:
            return
        positions[fn] = (column - 1, row)
        edges.append((fn, tensor))
        offsets = [0, 1, -1, 2, -2]
        for index, x in enumerate(fn.inputs):
            edges.append((x, fn))
            if x not in positions:
                place_tensor(x, column - 2, row + offsets[index % len(offsets)])

    place_tensor(loss, 0, 0)
    first = min(column for column, _ in positions.values())
    return {node: (column - first, row) for node, (column, row) in positions.items()}, edges


def draw(path: Path = OUTPUT) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    from minidl.autograd import Function, _topological_order
    from minidl.tensor import Tensor

    loss, _ = record_two_layer_net()
    positions, edges = layout(loss)
    visit = {fn: index + 1 for index, fn in enumerate(_topological_order({loss.creator}))}
    positions = {node: (1.45 * column, 1.05 * row) for node, (column, row) in positions.items()}
    right = max(x for x, _ in positions.values())
    fig, ax = plt.subplots(figsize=(0.95 * (right + 1.2), 3.2))
    height = 0.55
    widths = {}
    for node, (x, y) in positions.items():
        if isinstance(node, Function):
            label, face, edge = type(node).__name__, "#fde7c8", "#c2710c"
            ax.text(x, y - height / 2 - 0.1, f"backward #{visit[node]}", ha="center", va="top",
                    fontsize=7.5, color="#b3261e")
        else:
            assert isinstance(node, Tensor)
            shape = "×".join(map(str, node.shape)) or "scalar"
            label = f"{node.name}\n{shape}"
            face = "#d6e6fb" if node.requires_grad and node.is_leaf else "#eeeeee" if node.is_leaf else "white"
            edge = "#2f5d9e" if node.requires_grad else "#777777"
        width = widths[node] = max(0.8, 0.095 * max(len(part) for part in label.split("\n")) + 0.2)
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.02,rounding_size=0.12", facecolor=face, edgecolor=edge,
                                    linewidth=1.2))
        ax.text(x, y, label, ha="center", va="center", fontsize=8.5)
    for source, target in edges:
        (x0, y0), (x1, y1) = positions[source], positions[target]
        start = (x0 + widths[source] / 2, y0)
        if y0 == y1:
            end = (x1 - widths[target] / 2, y1)
        else:  # a side input enters the op's left side near the corner it comes from
            end = (x1 - widths[target] / 2, y1 + (height / 4 if y0 > y1 else -height / 4))
        ax.annotate("", xy=end, xytext=start,
                    arrowprops={"arrowstyle": "-|>", "color": "#444444", "lw": 1.0, "shrinkA": 1, "shrinkB": 1})
    columns = right
    rows = [row for _, row in positions.values()]
    ax.set_xlim(-0.7, columns + 0.7)
    ax.set_ylim(min(rows) - 0.45, max(rows) + 0.45)
    ax.set_aspect("equal")
    ax.axis("off")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight", metadata={"Date": None})  # no date: the same graph, the same file
    plt.close(fig)
    return path


def _on_builder_inited(app):
    draw()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
