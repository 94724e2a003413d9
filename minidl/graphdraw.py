"""The graph that made a tensor, drawn: ``mdl.draw_graph(loss)``.

Every op call records a node (a :class:`~minidl.autograd.Function`) holding its
input tensors; following ``tensor.creator`` and ``fn.inputs`` back from ``y``
walks the whole graph that ``y.backward()`` would walk. :func:`draw_graph`
draws that walk with matplotlib (no Graphviz needed): ops as orange boxes
with their names, tensors as boxes with their shapes, leaves that get a
``.grad`` in blue, parameters (given by ``params``) in green with their names,
constants in grey. The output is on the right; each op sits one column left
of what it made, so the forward pass reads left to right and the backward
walk right to left.

Options annotate what the engine does with the graph, from the engine's own
data: ``order=True`` numbers the ops in the order ``backward`` visits them
(its topological sort); ``memory=True`` writes under each op the bytes it
holds for backward (its saved inputs and arrays, as :mod:`minidl.memory`
counts them) and adds a panel of the bytes still held after each step of
the walk (a node lets go of its saves right after its backward, so a buffer
is freed when the last node holding it is done). A segment of gradient
checkpointing is one node whose inside was not recorded: it is drawn hatched,
labelled with the step at which backward recomputes it.

Draw before ``backward()``: without ``retain_graph=True`` the walk frees each
node as it goes.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import Function, topological_order
from minidl.tensor import Tensor

__all__ = ["draw_graph", "graph_nodes"]

_OP = ("#fde7c8", "#c2710c")          # face, edge
_RECOMPUTED = ("#fff4d6", "#8a5a00")
_LEAF_GRAD = ("#d6e6fb", "#2f5d9e")
_PARAMETER = ("#d8f0d2", "#2e7d32")
_CONSTANT = ("#eeeeee", "#777777")
_INNER = ("white", "#2f5d9e")


def graph_nodes(y: Tensor):
    """(tensors, functions, edges) of the graph that made ``y``: every Tensor and Function reachable
    backwards from it, and (source, target) pairs for tensor → op (an input) and op → tensor (its output)."""
    if not isinstance(y, Tensor):
        raise TypeError(f"draw_graph: expected the Tensor whose graph to draw, got {type(y).__name__}")
    tensors, functions, edges = {y: None}, {}, []
    stack = [y]
    while stack:
        t = stack.pop()
        fn = t.creator
        if fn is None:
            continue
        edges.append((fn, t))
        if fn in functions:
            continue
        if fn.inputs is None:
            raise RuntimeError(f"draw_graph: the graph was freed by backward() (at {type(fn).__name__}); draw "
                               "it before backward, or call backward(retain_graph=True)")
        functions[fn] = None
        for x in fn.inputs:
            edges.append((x, fn))
            if x not in tensors:
                tensors[x] = None
                stack.append(x)
    unique = {(id(source), id(target)): (source, target) for source, target in edges}  # ids: Tensor == is elementwise
    return list(tensors), list(functions), list(unique.values())


def _layout(y, tensors, functions, edges, walk):
    """{node: (column, row)}: y in the rightmost column, each node one column left of its leftmost consumer;
    in each column the nodes sorted by where their consumers are (first input highest), then spread."""
    consumers = {node: [] for node in tensors + functions}
    outputs = {fn: [] for fn in functions}
    for source, target in edges:
        consumers[source].append(target)
        if isinstance(source, Function):
            outputs[source].append(target)
    depth = {y: 0}
    for fn in walk:  # each op after every op that consumes its outputs: their depths are final
        depth[fn] = max(depth[t] for t in outputs[fn]) + 1
        for x in fn.inputs:
            depth[x] = max(depth.get(x, 0), depth[fn] + 1)
    columns = {}
    for node in tensors + functions:
        columns.setdefault(depth[node], []).append(node)
    rows = {}
    for column in sorted(columns):
        def wanted(node):
            taken = [rows[c] + 0.45 * _input_index(node, c) for c in consumers[node] if c in rows]
            return sum(taken) / len(taken) if taken else 0.0
        placed = sorted(columns[column], key=wanted)
        targets = [wanted(node) for node in placed]
        spread = targets[:1]
        for target in targets[1:]:
            spread.append(max(target, spread[-1] + 1.0))
        shift = (sum(targets) - sum(spread)) / len(spread)  # keep the column centred on what it feeds
        for node, row in zip(placed, spread):
            rows[node] = row + shift
    last = max(depth.values())
    return {node: (last - depth[node], rows[node]) for node in tensors + functions}


def _input_index(x, fn):
    return next((i for i, t in enumerate(fn.inputs) if t is x), 0) if isinstance(fn, Function) else 0


def _held_bytes(functions, visit):
    """(bytes each node holds, bytes held after each step of the backward walk), parameters left out."""
    from minidl.memory import saved_arrays

    holders, size, per_node = {}, {}, {}
    for fn in functions:
        buffers = {}
        for array in saved_arrays(fn):
            root = array
            while isinstance(root.base, type(array)):
                root = root.base
            buffers[id(root)] = int(root.nbytes)
        per_node[fn] = sum(buffers.values())
        for key, nbytes in buffers.items():
            holders.setdefault(key, []).append(visit[fn])
            size[key] = nbytes
    steps = len(visit)
    freed_at = {key: max(steps_) for key, steps_ in holders.items()}  # the last holder's backward frees it
    held = [sum(size[k] for k, at in freed_at.items() if at > step) for step in range(steps + 1)]
    return per_node, held


def _label(node, names, visit, order, per_node):
    if isinstance(node, Function):
        text = type(node).__name__
        notes = []
        if getattr(type(node), "recomputes", False):
            notes.append(f"recomputed at step {visit[node]}" if order else "recomputed in backward")
        elif order:
            notes.append(f"backward #{visit[node]}")
        if per_node is not None:
            from minidl.memory import format_bytes
            notes.append(f"holds {format_bytes(per_node[node])}")
        return text, notes
    shape = "×".join(map(str, node.shape)) or "scalar"
    name = names.get(id(node)) or node.name
    return (f"{name}\n{shape}" if name else shape), []


def _style(node, params):
    if isinstance(node, Function):
        return _RECOMPUTED if getattr(type(node), "recomputes", False) else _OP
    if id(node) in params:
        return _PARAMETER
    if node.creator is None:
        return _LEAF_GRAD if node.requires_grad else _CONSTANT
    return _INNER


def draw_graph(y: Tensor, params=None, names=None, order: bool = False, memory: bool = False,
               path=None, ax=None, title=None):
    """A matplotlib Figure of the graph that made ``y`` (see the module docstring for what is drawn).

    ``params``: a mapping name → tensor (``dict(model.named_parameters())``) whose tensors are marked
    as parameters and named; ``names``: more tensors to name (mapping name → tensor); a tensor's own
    ``name`` is used otherwise. ``order=True`` numbers the ops in backward's visit order;
    ``memory=True`` adds the bytes each op holds for backward and a panel of the bytes held as
    the walk frees them. ``path`` writes a PNG (complete or not at all; the figure is then made
    without pyplot); ``ax`` draws into your axes; otherwise the figure is a pyplot one, which a
    notebook shows (``plt.show()``; close it with ``plt.close(fig)`` in a loop).
    """
    tensors, functions, edges = graph_nodes(y)
    params = {id(t): name for name, t in (params or {}).items()}
    names = {**{id(t): name for name, t in (names or {}).items()}, **params}
    walk = topological_order({y.creator}) if y.creator is not None else []
    visit = {fn: step + 1 for step, fn in enumerate(walk)}
    per_node, held = _held_bytes(functions, visit) if memory else (None, None)
    positions = _layout(y, tensors, functions, edges, walk)
    positions = {node: (1.5 * column, -1.1 * row) for node, (column, row) in positions.items()}
    xs = [x for x, _ in positions.values()]
    ys = [r for _, r in positions.values()]
    width_in = max(4.0, 1.0 * (max(xs) - min(xs) + 1.6))
    height_in = max(2.2, 0.75 * (max(ys) - min(ys) + 1.4))
    if ax is None:
        size = (width_in, height_in + (2.0 if memory else 0.0))
        if path is not None:  # a bare Figure: no pyplot, no GUI backend, any thread
            from matplotlib.figure import Figure
            figure = Figure(figsize=size, layout="constrained")
        else:  # through pyplot, so that a notebook shows it (as plt.subplots would)
            import matplotlib.pyplot as plt
            figure = plt.figure(figsize=size, layout="constrained")
        if memory:
            ax, ax_memory = figure.subplots(2, 1, height_ratios=[height_in, 2.0])
        else:
            ax, ax_memory = figure.subplots(), None
    else:
        figure, ax_memory = ax.figure, None
    _draw_nodes(ax, positions, edges, names, params, visit, order, per_node)
    named = names.get(id(y)) or y.name
    ax.set_title(title if title is not None else f"the graph of {named or 'the output'} "
                 f"({len(functions)} ops, {len(tensors)} tensors)", fontsize=10)
    if ax_memory is not None:
        _draw_memory(ax_memory, held, walk)
    if path is not None:
        from minidl.serialization import atomic_write
        atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))
    return figure


def _draw_nodes(ax, positions, edges, names, params, visit, order, per_node):
    from matplotlib.patches import FancyBboxPatch

    height, widths = 0.62, {}
    for node, (x, y) in positions.items():
        label, notes = _label(node, names, visit, order, per_node)
        face, edge = _style(node, params)
        width = widths[node] = max(0.85, 0.095 * max(len(part) for part in label.split("\n")) + 0.25)
        recomputed = isinstance(node, Function) and getattr(type(node), "recomputes", False)
        ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                    boxstyle="round,pad=0.02,rounding_size=0.12", facecolor=face, edgecolor=edge,
                                    linewidth=1.2, hatch="///" if recomputed else None,
                                    linestyle="--" if recomputed else "-"))
        ax.text(x, y, label, ha="center", va="center", fontsize=8)
        if notes:
            ax.text(x, y - height / 2 - 0.06, "\n".join(notes), ha="center", va="top", fontsize=6.5,
                    color="#b3261e")
    for source, target in edges:
        (x0, y0), (x1, y1) = positions[source], positions[target]
        start = (x0 + widths[source] / 2, y0)
        end = (x1 - widths[target] / 2, y1 + np.clip(y0 - y1, -height / 4, height / 4))
        ax.annotate("", xy=end, xytext=start,
                    arrowprops={"arrowstyle": "-|>", "color": "#444444", "lw": 0.9, "shrinkA": 1, "shrinkB": 1})
    xs = [x for x, _ in positions.values()]
    ys = [y for _, y in positions.values()]
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(min(ys) - 0.75, max(ys) + 0.45)
    ax.set_aspect("equal")
    ax.axis("off")


def _draw_memory(ax, held, walk):
    from minidl.memory import format_bytes

    steps = np.arange(len(held))
    ax.step(steps, held, where="post", color="C0")
    ax.fill_between(steps, held, step="post", alpha=0.2, color="C0")
    ax.set_xticks(steps)
    ax.set_xticklabels(["start"] + [f"#{k}" for k in steps[1:]], fontsize=7)
    ax.set_xlabel("backward step (the op of that number has just run and let go of its saves)", fontsize=8)
    ax.set_ylabel("held for backward", fontsize=8)
    ticks = ax.get_yticks()
    ax.set_yticks(ticks)
    ax.set_yticklabels([format_bytes(t) for t in ticks], fontsize=7)
    ax.set_ylim(0, max(held) * 1.1 if held and max(held) else 1)
    ax.set_xlim(-0.3, len(held) - 0.7)
