"""Every state dict minidl produces goes through ``mdl.save``/``mdl.load`` and resumes the same work.

The optimizers page promises optimizer state "can be saved without pickle": here
every optimizer, the schedule runner, SWA, the data loader, the standardizer
and the trainer (with its callbacks) is saved to a file, loaded back into a
fresh object, and must then continue exactly as the original does.
"""
import copy

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.data import DataLoader, TensorDataset
from minidl.data.preprocess import Standardizer
from minidl.optim import schedules
from minidl.train import JSONLLogger, ModelCheckpoint, Trainer
from minidl.train.callbacks import EarlyStopping


def _through_a_file(state, tmp_path, name="state"):
    path = tmp_path / f"{name}.safetensors"
    mdl.save(state, path)
    return mdl.load(path)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((48, 5)).astype(np.float32), rng.integers(0, 3, 48)


def _model():
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def _optimizers():
    """Every optimizer class of minidl.optim: (name, factory(params))."""
    out = []
    for name in optim.__all__:
        cls = getattr(optim, name)
        if not (isinstance(cls, type) and issubclass(cls, optim.Optimizer)) or cls is optim.Optimizer:
            continue
        if name == "Lookahead":
            out.append((name, lambda p: optim.Lookahead(optim.Adam(p, lr=1e-2), k=2)))
        else:
            out.append((name, lambda p, cls=cls: cls(p, lr=1e-2)))
    # SGD-Q, a wrapper outside __all__ (LowPrecisionOptimizer needs 16-bit parameters: its file round trip
    # and resumed trajectory are in tests/optim/test_low_precision.py)
    out.append(("QuantizedGradients", lambda p: optim.QuantizedGradients(optim.SGD(p, lr=1e-2, momentum=0.9), bits=4)))
    return out


def _step(model, opt, x, y):
    create_graph = isinstance(opt, optim.AdaHessian)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(mdl.tensor(x)), y)
        loss.backward(create_graph=create_graph)
        return loss
    if isinstance(opt, optim.LBFGS):  # it evaluates the loss as often as its line search needs
        opt.step(closure)
    else:
        closure()
        opt.step()


@pytest.mark.parametrize("name, make", _optimizers(), ids=[n for n, _ in _optimizers()])
def test_optimizer_state_round_trips_and_resumes_the_same_trajectory(name, make, tmp_path):
    x, y = _data()
    model = _model()
    opt = make(model.parameters())
    for _ in range(3):  # state after a few steps: moments, step counts, Lookahead's slow weights
        _step(model, opt, x, y)
    twin = _model()
    twin.load_state_dict(_through_a_file(model.state_dict(), tmp_path, "model"))
    twin_opt = make(twin.parameters())
    twin_opt.load_state_dict(_through_a_file(opt.state_dict(), tmp_path))
    for _ in range(3):
        mdl.manual_seed(1)  # AdaHessian's Rademacher probes
        _step(model, opt, x, y)
        mdl.manual_seed(1)
        _step(twin, twin_opt, x, y)
    for a, b in zip(model.parameters(), twin.parameters()):  # float32 rounding only (threaded BLAS)
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_scheduler_state_round_trips(tmp_path):
    p = mdl.tensor(np.zeros(1), requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    scheduler = optim.ScheduleLR(opt, schedules.cosine(0.1, 20))
    for _ in range(7):
        scheduler.step()
    other = optim.SGD([mdl.tensor(np.zeros(1), requires_grad=True)], lr=0.1)
    again = optim.ScheduleLR(other, schedules.cosine(0.1, 20))
    again.load_state_dict(_through_a_file(scheduler.state_dict(), tmp_path))
    for _ in range(5):
        assert again.get_last_lr() == scheduler.get_last_lr()
        scheduler.step()
        again.step()
    assert again.t == scheduler.t == 12


def test_swa_state_round_trips(tmp_path):
    model = _model()
    swa = optim.SWA(model)
    swa.update()
    for p in model.parameters():
        p.array += 1
    swa.update()
    twin = _model()
    twin_swa = optim.SWA(twin)
    twin_swa.load_state_dict(_through_a_file(swa.state_dict(), tmp_path))
    assert twin_swa.n_averaged == 2
    for a, b in zip(swa.averages, twin_swa.averages):
        np.testing.assert_array_equal(a, b)


def test_loader_state_round_trips_mid_epoch(tmp_path):
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=3)
    batches = iter(loader)
    next(batches), next(batches)
    saved = _through_a_file(loader.state_dict(), tmp_path)
    expected = [b[1] for b in batches]  # the rest of this epoch
    again = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=0)
    again.load_state_dict(saved)
    got = [b[1] for b in again]
    assert len(got) == len(expected) == 4
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


def test_standardizer_state_round_trips(tmp_path):
    x, _ = _data()
    s = Standardizer().fit(x * 3 + 1)
    again = Standardizer().load_state_dict(_through_a_file(s.state_dict(), tmp_path))
    np.testing.assert_array_equal(again.transform(x), s.transform(x))


def test_trainer_state_with_every_callback_round_trips(tmp_path):
    x, y = _data()

    def trainer(model, folder):
        opt = optim.Adam(model.parameters(), lr=1e-2)
        callbacks = [ModelCheckpoint(folder, monitor="val_accuracy"),
                     EarlyStopping(monitor="val_accuracy", patience=50),
                     JSONLLogger(folder / "metrics.jsonl")]
        return Trainer(model, opt, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, seed=0),
                       DataLoader(TensorDataset(x, y), batch_size=48), scheduler=schedules.cosine(1e-2, 30),
                       callbacks=callbacks, progress=False, metrics=("accuracy",))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = trainer(_model(), tmp_path / "a")
    first.fit(2)
    state = first.state_dict()
    back = _through_a_file(state, tmp_path, "trainer")
    assert back["step"] == state["step"] == 6 and back["history"] == state["history"]
    second = trainer(_model(), tmp_path / "b")
    second.model.load_state_dict(copy.deepcopy(first.model.state_dict()))
    second.optimizer.load_state_dict(_through_a_file(first.optimizer.state_dict(), tmp_path, "opt"))
    second.scheduler.load_state_dict(_through_a_file(first.scheduler.state_dict(), tmp_path, "sched"))
    second.train_loader.load_state_dict(_through_a_file(first.train_loader.state_dict(), tmp_path, "loader"))
    second.load_state_dict(back)
    assert second.callbacks[1].state_dict()["best"] == first.callbacks[1].state_dict()["best"]
    first.fit(4)
    second.fit(4)
    assert second.history == [dict(r, time=second.history[i]["time"]) for i, r in enumerate(first.history)]
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
