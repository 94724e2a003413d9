"""The NCCL communicator reaches CuPy's NCCL only through minidl.backend."""
import pytest

import minidl as mdl
from minidl import backend, parallel
from minidl.parallel import comm


def test_nccl_available_asks_the_backend(monkeypatch):
    def missing():
        raise RuntimeError("NCCL is not available: pip install 'minidl[gpu]'")

    monkeypatch.setattr(backend, "nccl", missing)
    assert comm.nccl_available() is False
    monkeypatch.setattr(backend, "nccl", lambda: object())
    assert comm.nccl_available() is True


@pytest.mark.skipif(mdl.gpu_available(), reason="checks the error a CPU-only machine gives")
def test_nccl_communicator_without_a_gpu_says_how_to_fix_it():
    assert parallel.nccl_available() is False
    with pytest.raises(RuntimeError) as info:
        parallel.NCCLComm()
    message = str(info.value)
    assert "minidl[gpu]" in message and "device='cpu'" in message
