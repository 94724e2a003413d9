"""Models and one training step shared by the checkpointing tests (float64, seeded)."""
import numpy as np

import minidl as mdl
from minidl import nn


def mlp(layers=8, width=12, dropout=0.0, batchnorm=False):
    mdl.manual_seed(1)
    blocks = []
    for _ in range(layers):
        block = [nn.Linear(width, width)] + ([nn.BatchNorm1d(width)] if batchnorm else []) + [nn.Tanh()]
        blocks.append(nn.Sequential(*block, *([nn.Dropout(dropout)] if dropout else [])))
    return nn.Sequential(*blocks).double()


def cnn():
    mdl.manual_seed(2)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3)).double()


def residual_net():
    mdl.manual_seed(3)

    def block():
        return nn.Residual(nn.Sequential(nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 10)))
    return nn.Sequential(nn.Linear(6, 10), block(), nn.ReLU(), block(), nn.Tanh(), block(),
                         nn.Linear(10, 2)).double()


def data(*shape, requires_grad=False, seed=0):
    return mdl.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=requires_grad)


def step(model, forward, x, seed=7):
    """One loss.backward(); returns the loss, every parameter's gradient and x's gradient."""
    model.zero_grad()
    x.grad = None
    mdl.manual_seed(seed)
    out = forward(x)
    loss = (out * out).sum()
    loss.backward()
    return loss.item(), [p.grad.numpy().copy() for p in model.parameters()], (
        None if x.grad is None else x.grad.numpy().copy())


def assert_same_step(model, forward, x, **kw):
    plain = step(model, model, x, **kw)
    checked = step(model, forward, x, **kw)
    assert checked[0] == plain[0]
    for a, b in zip(checked[1], plain[1]):
        np.testing.assert_array_equal(a, b)  # exact: the same float64 operations in the same order
    if plain[2] is not None:
        np.testing.assert_array_equal(checked[2], plain[2])


def varying_net():
    mdl.manual_seed(5)
    widths = [8, 80, 8, 8, 80, 80, 8, 40, 8, 80, 8]
    return nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths, widths[1:])])
