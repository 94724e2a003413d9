"""Regularized evolution (Real et al., 2019): tournament selection, mutation, optional crossover, aging.

    from minidl.tune import LogUniform, TrainerObjective, evolution_search
    result = evolution_search(objective, {"lr": LogUniform(1e-3, 1.0)}, n_trials=20, epochs=2,
                              population_size=8, sample_size=3, seed=0)

The search keeps a *population* of the last ``population_size`` evaluated
configurations. It starts with that many random ones; then, for each new trial:

1. *tournament*: draw ``sample_size`` members uniformly without replacement; the best
   of them (by score; a diverged one never wins) is the parent;
2. *crossover* (with probability ``crossover``): a second parent from a second
   tournament, and each hyperparameter taken from one parent or the other, 50/50;
3. *mutation*: one hyperparameter, chosen uniformly, moves (:func:`mutate`);
4. *aging*: the child joins the population and the **oldest** member leaves, whatever
   its score. Real et al. call this regularization: a configuration survives only by
   being re-discovered, so a lucky early score cannot rule the population for ever.

Everything random comes from ``np.random.default_rng(seed)``: a seed gives one search.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.tune.results import SearchResult
from minidl.tune.search import TrialRunner, _positive_int, metric_name
from minidl.tune.space import Choice, Dimension, Integer, LogUniform, Uniform, sample

__all__ = ["crossover", "evolution_search", "mutate"]


def mutate(dim: Dimension, value, rng: np.random.Generator, scale: float = 0.1):
    """A neighbour of ``value`` in ``dim``, never ``value`` itself when ``dim`` has another value.

    - ``Uniform``: ``x + N(0, scale·(high − low))``, clipped to [low, high];
    - ``LogUniform``: ``x · exp(N(0, scale·ln(high/low)))``, clipped: the step is the same share
      of the range's decades wherever ``x`` lies;
    - ``Integer``: the same step (in log space with ``log=True``), rounded, and at least one away;
    - ``Choice``: another option, each equally likely.
    """
    if isinstance(dim, Choice):
        others = [o for o in dim.options if o != value]
        return others[int(rng.integers(len(others)))] if others else value
    if isinstance(dim, Uniform):
        return float(np.clip(value + rng.normal(0.0, scale * (dim.high - dim.low)), dim.low, dim.high))
    if isinstance(dim, LogUniform):
        step = rng.normal(0.0, scale * math.log(dim.high / dim.low))
        return float(np.clip(value * math.exp(step), dim.low, dim.high))
    if isinstance(dim, Integer):
        if dim.log:
            moved = value * math.exp(rng.normal(0.0, scale * math.log(dim.high / dim.low)))
        else:
            moved = value + rng.normal(0.0, scale * (dim.high - dim.low))
        moved = int(np.clip(round(moved), dim.low, dim.high))
        if moved == value:  # a step below one half rounds back: move by one, inward at an end
            moved = value + 1 if value == dim.low or (value < dim.high and rng.random() < 0.5) else value - 1
        return moved
    raise TypeError(f"mutate: cannot mutate a {type(dim).__name__}; use Choice, Uniform, LogUniform or Integer")


def crossover(first: dict, second: dict, space: dict, rng: np.random.Generator) -> dict:
    """Uniform crossover: each searched hyperparameter from ``first`` or ``second``, 50/50; constants as given."""
    return {name: (first[name] if rng.random() < 0.5 else second[name]) if isinstance(dim, Dimension) else dim
            for name, dim in space.items()}


def evolution_search(objective, space: dict, n_trials: int, epochs: int, population_size: int = 10,
                     sample_size: int = 3, crossover_rate: float = 0.0, mutation_scale: float = 0.1,
                     seed: int = 0, mode: str = "max", metric: str | None = None, on_trial=None) -> SearchResult:
    """Regularized evolution over ``space``: ``n_trials`` trials of ``epochs`` epochs each (the first
    ``population_size`` of them random), see the module docstring.

    Each trial's ``info`` records ``parents`` (the trial numbers it came from; empty for a random one).
    """
    n_trials, epochs = _positive_int(n_trials, "n_trials"), _positive_int(epochs, "epochs")
    population_size = _positive_int(population_size, "population_size")
    sample_size = _positive_int(sample_size, "sample_size")
    if sample_size > population_size:
        raise ValueError(f"evolution_search: sample_size ({sample_size}) must not exceed population_size "
                         f"({population_size}): a tournament draws from the population")
    if not 0.0 <= crossover_rate <= 1.0:
        raise ValueError(f"evolution_search: crossover_rate is a probability in [0, 1], got {crossover_rate!r}")
    if not mutation_scale > 0:
        raise ValueError(f"evolution_search: mutation_scale must be > 0, got {mutation_scale!r}")
    searched = [name for name, dim in space.items() if isinstance(dim, Dimension)]
    if not searched:
        raise ValueError("evolution_search: the space has no range to search (every entry is a constant)")
    rng = np.random.default_rng(seed)
    runner = TrialRunner(objective, mode, on_trial)
    sign = 1.0 if mode == "max" else -1.0
    population = []  # trials, oldest first

    def fitness(trial):
        return sign * trial.score if trial.status == "ok" else -math.inf

    def tournament():
        picks = rng.choice(len(population), size=sample_size, replace=False)
        # the best of the sample; among equals the younger (later) member, as a fresher copy of the same
        return max((population[i] for i in picks), key=lambda t: (fitness(t), t.number))

    for i in range(n_trials):
        if i < population_size:
            config, parents = sample(space, rng), []
        else:
            parent = tournament()
            config, parents = dict(parent.config), [parent.number]
            if crossover_rate and rng.random() < crossover_rate:
                other = tournament()
                config, parents = crossover(parent.config, other.config, space, rng), [parent.number, other.number]
            name = searched[int(rng.integers(len(searched)))]
            config[name] = mutate(space[name], config[name], rng, mutation_scale)
        trial = runner.run(config, epochs, key=("evolution", i), info_from_strategy={"parents": parents})
        runner.release(("evolution", i))
        population.append(trial)
        if len(population) > population_size:
            population.pop(0)  # aging: the oldest leaves, however good
    return runner.result("evolution", metric_name(objective, metric))
