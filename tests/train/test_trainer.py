"""The training loop: accumulation, clipping, label smoothing, schedules, seeding, NaN stop, devices."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.ops.loss import cross_entropy
from minidl.train import Callback, NonFiniteLossError, Trainer, fit


def _data(n=96, seed=0):
    x, y = gaussian_blobs(n=n, centers=3, std=1.0, seed=seed)
    return x.astype(np.float64), y


def _model(seed=0, dtype=np.float64):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype=dtype)


def _weights(model):
    return {k: np.array(v) for k, v in model.state_dict().items()}


def _manual_step(model, x, y, lr, transform_grads=lambda gs: gs, **loss_kw):
    """One plain SGD step computed outside the Trainer: w - lr * g."""
    model.zero_grad()
    cross_entropy(model(mdl.tensor(x)), mdl.tensor(y), **loss_kw).backward()
    params = list(model.parameters())
    grads = transform_grads([p.grad.array.copy() for p in params])
    return {name: p.array - lr * g for (name, p), g in zip(model.named_parameters(), grads)}


def test_gradient_accumulation_equals_the_large_batch():
    x, y = _data()
    big, small = _model(), _model()
    fit(big, optim.SGD(big.parameters(), lr=0.1), DataLoader((x, y), batch_size=16, shuffle=True, seed=3),
        epochs=2, progress=False)
    fit(small, optim.SGD(small.parameters(), lr=0.1), DataLoader((x, y), batch_size=8, shuffle=True, seed=3),
        epochs=2, progress=False, accumulation_steps=2)
    for k, v in _weights(big).items():
        np.testing.assert_allclose(_weights(small)[k], v, rtol=1e-10, atol=1e-12)


def test_accumulation_with_a_short_last_group_averages_what_it_has():
    x, y = _data(n=24)
    model = _model()
    expected = _manual_step(_model(), x, y, lr=0.5)  # 3 micro-batches of 8 in one group of k=4: one step
    fit(model, optim.SGD(model.parameters(), lr=0.5), DataLoader((x, y), batch_size=8), epochs=1,
        progress=False, accumulation_steps=4)
    for name, value in expected.items():
        np.testing.assert_allclose(_weights(model)[name], value, rtol=1e-10, atol=1e-12)


def test_clip_by_global_norm_matches_the_formula():
    x, y = _data(n=32)
    max_norm = 1e-2

    def clip(grads):
        total = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
        assert total > max_norm  # the test must actually clip
        return [g * (max_norm / (total + 1e-6)) for g in grads]

    expected = _manual_step(_model(), x, y, lr=1.0, transform_grads=clip)
    model = _model()
    fit(model, optim.SGD(model.parameters(), lr=1.0), DataLoader((x, y), batch_size=32), epochs=1,
        progress=False, max_grad_norm=max_norm)
    for name, value in expected.items():
        np.testing.assert_allclose(_weights(model)[name], value, rtol=1e-9, atol=1e-12)


def test_clip_by_value():
    x, y = _data(n=32)
    expected = _manual_step(_model(), x, y, lr=1.0, transform_grads=lambda gs: [np.clip(g, -1e-3, 1e-3) for g in gs])
    model = _model()
    fit(model, optim.SGD(model.parameters(), lr=1.0), DataLoader((x, y), batch_size=32), epochs=1,
        progress=False, max_grad_value=1e-3)
    for name, value in expected.items():
        np.testing.assert_allclose(_weights(model)[name], value, rtol=1e-12, atol=1e-15)


def test_label_smoothing_goes_through_the_loss():
    x, y = _data(n=32)
    expected = _manual_step(_model(), x, y, lr=0.3, label_smoothing=0.2)
    plain = _manual_step(_model(), x, y, lr=0.3)
    model = _model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.3), DataLoader((x, y), batch_size=32),
                      DataLoader((x, y), batch_size=32), progress=False, label_smoothing=0.2)
    trainer.fit(1)
    for name, value in expected.items():
        np.testing.assert_allclose(_weights(model)[name], value, rtol=1e-10, atol=1e-12)
    assert not np.allclose(expected["2.weight"], plain["2.weight"])
    # Validation loss is the plain cross-entropy, whatever the smoothing.
    with mdl.no_grad():
        plain_loss = cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).item()
    assert trainer.history[-1]["val_loss"] == pytest.approx(plain_loss)


def test_schedule_function_sets_each_steps_lr():
    x, y = _data(n=40)
    model = _model()
    schedule = optim.schedules.step_decay(0.1, 0.5, 2)
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=8),
                      scheduler=schedule, progress=False)
    trainer.fit(2)
    assert trainer.steps["lr"] == pytest.approx([schedule(t) for t in range(10)])  # step k used f(k-1)
    assert trainer.steps["step"] == list(range(1, 11))


def test_eval_every_adds_records_between_epochs():
    x, y = _data()  # 96 samples, batches of 16: 6 steps per epoch
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2),
                      DataLoader((x.astype(np.float32), y), batch_size=16, shuffle=True, seed=1),
                      DataLoader((x.astype(np.float32), y), batch_size=64), progress=False,
                      eval_every=4, metrics=("accuracy", "f1"))
    history = trainer.fit(2)
    # every 4 steps, plus each epoch end unless it was just validated (step 12 is both)
    assert [r["step"] for r in history] == [4, 6, 8, 12]
    assert [r["epoch"] for r in history] == pytest.approx([4 / 6, 1.0, 1 + 2 / 6, 2.0], abs=1e-4)
    assert {"train_loss", "train_accuracy", "lr", "val_loss", "val_accuracy", "val_f1"} <= set(history[-1])


def test_seeded_runs_are_identical():
    x, y = _data()
    out = []
    for _ in range(2):
        mdl.manual_seed(11)
        model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
        fit(model, optim.Adam(model.parameters(), lr=1e-2), DataLoader((x.astype(np.float32), y), batch_size=16,
                                                                       shuffle=True), epochs=2, progress=False, seed=5)
        out.append(_weights(model))
    for k in out[0]:
        np.testing.assert_array_equal(out[0][k], out[1][k])


def test_evaluate_matches_metrics_on_predictions():
    x, y = _data()
    model = _model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=16),
                      progress=False, metrics=("accuracy", "f1"))
    trainer.fit(3)
    scores = trainer.predict(DataLoader((x, y), batch_size=50))
    result = trainer.evaluate(DataLoader((x, y), batch_size=50))
    assert result["accuracy"] == pytest.approx(np.mean(scores.argmax(1) == y))
    log_p = scores - np.log(np.exp(scores).sum(1, keepdims=True))
    assert result["loss"] == pytest.approx(-log_p[np.arange(len(y)), y].mean())
    assert model.training  # evaluate puts the mode back


def test_learns_a_separable_problem():
    x, y = _data(n=300)
    model = _model()
    trainer = fit(model, optim.Adam(model.parameters(), lr=0.05), DataLoader((x, y), batch_size=32, shuffle=True,
                                                                              seed=0), epochs=15, progress=False)
    # every seed from 0 to 5 (data, model and shuffling) reaches 100%: the bar leaves 30 samples of room
    assert trainer.evaluate(DataLoader((x, y), batch_size=300))["accuracy"] > 0.9


def test_non_finite_loss_stops_with_step_and_hint_before_the_update():
    x, y = _data(n=64)
    x[40] = np.nan  # batch 3 (of 8 samples each, unshuffled) holds a NaN
    model = _model()
    seen = []

    class Remember(Callback):
        def on_step_end(self, trainer, step, logs):
            seen.append(_weights(trainer.model))

    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=8),
                      callbacks=[Remember()], progress=False)
    with pytest.raises(NonFiniteLossError, match=r"step 6 .*learning rate 10x lower.*clip") as info:
        trainer.fit(1)
    assert info.value.step == 6 and math.isnan(info.value.loss)
    assert trainer.step == 5
    for k, v in seen[-1].items():  # weights are those after step 5
        np.testing.assert_array_equal(_weights(model)[k], v)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_exploding_learning_rate_is_caught():
    x, y = _data(n=64)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    with pytest.raises(NonFiniteLossError, match="loss is (nan|inf)"):
        fit(model, optim.SGD(model.parameters(), lr=1e30), DataLoader((x.astype(np.float32), y), batch_size=8),
            epochs=3, progress=False)


def test_max_steps_and_progress_bar(capsys):
    x, y = _data(n=40)
    model = _model()
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=8),
                      DataLoader((x, y), batch_size=40), progress=True)
    trainer.fit(3, max_steps=7)
    assert trainer.step == 7 and trainer.epoch == 1 and not trainer.completed
    err = capsys.readouterr().err
    assert "epoch 1/3" in err and "loss=" in err and "lr=" in err
    trainer.fit(3)   # continues mid-epoch where it stopped
    assert trainer.step == 15 and trainer.epoch == 3 and trainer.completed


def test_trainer_on_device(device):
    x, y = _data(n=64)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), DataLoader((x.astype(np.float32), y),
                      batch_size=16), DataLoader((x.astype(np.float32), y), batch_size=64), device=device,
                      progress=False)
    trainer.fit(2)
    assert all(p.device.startswith(device) for p in model.parameters())
    assert math.isfinite(trainer.history[-1]["val_loss"])


@pytest.mark.parametrize("kwargs, message", [
    ({"accumulation_steps": 0}, "accumulation_steps"),
    ({"eval_every": -1}, "eval_every"),
    ({"max_grad_norm": 0}, "max_grad_norm"),
    ({"label_smoothing": 1.5}, "label_smoothing"),
    ({"metrics": ("auc",)}, "unknown metric"),
])
def test_bad_settings(kwargs, message):
    model = _model()
    with pytest.raises(ValueError, match=message):
        Trainer(model, optim.SGD(model.parameters(), lr=0.1), [], **kwargs)


def test_optimizer_and_callbacks_are_checked():
    model = _model()
    with pytest.raises(TypeError, match="step"):
        Trainer(model, object(), [])
    with pytest.raises(TypeError, match="Callback"):
        Trainer(model, optim.SGD(model.parameters(), lr=0.1), [], callbacks=[print])


def test_adahessian_with_clipping_probes_the_hessian_before_the_clip():
    """AdaHessian needs the gradients' graph; clipping replaces the gradients with new arrays. The Trainer
    takes D first (``probe``), then clips and steps: the run of a hand loop in that order, and the
    clip changed it (a clip at 1e9 would not). Clipping first loses the graph, and says so."""
    x = np.random.default_rng(0).normal(size=(8, 3))
    y = np.array([0, 1, 1, 0, 1, 0, 0, 1])

    def model_and_optimizer():
        mdl.manual_seed(0)
        model = nn.Linear(3, 2).to(dtype=np.float64)
        return model, optim.AdaHessian(model.parameters(), lr=0.1, seed=5)

    def trained(max_grad_norm):
        model, opt = model_and_optimizer()
        Trainer(model, opt, DataLoader((x, y), batch_size=4), max_grad_norm=max_grad_norm, progress=False).fit(1)
        return np.concatenate([p.numpy().ravel() for p in model.parameters()])

    model, opt = model_and_optimizer()
    params = list(model.parameters())
    for start in (0, 4):
        opt.zero_grad()
        cross_entropy(model(mdl.tensor(x[start:start + 4])), mdl.tensor(y[start:start + 4])).backward(
            create_graph=True)
        opt.probe(params)
        norm = np.sqrt(sum((p.grad.numpy() ** 2).sum() for p in params))
        for p in params:                                  # nn.utils.clip_grad_norm_'s rule, by hand
            p.grad = mdl.Tensor(p.grad.numpy() * min(1.0, 0.01 / (norm + 1e-6)))
        opt.step()
    by_hand = np.concatenate([p.numpy().ravel() for p in params])
    np.testing.assert_allclose(trained(0.01), by_hand, rtol=0, atol=1e-15)
    assert np.abs(trained(0.01) - trained(1e9)).max() > 1e-4
    model, opt = model_and_optimizer()
    cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward(create_graph=True)
    nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with pytest.raises(RuntimeError, match="the gradients carry no graph"):
        opt.step()
