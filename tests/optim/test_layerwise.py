"""LARS, LAMB, NovoGrad: steps by hand, the reductions to SGD/Adam with trust 1, and the book's LARS line."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.optim import layerwise
from tests.optim._helpers import assert_same_trajectory, hand_run, run_minidl


def norm(x):
    return math.sqrt(sum(float(v) ** 2 for v in np.ravel(x)))


def lars_by_hand(lr, mu, eta, wd):
    def update(w, g, s):
        b = s.setdefault("b", np.zeros_like(w))
        adapt = w.ndim > 1
        local = 1.0
        if adapt and norm(w) > 0 and norm(g) > 0:
            local = eta * norm(w) / (norm(g) + wd * norm(w))
        decay = wd if adapt else 0.0
        new = w.copy()
        for i in np.ndindex(w.shape):
            b[i] = mu * b[i] + lr * local * (g[i] + decay * w[i])
            new[i] = w[i] - b[i]
        return new
    return update


def lamb_by_hand(lr, b1, b2, eps, wd):
    def update(w, g, s):
        t = s["t"] = s.get("t", 0) + 1
        m, v = (s.setdefault(k, np.zeros_like(w)) for k in ("m", "v"))
        u = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            r = (m[i] / (1 - b1 ** t)) / (math.sqrt(v[i] / (1 - b2 ** t)) + eps)
            u[i] = r + wd * w[i]
        trust = norm(w) / norm(u) if norm(w) > 0 and norm(u) > 0 else 1.0
        return np.array([w[i] - lr * trust * u[i] for i in np.ndindex(w.shape)]).reshape(w.shape)
    return update


def novograd_by_hand(lr, b1, b2, eps, wd):
    def update(w, g, s):
        g2 = norm(g) ** 2
        s["v"] = g2 if "v" not in s else b2 * s["v"] + (1 - b2) * g2
        m = s.setdefault("m", np.zeros_like(w))
        new = w.copy()
        for i in np.ndindex(w.shape):
            m[i] = b1 * m[i] + g[i] / (math.sqrt(s["v"]) + eps) + wd * w[i]
            new[i] = w[i] - lr * m[i]
        return new
    return update


@pytest.mark.parametrize("make, hand", [
    (lambda p: optim.LARS(p, lr=0.1, trust_coefficient=0.01, weight_decay=0.1), lars_by_hand(0.1, 0.9, 0.01, 0.1)),
    (lambda p: optim.LAMB(p, lr=0.1, weight_decay=0.05), lamb_by_hand(0.1, 0.9, 0.999, 1e-6, 0.05)),
    (lambda p: optim.NovoGrad(p, lr=0.05, weight_decay=0.01), novograd_by_hand(0.05, 0.95, 0.98, 1e-8, 0.01)),
], ids=["lars", "lamb", "novograd"])
def test_first_three_steps_by_hand(make, hand):
    assert_same_trajectory(run_minidl(make, 3), hand_run(hand, 3), rtol=1e-11)


def test_lars_is_the_books_equation():
    """η = 1, μ = 0, λ = 0: w ← w − lr·(‖w‖/‖g‖)·g."""
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]])
    w = mdl.tensor(w0, requires_grad=True, dtype="float64")
    g = np.array([[0.1, 0.4], [-0.3, 0.2]])
    w.grad = mdl.tensor(g)
    optim.LARS([w], lr=0.5, momentum=0.0, trust_coefficient=1.0).step()
    np.testing.assert_allclose(w.numpy(), w0 - 0.5 * np.linalg.norm(w0) / np.linalg.norm(g) * g, rtol=1e-13)


def test_lars_step_from_zero_weights_uses_local_rate_one_not_eta():
    """‖w‖ = 0: local = 1, so with b = 0 the step is b = lr·(g + β·0) and w = −lr·g."""
    w = mdl.tensor(np.zeros((2, 2)), requires_grad=True, dtype="float64")
    w.grad = mdl.tensor(np.array([[0.1, 0.4], [-0.3, 0.2]]))
    opt = optim.LARS([w], lr=0.5, momentum=0.9, trust_coefficient=0.01, weight_decay=0.1)
    opt.step()
    np.testing.assert_allclose(w.numpy(), [[-0.05, -0.2], [0.15, -0.1]], rtol=1e-15)
    # second step, ‖w‖ = 0.5·‖g‖ = 0.5·√0.3 and g unchanged: local = 0.01·‖w‖/(‖g‖ + 0.1‖w‖) = 0.005/1.05
    # b = 0.9·(0.5·g) + 0.5·local·(g + 0.1·w) = (0.45 + 0.5·local·0.95)·g ;  w = −0.5g − b
    opt.step()
    g = np.array([[0.1, 0.4], [-0.3, 0.2]])
    local = 0.005 / 1.05
    np.testing.assert_allclose(w.numpy(), -(0.5 + 0.45 + 0.5 * local * 0.95) * g, rtol=1e-14)


def test_lars_step_with_a_zero_gradient_uses_local_rate_one():
    """‖g‖ = 0, ‖w‖ = 5: local = 1, so only the weight decay moves w: w ← w − lr·β·w = 0.95·w."""
    w0 = np.array([[3.0, 4.0], [0.0, 0.0]])
    w = mdl.tensor(w0, requires_grad=True, dtype="float64")
    w.grad = mdl.tensor(np.zeros((2, 2)))
    optim.LARS([w], lr=0.5, momentum=0.0, trust_coefficient=0.01, weight_decay=0.1).step()
    np.testing.assert_allclose(w.numpy(), 0.95 * w0, rtol=1e-15)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    assert float(layerwise.trust_ratio(np.float64(0.0), np.float64(2.0))) == 1.0
    assert float(layerwise.trust_ratio(np.float64(3.0), np.float64(0.0))) == 1.0
    assert float(layerwise.trust_ratio(np.float64(3.0), np.float64(2.0))) == 1.5


@pytest.fixture
def trust_one(monkeypatch):
    monkeypatch.setattr(layerwise, "trust_ratio", lambda a, b: 1.0)


def test_lars_with_trust_one_is_sgd_momentum(trust_one):
    ours = run_minidl(lambda p: optim.LARS(p, lr=0.05, momentum=0.9, trust_coefficient=1.0, weight_decay=0.1), 12)
    sgd = run_minidl(lambda p: optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.1), 12)
    # the 1-D parameter skips weight decay under LARS: compare the 2-D one, and the 1-D one without decay
    for a, b in zip(ours, sgd):
        np.testing.assert_allclose(a[1], b[1], rtol=1e-12)
    ours = run_minidl(lambda p: optim.LARS(p, lr=0.05, momentum=0.9, trust_coefficient=1.0), 12)
    sgd = run_minidl(lambda p: optim.SGD(p, lr=0.05, momentum=0.9), 12)
    assert_same_trajectory(ours, sgd, rtol=1e-12)


def test_lamb_with_trust_one_is_adam_and_adamw(trust_one):
    assert_same_trajectory(run_minidl(lambda p: optim.LAMB(p, lr=0.05, eps=1e-8), 12),
                           run_minidl(lambda p: optim.Adam(p, lr=0.05, eps=1e-8), 12), rtol=1e-12)
    assert_same_trajectory(run_minidl(lambda p: optim.LAMB(p, lr=0.05, eps=1e-8, weight_decay=0.1), 12),
                           run_minidl(lambda p: optim.AdamW(p, lr=0.05, eps=1e-8, weight_decay=0.1), 12),
                           rtol=1e-12)


def test_novograd_leaves_the_gradient_alone():
    w = mdl.tensor(np.ones((2, 2)), requires_grad=True)
    g = np.full((2, 2), 0.5, np.float32)
    g.flags.writeable = False  # a write would raise
    w.grad = mdl.Tensor(g)
    optim.NovoGrad([w], lr=0.1, weight_decay=0.1).step()
    np.testing.assert_array_equal(w.grad.array, 0.5)
