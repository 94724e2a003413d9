"""Callbacks: early stopping (patience, restore-best), checkpoints best/last, JSONL and CSV logs."""
import csv
import json
import os

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import CSVLogger, EarlyStopping, JSONLLogger, ModelCheckpoint, Trainer, load_checkpoint


class _StubTrainer:
    """Just what EarlyStopping reads and writes."""

    def __init__(self, model):
        self.model, self.step, self.stop_training, self.completed = model, 0, False, False


def _feed(callback, trainer, values, key="val_loss"):
    """Give the callback one record per value; the model's weight is set to the record index first."""
    for i, value in enumerate(values):
        trainer.step = i + 1
        trainer.model.weight.data[...] = i
        callback.on_evaluate(trainer, {"step": trainer.step, key: value})
        if trainer.stop_training:
            return i
    return None


def test_early_stopping_patience_and_restore_best():
    trainer = _StubTrainer(nn.Linear(2, 2))
    stopper = EarlyStopping(patience=2, restore_best=True)
    # best 0.9 at record 1; 0.95 and 0.96 are two records without improvement -> stop at record 3
    stopped_at = _feed(stopper, trainer, [1.0, 0.9, 0.95, 0.96, 0.5])
    assert stopped_at == 3 and stopper.best == 0.9 and stopper.best_step == 2
    stopper.on_train_end(trainer)
    np.testing.assert_array_equal(trainer.model.weight.data, 1.0)  # the weights of record 1


def test_early_stopping_min_delta_and_max_mode():
    trainer = _StubTrainer(nn.Linear(2, 2))
    stopper = EarlyStopping(monitor="val_accuracy", patience=1, min_delta=0.05)
    assert stopper.tracker.mode == "max"
    # 0.52 does not beat 0.5 by more than min_delta: stop right there
    assert _feed(stopper, trainer, [0.5, 0.52, 0.9], key="val_accuracy") == 1


def test_early_stopping_does_not_restore_when_interrupted_by_something_else():
    trainer = _StubTrainer(nn.Linear(2, 2))
    stopper = EarlyStopping(patience=5)
    _feed(stopper, trainer, [1.0, 2.0])
    stopper.on_train_end(trainer)   # neither stopped by it nor completed: a run that may be resumed
    np.testing.assert_array_equal(trainer.model.weight.data, 1.0)
    trainer.completed = True
    stopper.on_train_end(trainer)
    np.testing.assert_array_equal(trainer.model.weight.data, 0.0)


def test_early_stopping_state_round_trip_and_errors():
    trainer = _StubTrainer(nn.Linear(2, 2))
    a = EarlyStopping(patience=3)
    _feed(a, trainer, [1.0, 0.5, 0.7])
    b = EarlyStopping(patience=3)
    b.load_state_dict(a.state_dict())
    assert (b.best, b.wait, b.best_step) == (0.5, 1, 2)
    with pytest.raises(KeyError, match="monitor='val_loss'"):
        EarlyStopping().on_evaluate(trainer, {"train_loss": 1.0})
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=-1)
    with pytest.raises(ValueError, match="mode"):
        EarlyStopping(mode="up")


def _blobs_trainer(callbacks, lr=0.05, epochs_seed=0):
    x, y = gaussian_blobs(n=120, centers=3, std=2.0, seed=0)
    mdl.manual_seed(epochs_seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    return Trainer(model, optim.Adam(model.parameters(), lr=lr), DataLoader((x, y), batch_size=30, shuffle=True,
                   seed=0), DataLoader((x[:60], y[:60]), batch_size=60), callbacks=callbacks, progress=False)


def test_early_stopping_in_a_real_run_restores_the_best_epoch():
    stopper = EarlyStopping(monitor="val_loss", patience=2)
    trainer = _blobs_trainer([stopper], lr=0.5)   # a high rate makes the validation loss bounce
    trainer.fit(60)
    losses = [r["val_loss"] for r in trainer.history]
    best = int(np.argmin(losses))
    assert trainer.stop_training and len(losses) == best + 3   # stopped 2 records after the best
    assert stopper.best == pytest.approx(losses[best])
    with mdl.no_grad():
        assert trainer.evaluate(trainer.val_loader)["loss"] == pytest.approx(losses[best])


def test_model_checkpoint_best_and_last(tmp_path):
    saved = []

    class Spy(ModelCheckpoint):
        def on_evaluate(self, trainer, logs):
            before = self.best_step
            super().on_evaluate(trainer, logs)
            if self.best_step != before:
                saved.append((trainer.step, trainer.model.state_dict()))

    ckpt = Spy(tmp_path, monitor="val_accuracy")
    trainer = _blobs_trainer([ckpt])
    trainer.fit(4)
    accuracies = [r["val_accuracy"] for r in trainer.history]
    improved = [i for i, a in enumerate(accuracies) if a > max(accuracies[:i], default=-1)]
    assert [s for s, _ in saved] == [trainer.history[i]["step"] for i in improved]
    # best holds the weights of the last improvement, last those at the end
    model = _blobs_trainer([]).model
    state = load_checkpoint(ckpt.best_path, model)
    for k, v in saved[-1][1].items():
        np.testing.assert_array_equal(model.state_dict()[k], v)
    assert state["trainer"]["step"] == saved[-1][0]
    load_checkpoint(ckpt.last_path, model)
    for k, v in trainer.model.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[k], v)
    assert sorted(os.listdir(tmp_path)) == ["best.safetensors", "last.safetensors"]  # no temporary files left


def test_jsonl_and_csv_loggers_hold_the_history(tmp_path):
    jsonl, csv_path = tmp_path / "m.jsonl", tmp_path / "m.csv"
    trainer = _blobs_trainer([JSONLLogger(jsonl), CSVLogger(csv_path)])
    trainer.fit(3)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert records == trainer.history
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [r["step"] for r in trainer.history]
    assert [float(r["val_loss"]) for r in rows] == pytest.approx([r["val_loss"] for r in trainer.history])
    trainer.fit(4)   # a continued run appends, the CSV header is written once
    assert len(jsonl.read_text().splitlines()) == 4
    assert csv_path.read_text().count("step,") == 1 and len(csv_path.read_text().splitlines()) == 5
