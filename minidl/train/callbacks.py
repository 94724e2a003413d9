"""Callbacks: small objects the training loop calls at fixed points of a run.

    trainer = Trainer(model, opt, train_loader, val_loader, callbacks=[
        EarlyStopping(monitor="val_loss", patience=5, restore_best=True),
        ModelCheckpoint("runs/exp", monitor="val_accuracy"),
        JSONLLogger("runs/exp/metrics.jsonl"), CSVLogger("runs/exp/metrics.csv"),
    ])

The hooks, in the order a run calls them::

    on_train_begin(trainer)
      on_epoch_begin(trainer, epoch)
        on_before_optimizer_step(trainer, params)   the gradients are final (accumulated,
                                               unscaled), before clipping and the step
        on_step_end(trainer, step, logs)       after every optimizer step
        on_evaluate(trainer, logs)             after every validation (a history record)
      on_epoch_end(trainer, epoch, logs)
    on_train_end(trainer)

``logs`` is the record just added to ``trainer.history``: ``step``, ``epoch``,
``train_loss``, ``lr`` and, with validation data, ``val_loss`` and
``val_<metric>``. A callback stops the run by setting
``trainer.stop_training = True``. Callbacks with state (a patience counter, the
best value so far) save it in the training checkpoint through
``state_dict``/``load_state_dict``, so a resumed run stops where the
uninterrupted one would.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os

from minidl.serialization import atomic_write, plain
from minidl.train.run_state import consolidated_state


class Callback:
    """Base class: every hook does nothing; override the ones you need."""

    def on_train_begin(self, trainer):
        pass

    def on_epoch_begin(self, trainer, epoch: int):
        pass

    def on_before_optimizer_step(self, trainer, params: list):
        """``params``: the parameters that have a gradient; a callback may change their ``.grad``."""

    def on_step_end(self, trainer, step: int, logs: dict):
        pass

    def on_evaluate(self, trainer, logs: dict):
        pass

    def on_epoch_end(self, trainer, epoch: int, logs: dict):
        pass

    def on_train_end(self, trainer):
        pass

    def state_dict(self) -> dict:
        return {}

    def check_state_dict(self, state, trainer=None) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state)`` would fail; change nothing.

        ``trainer``, when given, is the one resuming (EarlyStopping checks its saved
        weights against ``trainer.model``). A callback that overrides
        ``load_state_dict`` overrides this too; otherwise it is restored first and
        put back if a later part of a checkpoint fails.
        """

    def load_state_dict(self, state: dict) -> None:
        pass


# ---------------------------------------------------------------- checking saved states
def _checked_fields(owner: str, state, required, optional=()) -> dict:
    if not isinstance(state, dict):
        raise ValueError(f"{owner}: expected the dict {owner}.state_dict() returns, got {type(state).__name__}")
    missing = [k for k in required if k not in state]
    unexpected = sorted(str(k) for k in state if k not in required and k not in optional)
    if missing or unexpected:
        raise ValueError(f"{owner}: the saved state lacks {missing} and has unexpected {unexpected}; "
                         f"expected {list(required) + list(optional)}")
    return state


def _check_best(owner: str, value) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)):
        raise ValueError(f"{owner}: best must be a number (or ±inf before any), got {repr(value)[:60]}")


def _check_step(owner: str, name: str, value, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63):
        raise ValueError(f"{owner}: {name} must be a step number{' or None' if optional else ''}, "
                         f"got {repr(value)[:60]}")


# ---------------------------------------------------------------- monitoring a value
class _Monitor:
    """Tracks the best value of one logged quantity; ``mode`` 'min', 'max' or 'auto'."""

    def __init__(self, monitor: str, mode: str, min_delta: float, owner: str):
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"{owner}: mode must be 'auto', 'min' or 'max', got {mode!r}")
        if min_delta < 0:
            raise ValueError(f"{owner}: min_delta must be >= 0, got {min_delta}")
        if mode == "auto":  # losses and errors go down, everything else (accuracy, F1) goes up
            mode = "min" if ("loss" in monitor or "error" in monitor) else "max"
        self.monitor, self.mode, self.min_delta, self.owner = monitor, mode, float(min_delta), owner
        self.best = math.inf if mode == "min" else -math.inf

    def value(self, logs: dict):
        """The monitored value in ``logs``, or None when this record does not have it."""
        if self.monitor not in logs:
            return None
        value = float(logs[self.monitor])
        return value if math.isfinite(value) else None

    def improved(self, value: float) -> bool:
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def missing_message(self, logs: dict) -> str:
        return (f"{self.owner}: monitor={self.monitor!r} is not in the logged values "
                f"({', '.join(sorted(logs))}); pass validation data or monitor one of those")


class EarlyStopping(Callback):
    """Stop when the monitored value has not improved for ``patience`` evaluations.

    The text's early stopping: keep training while the validation score
    improves; when it has not improved for ``patience`` checks, stop, and with
    ``restore_best=True`` put back the weights of the best check -- the model
    then generalizes like the best point on the validation curve, not like the
    last. An improvement must beat the best by more than ``min_delta``.

    The best weights kept are the model's consolidated state (``consolidated_state_dict()``
    where the model has one, else ``state_dict()``): under ZeRO stage 2 or 3, whose ranks
    each hold a shard, they are the whole weights, gathered from every rank (a collective:
    every rank runs this callback, and every rank keeps the whole copy), and the restore
    goes through the sharded model's ``load_state_dict``, which cuts each rank's shard back
    out. So a checkpoint of this callback resumes in one process or on any number of ranks.

    ``stop_below`` also stops the run as soon as the monitored value falls below it: a target
    reached (``monitor="train_loss", stop_below=0.05``: train until the training loss is
    0.05, however many epochs that takes, as a comparison of runs at the same training loss
    needs), or, monitoring an accuracy, a collapse. ``reached_step``
    is the step at which it did (None until then).
    """

    def __init__(self, monitor: str = "val_loss", patience: int = 5, min_delta: float = 0.0,
                 mode: str = "auto", restore_best: bool = True, verbose: bool = False,
                 stop_below: float | None = None):
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping: patience must be an int >= 0, got {patience!r}")
        if stop_below is not None and (isinstance(stop_below, bool) or not isinstance(stop_below, (int, float))
                                       or not math.isfinite(stop_below)):
            raise ValueError(f"EarlyStopping: stop_below must be a finite number or None, got {stop_below!r}")
        self.stop_below = None if stop_below is None else float(stop_below)
        self.reached_step = None
        self.tracker = _Monitor(monitor, mode, min_delta, "EarlyStopping")
        self.patience, self.restore_best, self.verbose = patience, bool(restore_best), verbose
        self.wait = 0
        self.best_step = None
        self.best_state = None
        self.stopped_step = None

    @property
    def best(self) -> float:
        return self.tracker.best

    def on_evaluate(self, trainer, logs):
        value = self.tracker.value(logs)
        if value is None:
            if self.tracker.monitor not in logs:
                raise KeyError(self.tracker.missing_message(logs))
            value = math.inf if self.tracker.mode == "min" else -math.inf  # NaN counts as no improvement
        improved = self.tracker.improved(value)
        if improved:
            self.tracker.best, self.wait, self.best_step = value, 0, trainer.step
            if self.restore_best:
                self.best_state = consolidated_state(trainer.model)
        if self.stop_below is not None and value < self.stop_below:
            trainer.stop_training = True
            self.stopped_step = self.reached_step = trainer.step
            if self.verbose:
                print(f"early stopping at step {trainer.step}: {self.tracker.monitor} = {value:.4g} is below "
                      f"{self.stop_below:g}")
            return
        if improved:
            return
        self.wait += 1
        if self.wait >= self.patience:
            trainer.stop_training = True
            self.stopped_step = trainer.step
            if self.verbose:
                print(f"early stopping at step {trainer.step}: {self.tracker.monitor} has not improved for "
                      f"{self.wait} evaluations (best {self.tracker.best:.4g} at step {self.best_step})")

    def on_train_end(self, trainer):
        # Restore when this callback stopped the run or the run went to its last epoch; not when
        # something else interrupted it (max_steps, a user's stop), since that run may be resumed.
        finished = self.stopped_step is not None or getattr(trainer, "completed", False)
        if self.restore_best and self.best_state is not None and finished:
            trainer.model.load_state_dict(self.best_state)

    def state_dict(self):
        state = {"best": self.tracker.best, "wait": self.wait, "best_step": self.best_step,
                 "stopped_step": self.stopped_step, "reached_step": self.reached_step}
        if self.best_state is not None:
            state["best_state"] = dict(self.best_state)
        return state

    def check_state_dict(self, state, trainer=None):
        owner = "EarlyStopping"
        _checked_fields(owner, state, ("best", "wait"), ("best_step", "stopped_step", "reached_step", "best_state"))
        _check_best(owner, state["best"])
        _check_step(owner, "wait", state["wait"], optional=False)
        _check_step(owner, "best_step", state.get("best_step"))
        _check_step(owner, "stopped_step", state.get("stopped_step"))
        _check_step(owner, "reached_step", state.get("reached_step"))
        best_state = state.get("best_state")
        if best_state is not None:
            if not isinstance(best_state, dict):
                raise ValueError(f"{owner}: best_state must be a state dict, got {type(best_state).__name__}")
            if trainer is not None:
                trainer.model.check_state_dict(best_state)

    def load_state_dict(self, state):
        self.check_state_dict(state)
        self.tracker.best = float(state["best"])
        self.wait, self.best_step = int(state["wait"]), state.get("best_step")
        self.stopped_step, self.reached_step = state.get("stopped_step"), state.get("reached_step")
        self.best_state = state.get("best_state")


class ModelCheckpoint(Callback):
    """Write full training checkpoints: ``best`` when the monitored value improves, ``last`` every epoch.

    Both are complete checkpoints (model, optimizer, schedule, loader position,
    random states), written atomically: a run that crashes or stops on a NaN
    leaves the previous files whole. Resume from either with
    ``trainer.load_checkpoint(path)`` or ``minidl train --resume path``.

    A sharded run (ZeRO) gathers each checkpoint from every rank: give every
    rank a ModelCheckpoint, with ``write=False`` on all but rank 0. All ranks
    validate on the same data with the same weights, so they agree on when
    the best checkpoint improves.
    """

    def __init__(self, dirpath, monitor: str = "val_loss", mode: str = "auto", save_best: bool = True,
                 save_last: bool = True, best_name: str = "best.safetensors",
                 last_name: str = "last.safetensors", write: bool = True):
        self.dirpath, self.write = os.fspath(dirpath), bool(write)
        self.tracker = _Monitor(monitor, mode, 0.0, "ModelCheckpoint")
        self.save_best, self.save_last = bool(save_best), bool(save_last)
        self.best_path = os.path.join(self.dirpath, best_name)
        self.last_path = os.path.join(self.dirpath, last_name)
        self.best_step = None
        self.last_saved_step = None

    @property
    def best(self) -> float:
        return self.tracker.best

    def on_evaluate(self, trainer, logs):
        if not self.save_best:
            return
        value = self.tracker.value(logs)
        if value is None and self.tracker.monitor not in logs:
            raise KeyError(self.tracker.missing_message(logs))
        if value is not None and self.tracker.improved(value):
            self.tracker.best, self.best_step = value, trainer.step
            trainer.save_checkpoint(self.best_path, write=self.write)

    def on_epoch_end(self, trainer, epoch, logs):
        if self.save_last:
            trainer.save_checkpoint(self.last_path, write=self.write)
            self.last_saved_step = trainer.step

    def on_train_end(self, trainer):
        # A run stopped mid-epoch (by a callback or max_steps) still leaves a resumable last
        # checkpoint. The trainer calls this before other callbacks' on_train_end, so the file holds
        # the weights the run ended with, not weights EarlyStopping restores afterwards.
        if self.save_last and trainer.step > 0 and trainer.step != self.last_saved_step:
            trainer.save_checkpoint(self.last_path, write=self.write)
            self.last_saved_step = trainer.step

    def state_dict(self):
        return {"best": self.tracker.best, "best_step": self.best_step}

    def check_state_dict(self, state, trainer=None):
        _checked_fields("ModelCheckpoint", state, ("best",), ("best_step",))
        _check_best("ModelCheckpoint", state["best"])
        _check_step("ModelCheckpoint", "best_step", state.get("best_step"))

    def load_state_dict(self, state):
        self.check_state_dict(state)
        self.tracker.best, self.best_step = float(state["best"]), state.get("best_step")


# ---------------------------------------------------------------- loggers
def _step_of(record):
    """The step a logged record belongs to, or None."""
    try:
        step = float(record.get("step"))
    except (TypeError, ValueError):
        return None
    return step if math.isfinite(step) else None


def _rewind_jsonl(path: str, step: int) -> None:
    """Drop the records after ``step`` (and a line cut short by a kill) from a JSON Lines log.

    A run resumed from a checkpoint taken at ``step`` logs what follows again;
    the records an interrupted run wrote after its checkpoint would otherwise
    appear twice.
    """
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    kept = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        after = isinstance(record, dict) and (_step_of(record) or 0) > step
        if not after:
            kept.append(line)
    new_text = "".join(line + "\n" for line in kept)
    if new_text != text:
        atomic_write(path, lambda tmp: _write_text(tmp, new_text))


def _rewind_csv(path: str, step: int) -> None:
    """The CSV counterpart of :func:`_rewind_jsonl`: keep the header and the rows up to ``step``."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        text = f.read()
    rows = list(csv.reader(text.splitlines()))
    if not rows or "step" not in rows[0]:
        return
    column = rows[0].index("step")
    kept = [rows[0]] + [r for r in rows[1:] if len(r) == len(rows[0]) and (_step_of({"step": r[column]}) or 0) <= step]
    if len(kept) != len(rows) or not text.endswith("\n"):
        out = io.StringIO()
        csv.writer(out).writerows(kept)
        atomic_write(path, lambda tmp: _write_text(tmp, out.getvalue()))


def _write_text(path: str, text: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write(text)


class JSONLLogger(Callback):
    """Append every history record to a JSON Lines file (one JSON object per line).

    Each line is written and flushed as it happens, so the file can be read
    (``tail -f``, pandas.read_json(lines=True)) while training runs, and a
    resumed run appends to it: records the interrupted run wrote after the
    checkpoint it resumes from are dropped first, since the resumed run logs
    them again, so each record appears once. ``append=False`` starts the file afresh.
    """

    def __init__(self, path, append: bool = True):
        self.path = os.fspath(path)
        self.append = append

    def on_train_begin(self, trainer):
        self.begin(trainer.step)

    def begin(self, step: int) -> None:
        """Prepare the file for a run that starts at ``step`` (a loop of its own calls it; the Trainer does)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        if not self.append and step == 0 and os.path.exists(self.path):
            os.remove(self.path)
        elif step > 0 and os.path.exists(self.path):
            _rewind_jsonl(self.path, step)

    def on_evaluate(self, trainer, logs):
        self.write(logs)

    def write(self, record: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({k: plain(v) for k, v in record.items()}) + "\n")
        except OSError as exc:
            if exc.errno is None or exc.filename is not None:
                raise
            raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), self.path) from None  # name the file


class CSVLogger(Callback):
    """Append every history record to a CSV file; the first record's keys become the header.

    A resumed run first drops the rows after its checkpoint's step, as :class:`JSONLLogger` does.
    """

    def __init__(self, path, append: bool = True):
        self.path = os.fspath(path)
        self.append = append
        self.fields = None

    def on_train_begin(self, trainer):
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if not self.append and trainer.step == 0 and os.path.exists(self.path):
            os.remove(self.path)
        elif trainer.step > 0 and os.path.exists(self.path):
            _rewind_csv(self.path, trainer.step)
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, newline="", encoding="utf-8") as f:
                self.fields = next(csv.reader(f), None)

    def on_evaluate(self, trainer, logs):
        new_file = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if self.fields is None or new_file:
            self.fields = list(logs)
        with open(self.path, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self.fields, extrasaction="ignore", restval="")
            if new_file:
                writer.writeheader()
            writer.writerow({k: plain(v) for k, v in logs.items()})
