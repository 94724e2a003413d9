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
    EarlyStopping,
    ModelCheckpoint,
    NonFiniteLossError,
    Trainer,
    load_checkpoint,
    save_checkpoint,
)
from tests.train._helpers import StopAt


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


@pytest.mark.parametrize("stop_step", [7, 10])  # mid-epoch, and exactly at an epoch end (5 steps per epoch)
def test_stopped_and_resumed_run_ends_with_the_same_weights(tmp_path, stop_step):
    path = tmp_path / "ckpt.safetensors"
    straight = _trainer([StopAt(-1, path)])
    straight.fit(4)

    first = _trainer([StopAt(stop_step, path)])
    first.fit(4)
    assert first.step == stop_step
    # A new process: different seed, fresh objects, random streams moved on; everything comes from the file.
    mdl.manual_seed(999)
    np.random.seed(5)
    random.seed(5)
    resumed = _trainer([StopAt(-1, path)], seed=1)
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


def test_optimizer_style_state_round_trips_through_a_file(tmp_path):
    state = {"state": {0: {"m": np.arange(3.0), "t": 2}, 5: {}}, "param_groups": [{"betas": (0.9, 0.999),
             "params": [0, 5], "nested": {(1, 2): "tuple key"}}]}
    mdl.save(state, tmp_path / "o.safetensors")
    out = mdl.load(tmp_path / "o.safetensors")
    assert out["param_groups"][0]["betas"] == (0.9, 0.999)
    assert set(out["state"]) == {0, 5} and out["state"][0]["t"] == 2
    np.testing.assert_array_equal(out["state"][0]["m"], np.arange(3.0))
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
        p.array[...] = 7.0
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(path, fresh, fresh_opt)
    assert all(np.all(p.array == 7.0) for p in fresh.parameters())


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


# ---------------------------------------------------------------- damaged parts: all or nothing
def _resumable(folder, optimizer=None, callbacks=None):
    """BatchNorm (buffers), Adam, a schedule, a shuffled loader, EarlyStopping with saved weights."""
    x, y = gaussian_blobs(n=60, centers=3, std=1.5, seed=0)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = (optimizer or (lambda params: optim.Adam(params, lr=1e-2)))(model.parameters())
    if callbacks is None:
        callbacks = [EarlyStopping(monitor="val_loss", patience=5), ModelCheckpoint(folder)]
    return Trainer(model, opt, DataLoader((x, y), batch_size=16, shuffle=True, seed=0),
                   DataLoader((x, y), batch_size=60), scheduler=optim.schedules.cosine_restarts(1e-2, 40),
                   callbacks=callbacks, progress=False)


def _everything(trainer) -> dict:
    """Every piece of state a resume may change, as plain copies."""
    state = trainer.state_dict()
    state.pop("elapsed")
    return {"model": {k: np.array(v) for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(), "scheduler": trainer.scheduler.state_dict(),
            "lr": [g["lr"] for g in trainer.optimizer.param_groups],
            "loader": trainer.train_loader.state_dict(), "trainer": state,
            "rng": (backend.get_rng_state(), np.random.get_state(legacy=False), random.getstate())}


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    trainer = _resumable(folder)
    trainer.fit(2)
    return folder / "last.safetensors"


def _pop(d, key):
    d.pop(key)


DAMAGE = {
    "scheduler key renamed": ("scheduler", lambda s: s["scheduler"].__setitem__("tt", s["scheduler"].pop("t"))),
    "scheduler t is text": ("scheduler", lambda s: s["scheduler"].__setitem__("t", "3")),
    "loader seed negative": ("loader", lambda s: s["loader"].__setitem__("seed", -5)),
    "loader seed huge float": ("loader", lambda s: s["loader"].__setitem__("seed", 1e300)),
    "loader batch past the end": ("loader", lambda s: s["loader"].__setitem__("batch", 99)),
    "python rng negative": ("rng", lambda s: s["rng"].__setitem__("python", [3, [-1] * 625, None])),
    "minidl rng too large": ("rng", lambda s: s["rng"]["minidl_cpu"]["state"].__setitem__("state", 2**200)),
    "numpy rng key short": ("rng", lambda s: s["rng"]["numpy_global"]["state"].__setitem__("key", np.ones(3))),
    "adam without v": ("optimizer", lambda s: _pop(s["optimizer"]["state"][0], "v")),
    "betas[0] is text": ("optimizer", lambda s: s["optimizer"]["param_groups"][0].__setitem__("betas", ("abc", .9))),
    "m is text": ("optimizer", lambda s: s["optimizer"]["state"][0].__setitem__("m", "abc")),
    "m mis-shaped": ("optimizer", lambda s: s["optimizer"]["state"][1].__setitem__("m", np.zeros(3, np.float32))),
    "lr renamed": ("optimizer", lambda s: s["optimizer"]["param_groups"][0].__setitem__(
        "rate", s["optimizer"]["param_groups"][0].pop("lr"))),
    "num_batches_tracked is text": ("model", lambda s: s["model"].__setitem__("1.num_batches_tracked", "abc")),
    "running_var mis-shaped": ("model", lambda s: s["model"].__setitem__("1.running_var", np.ones(3, np.float32))),
    "trainer step is text": ("trainer", lambda s: s["trainer"].__setitem__("step", "x")),
    "history record not a dict": ("trainer", lambda s: s["trainer"]["history"].append("x")),
    "curves of different lengths": ("trainer", lambda s: s["trainer"]["steps"].__setitem__("lr", np.ones(1))),
    "early stopping best is text": ("trainer", lambda s: s["trainer"]["callbacks"][0].__setitem__("best", "x")),
    "best weights mis-shaped": ("trainer", lambda s: s["trainer"]["callbacks"][0]["best_state"].__setitem__(
        "0.weight", np.zeros(3, np.float32))),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_part_raises_checkpoint_error_naming_it_and_changes_nothing(tmp_path, good_checkpoint, case):
    part, damage = DAMAGE[case]
    state = mdl.load(good_checkpoint)
    damage(state)
    bad = tmp_path / "bad.safetensors"
    mdl.save(state, bad)    # a well-formed file with one damaged part
    trainer = _resumable(tmp_path)
    before = _everything(trainer)
    with pytest.raises(CheckpointError, match=f"the {part} state does not fit") as info:
        trainer.load_checkpoint(bad)
    assert "\n" not in str(info.value)
    assert _equal(_everything(trainer), before)
    trainer.load_checkpoint(good_checkpoint)     # the same objects still take a good file
    assert trainer.step == 8


def test_an_optimizer_that_cannot_be_checked_ahead_is_put_back(tmp_path):
    """Lookahead reads its own format: it is restored first, and put back when a later part fails."""
    def lookahead(params):
        return optim.Lookahead(optim.Adam(params, lr=1e-2), k=2)

    trainer = _resumable(tmp_path, optimizer=lookahead)
    trainer.fit(1)
    state = mdl.load(tmp_path / "last.safetensors")
    state["model"]["1.num_batches_tracked"] = np.array(np.nan)
    mdl.save(state, tmp_path / "bad.safetensors")
    fresh = _resumable(tmp_path / "b", optimizer=lookahead)
    before = _everything(fresh)
    slow = {k: v.copy() for k, v in fresh.optimizer.slow.items()}
    with pytest.raises(CheckpointError, match="the model state does not fit.*num_batches_tracked"):
        fresh.load_checkpoint(tmp_path / "bad.safetensors")
    assert _equal(_everything(fresh), before)
    assert _equal(fresh.optimizer.slow, slow) and fresh.optimizer.inner_steps == 0


class _Fragile(Callback):
    """A callback with a load_state_dict of its own and no check: it fails on a bad state, after changing."""

    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = -1
        self.count = int(state["count"])


def test_a_callback_that_cannot_be_checked_ahead_is_put_back(tmp_path):
    trainer = _resumable(tmp_path, callbacks=[_Fragile(), ModelCheckpoint(tmp_path)])
    trainer.callbacks[0].count = 4
    trainer.fit(1)
    state = mdl.load(tmp_path / "last.safetensors")
    state["trainer"]["callbacks"][0] = {"count": "many"}
    mdl.save(state, tmp_path / "bad.safetensors")
    fresh = _resumable(tmp_path / "b", callbacks=[_Fragile(), ModelCheckpoint(tmp_path / "b")])
    fresh.callbacks[0].count = 7
    before = _everything(fresh)
    with pytest.raises(CheckpointError, match="the trainer state does not fit"):
        fresh.load_checkpoint(tmp_path / "bad.safetensors")
    assert fresh.callbacks[0].count == 7
    assert _equal(_everything(fresh), before)


def test_a_huge_schedule_step_does_not_stall(tmp_path, good_checkpoint):
    """SGDR with equal cycles is periodic: step 10**15 takes no longer than step 15."""
    import math
    import threading

    state = mdl.load(good_checkpoint)
    state["scheduler"]["t"] = 10**15
    mdl.save(state, tmp_path / "far.safetensors")
    trainer = _resumable(tmp_path)
    thread = threading.Thread(target=trainer.load_checkpoint, args=(tmp_path / "far.safetensors",), daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "loading a large schedule step hung"
    expected = 1e-2 * (1 + math.cos(math.pi * (10**15 % 40) / 40)) / 2
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
