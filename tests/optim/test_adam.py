"""Adam, AdamW, AMSGrad, NAdam, RAdam: steps by hand from their equations, and PyTorch's trajectories."""
import math

import numpy as np
import pytest

from minidl import optim
from tests.optim._helpers import assert_same_trajectory, hand_run, run_minidl, run_torch


def adam_by_hand(lr, b1, b2, eps, wd=0.0, decoupled=False, amsgrad=False):
    def update(w, g, s):
        t = s["t"] = s.get("t", 0) + 1
        m, v, vmax = (s.setdefault(k, np.zeros_like(w)) for k in ("m", "v", "vmax"))
        new = w.copy()
        for i in np.ndindex(w.shape):
            wi = w[i] * (1 - lr * wd) if decoupled else w[i]
            gi = g[i] if decoupled else g[i] + wd * w[i]
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            vmax[i] = max(vmax[i], v[i])
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = (vmax[i] if amsgrad else v[i]) / (1 - b2 ** t)
            new[i] = wi - lr * m_hat / (math.sqrt(v_hat) + eps)
        return new
    return update


def nadam_by_hand(lr, b1, b2, eps, psi):
    def update(w, g, s):
        t = s["t"] = s.get("t", 0) + 1
        mu = b1 * (1 - 0.5 * 0.96 ** (t * psi))
        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * psi))
        s["prod"] = s.get("prod", 1.0) * mu
        m, v = (s.setdefault(k, np.zeros_like(w)) for k in ("m", "v"))
        new = w.copy()
        for i in np.ndindex(w.shape):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            denom = math.sqrt(v[i] / (1 - b2 ** t)) + eps
            new[i] = (w[i] - lr * (1 - mu) / (1 - s["prod"]) * g[i] / denom
                      - lr * mu_next / (1 - s["prod"] * mu_next) * m[i] / denom)
        return new
    return update


def radam_by_hand(lr, b1, b2, eps):
    def update(w, g, s):
        t = s["t"] = s.get("t", 0) + 1
        m, v = (s.setdefault(k, np.zeros_like(w)) for k in ("m", "v"))
        rho_inf = 2 / (1 - b2) - 1
        rho = rho_inf - 2 * t * b2 ** t / (1 - b2 ** t)
        new = w.copy()
        for i in np.ndindex(w.shape):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            m_hat = m[i] / (1 - b1 ** t)
            if rho > 5:
                r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
                new[i] = w[i] - lr * r * m_hat * math.sqrt(1 - b2 ** t) / (math.sqrt(v[i]) + eps)
            else:
                new[i] = w[i] - lr * m_hat
        return new
    return update


@pytest.mark.parametrize("make, hand, steps", [
    (lambda p: optim.Adam(p, lr=0.1), adam_by_hand(0.1, 0.9, 0.999, 1e-8), 3),
    (lambda p: optim.Adam(p, lr=0.1, eps=1e-3, weight_decay=0.1), adam_by_hand(0.1, 0.9, 0.999, 1e-3, 0.1), 3),
    (lambda p: optim.AdamW(p, lr=0.1), adam_by_hand(0.1, 0.9, 0.999, 1e-8, 1e-2, decoupled=True), 3),
    (lambda p: optim.AMSGrad(p, lr=0.1, betas=(0.5, 0.6)), adam_by_hand(0.1, 0.5, 0.6, 1e-8, amsgrad=True), 6),
    (lambda p: optim.NAdam(p, lr=0.1), nadam_by_hand(0.1, 0.9, 0.999, 1e-8, 4e-3), 3),
    (lambda p: optim.RAdam(p, lr=0.1, betas=(0.9, 0.95)), radam_by_hand(0.1, 0.9, 0.95, 1e-8), 9),
], ids=["adam", "adam-eps-decay", "adamw", "amsgrad", "nadam", "radam"])
def test_steps_by_hand(make, hand, steps):
    assert_same_trajectory(run_minidl(make, steps), hand_run(hand, steps), rtol=1e-11)


def test_radam_falls_back_to_momentum_until_rho_exceeds_5():
    from minidl.optim.adam import radam_rectification
    assert [radam_rectification(t, 0.999) is None for t in range(1, 8)] == [True] * 5 + [False] * 2


@pytest.mark.parametrize("ours, theirs", [
    (lambda p: optim.Adam(p, lr=0.05), lambda t, p: t.optim.Adam(p, lr=0.05)),
    (lambda p: optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1),
     lambda t, p: t.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1)),
    (lambda p: optim.AdamW(p, lr=0.05, weight_decay=0.2), lambda t, p: t.optim.AdamW(p, lr=0.05, weight_decay=0.2)),
    (lambda p: optim.AMSGrad(p, lr=0.05, betas=(0.9, 0.9)),
     lambda t, p: t.optim.Adam(p, lr=0.05, betas=(0.9, 0.9), amsgrad=True)),
    (lambda p: optim.AdamW(p, lr=0.05, amsgrad=True), lambda t, p: t.optim.AdamW(p, lr=0.05, amsgrad=True)),
    (lambda p: optim.NAdam(p, lr=0.05), lambda t, p: t.optim.NAdam(p, lr=0.05)),
    (lambda p: optim.NAdam(p, lr=0.05, momentum_decay=0.1, weight_decay=0.1),
     lambda t, p: t.optim.NAdam(p, lr=0.05, momentum_decay=0.1, weight_decay=0.1)),
    (lambda p: optim.RAdam(p, lr=0.05), lambda t, p: t.optim.RAdam(p, lr=0.05)),
    (lambda p: optim.RAdam(p, lr=0.05, betas=(0.9, 0.98), weight_decay=0.1),
     lambda t, p: t.optim.RAdam(p, lr=0.05, betas=(0.9, 0.98), weight_decay=0.1)),
    (lambda p: optim.RAdam(p, lr=0.05, weight_decay=0.1, decoupled_weight_decay=True),
     lambda t, p: t.optim.RAdam(p, lr=0.05, weight_decay=0.1, decoupled_weight_decay=True)),
], ids=["adam", "adam-decay", "adamw", "amsgrad", "adamw-amsgrad", "nadam", "nadam-decay", "radam",
        "radam-decay", "radam-decoupled"])
def test_matches_torch(torch, ours, theirs):
    assert_same_trajectory(run_minidl(ours, 40), run_torch(lambda p: theirs(torch, p), 40))
