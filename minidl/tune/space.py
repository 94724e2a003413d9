"""Search spaces: the range each hyperparameter is drawn from.

    space = {"lr": LogUniform(1e-4, 1e-1), "dropout": Uniform(0.0, 0.5),
             "batch_size": Integer(16, 128, log=True), "optimizer": Choice(["adam", "sgd"]),
             "schedule": "cosine"}                      # a plain value is a constant
    config = sample(space, rng)                         # one random configuration
    configs = grid(space, points=3)                     # every combination of 3 points per range

A learning rate or a weight decay spans several orders of magnitude, and what
matters is its order: 1e-4 and 2e-4 differ as much as 1e-2 and 2e-2. So it is
drawn *log-uniformly*: ``x = low · (high/low)^u`` with ``u`` uniform in [0, 1),
which puts the same share of the draws in every decade (``log10 x`` is
uniform). A uniform draw from [1e-5, 1] would put 90% of them above 0.1.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

__all__ = ["Choice", "Dimension", "Integer", "LogUniform", "Uniform", "format_dimension", "grid", "parse_dimension",
           "sample"]


class Dimension:
    """One hyperparameter's range: ``sample(rng)``, ``grid(points)`` and ``suggest(trial, name)`` for Optuna."""

    log = False

    def sample(self, rng: np.random.Generator):
        raise NotImplementedError

    def grid(self, points: int) -> list:
        raise NotImplementedError

    def suggest(self, trial, name: str):
        raise NotImplementedError


def _check_range(kind, low, high, positive=False):
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
            raise ValueError(f"{kind}: low and high must be finite numbers, got low={low!r}, high={high!r}")
    if not low < high:
        raise ValueError(f"{kind}: low must be below high, got low={low!r}, high={high!r}")
    if positive and low <= 0:
        raise ValueError(f"{kind}: a log scale needs low > 0, got low={low!r}")


class Choice(Dimension):
    """One of ``options``, each equally likely; the grid is every option."""

    def __init__(self, options):
        self.options = list(options)
        if not self.options:
            raise ValueError("Choice: needs at least one option")

    def sample(self, rng):
        return self.options[int(rng.integers(len(self.options)))]

    def grid(self, points):
        return list(self.options)

    def suggest(self, trial, name):
        return trial.suggest_categorical(name, self.options)

    def __repr__(self):
        return f"Choice({self.options!r})"


class Uniform(Dimension):
    """A float uniform in [low, high]; the grid is ``points`` evenly spaced values, both ends included."""

    def __init__(self, low: float, high: float):
        _check_range("Uniform", low, high)
        self.low, self.high = float(low), float(high)

    def sample(self, rng):
        return float(self.low + (self.high - self.low) * rng.random())

    def grid(self, points):
        return [float(v) for v in np.linspace(self.low, self.high, points)]

    def suggest(self, trial, name):
        return trial.suggest_float(name, self.low, self.high)

    def __repr__(self):
        return f"Uniform({self.low:g}, {self.high:g})"


class LogUniform(Dimension):
    """A float whose logarithm is uniform: ``x = low · (high/low)^u``, u ~ U[0, 1).

    The grid is ``points`` values evenly spaced in ``log x`` (``np.geomspace``).
    """

    log = True

    def __init__(self, low: float, high: float):
        _check_range("LogUniform", low, high, positive=True)
        self.low, self.high = float(low), float(high)

    def sample(self, rng):
        return float(self.low * (self.high / self.low) ** rng.random())

    def grid(self, points):
        return [float(v) for v in np.geomspace(self.low, self.high, points)]

    def suggest(self, trial, name):
        return trial.suggest_float(name, self.low, self.high, log=True)

    def __repr__(self):
        return f"LogUniform({self.low:g}, {self.high:g})"


class Integer(Dimension):
    """An integer in [low, high], both included; uniform, or log-uniform with ``log=True``.

    A log-uniform integer is ``floor`` of a log-uniform draw from [low, high + 1),
    so each value gets the share of ``log`` it covers. The grid is ``points``
    evenly spaced values (in log space with ``log=True``) rounded, duplicates removed.
    """

    def __init__(self, low: int, high: int, log: bool = False):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (low, high)):
            raise ValueError(f"Integer: low and high must be integers, got low={low!r}, high={high!r}")
        _check_range("Integer", low, high, positive=log)
        self.low, self.high, self.log = int(low), int(high), bool(log)

    def sample(self, rng):
        if self.log:
            return min(int(self.low * ((self.high + 1) / self.low) ** rng.random()), self.high)
        return int(rng.integers(self.low, self.high + 1))

    def grid(self, points):
        values = np.geomspace(self.low, self.high, points) if self.log else np.linspace(self.low, self.high, points)
        return sorted({int(round(v)) for v in values})

    def suggest(self, trial, name):
        return trial.suggest_int(name, self.low, self.high, log=self.log)

    def __repr__(self):
        return f"Integer({self.low}, {self.high}{', log=True' if self.log else ''})"


def _check_space(space) -> dict:
    if not isinstance(space, dict) or not space:
        raise ValueError(f"a search space is a non-empty dict name -> Dimension (or constant), got {space!r}")
    return space


def sample(space: dict, rng: np.random.Generator) -> dict:
    """One configuration: each Dimension drawn with ``rng`` in the order of the dict, constants as given."""
    return {name: dim.sample(rng) if isinstance(dim, Dimension) else dim for name, dim in _check_space(space).items()}


def grid(space: dict, points: int = 3) -> list:
    """Every combination of ``points`` values per range (every option of a Choice), the last name varying fastest."""
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise ValueError(f"grid: points must be a positive integer, got {points!r}")
    names = list(_check_space(space))
    axes = [dim.grid(points) if isinstance(dim, Dimension) else [dim] for dim in space.values()]
    return [dict(zip(names, values)) for values in itertools.product(*axes)]


def _number(text: str):
    value = float(text)
    return int(value) if value.is_integer() and "e" not in text.lower() and "." not in text else value


def parse_dimension(text: str):
    """A Dimension from its command-line spelling.

    ``log:1e-4:1e-1`` (LogUniform), ``uniform:0:0.5``, ``int:16:128``, ``logint:16:256``,
    ``choice:adam,sgd`` (numbers in a choice become numbers), or a single value (a constant).
    """
    kind, _, rest = text.partition(":")
    try:
        if kind in ("log", "uniform", "int", "logint"):
            low, high = rest.split(":")
            if kind == "log":
                return LogUniform(float(low), float(high))
            if kind == "uniform":
                return Uniform(float(low), float(high))
            return Integer(int(low), int(high), log=kind == "logint")
        if kind == "choice":
            options = []
            for item in rest.split(","):
                try:
                    options.append(_number(item))
                except ValueError:
                    options.append(item)
            return Choice(options)
    except ValueError as exc:
        raise ValueError(f"cannot read the range {text!r}: {exc}; expected log:LOW:HIGH, uniform:LOW:HIGH, "
                         "int:LOW:HIGH, logint:LOW:HIGH or choice:A,B,C") from None
    try:
        return _number(text)
    except ValueError:
        return text


def format_dimension(dim) -> str:
    """The command-line spelling of a Dimension or a constant: the inverse of :func:`parse_dimension`."""
    if isinstance(dim, LogUniform):
        return f"log:{dim.low:g}:{dim.high:g}"
    if isinstance(dim, Uniform):
        return f"uniform:{dim.low:g}:{dim.high:g}"
    if isinstance(dim, Integer):
        return f"{'logint' if dim.log else 'int'}:{dim.low}:{dim.high}"
    if isinstance(dim, Choice):
        return "choice:" + ",".join(f"{o:g}" if isinstance(o, float) else str(o) for o in dim.options)
    return f"{dim:g}" if isinstance(dim, float) else str(dim)
