"""SGD, NAG and SGDM: three steps against the equations by hand, and PyTorch's trajectories."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from tests.optim._helpers import assert_same_trajectory, hand_run, run_minidl, run_torch


def sgd_by_hand(lr, mu=0.0, nesterov=False, wd=0.0):
    def update(w, g, s):
        b = s.setdefault("b", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            d = g[i] + wd * w[i]
            b[i] = mu * b[i] + d
            step = d + mu * b[i] if nesterov else (b[i] if mu else d)
            new[i] = w[i] - lr * step
        return new
    return update


def sgdm_by_hand(lr, beta, wd=0.0):
    def update(w, g, s):
        m = s.setdefault("m", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            m[i] = beta * m[i] + (1 - beta) * (g[i] + wd * w[i])
            new[i] = w[i] - lr * m[i]
        return new
    return update


@pytest.mark.parametrize("make, hand", [
    (lambda p: optim.SGD(p, lr=0.1), sgd_by_hand(0.1)),
    (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), sgd_by_hand(0.1, 0.9)),
    (lambda p: optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.1),
     sgd_by_hand(0.05, 0.8, True, 0.1)),
    (lambda p: optim.NAG(p, lr=0.05), sgd_by_hand(0.05, 0.9, True)),
    (lambda p: optim.SGDM(p, lr=0.2, beta=0.9, weight_decay=0.01), sgdm_by_hand(0.2, 0.9, 0.01)),
], ids=["sgd", "momentum", "nesterov-decay", "nag", "sgdm"])
def test_first_three_steps_by_hand(make, hand):
    assert_same_trajectory(run_minidl(make, 3), hand_run(hand, 3), rtol=1e-12)


def test_first_step_of_momentum_is_the_gradient():
    """b₁ = g: the first momentum step equals a plain step."""
    plain = run_minidl(lambda p: optim.SGD(p, lr=0.1), 1)
    heavy = run_minidl(lambda p: optim.SGD(p, lr=0.1, momentum=0.9), 1)
    assert_same_trajectory(plain, heavy, rtol=0, atol=0)


def test_sgdm_is_classic_momentum_with_scaled_lr():
    """m = (1 − β)b, so SGDM(lr) follows SGD(lr·(1 − β), momentum=β)."""
    ours = run_minidl(lambda p: optim.SGDM(p, lr=0.3, beta=0.8), 15)
    classic = run_minidl(lambda p: optim.SGD(p, lr=0.3 * (1 - 0.8), momentum=0.8), 15)
    assert_same_trajectory(ours, classic, rtol=1e-10)


@pytest.mark.parametrize("kwargs", [dict(lr=0.05), dict(lr=0.05, momentum=0.9), dict(lr=0.02, momentum=0.9,
                                    nesterov=True), dict(lr=0.05, momentum=0.5, weight_decay=0.1)],
                         ids=["plain", "momentum", "nesterov", "decay"])
def test_matches_torch_sgd(torch, kwargs):
    ours = run_minidl(lambda p: optim.SGD(p, **kwargs), 25)
    theirs = run_torch(lambda p: torch.optim.SGD(p, **kwargs), 25)
    assert_same_trajectory(ours, theirs)


def test_nag_is_torch_nesterov(torch):
    ours = run_minidl(lambda p: optim.NAG(p, lr=0.02, momentum=0.9), 25)
    theirs = run_torch(lambda p: torch.optim.SGD(p, lr=0.02, momentum=0.9, nesterov=True), 25)
    assert_same_trajectory(ours, theirs)


def test_nesterov_needs_momentum():
    with pytest.raises(ValueError, match="nesterov=True needs a momentum"):
        optim.SGD([optim.optimizer.Tensor(np.ones(2), requires_grad=True)], lr=0.1, nesterov=True)


@pytest.mark.parametrize("kwargs", [dict(lr=0.05, momentum=0.9, dampening=0.3),
                                    dict(lr=0.05, momentum=0.5, dampening=1.0, weight_decay=0.1)],
                         ids=["dampening", "full-dampening-decay"])
def test_dampening_gives_pytorchs_trajectory(torch, kwargs):
    """b ← μb + (1 − τ)g after an undamped first step b₁ = g, as torch.optim.SGD."""
    assert_same_trajectory(run_minidl(lambda p: optim.SGD(p, **kwargs), 30),
                           run_torch(lambda p: torch.optim.SGD(p, **kwargs), 30))


def test_dampening_by_hand_for_two_steps():
    w = mdl.tensor([1.0], dtype="float64", requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.5, dampening=0.5)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()  # g = 2w
        opt.step()
    # step 1: b = 2, w = 1 − 0.2 = 0.8;  step 2: g = 1.6, b = 0.5·2 + 0.5·1.6 = 1.8, w = 0.8 − 0.18
    np.testing.assert_allclose(w.numpy(), [0.62], rtol=1e-14)


def test_sgd_takes_pytorchs_positional_order():
    w = mdl.tensor([1.0], dtype="float64", requires_grad=True)
    opt = optim.SGD([w], 0.1, 0.9, 0.0, 0.01, True)  # lr, momentum, dampening, weight_decay, nesterov
    group = opt.param_groups[0]
    assert (group["momentum"], group["dampening"], group["weight_decay"], group["nesterov"]) == (0.9, 0.0, 0.01, True)
    with pytest.raises(ValueError, match="nesterov=True needs a momentum > 0 and dampening 0"):
        optim.SGD([w], 0.1, 0.9, 0.5, 0.0, True)
