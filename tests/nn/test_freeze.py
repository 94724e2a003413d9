"""Fine-tuning helpers: freezing (no gradients, no updates), replacing a head, parameter groups' learning rates."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim


def _model(seed=0):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype=np.float64)


def _data():
    rng = np.random.default_rng(0)
    return mdl.tensor(rng.standard_normal((10, 4))), mdl.tensor(rng.integers(0, 3, 10))


def _step(model, opt, x, y):
    opt.zero_grad()
    mdl.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_freeze_leaves_no_gradient_and_no_update():
    x, y = _data()
    model = _model()
    assert nn.utils.freeze(model[0]) is model[0]
    assert all(not p.requires_grad for p in model[0].parameters())
    assert all(p.requires_grad for p in model[2].parameters())
    body = [p.numpy().copy() for p in model[0].parameters()]
    head = [p.numpy().copy() for p in model[2].parameters()]
    opt = optim.Adam(model.parameters(), lr=0.1, weight_decay=0.1)  # frozen parameters may sit in the optimizer
    for _ in range(3):
        _step(model, opt, x, y)
        assert all(p.grad is None for p in model[0].parameters())
    for p, before in zip(model[0].parameters(), body):
        np.testing.assert_array_equal(p.numpy(), before)
    for p, before in zip(model[2].parameters(), head):
        assert not np.allclose(p.numpy(), before)
    nn.utils.unfreeze(model)
    _step(model, opt, x, y)
    assert not np.allclose(model[0].weight.numpy(), body[0])


def test_freeze_accepts_parameters_and_matches_requires_grad_():
    model = _model()
    nn.utils.freeze([model[0].weight])
    assert not model[0].weight.requires_grad and model[0].bias.requires_grad
    nn.utils.freeze(model[2].bias)
    assert not model[2].bias.requires_grad
    other = _model().requires_grad_(False)
    assert [p.requires_grad for p in other.parameters()] == [False] * 4
    with pytest.raises(TypeError, match="freeze"):
        nn.utils.freeze([1.0])


def test_count_parameters():
    model = _model()
    assert nn.utils.count_parameters(model) == 4 * 8 + 8 + 8 * 3 + 3
    nn.utils.freeze(model[0])
    assert nn.utils.count_parameters(model, trainable=True) == 8 * 3 + 3
    assert nn.utils.count_parameters(model) == 67


def test_replace_head():
    model = _model()
    old = model[2]
    assert nn.utils.replace_module(model, "-1", nn.Linear(8, 5)) is old
    assert model[2].out_features == 5 and model(mdl.tensor(np.ones((2, 4)))).shape == (2, 5)
    outer = nn.Sequential(model, nn.ReLU())
    new = nn.Linear(8, 2)
    nn.utils.replace_module(outer, "0.2", new)
    assert outer[0][2] is new
    assert "0.2.weight" in outer.state_dict() and outer.state_dict()["0.2.weight"].shape == (2, 8)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 3)

    net = Net()
    nn.utils.replace_module(net, "head", nn.Linear(8, 7))
    assert net.head.out_features == 7 and net.state_dict()["head.weight"].shape == (7, 8)
    with pytest.raises(KeyError, match="no submodule 'tail'"):
        nn.utils.replace_module(net, "tail", nn.Linear(1, 1))
    with pytest.raises(TypeError, match="Module"):
        nn.utils.replace_module(net, "head", lambda x: x)


def test_parameter_groups_sgd_use_each_groups_learning_rate():
    x, y = _data()
    model = _model()
    opt = optim.SGD([{"params": model[0].parameters(), "lr": 0.001}, {"params": model[2].parameters()}], lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.001, 0.1]
    before = [p.numpy().copy() for p in model.parameters()]
    opt.zero_grad()
    mdl.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    opt.step()
    for p, w, g, lr in zip(model.parameters(), before, grads, [0.001, 0.001, 0.1, 0.1]):
        np.testing.assert_allclose(p.numpy(), w - lr * g, rtol=1e-12, atol=1e-15)


def test_parameter_groups_adam_first_step_moves_each_weight_by_its_lr():
    # Adam's first step is lr * m_hat / (sqrt(v_hat) + eps) = lr * sign(g) (up to eps).
    x, y = _data()
    model = _model()
    opt = optim.Adam([{"params": model[0].parameters(), "lr": 1e-4}, {"params": model[2].parameters(), "lr": 1e-2}])
    before = [p.numpy().copy() for p in model.parameters()]
    _step(model, opt, x, y)
    for p, w, lr in zip(model.parameters(), before, [1e-4, 1e-4, 1e-2, 1e-2]):
        moved = np.abs(p.numpy() - w)
        moved = moved[moved > 0]
        np.testing.assert_allclose(moved, lr, rtol=1e-3)
