"""Shared fixtures: every device test runs on the CPU, and on the GPU when there is one."""
import os

# pytest -n 2 already keeps both cores busy: a multi-threaded BLAS in each worker (and in each
# notebook kernel, which inherits this environment) would fight over them and run 10x slower.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 - after the thread settings above
import pytest  # noqa: E402

import minidl  # noqa: E402


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    if request.param == "cuda" and not minidl.gpu_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return request.param


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same seed, so failures reproduce."""
    minidl.manual_seed(0)
    np.random.seed(0)
