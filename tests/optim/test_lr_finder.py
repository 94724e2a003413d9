"""The learning-rate range test: the sweep, the restored weights, the suggestion, the figure."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.cli.optimizers import lr_find_command
from minidl.optim.lr_finder import suggest_lr


class Linear:
    """y = x W + b from bare tensors: a model is anything callable with parameters()."""

    def __init__(self):
        self.w = mdl.tensor(np.zeros((4, 1)), requires_grad=True)
        self.b = mdl.tensor(np.zeros(1), requires_grad=True)

    def parameters(self):
        return [self.w, self.b]

    def __call__(self, x):
        return x @ self.w + self.b


def mse(prediction, y):
    d = prediction - y
    return (d * d).mean()


@pytest.fixture
def loader():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 1.0).astype(np.float32)
    return [(x[i:i + 32], y[i:i + 32]) for i in range(0, 256, 32)]


def test_sweep_restores_weights_and_optimizer(loader, tmp_path):
    model = Linear()
    model.w.array[...] = 0.25
    before = [p.numpy().copy() for p in model.parameters()]
    opt = optim.Adam(model.parameters(), lr=3e-4)
    opt.step()  # no gradients yet: nothing happens, state stays empty
    result = optim.lr_range_test(model, mse, loader, lr_min=1e-4, lr_max=10.0, steps=60, optimizer=opt,
                                 plot=str(tmp_path / "range.png"))
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
        assert p.grad is None
    assert opt.param_groups[0]["lr"] == 3e-4 and opt.state == {}
    assert result.lrs[0] == pytest.approx(1e-4)
    ratios = np.diff(np.log(result.lrs))
    np.testing.assert_allclose(ratios, np.log(1e5) / 59, rtol=1e-9)  # exponential sweep
    assert len(result.losses) == len(result.lrs) <= 60
    assert 1e-4 <= result.suggestion <= 10.0
    assert (tmp_path / "range.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_stops_when_the_loss_explodes(loader):
    result = optim.lr_range_test(Linear(), mse, loader, lr_min=1e-3, lr_max=1e3, steps=100)
    assert len(result.lrs) < 100  # SGD with momentum diverges long before lr = 1000


def test_suggestion_is_the_steepest_fall():
    lrs = np.logspace(-5, 0, 50)
    losses = list(2.0 - np.tanh((np.log10(lrs) + 2.5) * 2))  # falls fastest at 10^-2.5, then flat
    losses[-5:] = [5, 10, 20, 40, 80]
    assert suggest_lr(list(lrs), losses) == pytest.approx(10 ** -2.5, rel=0.6)


def test_bad_arguments(loader):
    with pytest.raises(ValueError, match="lr_min < lr_max"):
        optim.lr_range_test(Linear(), mse, loader, lr_min=1.0, lr_max=0.1)


def test_lr_find_command_writes_a_png(tmp_path, capsys):
    path = lr_find_command(str(tmp_path / "lr.png"), steps=30)
    assert open(path, "rb").read(4) == b"\x89PNG"
    assert "suggested lr" in capsys.readouterr().out
