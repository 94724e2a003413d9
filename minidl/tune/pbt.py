"""Population-based training (Jaderberg et al., 2017): trials that share checkpoints while they train.

    from minidl.tune import LogUniform, TrainerObjective, hyperparameter_schedule, pbt_search
    objective = TrainerObjective(data="digits", model="mlp", optimizer="sgd", batch_size=64)
    result = pbt_search(objective, {"lr": LogUniform(1e-3, 1.0)}, population_size=8, intervals=4,
                        epochs_per_interval=1, seed=0)
    hyperparameter_schedule(result)[member]       # [(first epoch, config), ...] of one member

``population_size`` runs start from random configurations and train in lock-step
*intervals* of ``epochs_per_interval`` epochs. After every interval but the last, each
member in the bottom ``quantile`` of the validation scores (a diverged one first):

- **exploits**: copies a member of the top ``quantile``, chosen uniformly: its weights and
  its optimizer state (``Module.state_dict``, ``Optimizer.state_dict``) and its loop's counters
  and records (``Trainer.state_dict``), so the copy continues the source's run exactly;
- **explores**: perturbs the copied hyperparameters (:func:`explore`): each is multiplied by
  0.8 or 1.2 (50/50), or with probability ``resample_probability`` drawn afresh from the space.

The others continue with their own weights and hyperparameters. A member's
hyperparameters thus change during its run: the search returns a *schedule* per member
(:func:`hyperparameter_schedule`), not a single configuration. The budget is
``population_size · intervals · epochs_per_interval`` epochs, the same as that many epochs
of random search, and no epoch is trained twice.

The hyperparameters live in the optimizer's parameter groups (``lr``, ``weight_decay``), set
at the start of every interval; a learning-rate *schedule* would overwrite them, so the run
needs ``schedule="constant"`` (the default of :class:`~minidl.tune.TrainerObjective`).
"""
from __future__ import annotations

import math

import numpy as np

from minidl.tune.results import SearchResult
from minidl.tune.search import TrialRunner, _positive_int, metric_name
from minidl.tune.space import Choice, Dimension, Integer, sample

__all__ = ["PERTURBABLE", "exploit", "explore", "hyperparameter_schedule", "pbt_search", "set_hyperparameters"]

# The hyperparameters PBT changes mid-run: each is a key of the optimizer's parameter groups.
PERTURBABLE = ("lr", "weight_decay")


def set_hyperparameters(trainer, config: dict) -> None:
    """Write ``config``'s ``lr`` and ``weight_decay`` into every parameter group of ``trainer.optimizer``: the
    next optimizer step uses them."""
    for group in trainer.optimizer.param_groups:
        for name in PERTURBABLE:
            if name in config:
                group[name] = float(config[name])


def exploit(target, source) -> None:
    """Make Trainer ``target`` continue ``source``'s run: copies of its weights (and buffers), its optimizer state
    and hyperparameters, and its loop state (epoch and step counters, records)."""
    target.model.load_state_dict(source.model.state_dict())        # copies: training on changes neither
    target.optimizer.load_state_dict(source.optimizer.state_dict())
    target.load_state_dict(source.state_dict())


def explore(config: dict, space: dict, rng: np.random.Generator, factors=(0.8, 1.2),
            resample_probability: float = 0.0) -> dict:
    """Perturb each searched hyperparameter of ``config``: with probability ``resample_probability`` a fresh
    draw from its range, else multiplied by one of ``factors`` (uniformly; an Integer rounded); a Choice is
    always resampled. Values are not clipped to the range: PBT may walk out of the initial box, as in
    Jaderberg et al."""
    out = dict(config)
    for name, dim in space.items():
        if not isinstance(dim, Dimension):
            continue
        if isinstance(dim, Choice) or rng.random() < resample_probability:
            out[name] = dim.sample(rng)
        else:
            factor = factors[int(rng.integers(len(factors)))]
            out[name] = max(int(round(config[name] * factor)), 1) if isinstance(dim, Integer) else \
                float(config[name] * factor)
    return out


class _Population:
    """The objective PBT hands the TrialRunner: ``key`` is a member, whose Trainer continues to ``epochs``."""

    resumes = True

    def __init__(self, objective, horizon: int):
        self.objective, self.horizon, self.trainers = objective, horizon, {}
        self.metric = getattr(objective, "metric", "val_accuracy")

    def __call__(self, config: dict, epochs: int, key=None) -> dict:
        from minidl.train import NonFiniteLossError

        trainer = self.trainers.get(key)
        if trainer is None:
            trainer = self.trainers[key] = self.objective.build(config, self.horizon)
        set_hyperparameters(trainer, config)
        start = trainer.epoch
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging member is expected
                trainer.fit(epochs)
        except NonFiniteLossError as exc:
            return {"score": float("nan"), "diverged": True, "epochs_trained": trainer.epoch + 1 - start,
                    "reason": str(exc).split(".")[0]}
        record = trainer.history[-1]
        score = float(record[self.metric])
        return {"score": score, "diverged": not math.isfinite(record.get("train_loss", score)),
                "epochs_trained": trainer.epoch - start, "train_loss": record.get("train_loss")}


def pbt_search(objective, space: dict, population_size: int, intervals: int, epochs_per_interval: int = 1,
               quantile: float = 0.25, factors=(0.8, 1.2), resample_probability: float = 0.25, seed: int = 0,
               mode: str | None = None, metric: str | None = None, on_trial=None) -> SearchResult:
    """Population-based training over ``space`` (see the module docstring).

    ``objective`` builds a run with ``objective.build(config, epochs)`` (a :class:`~minidl.tune.TrainerObjective`)
    and names its ``metric``; ``mode`` defaults to the objective's. One Trial per member and interval:
    ``epochs`` the member's total so far, ``rung`` the interval, ``info["member"]`` and ``info["copied_from"]``
    (the member it copied at the start of this interval, or None).
    """
    population_size = _positive_int(population_size, "population_size", 2)
    intervals, epochs_per_interval = _positive_int(intervals, "intervals"), _positive_int(epochs_per_interval,
                                                                                          "epochs_per_interval")
    if not callable(getattr(objective, "build", None)):
        raise TypeError(f"pbt_search: the objective must build its runs (objective.build(config, epochs) -> "
                        f"Trainer, as TrainerObjective does), got {type(objective).__name__}")
    if not 0.0 < quantile <= 0.5:
        raise ValueError(f"pbt_search: quantile must be in (0, 0.5] (the bottom and top shares), got {quantile!r}")
    bad = [n for n, d in space.items() if isinstance(d, Dimension) and n not in PERTURBABLE]
    if bad:
        raise ValueError(f"pbt_search: cannot change {bad} during a run; PBT perturbs {', '.join(PERTURBABLE)} "
                         "(the optimizer's parameter groups); give the others as constants")
    settings = getattr(objective, "settings", {})
    if settings.get("schedule", "constant") != "constant":
        raise ValueError(f"pbt_search: the objective's schedule {settings['schedule']!r} would overwrite the "
                         "learning rates PBT sets; build the objective with schedule='constant'")
    mode = mode or getattr(objective, "mode", "max")
    rng = np.random.default_rng(seed)
    population = _Population(objective, intervals * epochs_per_interval)
    runner = TrialRunner(population, mode, on_trial)
    sign = 1.0 if mode == "max" else -1.0
    configs = [sample(space, rng) for _ in range(population_size)]
    copied = [None] * population_size
    n_move = max(int(population_size * quantile), 1)
    for interval in range(intervals):
        trials = []
        for m in range(population_size):
            trials.append(runner.run(configs[m], (interval + 1) * epochs_per_interval, key=m, rung=interval,
                                     info_from_strategy={"member": m, "copied_from": copied[m]}))
        if interval + 1 == intervals:
            break
        # rank: a diverged member below every finished one; among equals the lower member number first
        order = sorted(range(population_size),
                       key=lambda m: (-(sign * trials[m].score) if trials[m].status == "ok" else math.inf, m))
        top, bottom = order[:n_move], order[-n_move:]
        copied = [None] * population_size
        for m in bottom:
            source = top[int(rng.integers(len(top)))]
            exploit(population.trainers[m], population.trainers[source])
            configs[m] = explore(configs[source], space, rng, factors, resample_probability)
            copied[m] = source
    return runner.result("pbt", metric_name(objective, metric))


def hyperparameter_schedule(result: SearchResult) -> dict:
    """Each PBT member's schedule: ``{member: [(first epoch, config), ...]}``, one entry per change of config
    (an exploit starts a new one, with the epoch the member continues from)."""
    out = {}
    for t in result.trials:
        m = t.info["member"]
        start = t.epochs - t.epochs_trained
        steps = out.setdefault(m, [])
        if not steps or steps[-1][1] != t.config or t.info.get("copied_from") is not None:
            steps.append((start, dict(t.config)))
    return out
