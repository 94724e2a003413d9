"""NCCLComm's all-to-all checked against the real binding, without a GPU (see test_nccl_binding.py for how:
a NULL communicator, which libnccl refuses only after the binding has converted every argument)."""
import numpy as np
import pytest

from tests.parallel.test_nccl_binding import (  # noqa: F401 - nccl and null_world are fixtures
    DTYPES,
    _DeviceArray,
    _fails_inside_libnccl,
    nccl,
    null_world,
)


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_reaches_libnccl_inside_a_group(null_world, nccl, dtype):
    """ncclGroupStart, then the first ncclSend (bytes: NCCL_UINT8), refused for the NULL communicator."""
    _fails_inside_libnccl(nccl, lambda: null_world.all_to_all(_DeviceArray((2, 3), dtype)))


def test_all_to_all_v_reaches_libnccl_with_its_counts_given(null_world, nccl):
    _fails_inside_libnccl(nccl, lambda: null_world.all_to_all_v(_DeviceArray((5, 2), "float32"), [2, 3],
                                                                recv_counts=[1, 4]))


def test_all_to_all_needs_a_row_per_rank(null_world):
    with pytest.raises(ValueError, match=r"NCCLComm.all_to_all: all_to_all takes an array of shape \(2, \.\.\.\)"):
        null_world.all_to_all(_DeviceArray((3, 2), np.float32))
