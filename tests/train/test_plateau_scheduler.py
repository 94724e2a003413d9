"""ReduceLROnPlateau in the Trainer: stepped with the monitored validation metric at each validation."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import Trainer


def _setup(seed=0):
    x, y = gaussian_blobs(n=96, centers=3, std=1.0, seed=seed)
    x = x.astype(np.float64)
    rng = np.random.default_rng(1)
    y_val = rng.permutation(y)  # labels the model cannot learn: the validation loss rises, the rate must drop
    mdl.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype=np.float64)
    train = DataLoader((x, y), batch_size=16, shuffle=True, seed=2)
    val = DataLoader((x, y_val), batch_size=96)
    return model, train, val


def _replay(values, lr, mode="min", factor=0.5, patience=1, threshold=0.0):
    """The plateau rule by hand: the rate in force after each validation."""
    best, bad, rates = (math.inf if mode == "min" else -math.inf), 0, []
    for v in values:
        if (v < best) if mode == "min" else (v > best):
            best, bad = v, 0
        else:
            bad += 1
        if bad > patience:
            lr, bad = lr * factor, 0
        rates.append(lr)
    return rates


@pytest.mark.parametrize("monitor,mode", [("val_loss", "min"), ("val_accuracy", "max")])
def test_plateau_scheduler_steps_on_the_monitored_metric_at_each_validation(monitor, mode):
    model, train, val = _setup()
    opt = optim.SGD(model.parameters(), lr=0.4)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(opt, mode=mode, factor=0.5, patience=1, threshold=0.0)
    trainer = Trainer(model, opt, train, val, scheduler=scheduler, eval_every=2, progress=False,
                      scheduler_monitor=monitor)
    trainer.fit(epochs=4)
    history = trainer.history
    rates = _replay([r[monitor] for r in history], 0.4, mode=mode)
    # The rate used by each step is the one in force after the last validation before it.
    expected, k = [], 0
    for step in trainer.steps["step"]:
        while k < len(history) and history[k]["step"] < step:
            k += 1
        expected.append(0.4 if k == 0 else rates[k - 1])
    assert trainer.steps["lr"] == pytest.approx(expected, rel=0, abs=0)
    assert scheduler.num_bad_epochs <= 1 and scheduler._step_count == len(history)
    if monitor == "val_loss":
        assert min(expected) < 0.4 < max(expected) + 1e-12  # the rule did drop the rate, and not from the start
    assert opt.param_groups[0]["lr"] == pytest.approx(rates[-1], rel=0, abs=0)


def test_plateau_scheduler_needs_validation_data_unless_it_watches_training_loss():
    model, train, _ = _setup()
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="val_loader"):
        Trainer(model, opt, train, scheduler=optim.lr_scheduler.ReduceLROnPlateau(opt), progress=False)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=0.0)
    trainer = Trainer(model, opt, train, scheduler=scheduler, scheduler_monitor="train_loss", progress=False)
    trainer.fit(epochs=3)
    rates = _replay([r["train_loss"] for r in trainer.history], 0.1, patience=0)
    assert opt.param_groups[0]["lr"] == rates[-1]
    assert scheduler._step_count == 3


def test_a_missing_monitor_key_is_named():
    model, train, val = _setup()
    opt = optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, opt, train, val, scheduler=optim.lr_scheduler.ReduceLROnPlateau(opt),
                      scheduler_monitor="val_f1", progress=False)
    with pytest.raises(ValueError, match="val_f1"):
        trainer.fit(epochs=1)


def test_per_step_schedulers_still_step_after_every_optimizer_step():
    model, train, val = _setup()
    opt = optim.SGD(model.parameters(), lr=0.1)
    trainer = Trainer(model, opt, train, val, scheduler=optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
                      progress=False)
    trainer.fit(epochs=1)
    assert trainer.steps["lr"] == [0.1 * 0.5 ** i for i in range(len(train))]


def test_a_resumed_run_continues_the_plateau_schedule_exactly(tmp_path):
    def run(stop_after=None):
        model, train, val = _setup()
        opt = optim.SGD(model.parameters(), lr=0.4)
        sched = optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1, threshold=0.0)
        return Trainer(model, opt, train, val, scheduler=sched, eval_every=2, progress=False), sched

    whole, _ = run()
    whole.fit(epochs=4)
    first, _ = run()
    first.fit(epochs=2)
    first.save_checkpoint(tmp_path / "ckpt.safetensors")
    resumed, sched = run()
    resumed.load_checkpoint(tmp_path / "ckpt.safetensors")
    resumed.fit(epochs=4)
    assert resumed.steps["lr"] == whole.steps["lr"]
    assert sched.num_bad_epochs == whole.scheduler.num_bad_epochs and sched.best == whole.scheduler.best
    for (name, a), (_, b) in zip(resumed.model.named_parameters(), whole.model.named_parameters()):
        np.testing.assert_array_equal(a.array, b.array, err_msg=name)
