"""A small architecture search: the depth and widths of an MLP as hyperparameters, with their cost.

    from minidl.tune import ArchitectureObjective, Choice, Integer, evolution_search, random_search
    objective = ArchitectureObjective(data="digits", optimizer="adam", lr=3e-3, batch_size=64)
    space = {"depth": Integer(1, 3), "width": Choice([8, 16, 32, 64, 128])}
    result = random_search(objective, space, n_trials=10, epochs=3, seed=0)
    print(result.table(info=("params", "flops")))

An architecture is a configuration like any other: ``depth`` hidden layers of ``width``
units each (``width_1``, ``width_2``, ... override one layer's width), so every strategy of
:mod:`minidl.tune` searches it: random search, :func:`~minidl.tune.evolution_search`
(mutation moves one layer's width or the depth, as Real et al. 2019 mutate one cell).
Training settings (``lr``, ``weight_decay``, ...) may be searched with them.

Each trial reports the architecture's size and cost (:func:`mlp_cost`), for an input of
``d_0`` features, hidden widths ``d_1 .. d_L`` and ``d_{L+1}`` classes::

    parameters = Σ_i (d_i · d_{i+1} + d_{i+1})       (weights and biases)
    FLOPs      = Σ_i 2 · d_i · d_{i+1}                (one multiply and one add per weight, per example)

so a search can weigh accuracy against size (a Pareto front) rather than accuracy alone.
"""
from __future__ import annotations

import re

import numpy as np

from minidl.tune.objective import TrainerObjective

__all__ = ["ArchitectureObjective", "hidden_widths", "mlp_cost"]

_LAYER_WIDTH = re.compile(r"width_([1-9][0-9]*)$")


def _is_architecture(name: str) -> bool:
    return name in ("depth", "width") or _LAYER_WIDTH.match(name) is not None


def hidden_widths(config: dict) -> tuple:
    """The hidden widths of ``config``: ``depth`` layers of ``width`` units, ``width_i`` overriding layer i."""
    depth, width = config.get("depth"), config.get("width")
    for name, value in (("depth", depth), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name == "depth"
                                                                                           else 1):
            raise ValueError(f"ArchitectureObjective: {name} must be a whole number (depth >= 0, width >= 1), "
                             f"got {value!r}; search it with Integer or a Choice of integers")
    widths = []
    for i in range(1, int(depth) + 1):
        w = config.get(f"width_{i}", width)
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise ValueError(f"ArchitectureObjective: width_{i} must be a whole number >= 1, got {w!r}")
        widths.append(int(w))
    return tuple(widths)


def mlp_cost(inputs: int, hidden, classes: int) -> dict:
    """The parameters and the FLOPs of one example's forward pass of an MLP from ``inputs`` features through the
    ``hidden`` widths to ``classes`` scores, as ``{"params": int, "flops": int}`` (equations in the module
    docstring)."""
    sizes = [int(inputs), *(int(h) for h in hidden), int(classes)]
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return {"params": sum(a * b + b for a, b in pairs), "flops": sum(2 * a * b for a, b in pairs)}


class ArchitectureObjective(TrainerObjective):
    """A :class:`~minidl.tune.TrainerObjective` whose configuration also sets the MLP: ``depth``, ``width``,
    ``width_i`` (see the module docstring). Each result carries ``params`` and ``flops``, and ``hidden``."""

    def __init__(self, data: str = "digits", **settings):
        if settings.get("model", "mlp") != "mlp":
            raise ValueError(f"ArchitectureObjective searches MLPs; got model={settings['model']!r}")
        settings.pop("model", None)
        super().__init__(data, "mlp", **settings)

    def settings_for(self, config: dict) -> dict:
        architecture = {k: v for k, v in config.items() if _is_architecture(k)}
        training = {k: v for k, v in config.items() if not _is_architecture(k)}
        settings = super().settings_for(training)
        settings["hidden"] = hidden_widths({"depth": 2, "width": 64, **architecture})
        return settings

    def model_for(self, settings: dict):
        from minidl.train.classifiers import mlp

        return mlp(self.data.sample_shape, self.data.num_classes, hidden=settings["hidden"],
                   dropout=settings["dropout"])

    def __call__(self, config: dict, epochs: int, key=None) -> dict:
        out = super().__call__(config, epochs, key)
        hidden = self.settings_for(config)["hidden"]
        cost = mlp_cost(int(np.prod(self.data.sample_shape)), hidden, self.data.num_classes)
        return {**out, **cost, "hidden": list(hidden)}
