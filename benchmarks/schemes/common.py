"""The one small model and data every parallel scheme trains in notebook 30, so their curves compare.

Each scheme's script in this folder (``benchmarks/schemes/<scheme>.py``) is run under
``mpiexec -n 2 python -m mpi4py benchmarks/schemes/<scheme>.py --steps S --out result.json``: it
builds :func:`model` and :func:`batches` with the same seed on every rank, trains ``S`` steps of
plain SGD (``LR``) with its scheme, and rank 0 writes :func:`report`'s JSON: the loss of every step
(on the whole global batch, as one process would log it), the payload bytes the communicator
counted per step, and the seconds per step.

The model is a small CNN on the bundled 8 × 8 digits, with a hidden layer a mixture of experts can
replace: Conv2d(1, 8, 3, padding=1) → ReLU → Conv2d(8, 8, 3, padding=1) → ReLU → Flatten →
Linear(512, 32) → ReLU → Linear(32, 10). Filter-wise and spatial splits split its convolutions;
the parameter server, local SGD and data parallelism split its batch; the MoE script swaps the
Linear(512, 32) → ReLU block for experts of that shape.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

import minidl as mdl
from minidl import data, nn

SEED = 0
GLOBAL_BATCH = 64
LR = 0.5  # plain SGD: the loss falls from 2.30 to about 1.1 in 30 steps (0.05 barely moves it)


def model(dtype=np.float32) -> nn.Sequential:
    """The small CNN, initialized from ``SEED`` (the same weights on every rank)."""
    mdl.manual_seed(SEED)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        nn.Flatten(),
        nn.Linear(512, 32), nn.ReLU(),
        nn.Linear(32, 10),
    ).to(dtype=dtype)


def batches(steps: int, batch: int = GLOBAL_BATCH, dtype=np.float32):
    """``steps`` global batches ``(x, y)`` of the digits: x of shape (batch, 1, 8, 8), y class indices.

    Drawn from ``SEED`` alone, so every rank sees the same global batches and slices its own part."""
    x, y = data.digits()
    x = (np.asarray(x, dtype=dtype) / 16).reshape(-1, 1, 8, 8)   # pixels 0..16 scaled to [0, 1]
    y = np.asarray(y)
    rng = np.random.default_rng(SEED)
    for _ in range(steps):
        idx = rng.choice(len(x), size=batch, replace=False)
        yield x[idx], y[idx]


def report(path: str, losses, bytes_per_step: float, seconds_per_step: float, **extra) -> None:
    """Rank 0's result file: written whole, then renamed (no half-written file)."""
    out = {"loss": [float(v) for v in losses], "bytes_per_step": float(bytes_per_step),
           "seconds_per_step": float(seconds_per_step), **extra}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, path)


class StepClock:
    """Seconds per step over a run, leaving out the first (warm-up) step."""

    def __init__(self):
        self.times = []
        self._start = None

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.times.append(time.perf_counter() - self._start)

    @property
    def seconds_per_step(self) -> float:
        rest = self.times[1:] or self.times
        return float(np.median(rest))
