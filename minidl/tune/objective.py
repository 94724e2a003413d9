"""The objective every search strategy calls: one seeded Trainer run, built by the recipe of ``minidl train``
(:func:`minidl.train.recipe.build_run`).

    objective = TrainerObjective(data="digits", model="mlp", optimizer="sgd", batch_size=64, seed=0)
    objective({"lr": 0.1, "weight_decay": 1e-4}, epochs=3)   # {"score": val accuracy, "diverged": False, ...}

A configuration overrides the run settings of ``minidl train`` (``lr``,
``weight_decay``, ``batch_size``, ``dropout``, ``label_smoothing``,
``optimizer``, ``schedule``, ``clip_norm``, ``accumulate``) and may set the
optimizer's ``beta1``, ``beta2`` and ``eps``; the rest come from the
objective's own settings. Each result carries ``curve``, the validation metric
after every epoch of the run (for :func:`minidl.tune.analysis.plot_top_curves`).
Every trial starts from the same seed, so two configurations differ only in their hyperparameters: the same
initialization, the same split, the same order of batches.

A trial *diverges* when its loss becomes NaN or infinite (the Trainer stops
before the bad update) or when the mean training loss of any of its epochs is
above the loss of its very first step: it got worse than where it started
(a run that blew up and then collapsed to a constant prediction counts too).

Successive halving and Hyperband ask for the same configuration again with
more epochs; with ``resume=True`` (the default) the objective keeps that run's
Trainer and continues it, so a survivor pays only for its new epochs. The
learning-rate schedule then spans ``horizon`` epochs (the search's largest
budget), fixed when the run starts; the default schedule is ``constant``, so
a score after few epochs is not flattered by a schedule that has not decayed yet.
With dropout, a continued run draws other dropout masks than an uninterrupted
one would (other trials used the generator in between); without it, they match.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.train import data_sources
from minidl.train.recipe import DEFAULTS, SCHEDULES, build_run, optimizer_classes

__all__ = ["DOMAINS", "OPTIMIZER_SETTINGS", "TUNABLE", "TrainerObjective", "check_space", "optimizer_options"]

TUNABLE = ("lr", "weight_decay", "batch_size", "dropout", "label_smoothing", "optimizer", "schedule",
           "clip_norm", "accumulate", "beta1", "beta2", "eps")
# The optimizer's own settings a configuration may tune (the guide: "Adam has four [hyperparameters], and
# they can all matter"); they go to the optimizer as its betas and eps, the untuned beta keeping its default.
OPTIMIZER_SETTINGS = ("beta1", "beta2", "eps")

# Each tunable setting's valid values, as minidl train accepts them: (kind, the domain in words);
# kind "float": a finite number, "int": a whole number, "name": a name. _in_domain holds the bounds.
DOMAINS = {
    "lr": ("float", "a number > 0"),
    "weight_decay": ("float", "a number >= 0"),
    "batch_size": ("int", "a whole number >= 1"),
    "dropout": ("float", "a number in [0, 1)"),
    "label_smoothing": ("float", "a number in [0, 1]"),
    "clip_norm": ("float", "a number > 0"),
    "accumulate": ("int", "a whole number >= 1"),
    "optimizer": ("name", "a minidl.optim optimizer's name"),
    "schedule": ("name", "one of the schedules of minidl train"),
    "beta1": ("float", "a number in [0, 1)"),
    "beta2": ("float", "a number in [0, 1)"),
    "eps": ("float", "a number > 0"),
}


def _in_domain(name: str, value) -> bool:
    """Is ``value`` a valid value of the tunable setting ``name``?"""
    kind = DOMAINS[name][0]
    if kind == "name":
        if not isinstance(value, str):
            return False
        if name == "schedule":
            return value in SCHEDULES
        return value.lower().replace("-", "").replace("_", "") in optimizer_classes()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return False
    if not math.isfinite(value) or (kind == "int" and value != int(value)):
        return False
    return {"lr": value > 0, "weight_decay": value >= 0, "batch_size": value >= 1, "dropout": 0 <= value < 1,
            "label_smoothing": 0 <= value <= 1, "clip_norm": value > 0, "accumulate": value >= 1,
            "beta1": 0 <= value < 1, "beta2": 0 <= value < 1, "eps": value > 0}[name]


def check_space(space: dict) -> None:
    """Check every range of ``space`` against its setting's valid values before any trial runs.

    A range is checked at both ends (a Choice: every option; a constant: itself);
    an integer setting needs an integer range (``int:LOW:HIGH``) or whole numbers.
    Raises a ValueError naming the setting, the range, the value out of bounds and the domain.
    """
    from minidl.tune.space import Choice, Dimension, Integer
    for name, dim in space.items():
        if name not in DOMAINS:
            raise ValueError(f"cannot tune {name!r}; tunable settings: {', '.join(TUNABLE)}; nothing was trained")
        kind, domain = DOMAINS[name]
        if isinstance(dim, Choice):
            values = dim.options
        elif isinstance(dim, Dimension):
            if kind == "int" and not isinstance(dim, Integer):
                raise ValueError(f"--param {name}: {dim!r} draws fractions; {name} is {domain}: use int:LOW:HIGH "
                                 "or logint:LOW:HIGH; nothing was trained")
            if kind == "name":
                raise ValueError(f"--param {name}: {dim!r} draws numbers; {name} is {domain}: use choice:A,B; "
                                 "nothing was trained")
            values = [dim.low, dim.high]
        else:
            values = [dim]
        bad = [v for v in values if not _in_domain(name, v)]
        if bad:
            raise ValueError(f"--param {name}: the range {dim!r} reaches {bad[0]!r}, and {name} must be {domain}; "
                             "nothing was trained")


def optimizer_options(settings: dict) -> dict:
    """The optimizer arguments of the tuned ``beta1``, ``beta2`` and ``eps`` in ``settings`` (empty when none is).

    A beta not tuned keeps the optimizer's default; an optimizer without betas or eps refuses them by name.
    """
    import inspect

    from minidl.train.recipe import optimizer_classes

    tuned = {k: settings[k] for k in OPTIMIZER_SETTINGS if settings.get(k) is not None}
    if not tuned:
        return {}
    name = str(settings["optimizer"])
    cls = optimizer_classes().get(name.lower().replace("-", "").replace("_", ""))
    parameters = inspect.signature(cls.__init__).parameters if cls is not None else {}
    options = {}
    if "beta1" in tuned or "beta2" in tuned:
        if "betas" not in parameters:
            raise ValueError(f"TrainerObjective: optimizer {name!r} has no betas, so beta1/beta2 cannot be tuned; "
                             "tune them with adam, adamw, nadam, radam, amsgrad or lamb")
        default = parameters["betas"].default
        options["betas"] = (float(tuned.get("beta1", default[0])), float(tuned.get("beta2", default[1])))
    if "eps" in tuned:
        if "eps" not in parameters:
            raise ValueError(f"TrainerObjective: optimizer {name!r} has no eps to tune")
        options["eps"] = float(tuned["eps"])
    return options


class TrainerObjective:
    """Train ``config`` for ``epochs`` epochs on ``data`` and return its validation ``metric``.

    Args:
        data, model, optimizer, batch_size, seed, schedule, ...: the run settings of ``minidl train``
            (``schedule`` defaults to "constant" here, see the module docstring).
        metric: a key of the Trainer's validation record: "val_accuracy" (default, higher is better),
            "val_f1", or "val_loss" (lower is better); ``mode`` follows from it.
        resume: continue a configuration's run when it is asked for more epochs (successive halving).
        horizon: the epochs the schedule spans; None: the epochs of the first call for that run.
    """

    resumes = True

    def __init__(self, data: str = "digits", model: str = "mlp", *, metric: str = "val_accuracy",
                 resume: bool = True, horizon: int | None = None, device: str | None = None, **settings):
        unknown = sorted(set(settings) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"TrainerObjective: unknown settings {unknown}; known: {', '.join(DEFAULTS)}")
        if metric not in ("val_accuracy", "val_f1", "val_loss"):
            raise ValueError(f"TrainerObjective: metric must be val_accuracy, val_f1 or val_loss, got {metric!r}")
        self.settings = {**DEFAULTS, "schedule": "constant", **settings, "data": data, "model": model}
        self.metric, self.mode = metric, "min" if metric == "val_loss" else "max"
        self.resumes, self.horizon, self.device = bool(resume), horizon, device
        self._data, self._runs = None, {}

    @property
    def data(self):
        if self._data is None:
            self._data = data_sources.load(self.settings["data"], seed=self.settings["seed"])
        return self._data

    def settings_for(self, config: dict) -> dict:
        """The run settings of one configuration (the objective's, overridden by ``config``)."""
        bad = sorted(set(config) - set(TUNABLE))
        if bad:
            raise ValueError(f"TrainerObjective: cannot tune {bad}; tunable settings: {', '.join(TUNABLE)}")
        return {**self.settings, **config}

    def model_for(self, settings: dict):
        """The model of one run, built once every generator is seeded: ``settings["model"]`` for the data.
        A subclass overrides it to search the model itself (:class:`~minidl.tune.nas.ArchitectureObjective`)."""
        from minidl.train.classifiers import build_model

        data = self.data
        return build_model(settings["model"], data.sample_shape, data.num_classes, dropout=settings["dropout"])

    def build(self, config: dict, epochs: int):
        """A fresh, seeded Trainer for ``config`` (the schedule spanning ``horizon or epochs`` epochs)."""
        from minidl.data import TensorDataset

        s, data = self.settings_for(config), self.data
        run = build_run(s, TensorDataset(data.x_train, data.y_train), TensorDataset(data.x_val, data.y_val),
                        model=lambda: self.model_for(s),
                        optimizer_options=optimizer_options(s), epochs=self.horizon or epochs, device=self.device)
        return run.trainer(progress=False, metrics=("accuracy", "f1") if self.metric == "val_f1" else ("accuracy",))

    def __call__(self, config: dict, epochs: int, key=None) -> dict:
        from minidl.train import NonFiniteLossError

        trainer = self._runs.get(key) if (self.resumes and key is not None) else None
        if trainer is None or trainer.epoch > epochs:
            trainer = self.build(config, epochs)
        start = trainer.epoch
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # a diverging trial is expected, not a surprise
                trainer.fit(epochs)
        except NonFiniteLossError as exc:
            self._runs.pop(key, None)
            return {"score": float("nan"), "diverged": True, "epochs_trained": trainer.epoch + 1 - start,
                    "reason": str(exc).split(".")[0]}
        if self.resumes and key is not None:
            self._runs[key] = trainer
        record = trainer.history[-1]
        curve = [float(r[self.metric]) for r in trainer.history if self.metric in r]
        first, last = trainer.steps["loss"][0], record.get("train_loss", float("nan"))
        worst = max(trainer.history, key=lambda r: r.get("train_loss", -math.inf))
        peak = worst.get("train_loss", last)
        diverged = not (math.isfinite(last) and math.isfinite(peak) and peak <= first)
        out = {"score": float("nan") if diverged else float(record[self.metric]), "diverged": diverged,
               "epochs_trained": trainer.epoch - start, "train_loss": last,
               "val_loss": record.get("val_loss"), "val_accuracy": record.get("val_accuracy"), "curve": curve}
        if diverged:
            out["reason"] = (f"the mean training loss of epoch {worst.get('epoch', 0):g}, {peak:.3g}, rose above "
                             f"the first step's {first:.3g}")
        return out

    def release(self, key) -> None:
        """Forget the run of ``key`` (a configuration successive halving dropped)."""
        self._runs.pop(key, None)
