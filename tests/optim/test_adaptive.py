"""AdaGrad, RMSProp, AdaDelta: three steps by hand, and PyTorch's trajectories."""
import math

import numpy as np
import pytest

from minidl import optim
from tests.optim._helpers import assert_same_trajectory, hand_run, minidl_params, run_minidl, run_torch


def adagrad_by_hand(lr, eps):
    def update(w, g, s):
        acc = s.setdefault("sum", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            acc[i] += g[i] ** 2
            new[i] = w[i] - lr * g[i] / (math.sqrt(acc[i]) + eps)
        return new
    return update


def rmsprop_by_hand(lr, rho, eps, mu=0.0, centered=False):
    def update(w, g, s):
        sq = s.setdefault("sq", np.zeros_like(w))
        avg = s.setdefault("avg", np.zeros_like(w))
        buf = s.setdefault("buf", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            sq[i] = rho * sq[i] + (1 - rho) * g[i] ** 2
            avg[i] = rho * avg[i] + (1 - rho) * g[i]
            scale = math.sqrt(sq[i] - avg[i] ** 2) if centered else math.sqrt(sq[i])
            r = g[i] / (scale + eps)
            if mu:
                buf[i] = mu * buf[i] + r
                r = buf[i]
            new[i] = w[i] - lr * r
        return new
    return update


def adadelta_by_hand(lr, rho, eps):
    def update(w, g, s):
        eg2 = s.setdefault("eg2", np.zeros_like(w))
        edx2 = s.setdefault("edx2", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            eg2[i] = rho * eg2[i] + (1 - rho) * g[i] ** 2
            dx = -math.sqrt(edx2[i] + eps) / math.sqrt(eg2[i] + eps) * g[i]
            edx2[i] = rho * edx2[i] + (1 - rho) * dx ** 2
            new[i] = w[i] + lr * dx
        return new
    return update


@pytest.mark.parametrize("make, hand", [
    (lambda p: optim.AdaGrad(p, lr=0.1), adagrad_by_hand(0.1, 1e-10)),
    (lambda p: optim.RMSProp(p, lr=0.01), rmsprop_by_hand(0.01, 0.99, 1e-8)),
    (lambda p: optim.RMSProp(p, lr=0.01, rho=0.9, momentum=0.8, centered=True),
     rmsprop_by_hand(0.01, 0.9, 1e-8, 0.8, True)),
    (lambda p: optim.AdaDelta(p), adadelta_by_hand(1.0, 0.9, 1e-6)),
], ids=["adagrad", "rmsprop", "rmsprop-centered-momentum", "adadelta"])
def test_first_three_steps_by_hand(make, hand):
    assert_same_trajectory(run_minidl(make, 3), hand_run(hand, 3), rtol=1e-12)


@pytest.mark.parametrize("ours, theirs", [
    (lambda p: optim.AdaGrad(p, lr=0.1), lambda t, p: t.optim.Adagrad(p, lr=0.1)),
    (lambda p: optim.AdaGrad(p, lr=0.1, weight_decay=0.1), lambda t, p: t.optim.Adagrad(p, lr=0.1, weight_decay=0.1)),
    (lambda p: optim.RMSProp(p, lr=0.01), lambda t, p: t.optim.RMSprop(p, lr=0.01)),
    (lambda p: optim.RMSProp(p, lr=0.01, centered=True), lambda t, p: t.optim.RMSprop(p, lr=0.01, centered=True)),
    (lambda p: optim.RMSProp(p, lr=0.01, momentum=0.9, rho=0.95),
     lambda t, p: t.optim.RMSprop(p, lr=0.01, momentum=0.9, alpha=0.95)),
    (lambda p: optim.RMSProp(p, lr=0.005, momentum=0.5, centered=True, weight_decay=0.05),
     lambda t, p: t.optim.RMSprop(p, lr=0.005, momentum=0.5, centered=True, weight_decay=0.05)),
    (lambda p: optim.AdaDelta(p), lambda t, p: t.optim.Adadelta(p)),
    (lambda p: optim.AdaDelta(p, lr=0.5, rho=0.95, weight_decay=0.1),
     lambda t, p: t.optim.Adadelta(p, lr=0.5, rho=0.95, weight_decay=0.1)),
], ids=["adagrad", "adagrad-decay", "rmsprop", "centered", "momentum", "centered-momentum-decay",
        "adadelta", "adadelta-decay"])
def test_matches_torch(torch, ours, theirs):
    assert_same_trajectory(run_minidl(ours, 30), run_torch(lambda p: theirs(torch, p), 30))


@pytest.mark.parametrize("ours, theirs", [
    (lambda p: optim.Adagrad(p, 0.1, 0.05, 0.02, 0.3), lambda t, p: t.optim.Adagrad(p, 0.1, 0.05, 0.02, 0.3)),
    (lambda p: optim.RMSprop(p, 0.01, 0.9, 1e-8, 0.05, 0.5),
     lambda t, p: t.optim.RMSprop(p, 0.01, 0.9, 1e-8, 0.05, 0.5)),
    (lambda p: optim.RMSprop(p, lr=0.01, alpha=0.95, centered=True),
     lambda t, p: t.optim.RMSprop(p, lr=0.01, alpha=0.95, centered=True)),
    (lambda p: optim.Adadelta(p, 0.5, 0.95), lambda t, p: t.optim.Adadelta(p, 0.5, 0.95)),
], ids=["adagrad-positional-lr_decay-initial", "rmsprop-positional", "rmsprop-alpha", "adadelta"])
def test_pytorch_names_and_argument_order_give_pytorchs_trajectory(torch, ours, theirs):
    """PyTorch's class names and positional order (RMSprop: lr, alpha, eps, weight_decay, momentum)."""
    assert_same_trajectory(run_minidl(ours, 30), run_torch(lambda p: theirs(torch, p), 30))


def test_minidl_spellings_stay_the_same_classes():
    assert optim.AdaGrad is optim.Adagrad and optim.RMSProp is optim.RMSprop and optim.AdaDelta is optim.Adadelta
    with pytest.raises(TypeError, match=r"RMSprop: got alpha=0.9 and rho=0.8; pass one"):
        optim.RMSprop(minidl_params(), alpha=0.9, rho=0.8)
