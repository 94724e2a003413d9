"""Checkpoints: exact stop-and-resume, bad files, the best checkpoint surviving a NaN stop."""
import os
import pickle
import random

import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import (
    Callback,
    CheckpointError,
    ModelCheckpoint,
    NonFiniteLossError,
    Trainer,
    load_checkpoint,
    save_checkpoint,
)
from minidl.train.checkpoint import pack, unpack


def _trainer(callbacks=(), seed=0, epochs_total=3):
    """Dropout (random masks), shuffling, Adam moments, a schedule, accumulation: every kind of state."""
    x, y = gaussian_blobs(n=150, centers=3, std=1.5, seed=0)
    mdl.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    schedule = optim.schedules.warmup(optim.schedules.cosine_restarts(1e-2, 40), 5)
    return Trainer(model, opt, DataLoader((x, y), batch_size=16, shuffle=True, seed=seed),
                   DataLoader((x, y), batch_size=150), scheduler=schedule, accumulation_steps=2,
                   eval_every=3, callbacks=list(callbacks), progress=False)


class _StopAt(Callback):
    def __init__(self, step, path):
        self.at, self.path = step, path

    def on_step_end(self, trainer, step, logs):
        if step == self.at:
            trainer.save_checkpoint(self.path)
            trainer.stop_training = True


@pytest.mark.parametrize("stop_step", [7, 10])  # mid-epoch, and exactly at an epoch end (5 steps per epoch)
def test_stopped_and_resumed_run_ends_with_the_same_weights(tmp_path, stop_step):
    path = tmp_path / "ckpt.safetensors"
    straight = _trainer([_StopAt(-1, path)])
    straight.fit(4)

    first = _trainer([_StopAt(stop_step, path)])
    first.fit(4)
    assert first.step == stop_step
    # A new process: different seed, fresh objects, random streams moved on; everything comes from the file.
    mdl.manual_seed(999)
    np.random.seed(5)
    random.seed(5)
    resumed = _trainer([_StopAt(-1, path)], seed=1)
    resumed.load_checkpoint(path)
    resumed.fit(4)

    assert resumed.step == straight.step == 20
    for name, value in straight.model.state_dict().items():
        np.testing.assert_array_equal(resumed.model.state_dict()[name], value, err_msg=name)
    assert [r["val_loss"] for r in resumed.history] == [r["val_loss"] for r in straight.history]
    assert resumed.steps["lr"] == straight.steps["lr"]


def test_checkpoint_restores_every_random_state(tmp_path):
    model = nn.Linear(2, 2)
    mdl.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    save_checkpoint(tmp_path / "c.safetensors", model)
    expected = (backend.rng("cpu").random(3), np.random.rand(3), random.random())
    mdl.manual_seed(4)
    np.random.seed(4)
    random.seed(4)
    load_checkpoint(tmp_path / "c.safetensors", model)
    got = (backend.rng("cpu").random(3), np.random.rand(3), random.random())
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert got[2] == expected[2]


def test_pack_round_trips_optimizer_style_state():
    state = {"state": {0: {"m": np.arange(3.0), "t": 2}, 5: {}}, "param_groups": [{"betas": (0.9, 0.999),
             "params": [0, 5], "nested": {(1, 2): "tuple key"}}]}
    out = unpack(pack(state))
    assert out["param_groups"][0]["betas"] == (0.9, 0.999)
    assert set(out["state"]) == {0, 5} and out["state"][0]["t"] == 2
    assert out["param_groups"][0]["nested"] == {(1, 2): "tuple key"}


def _model_and_opt():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return model, optim.Adam(model.parameters(), lr=1e-3)


def test_truncated_checkpoint_is_refused_and_changes_nothing(tmp_path):
    model, opt = _model_and_opt()
    path = tmp_path / "c.safetensors"
    save_checkpoint(path, model, opt)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    fresh, fresh_opt = _model_and_opt()
    for p in fresh.parameters():
        p.data[...] = 7.0
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path, fresh, fresh_opt)
    assert all(np.all(p.data == 7.0) for p in fresh.parameters())


def test_foreign_safetensors_file_is_refused(tmp_path):
    model, opt = _model_and_opt()
    path = tmp_path / "weights.safetensors"
    mdl.save(model.state_dict(), path)   # weights only: not a training checkpoint
    with pytest.raises(CheckpointError, match="not a minidl training checkpoint.*load_state_dict"):
        load_checkpoint(path, model, opt)


class _Payload:
    """Unpickling this would create a file: proof that code from the file ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_file_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.safetensors"
    path.write_bytes(pickle.dumps(_Payload(str(marker))))
    model, opt = _model_and_opt()
    with pytest.raises(CheckpointError):
        load_checkpoint(path, model, opt)
    assert not marker.exists()


def test_missing_checkpoint_and_mismatched_optimizer(tmp_path):
    model, opt = _model_and_opt()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "absent.safetensors", model)
    save_checkpoint(tmp_path / "c.safetensors", model, opt)
    other = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
    with pytest.raises(ValueError, match="mis-shaped key 2.weight"):
        load_checkpoint(tmp_path / "c.safetensors", other, optim.Adam(other.parameters()))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_best_checkpoint_intact_after_a_nan_stop(tmp_path):
    trainer = _trainer([ModelCheckpoint(tmp_path, monitor="val_loss")])
    trainer.fit(2)
    best = tmp_path / "best.safetensors"
    before = best.read_bytes()
    best_step = trainer.callbacks[0].best_step
    for group in trainer.optimizer.param_groups:
        group["lr"] = 1e30
    trainer.scheduler = None
    with pytest.raises(NonFiniteLossError, match=f"best checkpoint is intact: {best}") as info:
        trainer.fit(6)
    assert f"step {info.value.step}" in str(info.value)
    assert best.read_bytes() == before   # untouched, and still a complete checkpoint
    model = _trainer().model
    state = load_checkpoint(best, model)
    assert state["trainer"]["step"] == best_step
    assert all(np.all(np.isfinite(v)) for v in model.state_dict().values())
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]
