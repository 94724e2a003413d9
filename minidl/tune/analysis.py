"""Reading a search's results: the best trial at an edge of the space, the optimism of a best-of-N, the curves.

    edge_warnings(result, space)          # ["lr: the best trial's 0.97 is at the high edge of LogUniform(1e-05, 1)..."]
    best_of_n_optimism(result, n_val=180) # Optimism(n=9, noise_std=0.012, expected=0.018)
    plot_top_curves(result, k=5)          # the validation curves of the 5 best trials

Three of the guide's checks after a round of experiments (Training Deep
Learning Models, §4.3: "Check search space boundaries", "Examine training
curves"), and the reason not to trust the best validation score as it is:

**Edges.** A best value at the end of its range says the optimum may lie
outside it: widen the range there. A numeric dimension's value is placed in
[0, 1] along the range (along ``log x`` for a log scale); below ``margin`` or
above ``1 − margin`` is an edge. A choice of numbers is at an edge when the
best is its smallest or largest option.

**Optimism.** The best of N validation scores is the largest of N noisy
measurements. If every configuration had the same true score and each
measurement had the noise σ, the best one would exceed it by
``σ · E[max(Z_1..Z_N)]`` on average, Z_i standard normal; that expected
maximum is

    E[max] = ∫ x · N φ(x) Φ(x)^(N−1) dx

(0 for N = 1, 1/√π for N = 2, 3/(2√π) for N = 3, about 1.54 for N = 10, 3.24 for
N = 1,000). For an accuracy on n validation samples σ = √(p(1 − p)/n). It is
an upper bound in two ways: when the configurations differ, the best one's lead
is partly real; and when they err on the same samples (models of one family
usually do), their scores move together and the noise of their differences is
smaller than σ (notebook 28 measures 1.2 points where the bound says 2.9 for
eight seeds of one model). A best score that beats the runner-up by less than
this has not been shown to be better.

**Curves.** :class:`~minidl.tune.TrainerObjective` returns each trial's
validation metric after every epoch (``trial.info["curve"]``);
:func:`plot_top_curves` draws those of the best trials, where a curve still
rising at the end says "train longer" and one that peaked early "fewer epochs".
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minidl.tune.space import Choice, Dimension

__all__ = ["Optimism", "best_of_n_optimism", "edge_position", "edge_warnings", "expected_max_normal",
           "plot_top_curves"]


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normal draws] = ∫ x n φ(x) Φ(x)^(n−1) dx, by the trapezoid rule."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"expected_max_normal: n must be a whole number >= 1, got {n!r}")
    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    density = n * phi * cdf ** (n - 1)
    return float(np.trapezoid(x * density, x) if hasattr(np, "trapezoid") else np.trapz(x * density, x))


class Optimism(NamedTuple):
    """The best of ``n`` scores, each with noise ``noise_std``: expected to be ``expected`` above its true value."""

    n: int
    noise_std: float
    expected: float


def _scores(result_or_scores) -> np.ndarray:
    if hasattr(result_or_scores, "finished"):
        return np.array([t.score for t in result_or_scores.finished], dtype=float)
    return np.asarray(result_or_scores, dtype=float)


def best_of_n_optimism(result_or_scores, n_val: int | None = None, noise_std: float | None = None) -> Optimism:
    """The expected optimism of the best of N validation scores (module docstring).

    Give the noise of one score as ``noise_std``, or, for an accuracy, the
    number of validation samples ``n_val`` (σ = √(p(1 − p)/n_val) at the best
    score p). ``result_or_scores``: a :class:`~minidl.tune.SearchResult` (its
    finished trials) or the scores themselves.
    """
    scores = _scores(result_or_scores)
    scores = scores[np.isfinite(scores)]
    if len(scores) == 0:
        raise ValueError("best_of_n_optimism: no finished score to take the best of")
    if (noise_std is None) == (n_val is None):
        raise ValueError("best_of_n_optimism: give exactly one of noise_std (the noise of one score) and n_val "
                         "(the validation samples behind an accuracy)")
    if noise_std is None:
        p = float(scores.max())
        if not 0.0 <= p <= 1.0 or n_val < 1:
            raise ValueError(f"best_of_n_optimism: n_val needs accuracies in [0, 1] and n_val >= 1, got best "
                             f"score {p} and n_val={n_val}; give noise_std for other metrics")
        noise_std = math.sqrt(p * (1.0 - p) / n_val)
    if noise_std < 0:
        raise ValueError(f"best_of_n_optimism: noise_std must be >= 0, got {noise_std}")
    return Optimism(len(scores), float(noise_std), float(noise_std) * expected_max_normal(len(scores)))


def edge_position(dimension, value) -> float | None:
    """Where ``value`` lies along ``dimension``'s range, from 0 (low end) to 1 (high end); None for a
    choice of names, or a range of one value."""
    if isinstance(dimension, Choice):
        options = list(dimension.options)
        if len(options) < 2 or not all(isinstance(o, (int, float)) and not isinstance(o, bool) for o in options):
            return None
        ordered = sorted(options)
        return ordered.index(value) / (len(ordered) - 1) if value in ordered else None
    if not isinstance(dimension, Dimension) or dimension.high == dimension.low:
        return None
    if dimension.log:
        return (math.log(value) - math.log(dimension.low)) / (math.log(dimension.high) - math.log(dimension.low))
    return (value - dimension.low) / (dimension.high - dimension.low)


def edge_warnings(result, space: dict, margin: float = 0.1) -> list:
    """One sentence per hyperparameter whose best value sits at an edge of its range (empty: none does)."""
    if not 0.0 <= margin < 0.5:
        raise ValueError(f"edge_warnings: margin must be in [0, 0.5), got {margin}")
    best = result.best
    if best is None:
        return []
    found = []
    for name, dimension in space.items():
        if name not in best.config:
            continue
        position = edge_position(dimension, best.config[name])
        if position is None:
            continue
        value = best.config[name]
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        if isinstance(dimension, Choice):
            edge = "low" if position == 0.0 else "high" if position == 1.0 else None
        else:
            edge = "low" if position <= margin else "high" if position >= 1.0 - margin else None
        if edge:
            found.append(f"{name}: the best trial's {shown} is at the {edge} edge of {dimension!r}; the best value "
                         f"may lie beyond it: widen the range {'downwards' if edge == 'low' else 'upwards'} "
                         "and search again")
    return found


def plot_top_curves(result, k: int = 5, ax=None, path=None):
    """The per-epoch validation curves (``trial.info["curve"]``) of the ``k`` best trials; returns the figure."""
    from matplotlib.figure import Figure

    from minidl.serialization import atomic_write

    ranked = [t for t in result.ranked() if t.status == "ok" and t.info.get("curve")][:k]
    if ax is None:
        fig = Figure(figsize=(5.5, 3.4), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.figure
    for place, trial in enumerate(ranked, 1):
        curve = trial.info["curve"]
        settings = ", ".join(f"{n}={v:.3g}" if isinstance(v, float) else f"{n}={v}" for n, v in trial.config.items())
        ax.plot(range(1, len(curve) + 1), curve, "o-", ms=3, label=f"#{place}: {settings}")
    ax.set_xlabel("epoch")
    ax.set_ylabel(result.metric)
    ax.set_title(f"the {len(ranked)} best trials' validation curves", fontsize=9)
    if ranked:
        ax.legend(fontsize=7)
    if path is not None:
        atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=100))
    return fig
