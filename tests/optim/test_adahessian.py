"""AdaHessian: the Hutchinson diagonal, steps by hand, conv averaging, and the missing-graph error."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from tests.optim._helpers import A, assert_same_trajectory, hand_run, run_minidl


def adahessian_by_hand(lr, b1, b2, eps, k, wd):
    def update(w, g, s):
        t = s["t"] = s.get("t", 0) + 1
        m, v = (s.setdefault(key, np.zeros_like(w)) for key in ("m", "v"))
        new = w.copy()
        for i in np.ndindex(w.shape):
            d = abs(A[w.shape][i] + 1.2 * w[i] ** 2)  # the loss is separable: H is diagonal, z ⊙ Hz = diag(H)
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * d * d
            m_hat, v_hat = m[i] / (1 - b1 ** t), v[i] / (1 - b2 ** t)
            new[i] = w[i] - lr * (m_hat / (math.sqrt(v_hat) ** k + eps) + wd * w[i])
        return new
    return update


@pytest.mark.parametrize("k, wd", [(1.0, 0.0), (0.5, 0.1)])
def test_first_three_steps_by_hand(k, wd):
    ours = run_minidl(lambda p: optim.AdaHessian(p, lr=0.1, hessian_power=k, weight_decay=wd), 3,
                      create_graph=True)
    assert_same_trajectory(ours, hand_run(adahessian_by_hand(0.1, 0.9, 0.999, 1e-4, k, wd), 3), rtol=1e-11)


def test_hutchinson_diagonal_is_averaged_over_conv_kernels():
    from minidl.optim.adahessian import hutchinson_diagonal
    w = mdl.tensor(np.random.default_rng(1).standard_normal((2, 3, 2, 2)), requires_grad=True, dtype="float64")
    loss = (w ** 4).sum()  # H = diag(12 w²)
    (g,) = mdl.grad(loss, [w], create_graph=True)
    (d,) = hutchinson_diagonal([w], [g], np.random.default_rng(0))
    expected = np.broadcast_to((12 * w.numpy() ** 2).mean(axis=(2, 3), keepdims=True), w.shape)
    np.testing.assert_allclose(d, expected, rtol=1e-12)


def test_hutchinson_is_unbiased_for_a_coupled_hessian():
    from minidl.optim.adahessian import hutchinson_diagonal
    H = np.array([[2.0, 1.0, 0.5], [1.0, 3.0, -1.0], [0.5, -1.0, 4.0]])
    w = mdl.tensor(np.array([0.3, -0.2, 0.1]), requires_grad=True, dtype="float64")
    (g,) = mdl.grad(0.5 * (w @ (mdl.tensor(H) @ w)), [w], create_graph=True)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(400):  # z ⊙ Hz before the absolute value is unbiased for diag(H)
        z = (rng.integers(0, 2, 3) * 2 - 1).astype(float)
        (hz,) = mdl.grad([g], [w], grad_outputs=[mdl.Tensor(z)], retain_graph=True)
        samples.append(z * hz.numpy())
    np.testing.assert_allclose(np.mean(samples, axis=0), np.diag(H), atol=0.2)
    (d,) = hutchinson_diagonal([w], [g], np.random.default_rng(0))
    assert np.all(d >= 0)


def test_without_create_graph_raises():
    w = mdl.tensor(np.ones(3), requires_grad=True)
    opt = optim.AdaHessian([w])
    (w * w).sum().backward()
    with pytest.raises(RuntimeError, match=r"backward\(create_graph=True\)"):
        opt.step()


def test_seeded_and_resumable():
    H = mdl.tensor(np.array([[2.0, 1.0], [1.0, 3.0]]))

    def run(opt, w, steps):
        for _ in range(steps):
            opt.zero_grad()
            (0.5 * (w @ (H @ w)) + (w ** 4).sum()).backward(create_graph=True)
            opt.step()
        return w.numpy().copy()

    w1 = mdl.tensor([1.0, -1.0], requires_grad=True, dtype="float64")
    first = run(optim.AdaHessian([w1], lr=0.1, seed=3), w1, 6)
    w2 = mdl.tensor([1.0, -1.0], requires_grad=True, dtype="float64")
    opt2 = optim.AdaHessian([w2], lr=0.1, seed=3)
    run(opt2, w2, 3)
    saved = opt2.state_dict()
    w3 = mdl.tensor(w2.numpy(), requires_grad=True, dtype="float64")
    opt3 = optim.AdaHessian([w3], lr=0.1, seed=99)
    opt3.load_state_dict(saved)
    np.testing.assert_array_equal(run(opt3, w3, 3), first)


def test_probe_then_step_is_the_plain_step_bit_for_bit():
    """probe() (data parallelism's seam: D taken before the gradients lose their graph) keeps for step() exactly
    the D that step() computes itself; with reduce, Hz passes through it before the absolute value."""
    H = mdl.tensor(np.array([[2.0, 1.0], [1.0, -3.0]]))

    def run(probe, reduce=None):
        w = mdl.tensor([1.0, -1.0], requires_grad=True, dtype="float64")
        b = mdl.tensor([0.5], requires_grad=True, dtype="float64")
        opt = optim.AdaHessian([w, b], lr=0.1, seed=3)
        for _ in range(4):
            opt.zero_grad()
            (0.5 * (w @ (H @ w)) + (w ** 4).sum() + (b ** 3).sum()).backward(create_graph=True)
            if probe:
                opt.probe([w, b], reduce)
                w.grad, b.grad = mdl.Tensor(w.grad.array.copy()), mdl.Tensor(b.grad.array.copy())  # graph gone
            opt.step()
        return np.concatenate([w.numpy(), b.numpy()])

    np.testing.assert_array_equal(run(probe=True), run(probe=False))
    # a reduce that changes Hz changes the step (it acts before |z ⊙ Hz|): -Hz gives the same D, 3·Hz does not
    np.testing.assert_array_equal(run(True, lambda hz: [-h for h in hz]), run(probe=False))
    assert np.abs(run(True, lambda hz: [3 * h for h in hz]) - run(probe=False)).max() > 1e-3


def test_a_probe_without_a_graph_raises():
    w = mdl.tensor(np.ones(3), requires_grad=True)
    opt = optim.AdaHessian([w])
    (w * w).sum().backward()
    with pytest.raises(RuntimeError, match=r"AdaHessian.probe\(\).*create_graph=True"):
        opt.probe([w])
