"""Shared fixtures: every device test runs on the CPU, and on the GPU when there is one."""
import numpy as np
import pytest

import minidl


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
