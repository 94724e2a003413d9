"""Search strategies: grid, random, successive halving, Hyperband, and TPE through Optuna.

Every strategy calls the same objective, ``objective(config, epochs)``: train
the configuration ``config`` for ``epochs`` epochs and return its score (a
number, higher is better with ``mode="max"``), or a dict ``{"score": ...,
"diverged": bool, "epochs_trained": int, ...}``. A NaN or infinite score, or
``diverged=True``, marks a trial that diverged: it is kept in the results and
never chosen or promoted. An objective with ``resumes = True`` is called as
``objective(config, epochs, key=key)`` and may continue the run of the same
``key`` from the epochs it already trained (:class:`~minidl.tune.TrainerObjective`
does), so a survivor of successive halving pays only for its new epochs.

The budget is counted in epochs. Successive halving (Jamieson & Talwalkar, 2016)
starts ``n`` configurations with ``r`` epochs each and, at every rung, keeps the
best ``1/eta`` of them and trains the survivors ``eta`` times longer::

    rung i:  n_i = floor(n / eta^i) configurations,  r_i = r · eta^i epochs   (i = 0 .. s, r_s ≤ R)

Hyperband (Li et al., 2018) hedges over how aggressive to be: with
``s_max = floor(log_eta(R / r))`` and ``B = (s_max + 1) R`` it runs one
successive halving per bracket ``s = s_max, ..., 0``, each bracket starting
``n = ceil(B/R · eta^s / (s + 1))`` configurations at ``R · eta^-s`` epochs.
:func:`halving_rungs` and :func:`hyperband_brackets` give these plans as plain
numbers before anything is trained.

Every strategy takes ``on_trial(trial, trials)``, called as each trial
finishes with the trials so far: ``minidl tune`` rewrites ``trials.csv``
there, so a search that fails or is stopped later keeps the finished trials.
"""
from __future__ import annotations

import math
import time

import numpy as np

from minidl.tune.results import SearchResult, Trial
from minidl.tune.space import Dimension, grid, sample

__all__ = ["grid_search", "halving_rungs", "hyperband", "hyperband_brackets", "random_search",
           "successive_halving", "tpe_search"]


# ---------------------------------------------------------------- plans
def _positive_int(value, name, low=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _largest_power(eta: int, ratio: int) -> int:
    """The largest s with eta^s <= ratio, in integers (floating log_eta can land just below a whole number)."""
    s = 0
    while eta ** (s + 1) <= ratio:
        s += 1
    return s


def halving_rungs(n_configs: int, min_epochs: int, max_epochs: int, eta: int = 3) -> list:
    """Successive halving's plan: ``[(n_i, r_i), ...]``, configurations and epochs of each rung.

    ``n_i = max(floor(n / eta^i), 1)``, ``r_i = min_epochs · eta^i``, for as many rungs as keep
    ``r_i <= max_epochs``. E.g. ``halving_rungs(9, 1, 9, 3) == [(9, 1), (3, 3), (1, 9)]``.
    """
    n, r, big, eta = (_positive_int(n_configs, "n_configs"), _positive_int(min_epochs, "min_epochs"),
                      _positive_int(max_epochs, "max_epochs"), _positive_int(eta, "eta", 2))
    if r > big:
        raise ValueError(f"min_epochs ({r}) must not exceed max_epochs ({big})")
    s = _largest_power(eta, big // r)
    return [(max(n // eta ** i, 1), r * eta ** i) for i in range(s + 1)]


def hyperband_brackets(max_epochs: int, min_epochs: int = 1, eta: int = 3) -> list:
    """Hyperband's plan: one list of rungs ``(n_i, r_i)`` per bracket, most aggressive first.

    With ``R = max_epochs // min_epochs`` (in units of ``min_epochs``), ``s_max`` the largest
    ``s`` with ``eta^s <= R``: bracket ``s`` starts ``ceil((s_max + 1) eta^s / (s + 1))``
    configurations and its rung ``i`` trains ``floor(n_s / eta^i)`` of them for
    ``min_epochs · floor(R / eta^(s - i))`` epochs. For ``max_epochs=81, eta=3`` this is Table 1
    of Li et al. (2018): brackets starting 81, 34, 15, 8 and 5 configurations.
    """
    r, big, eta = (_positive_int(min_epochs, "min_epochs"), _positive_int(max_epochs, "max_epochs"),
                   _positive_int(eta, "eta", 2))
    if r > big:
        raise ValueError(f"min_epochs ({r}) must not exceed max_epochs ({big})")
    units = big // r
    s_max = _largest_power(eta, units)
    brackets = []
    for s in range(s_max, -1, -1):
        n = -(-(s_max + 1) * eta ** s // (s + 1))  # ceil in integers
        brackets.append([(n // eta ** i, r * (units // eta ** (s - i))) for i in range(s + 1)])
    return brackets


# ---------------------------------------------------------------- running trials
class TrialRunner:
    """Calls the objective, times it, turns what it returns into a Trial."""

    def __init__(self, objective, mode: str, on_trial=None):
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if not callable(objective):
            raise TypeError(f"the objective must be callable, got {type(objective).__name__}")
        self.objective, self.mode, self.trials, self.on_trial = objective, mode, [], on_trial

    def run(self, config: dict, epochs: int, key=None, rung: int = 0, bracket: int = 0,
            info_from_strategy: dict | None = None) -> Trial:
        """Train ``config`` to ``epochs`` and record the Trial; ``info_from_strategy`` (what the strategy knows
        of the trial, such as its parents) joins the objective's info, before ``on_trial`` sees the trial."""
        start = time.perf_counter()
        if getattr(self.objective, "resumes", False):
            out = self.objective(dict(config), epochs, key=key)
        else:
            out = self.objective(dict(config), epochs)
        info = dict(out) if isinstance(out, dict) else {"score": out}
        score = info.pop("score", float("nan"))
        score = float("nan") if score is None else float(score)
        diverged = bool(info.pop("diverged", False)) or not math.isfinite(score)
        trained = int(info.pop("epochs_trained", epochs))
        info.update(info_from_strategy or {})
        trial = Trial(len(self.trials), dict(config), int(epochs), float("nan") if diverged else score,
                      "diverged" if diverged else "ok", trained, rung, bracket, time.perf_counter() - start, info)
        self.trials.append(trial)
        if self.on_trial is not None:  # as each trial finishes: a later failure keeps the finished ones
            self.on_trial(trial, list(self.trials))
        return trial

    def release(self, key) -> None:
        release = getattr(self.objective, "release", None)
        if callable(release):
            release(key)

    def top(self, trials: list, k: int) -> list:
        """The ``k`` best finished trials (fewer if fewer finished), ties broken by the earlier trial."""
        done = [t for t in trials if t.status == "ok"]
        sign = -1.0 if self.mode == "max" else 1.0
        return sorted(done, key=lambda t: (sign * t.score, t.number))[:k]

    def result(self, strategy: str, metric: str) -> SearchResult:
        return SearchResult(strategy, self.trials, self.mode, metric)


def metric_name(objective, metric) -> str:
    """The name a search gives its scores: ``metric``, else the objective's ``metric``, else "score"."""
    return metric or getattr(objective, "metric", None) or "score"


# ---------------------------------------------------------------- strategies
def grid_search(objective, space: dict, epochs: int, points: int = 3, mode: str = "max",
                metric: str | None = None, on_trial=None) -> SearchResult:
    """Every combination of :func:`~minidl.tune.space.grid` (``points`` values per range), ``epochs`` each."""
    epochs = _positive_int(epochs, "epochs")
    runner = TrialRunner(objective, mode, on_trial)
    for i, config in enumerate(grid(space, points)):
        runner.run(config, epochs, key=("grid", i))
        runner.release(("grid", i))
    return runner.result("grid", metric_name(objective, metric))


def random_search(objective, space: dict, n_trials: int, epochs: int, seed: int = 0, mode: str = "max",
                  metric: str | None = None, on_trial=None) -> SearchResult:
    """``n_trials`` configurations drawn from ``space`` with ``np.random.default_rng(seed)``, ``epochs`` each."""
    n_trials, epochs = _positive_int(n_trials, "n_trials"), _positive_int(epochs, "epochs")
    rng = np.random.default_rng(seed)
    runner = TrialRunner(objective, mode, on_trial)
    for i in range(n_trials):
        runner.run(sample(space, rng), epochs, key=("random", i))
        runner.release(("random", i))
    return runner.result("random", metric_name(objective, metric))


def _halving(runner, configs: list, rungs: list, bracket: int) -> None:
    """Run one successive halving over ``configs`` (keys ``(bracket, index)``) along ``rungs``."""
    alive = list(range(len(configs)))
    for i, (_, epochs) in enumerate(rungs):
        trials = [runner.run(configs[j], epochs, key=(bracket, j), rung=i, bracket=bracket) for j in alive]
        if i + 1 < len(rungs):
            keep = {t.number for t in runner.top(trials, rungs[i + 1][0])}
            survivors = [j for j, t in zip(alive, trials) if t.number in keep]
        else:
            survivors = []
        for j in alive:
            if j not in survivors:
                runner.release((bracket, j))
        alive = survivors
        if not alive:
            break


def successive_halving(objective, space: dict, n_configs: int, max_epochs: int, min_epochs: int = 1,
                       eta: int = 3, seed: int = 0, mode: str = "max", metric: str | None = None,
                       on_trial=None) -> SearchResult:
    """Successive halving along :func:`halving_rungs` over ``n_configs`` random configurations."""
    rungs = halving_rungs(n_configs, min_epochs, max_epochs, eta)
    rng = np.random.default_rng(seed)
    runner = TrialRunner(objective, mode, on_trial)
    _halving(runner, [sample(space, rng) for _ in range(rungs[0][0])], rungs, bracket=0)
    return runner.result("halving", metric_name(objective, metric))


def hyperband(objective, space: dict, max_epochs: int, min_epochs: int = 1, eta: int = 3, seed: int = 0,
              mode: str = "max", metric: str | None = None, on_trial=None) -> SearchResult:
    """Hyperband: one successive halving per bracket of :func:`hyperband_brackets`, fresh random configurations
    for each (``Trial.bracket`` is the bracket's ``s``)."""
    brackets = hyperband_brackets(max_epochs, min_epochs, eta)
    rng = np.random.default_rng(seed)
    runner = TrialRunner(objective, mode, on_trial)
    for rungs in brackets:
        s = len(rungs) - 1
        _halving(runner, [sample(space, rng) for _ in range(rungs[0][0])], rungs, bracket=s)
    return runner.result("hyperband", metric_name(objective, metric))


def _diverged_constraint(frozen_trial) -> tuple:
    """Optuna's constraint: a value > 0 means infeasible (here: the run diverged)."""
    return (frozen_trial.user_attrs.get("diverged", 0.0),)


def tpe_search(objective, space: dict, n_trials: int, epochs: int, seed: int = 0, mode: str = "max",
               metric: str | None = None, n_startup_trials: int = 5, on_trial=None) -> SearchResult:
    """Bayesian optimization with Optuna's Tree-structured Parzen Estimator, ``epochs`` per trial.

    The first ``n_startup_trials`` configurations are random; after that TPE models
    the good and the bad configurations' densities and proposes where their ratio is
    largest. Needs Optuna (``pip install minidl[tune]``). A diverged trial is told to
    Optuna as *infeasible* (a violated constraint), so TPE counts its region among
    the bad ones; a trial merely marked failed would be ignored, and TPE would keep
    proposing the unexplored, diverging rates.
    """
    try:
        import optuna
    except ImportError:
        raise ImportError("tpe_search needs Optuna: pip install 'minidl[tune]' (or pip install optuna)") from None
    n_trials, epochs = _positive_int(n_trials, "n_trials"), _positive_int(epochs, "epochs")
    runner = TrialRunner(objective, mode, on_trial)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Optuna 5 takes constraints from each trial (set_constraint); older versions from a function.
    per_trial = hasattr(optuna.trial.Trial, "set_constraint")
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials,
                                         **({} if per_trial else {"constraints_func": _diverged_constraint}))
    study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", sampler=sampler)
    for i in range(n_trials):
        ask = study.ask()
        config = {name: dim.suggest(ask, name) if isinstance(dim, Dimension) else dim for name, dim in space.items()}
        trial = runner.run(config, epochs, key=("tpe", i))
        runner.release(("tpe", i))
        violation = 0.0 if trial.status == "ok" else 1.0
        if per_trial:
            ask.set_constraint("diverged", violation)
        else:
            ask.set_user_attr("diverged", violation)
        # A diverged trial's value is unused: as an infeasible trial it ranks below every finished one.
        study.tell(ask, trial.score if trial.status == "ok" else 0.0)
    return runner.result("tpe", metric_name(objective, metric))
