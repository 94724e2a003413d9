"""Callbacks: early stopping (patience, restore-best), checkpoints best/last, JSONL and CSV logs."""
import csv
import json
import os

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import Callback, CSVLogger, EarlyStopping, JSONLLogger, ModelCheckpoint, Trainer, load_checkpoint


class _StubTrainer:
    """Just what EarlyStopping reads and writes."""

    def __init__(self, model):
        self.model, self.step, self.stop_training, self.completed = model, 0, False, False


def _feed(callback, trainer, values, key="val_loss"):
    """Give the callback one record per value; the model's weight is set to the record index first."""
    for i, value in enumerate(values):
        trainer.step = i + 1
        trainer.model.weight.array[...] = i
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
    np.testing.assert_array_equal(trainer.model.weight.array, 1.0)  # the weights of record 1


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
    np.testing.assert_array_equal(trainer.model.weight.array, 1.0)
    trainer.completed = True
    stopper.on_train_end(trainer)
    np.testing.assert_array_equal(trainer.model.weight.array, 0.0)


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


# ---------------------------------------------------------------- logs of a resumed run
class _KeepCheckpointAt(Callback):
    """Copy the checkpoint written at the end of ``epoch``: the file a crash after it would leave."""

    def __init__(self, folder, epoch):
        self.folder, self.epoch = folder, epoch

    def on_epoch_end(self, trainer, epoch, logs):
        if epoch + 1 == self.epoch:
            trainer.save_checkpoint(os.path.join(self.folder, "kept.safetensors"))


def _logged_trainer(folder, extra=()):
    x, y = gaussian_blobs(n=60, centers=3, std=1.5, seed=0)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3))
    callbacks = [JSONLLogger(os.path.join(folder, "metrics.jsonl")), CSVLogger(os.path.join(folder, "metrics.csv"))]
    return Trainer(model, optim.Adam(model.parameters(), lr=1e-2),
                   DataLoader((x, y), batch_size=16, shuffle=True, seed=0), DataLoader((x, y), batch_size=60),
                   eval_every=3, callbacks=callbacks + list(extra), progress=False)


def test_a_resumed_run_logs_each_record_once(tmp_path):
    straight = _logged_trainer(tmp_path / "straight")
    straight.fit(4)

    crashed = _logged_trainer(tmp_path / "run", extra=[_KeepCheckpointAt(tmp_path, 2)])
    crashed.fit(3)                                          # the run goes on past its checkpoint, then dies
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "val_lo')                    # killed in the middle of a line
    resumed = _logged_trainer(tmp_path / "run", extra=[_KeepCheckpointAt(tmp_path / "unused", 2)])
    resumed.load_checkpoint(tmp_path / "kept.safetensors")
    resumed.fit(4)

    def records(folder):
        with open(folder / "metrics.jsonl") as f:
            return [json.loads(line) for line in f]

    got, expected = records(tmp_path / "run"), records(tmp_path / "straight")
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    assert len({r["step"] for r in got}) == len(got)
    assert [r["val_loss"] for r in got] == [r["val_loss"] for r in expected]
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [r["step"] for r in expected]


def test_a_fresh_run_keeps_an_existing_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 50, "note": "an earlier run"}\n')
    trainer = _logged_trainer(tmp_path)
    trainer.fit(1)
    with open(path) as f:
        first = json.loads(f.readline())
    assert first == {"step": 50, "note": "an earlier run"}


@pytest.mark.parametrize("state, message", [
    ({"best": "x", "wait": 0}, "best must be a number"),
    ({"best": 1.0, "wait": -1}, "wait must be a step number"),
    ({"best": 1.0, "wait": 0, "patience_left": 2}, "unexpected \\['patience_left'\\]"),
    ({"wait": 0}, "lacks \\['best'\\]"),
    ({"best": 1.0, "wait": 0, "best_state": [1]}, "best_state must be a state dict"),
])
def test_early_stopping_refuses_a_damaged_state_and_keeps_its_own(state, message):
    stopper = EarlyStopping(patience=3)
    stopper.wait, stopper.tracker.best = 2, 0.5
    with pytest.raises(ValueError, match=message):
        stopper.load_state_dict(state)
    assert stopper.wait == 2 and stopper.best == 0.5


def test_model_checkpoint_refuses_a_damaged_state(tmp_path):
    ckpt = ModelCheckpoint(tmp_path)
    with pytest.raises(ValueError, match="best_step must be a step number"):
        ckpt.load_state_dict({"best": 0.1, "best_step": "7"})
    assert ckpt.best_step is None
