"""SwitchOptimizer (SWATS, Keskar & Socher 2017) against a NumPy transcription of the paper's Algorithm 1."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim


def swats_reference(w, grad_fn, steps, lr, beta1, beta2, eps, tol, switch_at=None):
    """Algorithm 1 of the paper (Adam's ε inside the root's sum, as minidl's Adam), in float64 NumPy."""
    m, v, b, lam, phase, big_lambda, switched, path = 0 * w, 0 * w, 0 * w, 0.0, "adam", None, None, []
    for k in range(1, steps + 1):
        g = grad_fn(w)
        if phase == "sgd":
            b = beta1 * b + g                   # the paper's v_k = β₁v + g
            w = w - (1 - beta1) * big_lambda * b
        else:
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            p = -lr * (m / (1 - beta1 ** k)) / (np.sqrt(v / (1 - beta2 ** k)) + eps)
            w = w + p
            if p @ g != 0:
                gamma = (p @ p) / -(p @ g)
                lam = beta2 * lam + (1 - beta2) * gamma
                estimate = lam / (1 - beta2 ** k)
                if (switch_at is None and k > 1 and abs(estimate - gamma) < tol) or k == switch_at:
                    phase, big_lambda, switched = "sgd", estimate, k
        path.append(w.copy())
    return np.array(path), switched, big_lambda


H = np.array([[3.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.3]])


def run(steps, **kwargs):
    w = mdl.tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)
    opt = optim.SwitchOptimizer([w], **kwargs)
    path = []
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * (w @ mdl.tensor(H) @ w)).backward()
        opt.step()
        path.append(w.numpy().copy())
    return np.array(path), opt


@pytest.mark.parametrize("kwargs", [dict(tol=0.01), dict(tol=0.0, switch_at=7)])
def test_trajectory_and_switch_match_algorithm_1(kwargs):
    ours, opt = run(80, lr=0.05, **kwargs)
    ref, switched, big_lambda = swats_reference(np.array([1.0, -2.0, 0.5]), lambda w: H @ w, 80, 0.05, 0.9, 0.999,
                                                1e-8, kwargs["tol"], kwargs.get("switch_at"))
    assert switched is not None and 1 < switched < 80  # the test covers both phases
    assert opt.switched_at == [switched] and opt.phase() == "sgd"
    np.testing.assert_allclose(opt.param_groups[0]["lr"], big_lambda, rtol=1e-12)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


def test_adam_phase_is_adam_and_the_first_estimate_by_hand():
    """Step 1: m̂ = g, v̂ = g², so p = −lr·g/(|g| + ε) ≈ −lr·sign(g) and γ₁ = lr·n/Σ|gᵢ|; Λ₁ = γ₁."""
    ours, opt = run(1, lr=0.05, tol=0.0)
    g = H @ np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(opt.switch[0]["estimate"], 0.05 * 3 / np.abs(g).sum(), rtol=1e-6)
    w = mdl.tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)
    adam, adam_path = optim.Adam([w], lr=0.05), []
    switching, _ = run(30, lr=0.05, tol=0.0)  # tol 0: never switches, so it is Adam throughout
    for _ in range(30):
        adam.zero_grad()
        (0.5 * (w @ mdl.tensor(H) @ w)).backward()
        adam.step()
        adam_path.append(w.numpy().copy())
    np.testing.assert_allclose(switching, np.array(adam_path), rtol=1e-12)


def test_given_sgd_lr_and_the_state_round_trip():
    _, opt = run(10, lr=0.05, switch_at=3, sgd_lr=0.01)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.switched_at == [3]
    _, other = run(1, lr=0.05, tol=0.0)
    other.load_state_dict(opt.state_dict())
    assert other.switched_at == [3] and other.param_groups[0]["lr"] == 0.01
    with pytest.raises(ValueError, match="switch_at"):
        optim.SwitchOptimizer([mdl.zeros(2, requires_grad=True)], switch_at=0)
    with pytest.raises(ValueError, match="'switch' entry"):
        other.load_state_dict({"state": {}, "param_groups": []})
