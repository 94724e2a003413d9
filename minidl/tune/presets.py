"""The book's tuning recipes as presets.

- **Learning rate:** try 10^-5.0, 10^-4.5, ..., 10^0.0 (eleven rates, half a decade
  apart) and take the *largest that does not diverge*: the largest rate still
  learns fastest, and the one above it is where training falls apart.
  :func:`learning_rate_sweep` runs it; :data:`LEARNING_RATES` are the rates.
- **Weight decay:** search 10^-6 to 10^-3 on a log scale (:data:`WEIGHT_DECAY`,
  grid :data:`WEIGHT_DECAYS` = 1e-6, 1e-5, 1e-4, 1e-3).

    sweep = learning_rate_sweep(TrainerObjective(optimizer="sgd"), epochs=2)
    sweep.chosen                     # the largest rate that did not diverge
    PRESETS["lr-wd"]                 # {"lr": Choice(LEARNING_RATES), "weight_decay": LogUniform(1e-6, 1e-3)}
"""
from __future__ import annotations

from dataclasses import dataclass

from minidl.tune.results import SearchResult
from minidl.tune.search import TrialRunner, metric_name
from minidl.tune.space import Choice, LogUniform

__all__ = ["LEARNING_RATES", "PRESETS", "WEIGHT_DECAY", "WEIGHT_DECAYS", "LearningRateSweep", "largest_stable",
           "learning_rate_sweep"]

# 10^-5.0, 10^-4.5, ..., 10^0.0: computed from the exponents so each is exactly 10**e.
LEARNING_RATE_EXPONENTS = tuple(-5.0 + 0.5 * k for k in range(11))
LEARNING_RATES = tuple(10.0 ** e for e in LEARNING_RATE_EXPONENTS)
WEIGHT_DECAY = LogUniform(1e-6, 1e-3)
WEIGHT_DECAYS = tuple(10.0 ** e for e in (-6, -5, -4, -3))

PRESETS = {
    "lr": {"lr": Choice(LEARNING_RATES)},
    "weight-decay": {"weight_decay": WEIGHT_DECAY},
    "lr-wd": {"lr": Choice(LEARNING_RATES), "weight_decay": WEIGHT_DECAY},
}


def largest_stable(trials) -> float | None:
    """The largest learning rate among ``trials`` (each with ``config["lr"]``) that did not diverge."""
    stable = [t.config["lr"] for t in trials if t.status == "ok"]
    return max(stable) if stable else None


@dataclass
class LearningRateSweep:
    """The sweep's trials (``result``) and its choice (``chosen``: the largest rate that did not diverge)."""

    result: SearchResult
    chosen: float | None


def learning_rate_sweep(objective, epochs: int, rates=LEARNING_RATES, config: dict | None = None,
                        mode: str | None = None, stop_at_divergence: bool = True,
                        on_trial=None) -> LearningRateSweep:
    """Train with each rate in ``rates`` (smallest first) for ``epochs`` epochs; choose the largest stable one.

    ``config`` holds the other hyperparameters (fixed). With ``stop_at_divergence``
    the sweep ends at the first rate that diverges: a larger one would diverge too.
    """
    rates = sorted(float(r) for r in rates)
    if not rates:
        raise ValueError("learning_rate_sweep: needs at least one rate")
    runner = TrialRunner(objective, mode or getattr(objective, "mode", "max"), on_trial)
    for i, lr in enumerate(rates):
        trial = runner.run({**(config or {}), "lr": lr}, epochs, key=("lr", i))
        runner.release(("lr", i))
        if trial.status != "ok" and stop_at_divergence:
            break
    result = runner.result("lr-sweep", metric_name(objective, None))
    return LearningRateSweep(result, largest_stable(result.trials))
