"""Shared fixtures: every device test runs on the CPU, and on "cuda": a GPU where there is one,
the strict CuPy stand-in of tests/cupy_standin everywhere else."""
import os

# pytest -n 2 already keeps both cores busy: a multi-threaded BLAS in each worker (and in each
# notebook kernel, which inherits this environment) would fight over them and run 10x slower.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 - after the thread settings above
import pytest  # noqa: E402

import minidl  # noqa: E402
from minidl import backend  # noqa: E402
from tests import cupy_standin  # noqa: E402

# Asked once, before any test can put the stand-in in place: is there a real GPU with CuPy?
REAL_GPU = minidl.gpu_available()


@pytest.fixture
def standin():
    """minidl's GPU array module is the CuPy stand-in for this test (tests/cupy_standin).

    Yields the stand-in module: ``standin.syncs.count`` is the number of
    device-to-host synchronizations since the test began. Afterwards minidl
    forgets it, so a later GPU request imports the real CuPy again.
    """
    previous = backend._use_cupy_module(cupy_standin, cupy_standin.cupyx)
    cupy_standin.reset()
    try:
        yield cupy_standin
    finally:
        backend._use_cupy_module(*previous)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """Every device test runs on the CPU and on "cuda": the real GPU where there is one, else the stand-in."""
    if request.param == "cuda" and not REAL_GPU:
        request.getfixturevalue("standin")
    return request.param


@pytest.fixture
def torch():
    """PyTorch, for the tests that compare with it; each such test skips where PyTorch is not installed."""
    return pytest.importorskip("torch")


def leaf(array, device="cpu"):
    """A float64 tensor that requires its gradient (gradients are checked in float64): ``leaf(x, device)``.

    A plain function, not a fixture, so helpers can call it: ``from tests.conftest import leaf``.
    """
    return minidl.tensor(np.asarray(array, dtype=np.float64), requires_grad=True, device=device)


def check_device_against_cpu(op, x, device, exact=False, rtol=1e-12, seed=1):
    """``op`` on ``device`` gives the CPU's value (equal when ``exact``, else to ``rtol``) and, under one random
    upstream gradient drawn from ``seed``, the CPU's gradient, on the device: one check for every op's device test.
    """
    t, c = leaf(x, device), leaf(x)
    y, yc = op(t), op(c)
    assert y.device == t.device
    if exact:
        np.testing.assert_array_equal(y.numpy(), yc.numpy())
    else:
        np.testing.assert_allclose(y.numpy(), yc.numpy(), rtol=rtol)
    w = np.random.default_rng(seed).standard_normal(yc.shape)
    (y * minidl.tensor(w, device=device)).sum().backward()
    (yc * minidl.tensor(w)).sum().backward()
    assert t.grad.device == t.device
    np.testing.assert_allclose(t.grad.numpy(), c.grad.numpy(), rtol=rtol)


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same seed, so failures reproduce."""
    minidl.manual_seed(0)
    np.random.seed(0)


@pytest.fixture
def standin_or_gpu(request):
    """"cuda" for this test is the real GPU where there is one, the stand-in everywhere else."""
    if not REAL_GPU:
        request.getfixturevalue("standin")
    return "cuda"


def pytest_collection_modifyitems(config, items):
    """Mark ``cuda`` every test that runs minidl on "cuda": its ``device`` parameter is "cuda", it asks for
    ``standin_or_gpu``, or it is marked ``gpu``. On a GPU machine ``pytest -m cuda`` runs exactly these on
    real CuPy (benchmarks/gpu_run.sh); tests that ask for ``standin`` itself test the stand-in and are not."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cuda = callspec is not None and str(callspec.params.get("device", "")).startswith("cuda")
        # a notebook (nbmake's item) has no fixtures: getattr, not .fixturenames
        if on_cuda or "standin_or_gpu" in getattr(item, "fixturenames", ()) or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.cuda)
