"""Hessian-vector products, trace and top eigenvalue against a quadratic's known Hessian; noise scale."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim

RNG = np.random.default_rng(0)
Q, _ = np.linalg.qr(RNG.standard_normal((5, 5)))
EIGENVALUES = np.array([5.0, 2.0, 1.0, 0.5, 0.1])
H = Q @ np.diag(EIGENVALUES) @ Q.T
B = RNG.standard_normal(5)


def quadratic(hessian=H):
    """½ wᵀHw + bᵀw over two parameters, w = (w1, w2): its Hessian is H everywhere."""
    w1 = mdl.tensor(RNG.standard_normal(2), requires_grad=True, dtype="float64")
    w2 = mdl.tensor(RNG.standard_normal(3), requires_grad=True, dtype="float64")
    w = mdl.concatenate([w1, w2])
    loss = 0.5 * (w @ (mdl.tensor(hessian) @ w)) + mdl.tensor(B) @ w
    return loss, [w1, w2]


def test_hessian_vector_product_is_hv():
    loss, params = quadratic()
    v = RNG.standard_normal(5)
    hv = optim.hessian_vector_product(loss, params, [v[:2], v[2:]])
    np.testing.assert_allclose(np.concatenate([t.numpy() for t in hv]), H @ v, rtol=1e-12)
    again = optim.hessian_vector_product(loss, params, [mdl.Tensor(v[:2]), mdl.Tensor(v[2:])])  # graph kept
    np.testing.assert_allclose(np.concatenate([t.numpy() for t in again]), H @ v, rtol=1e-12)


def test_hessian_vector_product_of_a_quartic():
    w = mdl.tensor([1.0, -2.0, 0.5], requires_grad=True, dtype="float64")
    hv = optim.hessian_vector_product((w ** 4).sum(), w, np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(hv.numpy(), 12 * w.numpy() ** 2 * [1.0, 2.0, 3.0], rtol=1e-12)


def test_hessian_trace_exact_for_a_diagonal_hessian_and_close_otherwise():
    diagonal = np.diag([3.0, 1.0, 0.5, 2.0, 4.0])
    loss, params = quadratic(diagonal)
    assert optim.hessian_trace(loss, params, samples=3) == pytest.approx(10.5, rel=1e-12)
    loss, params = quadratic()
    assert optim.hessian_trace(loss, params, samples=400) == pytest.approx(EIGENVALUES.sum(), rel=0.05)


def test_top_hessian_eigenvalue_by_power_iteration():
    loss, params = quadratic()
    assert optim.top_hessian_eigenvalue(loss, params, iters=200, tol=1e-10) == pytest.approx(5.0, rel=1e-6)


def test_linear_loss_has_zero_curvature():
    w = mdl.tensor([1.0, 2.0], requires_grad=True, dtype="float64")
    assert optim.top_hessian_eigenvalue((w * 3.0).sum(), [w]) == 0.0


def test_gradient_noise_scale_matches_the_estimator_by_hand():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((240, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.7 * rng.standard_normal(240)
    w0 = np.array([0.2, 0.1, -0.3])
    w = mdl.tensor(w0, requires_grad=True, dtype="float64")
    batches = [(x[i:i + 20], y[i:i + 20]) for i in range(0, 240, 20)]

    def loss_fn(batch):
        xb, yb = batch
        r = mdl.Tensor(xb) @ w - mdl.Tensor(yb)
        return 0.5 * (r * r).mean()
    ours = optim.gradient_noise_scale(loss_fn, [w], batches)
    grads = np.stack([xb.T @ (xb @ w0 - yb) / len(yb) for xb, yb in batches])  # ∇ of the batch mean, by hand
    mean = grads.mean(axis=0)
    trace_sigma = 20 * ((grads - mean) ** 2).sum() / (len(batches) - 1)
    expected = trace_sigma / (mean @ mean - trace_sigma / (len(batches) * 20))
    assert ours == pytest.approx(expected, rel=1e-10)
    assert ours > 0


def test_curvature_errors():
    w = mdl.tensor([1.0], requires_grad=True)
    with mdl.no_grad():
        loss = (w * w).sum()
    with pytest.raises(RuntimeError, match="no graph"):
        optim.hessian_trace(loss, [w])
    with pytest.raises(ValueError, match="at least 2 batches"):
        optim.gradient_noise_scale(lambda b: (w * w).sum(), [w], [np.ones((4, 1))])
