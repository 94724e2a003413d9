"""Training runs shared by the MPI worker (data-parallel) and the tests (one process, the reference).

Each scenario trains a small model for STEPS steps on batches of B samples.
The reference is a plain single-process loop that uses nothing from
minidl.parallel; the worker runs the same scenario on N ranks, each rank on
its slice of every batch, from a different initialization (seeded by rank).
"""
from __future__ import annotations

import numpy as np

import minidl as mdl
from minidl import nn, optim
from minidl.ops.loss import cross_entropy

STEPS = 20
FEATURES, CLASSES = 6, 3

SCENARIOS = {
    # name: (optimizer, dtype, global batch, how the step is driven)
    "sgd_f64": ("sgd", "float64", 12, "manual"),
    "adam_f64": ("adam", "float64", 12, "manual"),
    "sgd_f32": ("sgd", "float32", 12, "manual"),
    "adam_f32": ("adam", "float32", 12, "manual"),
    "uneven_adam_f64": ("adam", "float64", 11, "manual"),   # 11 = 6+5 on 2 ranks, 3+3+3+2 on 4
    "small_buckets_sgd_f32": ("sgd", "float32", 12, "manual"),  # 256-byte buckets: several all-reduces
    "zero_adam_f64": ("adam", "float64", 12, "zero"),
    "zero_sgd_f32": ("sgd", "float32", 12, "zero"),
    "trainer_adam_f64": ("adam", "float64", 12, "trainer"),
    "trainer_clip_sgd_f64": ("sgd", "float64", 12, "trainer_clip"),
    # overlap=True: buckets all-reduced while backward runs (Iallreduce), the same numbers
    "overlap_adam_f64": ("adam", "float64", 12, "manual"),
    "overlap_small_buckets_uneven_adam_f64": ("adam", "float64", 11, "manual"),
    "overlap_trainer_clip_sgd_f64": ("sgd", "float64", 12, "trainer_clip"),
    # AdaHessian: every rank probes its own graph with the same z and the Hz are all-reduced with the
    # gradients' weights before |z ⊙ Hz| (DataParallel.probe_gradients)
    "adahessian_f64": ("adahessian", "float64", 12, "manual"),
    "uneven_adahessian_f64": ("adahessian", "float64", 11, "manual"),
    "zero_adahessian_f64": ("adahessian", "float64", 12, "zero"),   # z for every rank's parameters
    # ZeRO-1's chunks cut parameters: the layer-wise norms add each parameter's pieces over the ranks
    "zero_lamb_f64": ("lamb", "float64", 12, "zero"),
    "zero_novograd_f64": ("novograd", "float64", 12, "zero"),
    "overlap_trainer_adahessian_f64": ("adahessian", "float64", 12, "trainer"),
}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


class Net(nn.Module):
    """An MLP with a buffer used in forward, so that broadcasting buffers matters too."""

    def __init__(self, hidden: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, hidden)
        self.fc2 = nn.Linear(hidden, CLASSES)
        self.register_buffer("input_scale", mdl.rand(FEATURES) + 0.5)

    def forward(self, x):
        return self.fc2(self.fc1(x * self.input_scale).tanh())


def make_model(seed: int, dtype: str, hidden: int = 16) -> Net:
    mdl.manual_seed(seed)
    return Net(hidden).to(dtype=np.dtype(dtype))


OPTIMIZERS = {"sgd": (optim.SGD, {"lr": 0.1, "momentum": 0.9}), "adam": (optim.Adam, {"lr": 0.01}),
              "adahessian": (optim.AdaHessian, {"lr": 0.05}), "lamb": (optim.LAMB, {"lr": 0.01}),
              "novograd": (optim.NovoGrad, {"lr": 0.01})}


def make_optimizer(kind: str, params):
    cls, options = OPTIMIZERS[kind]
    return cls(params, **options)  # AdaHessian's z generator: seeded from mdl.manual_seed, alike on every rank


def make_batches(batch: int, dtype: str):
    """STEPS batches: x of shape (STEPS, batch, FEATURES), integer labels (STEPS, batch)."""
    rng = np.random.default_rng(123)
    x = rng.normal(size=(STEPS, batch, FEATURES)).astype(dtype)
    y = rng.integers(0, CLASSES, size=(STEPS, batch))
    return x, y


def make_dataset(batch: int, dtype: str):
    """For the Trainer runs: STEPS * batch / 4 samples, so 20 steps are 4 shuffled epochs."""
    rng = np.random.default_rng(7)
    n = STEPS * batch // 4
    return rng.normal(size=(n, FEATURES)).astype(dtype), rng.integers(0, CLASSES, size=n)


def loss_of(model, x, y):
    """Mean cross-entropy of ``model`` on (x, y); the labels follow the output to its device."""
    out = model(mdl.tensor(x))
    return cross_entropy(out, mdl.tensor(y, device=out.device))


def reference(name: str):
    """The single-process run: final parameters (a list of arrays) and the optimizer."""
    kind, dtype, batch, loop = SCENARIOS[name]
    model = make_model(0, dtype)
    opt = make_optimizer(kind, model.parameters())
    if loop.startswith("trainer"):
        from minidl.data import DataLoader
        from minidl.train import Trainer
        x, y = make_dataset(batch, dtype)
        loader = DataLoader((x, y), batch_size=batch, shuffle=True, seed=5)
        clip = 0.5 if loop == "trainer_clip" else None
        Trainer(model, opt, loader, progress=False, max_grad_norm=clip).fit(epochs=4, max_steps=STEPS)
    else:
        xs, ys = make_batches(batch, dtype)
        for step in range(STEPS):
            opt.zero_grad()
            loss_of(model, xs[step], ys[step]).backward(create_graph=kind == "adahessian")
            opt.step()
    return [p.array.copy() for p in model.parameters()], opt


def state_bytes(opt) -> int:
    return sum(v.nbytes for s in opt.state.values() for v in s.values() if hasattr(v, "nbytes"))
