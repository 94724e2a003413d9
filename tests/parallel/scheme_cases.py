"""The problems the parameter-server and local-SGD tests train, shared by the MPI workers and the tests.

Two float64 problems, each with its global batches drawn from a fixed seed (the same on every rank):
- ``mlp``: Linear(6, 8) → Tanh → Linear(8, 3), cross-entropy, 13 samples a step (uneven on 2, 3, 4 ranks);
- ``linreg``: Linear(5, 3), mean squared error, 13 samples a step: a convex quadratic, whose Hessian
  gives the asynchronous run's bound (see test_parameter_server.py).
"""
import numpy as np

import minidl as mdl
from minidl import nn, optim
from minidl.ops.loss import cross_entropy, mse_loss

BATCH = 13
STEPS = 15
LR = 0.1


def make_model(problem: str, seed: int = 0):
    mdl.manual_seed(seed)
    if problem == "mlp":
        model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    else:
        model = nn.Linear(5, 3)
    return model.to(dtype=np.float64)


def loss_fn(problem: str):
    return cross_entropy if problem == "mlp" else mse_loss


def batches(problem: str, steps: int = STEPS):
    rng = np.random.default_rng(7)
    if problem == "mlp":
        return [(rng.normal(size=(BATCH, 6)), rng.integers(0, 3, size=BATCH)) for _ in range(steps)]
    truth = rng.normal(size=(5, 3))
    out = []
    for _ in range(steps):
        x = rng.normal(size=(BATCH, 5))
        out.append((x, x @ truth + 0.1 * rng.normal(size=(BATCH, 3))))
    return out


def make_optimizer(params, kind: str):
    if kind == "sgd":
        return optim.SGD(params, lr=LR)
    if kind == "momentum":
        return optim.SGD(params, lr=LR, momentum=0.9)
    return optim.Adam(params, lr=0.01)


def one_process(problem: str, kind: str, steps: int = STEPS):
    """The reference: one process, the whole global batch each step. Returns the final parameters and the
    loss of every step."""
    model = make_model(problem)
    opt = make_optimizer(model.parameters(), kind)
    fn = loss_fn(problem)
    losses = []
    for x, y in batches(problem, steps):
        opt.zero_grad()
        loss = fn(model(mdl.tensor(x)), mdl.tensor(y))
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return [p.array.copy() for p in model.parameters()], losses
