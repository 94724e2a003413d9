"""One recipe for a run: settings → model, optimizer (with its parameter groups), schedule, data, Trainer.

    s = {**DEFAULTS, "optimizer": "sgd", "lr": 0.1}
    data = data_sources.load(s["data"], seed=s["seed"])
    run = build_run(s, TensorDataset(data.x_train, data.y_train), TensorDataset(data.x_val, data.y_val),
                    model=lambda: build_model(s["model"], data.sample_shape, data.num_classes, dropout=s["dropout"]))
    trainer = run.trainer(callbacks=[...], metrics=("accuracy", "f1"))
    trainer.fit(s["epochs"])

``minidl train``, the objective of ``minidl tune`` and ``minidl gpt train``
build their runs here, in one order: seed every generator, build the model
(so the same seed gives the same initialization), move it to its device,
resolve the learning rate once (given, else the optimizer's own default, else
0.05 for SGD, whose ``lr`` has none), build the optimizer over the model's
parameters or the parameter groups a run asks for, the shuffled training
loader (split across ranks under data parallelism), the validation loader,
and the schedule over the run's optimizer steps; then the Trainer, with the
settings' clipping, accumulation and label smoothing.

The settings are those of ``minidl train`` (:data:`DEFAULTS`); a run may carry
more (the GPT's ``min_lr``, ``warmup``...), which the recipe passes by.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["DEFAULTS", "RUN_DEFAULTS", "RUN_SETTINGS", "Run", "SCHEDULES", "build_run", "make_optimizer",
           "make_schedule", "optimizer_classes", "resolve_lr"]

DEFAULTS = {"data": "digits", "model": "mlp", "optimizer": "adam", "lr": None, "schedule": "cosine",
            "epochs": 20, "batch_size": 32, "seed": 0, "weight_decay": 0.0, "label_smoothing": 0.0,
            "clip_norm": None, "accumulate": 1, "dropout": 0.0}
SCHEDULES = ("constant", "cosine", "warmup-cosine", "step", "exponential", "polynomial", "cyclical",
             "inverse-sqrt")
# Settings that define a run, and the device it runs on: a resumed run takes them from its
# checkpoint unless given again (a checkpoint without a device, from before it was kept, runs on
# the CPU). DEFAULTS alone are what a tuning trial may set (minidl.tune.objective).
RUN_DEFAULTS = {**DEFAULTS, "device": "cpu"}
RUN_SETTINGS = tuple(RUN_DEFAULTS)


# ---------------------------------------------------------------- optimizers and schedules by name
def optimizer_classes() -> dict:
    """Lower-case name -> optimizer class, for every minidl.optim optimizer built from ``params``."""
    from minidl import optim
    found = {}
    for name in getattr(optim, "__all__", dir(optim)):
        cls = getattr(optim, name, None)
        if not (isinstance(cls, type) and issubclass(cls, optim.Optimizer)) or cls is optim.Optimizer:
            continue
        params = list(inspect.signature(cls.__init__).parameters)
        if len(params) > 1 and params[1] == "params":  # wrappers (Lookahead) take an optimizer instead
            found[name.lower()] = cls
    return found


def _optimizer_class(name: str):
    classes = optimizer_classes()
    key = name.lower().replace("-", "").replace("_", "")
    if key not in classes:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(sorted(classes))}")
    return classes[key]


def resolve_lr(name: str, lr: float | None) -> float:
    """The learning rate of a run: ``lr`` when given, else optimizer ``name``'s default, else 0.05 (SGD's)."""
    if lr is not None:
        return float(lr)
    signature = inspect.signature(_optimizer_class(name).__init__).parameters
    default = signature["lr"].default if "lr" in signature else inspect.Parameter.empty
    return float(default) if default is not inspect.Parameter.empty else 0.05


def make_optimizer(name: str, parameters, lr: float | None, weight_decay: float = 0.0, **options):
    """The minidl.optim optimizer called ``name`` over ``parameters`` (or parameter groups).

    ``lr`` None takes :func:`resolve_lr`'s rate; ``options`` go to the optimizer (``betas``...).
    """
    cls, options = _optimizer_and_options(name, lr, weight_decay, options)
    return cls(parameters, **options)


def _optimizer_and_options(name: str, lr: float | None, weight_decay: float, options: dict):
    """The optimizer class called ``name`` and the keyword arguments :func:`make_optimizer` gives it."""
    cls = _optimizer_class(name)
    signature = inspect.signature(cls.__init__).parameters
    options = {"lr": resolve_lr(name, lr), **options}
    if weight_decay:
        if "weight_decay" not in signature:
            raise ValueError(f"optimizer {name!r} has no weight_decay option")
        options["weight_decay"] = weight_decay
    return cls, options


def make_schedule(name: str, lr: float, total_steps: int):
    """The schedule ``f(t)`` called ``name`` over ``total_steps`` optimizer steps (None for constant)."""
    from minidl.optim import schedules as S
    total = max(int(total_steps), 1)
    tenth = max(total // 10, 1)
    builders = {
        "constant": lambda: None,
        "cosine": lambda: S.cosine(lr, total),
        "warmup-cosine": lambda: S.warmup(S.cosine(lr, total), tenth),
        "step": lambda: S.step_decay(lr, 0.1, max(total // 3, 1)),
        "exponential": lambda: S.exponential(lr, 0.01 ** (1.0 / total)),
        "polynomial": lambda: S.polynomial(lr, total, 2),
        "cyclical": lambda: S.cyclical(lr / 10, lr, max(total // 8, 1)),
        "inverse-sqrt": lambda: S.inverse_sqrt(lr, tenth),
    }
    if name not in builders:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return builders[name]()


# ---------------------------------------------------------------- the run
@dataclass
class Run:
    """The parts of one run, built by :func:`build_run`; :meth:`trainer` puts them in a Trainer."""

    settings: dict
    model: Any
    optimizer: Any
    lr: float                      # the learning rate, resolved once: the optimizer's and the schedule's
    schedule: Callable | None      # f(t) over the optimizer steps, or None for a constant rate
    train_loader: Any
    val_loader: Any
    total_steps: int               # the optimizer steps the schedule spans

    def trainer(self, **options):
        """A Trainer of this run: the settings' ``clip_norm``, ``accumulate`` and ``label_smoothing``,
        then ``options`` (callbacks, metrics, progress, amp, loss_fn...) as :class:`~minidl.train.Trainer`
        takes them."""
        from minidl.train.trainer import Trainer
        s = self.settings
        settings = dict(scheduler=self.schedule, max_grad_norm=s.get("clip_norm"),
                        accumulation_steps=int(s.get("accumulate", 1)),
                        label_smoothing=s.get("label_smoothing", 0.0))
        return Trainer(self.model, self.optimizer, self.train_loader, self.val_loader, **{**settings, **options})


def build_run(settings: dict, train_set, val_set, model, *, params=None, optimizer: str | None = None,
              optimizer_options: dict | None = None, schedule=None, epochs: int | None = None,
              steps: int | None = None, device=None, comm=None, zero: int = 0, drop_last: bool = False,
              val_batch_size: int = 512, pipeline: dict | None = None) -> Run:
    """Build a run from ``settings`` (the keys of :data:`DEFAULTS` it uses: seed, optimizer, lr,
    weight_decay, batch_size, accumulate, schedule, epochs).

    Args:
        train_set, val_set: the datasets of the two loaders (``val_set`` None: no validation).
        model: a function that builds the model, called once every generator is seeded.
        params: ``params(model)``, the parameters or parameter groups to optimize (default: all of them).
        optimizer: the optimizer's name (default ``settings["optimizer"]``); ``optimizer_options``: more
            of its arguments (``betas``...).
        schedule: ``schedule(lr, total_steps)``, the schedule f(t) of the run (default: the named
            ``settings["schedule"]`` of :func:`make_schedule`).
        epochs, steps: the schedule spans ``steps`` optimizer steps, or ``epochs`` epochs of the
            training loader (default ``settings["epochs"]``).
        device: where the model goes (default: where it was built).
        comm: the run's parallel layout: a :class:`~minidl.parallel.layout.Layout` (data × pipeline ×
            tensor groups: :func:`minidl.parallel.layout`), or a communicator for data parallelism over
            it; model, optimizer and loader are wrapped by :func:`minidl.parallel.prepare`.
        zero: with a data group, the ZeRO stage: 0 plain data parallelism; 1 the optimizer state sharded
            (:class:`~minidl.parallel.ZeroRedundancyOptimizer`); 2 the gradients too, 3 the parameters too
            (:class:`~minidl.parallel.ShardedDataParallel`, whose optimizer sees flat shards: no ``params``).
        pipeline: with a pipeline group, how the model is cut: ``layers`` (model → ``nn.Sequential``),
            ``boundaries``, ``micro_batches`` and ``schedule`` as :func:`minidl.parallel.prepare` takes them.
        drop_last: drop the last short training batch; ``val_batch_size``: the validation loader's batch.

    Raises ValueError for an unknown optimizer or schedule, a ZeRO stage other than 0 to 3 or without
    a data group, or an optimizer a ZeRO stage cannot shard, before anything is trained.
    """
    from minidl.data import DataLoader
    from minidl.train.trainer import seed_everything

    s = settings
    if zero not in (0, 1, 2, 3) or isinstance(zero, bool):
        raise ValueError(f"build_run: zero must be a ZeRO stage 0, 1, 2 or 3, got {zero!r}")
    if zero and comm is None:
        raise ValueError(f"build_run: ZeRO stage {zero} shards across data-parallel ranks; give comm "
                         "(minidl.parallel.init()) or zero=0")
    if zero >= 2 and params is not None:
        raise ValueError(f"build_run: ZeRO stage {zero} optimizes flat shards of the whole model, so it takes no "
                         "parameter groups (params); use zero=1, whose shards are whole parameters")
    seed_everything(s["seed"])
    net = model()
    if device is not None:
        net.to(device)
    name = optimizer or s["optimizer"]
    lr = resolve_lr(name, s.get("lr"))
    cls, options = _optimizer_and_options(name, lr, s.get("weight_decay", 0.0), optimizer_options or {})
    train_loader = DataLoader(train_set, batch_size=int(s["batch_size"]), shuffle=True, drop_last=drop_last,
                              seed=s["seed"])
    from minidl.parallel.layout import prepare
    net, opt, train_loader = prepare(net, cls, train_loader, comm, params=params, zero=zero, **(pipeline or {}),
                                     **options)
    val_loader = DataLoader(val_set, batch_size=val_batch_size) if val_set is not None else None
    if steps is None:
        steps = math.ceil(len(train_loader) / int(s.get("accumulate", 1))) * int(epochs or s["epochs"])
    f = schedule(lr, steps) if schedule is not None else make_schedule(s["schedule"], lr, steps)
    return Run(s, net, opt, lr, f, train_loader, val_loader, int(steps))
