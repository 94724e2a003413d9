"""The models and batches of the filter-wise and spatial checks, built alike by split_worker.py under MPI and
by test_split_mpi.py in one process (the plain reference, which uses nothing from minidl.parallel)."""
import importlib.util
import os

import numpy as np

import minidl as mdl
import minidl.functional as F
from minidl import nn

# benchmarks/schemes/common.py, the CNN every scheme trains, loaded under a name of its own: benchmarks/common.py
# is also a module "common" in the same test process
_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks", "schemes", "common.py")
_SPEC = importlib.util.spec_from_file_location("schemes_common", _PATH)
common = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(common)

STEPS = 3        # Trainer steps of the training checks
CLIP = 0.2       # the filter-wise Trainer run clips to this global norm (every step clips: ‖g‖ ≈ 0.4)


def cnn():
    """benchmarks/schemes/common.py's CNN in float64: Conv(1→8) → ReLU → Conv(8→8) → ReLU → Flatten → Linear…"""
    return common.model(dtype=np.float64)


def odd_cnn():
    """A CNN of the other supported shapes: a (5, 3) kernel, a dilated 'same' convolution, no bias, Tanh."""
    mdl.manual_seed(1)
    return nn.Sequential(
        nn.Conv2d(2, 4, (5, 3), padding=(2, 1)), nn.Tanh(),
        nn.Conv2d(4, 4, 3, padding="same", dilation=2, bias=False), nn.ReLU(),
        nn.Flatten(), nn.Linear(4 * 16 * 6, 3),
    ).to(dtype=np.float64)


def cnn_batch():
    x, y = next(common.batches(1, batch=8, dtype=np.float64))
    return x, y


def odd_batch():
    rng = np.random.default_rng(2)
    return rng.standard_normal((3, 2, 16, 6)), rng.integers(0, 3, size=3)


def forward_backward(model, x, y):
    """(output, the input's gradient) of cross_entropy(model(x), y).backward()."""
    xt = mdl.tensor(x, requires_grad=True)
    out = model(xt)
    F.cross_entropy(out, mdl.tensor(y)).backward()
    return out.numpy(), xt.grad.numpy()


def train_batches():
    return list(common.batches(STEPS, batch=16, dtype=np.float64))
