"""A network as a graph of layers: the input of rematerialization planning beyond chains.

The chain schedules (:mod:`minidl.checkpoint.schedule`) see a model as layers
0 … L−1, each fed by the one before; a skip connection has to stay inside one
atomic layer (``nn.Residual``), so no checkpoint can fall inside it. A
:class:`LayerGraph` names every layer's inputs instead, as torch.fx's
GraphModule does, so that a planner sees the skip as an edge::

    net = LayerGraph()
    net.add("stem", nn.Linear(8, 32))                  # fed by the model's input
    net.add("fc", nn.Linear(32, 32), "stem")
    net.add("act", nn.Tanh(), "fc")
    net.add("skip", Add(), "stem", "act")              # the skip: stem's output used again
    y = net(x)                                          # the last layer's output

Layers run in the order they were added (a topological order: each names
only layers added before it, or ``"input"``). :meth:`LayerGraph.from_sequential`
opens the ``nn.Residual`` blocks of a Sequential into their layers and an
:class:`Add`, sharing the modules (and so the parameters) with it.
"""
from __future__ import annotations

from minidl.nn.containers import Sequential
from minidl.nn.layers import Residual
from minidl.nn.module import Module

__all__ = ["LayerGraph", "Add", "INPUT"]

INPUT = "input"  # the name of the model's input among a layer's inputs


class Add(Module):
    """y = a + b + …: where a skip connection joins (its inputs are any number of tensors of one shape)."""

    def forward(self, *xs):
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return total


class LayerGraph(Module):
    """Layers with named inputs, run in the order added; the output is the last layer's (module docstring).

    ``inputs[i]`` lists layer i's inputs as indices: −1 for the model's input, j < i for layer j.
    """

    def __init__(self):
        super().__init__()
        self.names, self.inputs = [], []

    def add(self, name: str, module: Module, *inputs: str) -> "LayerGraph":
        """Append layer ``name`` computing ``module(*inputs)`` (layer names, or ``"input"``; default: the input)."""
        if not isinstance(module, Module):
            raise TypeError(f"LayerGraph.add: layer '{name}' must be a Module, got {type(module).__name__}")
        if name in self.names or name == INPUT or not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"LayerGraph.add: '{name}' must be a new identifier other than '{INPUT}'; "
                             f"the layers so far are {self.names}")
        indices = []
        for source in inputs or (INPUT,):
            if source != INPUT and source not in self.names:
                raise ValueError(f"LayerGraph.add: layer '{name}' names input '{source}', which is neither "
                                 f"'{INPUT}' nor a layer added before it ({self.names})")
            indices.append(-1 if source == INPUT else self.names.index(source))
        self.add_module(name, module)
        self.names.append(name)
        self.inputs.append(tuple(indices))
        return self

    @property
    def layers(self) -> list:
        return [getattr(self, name) for name in self.names]

    def __len__(self):
        return len(self.names)

    def consumers(self) -> list:
        """consumers[i]: the layers that read layer i's output (in order)."""
        found = [[] for _ in self.names]
        for k, sources in enumerate(self.inputs):
            for j in dict.fromkeys(sources):
                if j >= 0:
                    found[j].append(k)
        return found

    def forward(self, x):
        if not self.names:
            raise ValueError("LayerGraph: no layers; add some with LayerGraph.add(name, module, *inputs)")
        values = []
        for layer, sources in zip(self.layers, self.inputs):
            values.append(layer(*[x if j < 0 else values[j] for j in sources]))
        return values[-1]

    @classmethod
    def from_sequential(cls, model: Sequential) -> "LayerGraph":
        """The layers of a Sequential (nested ones opened) with each Residual's body and shortcut opened too.

        ``Residual(body)`` becomes body's layers and an :class:`Add` of the block's input and the body's output.
        The modules are the Sequential's own: the graph computes the same function with the same parameters.
        """
        if not isinstance(model, Sequential):
            raise TypeError(f"LayerGraph.from_sequential: expected an nn.Sequential, got {type(model).__name__}")
        graph = cls()

        def place(module, source, prefix):
            if type(module) is Sequential:
                for i, layer in enumerate(module):
                    source = place(layer, source, f"{prefix}_{i}")
                return source
            if type(module) is Residual:
                body = place(module.body, source, f"{prefix}_body")
                skip = source if module.shortcut is None else place(module.shortcut, source, f"{prefix}_shortcut")
                graph.add(f"{prefix}_add", Add(), skip, body)
                return f"{prefix}_add"
            graph.add(prefix, module, source)
            return prefix
        for i, layer in enumerate(model):
            place(layer, INPUT if i == 0 else graph.names[-1], f"l{i}")
        return graph
