"""One moment function for the Adam family, and every member's step bit for bit against its equations in NumPy.

Adam, AdamW and AMSGrad write the book's lines out in ``adam_update``; NAdam,
RAdam, LAMB and AdaHessian share its pieces ``adam_moments`` (m ← β₁m + (1 − β₁)g,
v ← β₂v + (1 − β₂)g²) and ``bias_corrected`` (m̂ = m/(1 − β₁ᵗ)). The
transcriptions below write each optimizer's equations as
whole-array NumPy expressions in float32, with the floating-point operations
the update performs (a bias correction is a multiply by 1/(1 − βᵗ); (1 − β₂)·(g²),
not ((1 − β₂)·g)·g), so every rounding is the same and the results must be
equal bit for bit: on small arrays (one call) and on arrays larger than a
chunk of ``kernels.run_update`` (several calls on cache-sized pieces).
"""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.optim import kernels
from minidl.optim.adahessian import adahessian_update
from minidl.optim.adam import adam_moments, bias_corrected

STEPS = 8  # past RAdam's threshold: its rectified steps begin at t = 6 with β₂ = 0.999
SHAPES = [(7, 5), (300, 200)]  # 60,000 float32 values: two chunks of kernels.CHUNK_BYTES


def gradients(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(STEPS)]


def run_class(make, shape):
    """The parameter after each of STEPS steps of ``make([p])`` fed the fixed gradients."""
    w0 = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    p = mdl.tensor(w0, requires_grad=True)
    opt = make([p])
    out = []
    for g in gradients(shape):
        p.grad = mdl.tensor(g)
        opt.step()
        out.append(p.numpy().copy())
    return w0, out


def moments(m, v, g, b1, b2):
    return b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g ** 2


def adam_numpy(w, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False, amsgrad=False, shape=None):
    m, v, v_max, out = np.zeros_like(w), np.zeros_like(w), np.zeros_like(w), []
    for t, g in enumerate(gradients(shape), start=1):
        if decoupled:
            w = w * (1.0 - lr * wd)
        elif wd:
            g = g + wd * w
        m, v = moments(m, v, g, b1, b2)
        v_max = np.maximum(v_max, v)
        v_hat = (v_max if amsgrad else v) * (1 / (1 - b2 ** t))
        m_hat = m * (1 / (1 - b1 ** t))
        w = w - (m_hat / (np.sqrt(v_hat) + eps)) * lr
        out.append(w)
    return out


def nadam_numpy(w, lr=2e-3, b1=0.9, b2=0.999, eps=1e-8, psi=4e-3, wd=0.0, shape=None):
    m, v, product, out = np.zeros_like(w), np.zeros_like(w), 1.0, []
    for t, g in enumerate(gradients(shape), start=1):
        mu, mu_next = (b1 * (1.0 - 0.5 * 0.96 ** (s * psi)) for s in (t, t + 1))
        product *= mu
        if wd:
            g = g + wd * w
        m, v = moments(m, v, g, b1, b2)
        denom = np.sqrt(v * (1 / (1 - b2 ** t))) + eps
        w = w - lr * (1 - mu) / (1 - product) * (g / denom)
        w = w - lr * mu_next / (1 - product * mu_next) * (m / denom)
        out.append(w)
    return out


def radam_numpy(w, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.0, decoupled=False, shape=None):
    m, v, out = np.zeros_like(w), np.zeros_like(w), []
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    for t, g in enumerate(gradients(shape), start=1):
        if decoupled:
            w = w * (1.0 - lr * wd)
        elif wd:
            g = g + wd * w
        m, v = moments(m, v, g, b1, b2)
        m_hat = m * (1 / (1 - b1 ** t))
        rho_t = rho_inf - 2.0 * t * b2 ** t / (1.0 - b2 ** t)
        if rho_t > 5.0:
            r_t = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            step = m_hat * ((1 - b2 ** t) ** 0.5 / (np.sqrt(v) + eps) * r_t)
        else:
            step = m_hat
        w = w - step * lr
        out.append(w)
    return out


def lamb_numpy(w, lr=1e-3, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, shape=None):
    m, v, out = np.zeros_like(w), np.zeros_like(w), []
    for t, g in enumerate(gradients(shape), start=1):
        m, v = moments(m, v, g, b1, b2)
        r = (m * (1 / (1 - b1 ** t))) / (np.sqrt(v * (1 / (1 - b2 ** t))) + eps)
        u = r + wd * w if wd else r
        trust = np.linalg.norm(w.reshape(-1)) / np.linalg.norm(u.reshape(-1))
        w = w - (lr * trust) * u
        out.append(w)
    return out


CASES = {
    "Adam": (lambda p: optim.Adam(p), adam_numpy, {}),
    "Adam, L2": (lambda p: optim.Adam(p, lr=1e-2, weight_decay=0.1), adam_numpy, dict(lr=1e-2, wd=0.1)),
    "AdamW": (lambda p: optim.AdamW(p, lr=1e-2), adam_numpy, dict(lr=1e-2, wd=1e-2, decoupled=True)),
    "AMSGrad": (lambda p: optim.AMSGrad(p, weight_decay=0.05), adam_numpy, dict(wd=0.05, amsgrad=True)),
    "NAdam": (lambda p: optim.NAdam(p), nadam_numpy, {}),
    "NAdam, L2": (lambda p: optim.NAdam(p, weight_decay=0.1), nadam_numpy, dict(wd=0.1)),
    "RAdam": (lambda p: optim.RAdam(p, betas=(0.8, 0.999)), radam_numpy, dict(b1=0.8)),
    "RAdam, decoupled": (lambda p: optim.RAdam(p, weight_decay=0.1, decoupled_weight_decay=True), radam_numpy,
                         dict(wd=0.1, decoupled=True)),
    "LAMB": (lambda p: optim.LAMB(p, lr=1e-2, weight_decay=0.01), lamb_numpy, dict(lr=1e-2, wd=0.01)),
}


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_each_adam_family_step_equals_its_numpy_equations_bit_for_bit(name, shape):
    make, numpy_steps, hyper = CASES[name]
    w0, ours = run_class(make, shape)
    expected = numpy_steps(w0, shape=shape, **hyper)
    assert ours[0].dtype == np.float32
    for t, (a, b) in enumerate(zip(ours, expected), start=1):
        assert b.dtype == np.float32
        assert np.array_equal(a, b), f"{name}, step {t}: largest difference {np.abs(a - b).max()}"
    assert not np.array_equal(ours[-1], w0)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("power, wd", [(1.0, 0.0), (0.5, 0.01)])
def test_adahessian_step_equals_its_numpy_equations_bit_for_bit(shape, power, wd):
    """AdaHessian's update with a given Hessian diagonal D (the optimizer draws D by Hutchinson's method)."""
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal(shape).astype(np.float32)
    diagonals = [np.abs(rng.standard_normal(shape)).astype(np.float32) for _ in range(STEPS)]
    lr, b1, b2, eps = 0.15, 0.9, 0.999, 1e-4
    ours, m_ours, v_ours = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    w, m, v = w0, np.zeros_like(w0), np.zeros_like(w0)
    for t, (g, d) in enumerate(zip(gradients(shape), diagonals), start=1):
        kernels.run_update(adahessian_update, w=ours, g=g, d=d, m=m_ours, v=v_ours, t=t, lr=lr, beta1=b1,
                           beta2=b2, eps=eps, hessian_power=power, weight_decay=wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * d ** 2                      # D in place of g
        denom = np.sqrt(v * (1 / (1 - b2 ** t))) ** power + eps
        step = (m * (1 / (1 - b1 ** t))) / denom
        if wd:
            step = step + wd * w
        w = w - step * lr
        assert w.dtype == np.float32
        assert np.array_equal(ours, w), f"step {t}: largest difference {np.abs(ours - w).max()}"
    assert np.array_equal(m_ours, m) and np.array_equal(v_ours, v)
    assert not np.array_equal(ours, w0)


def test_the_moments_are_the_books_lines_in_place():
    """adam_moments writes m and v in place (and nothing else but the scratch); bias_corrected divides by 1 − βᵗ."""
    g = np.array([2.0, -1.0, 0.5], np.float32)
    m, v = np.array([1.0, 0.0, -1.0], np.float32), np.array([4.0, 1.0, 0.0], np.float32)
    g_before, tmp = g.copy(), np.empty_like(g)
    adam_moments(g, m, v, beta1=0.5, beta2=0.75, tmp=tmp)
    np.testing.assert_array_equal(g, g_before)
    np.testing.assert_array_equal(m, [1.5, -0.5, -0.25])         # 0.5·m + 0.5·g
    np.testing.assert_array_equal(v, [4.0, 1.0, 0.0625])         # 0.75·v + 0.25·g²
    d = np.array([0.0, 2.0, 4.0], np.float32)
    adam_moments(g, m, v, beta1=0.5, beta2=0.75, tmp=tmp, d=d)  # AdaHessian: D in place of g in v
    np.testing.assert_array_equal(v, [3.0, 1.75, 4.046875])
    np.testing.assert_allclose(bias_corrected(np.float32([0.19]), 0.9, 2), [1.0], rtol=1e-6)  # 0.19/(1 − 0.81)
    out = np.empty(1, np.float32)
    assert bias_corrected(np.float32([0.5]), 0.5, 1, out=out) is out and out[0] == 1.0
