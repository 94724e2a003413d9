"""Shared pieces of the optimizer tests: a small non-quadratic loss, run in minidl and in PyTorch."""
import numpy as np

import minidl as mdl

# L(w) = Σ ½·a·w² + c·w + 0.1·w⁴ over every parameter: curvature differs per coordinate,
# and the quartic term makes the gradient non-linear, so trajectories really differ.
A = {(3,): np.array([1.0, 4.0, 0.5]), (2, 3): np.array([[2.0, 0.3, 1.0], [5.0, 1.5, 0.8]])}
C = {(3,): np.array([0.5, -1.0, 0.2]), (2, 3): np.array([[-0.4, 0.1, 0.7], [0.2, -0.9, 0.3]])}
W0 = {(3,): np.array([1.0, -2.0, 0.5]), (2, 3): np.array([[0.3, -1.2, 2.0], [-0.7, 0.4, 1.1]])}
SHAPES = [(3,), (2, 3)]


def gradient(w):
    """∇L for one parameter, in plain NumPy (the hand computations use it)."""
    return A[w.shape] * w + C[w.shape] + 0.4 * w ** 3


def minidl_params(dtype="float64"):
    return [mdl.tensor(W0[s], requires_grad=True, dtype=dtype) for s in SHAPES]


def minidl_loss(params):
    total = None
    for p in params:
        a = mdl.tensor(A[p.shape], dtype=p.dtype)
        c = mdl.tensor(C[p.shape], dtype=p.dtype)
        term = (0.5 * a * p * p + c * p + 0.1 * p ** 4).sum()
        total = term if total is None else total + term
    return total


def run_minidl(make, steps, dtype="float64", params=None, create_graph=False):
    """Trajectory [params after step 1, 2, ...] of the optimizer ``make(params)``."""
    params = minidl_params(dtype) if params is None else params
    opt = make(params)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        minidl_loss(params).backward(create_graph=create_graph)
        opt.step()
        out.append([p.numpy().copy() for p in params])
    return out


def run_torch(make, steps):
    import torch
    params = [torch.tensor(W0[s], dtype=torch.float64, requires_grad=True) for s in SHAPES]
    opt = make(params)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = sum((0.5 * torch.tensor(A[p.shape]) * p * p + torch.tensor(C[p.shape]) * p + 0.1 * p ** 4).sum()
                   for p in params)
        loss.backward()
        opt.step()
        out.append([p.detach().numpy().copy() for p in params])
    return out


def assert_same_trajectory(ours, theirs, rtol=1e-6, atol=1e-9):
    for step, (a, b) in enumerate(zip(ours, theirs), start=1):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol, err_msg=f"step {step}")


def hand_run(update, steps):
    """Apply ``update(w, g, state)`` (plain NumPy written in the test) for each parameter, ``steps`` times."""
    ws = [W0[s].astype(np.float64).copy() for s in SHAPES]
    states = [{} for _ in ws]
    out = []
    for _ in range(steps):
        for i, w in enumerate(ws):
            ws[i] = update(w, gradient(w), states[i])
        out.append([w.copy() for w in ws])
    return out
