"""NCCL through CuPy: a world of one GPU through the real NCCL path; two or more GPUs under mpiexec.

Skipped on machines without a GPU (the one-GPU tests) or with fewer than two
GPUs (the multi-rank test). To run the multi-rank test by hand on a machine
with G GPUs:

    mpiexec -n G python -m mpi4py tests/parallel/dp_worker.py /tmp/out --device cuda --backend nccl
"""
import json
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import backend, optim, parallel
from minidl.parallel import launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scenarios  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not parallel.nccl_available(), reason="no CUDA GPU with CuPy and NCCL here")]


@pytest.fixture(scope="module")
def nccl_world():
    return parallel.NCCLComm()  # not under mpiexec: a world of one GPU, still through NCCL


def test_nccl_collectives_on_one_gpu(nccl_world):
    cp = backend.cupy_module()
    assert (nccl_world.rank, nccl_world.size, nccl_world.device) == (0, 1, "cuda:0")
    x = cp.arange(10, dtype=cp.float32)
    assert nccl_world.allreduce_(x) is x
    nccl_world.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(x), np.arange(10, dtype=np.float32))
    nccl_world.broadcast_(x, root=0)
    gathered = nccl_world.allgather(x)
    nccl_world.synchronize()
    assert gathered.shape == (1, 10)
    np.testing.assert_array_equal(cp.asnumpy(gathered[0]), np.arange(10, dtype=np.float32))
    with pytest.raises(TypeError, match="NCCL has no type"):
        nccl_world.allreduce_(cp.zeros(3, dtype=cp.complex64))


def test_data_parallel_through_nccl_equals_the_cpu_reference(nccl_world):
    """Pack, all-reduce through NCCL, unpack: 20 Adam steps on the GPU equal the single-process CPU run."""
    expected, _ = scenarios.reference("adam_f64")
    model = scenarios.make_model(0, "float64").to(nccl_world.device)
    dp = parallel.DataParallel(model, nccl_world, bucket_bytes=256)  # several buckets
    opt = parallel.DistributedOptimizer(optim.Adam(dp.parameters(), lr=0.01), dp)
    xs, ys = scenarios.make_batches(12, "float64")
    for step in range(scenarios.STEPS):
        opt.zero_grad()
        scenarios.loss_of(dp, mdl.tensor(xs[step], device=nccl_world.device), ys[step]).backward()
        opt.step()
    assert dp.last_sync["buckets"] == 3
    for p, want in zip(dp.parameters(), expected):
        assert p.device == nccl_world.device
        np.testing.assert_allclose(p.numpy(), want, rtol=0, atol=1e-9)


def _gpu_count() -> int:
    try:
        return backend.cupy_module().cuda.runtime.getDeviceCount()
    except RuntimeError:
        return 0


@pytest.mark.skipif(_gpu_count() < 2, reason="multi-rank NCCL needs at least 2 GPUs")
@pytest.mark.skipif(launch.mpi_unavailable_reason() is not None, reason="MPI not installed")
def test_two_gpus_under_mpiexec_equal_one_process(tmp_path):
    only = ["adam_f64", "sgd_f32", "uneven_adam_f64", "zero_adam_f64"]
    result = launch.run(2, [os.path.join(HERE, "dp_worker.py"), str(tmp_path), "--device", "cuda",
                            "--backend", "nccl", "--only", *only], timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in range(2):
        arrays = dict(np.load(tmp_path / f"rank{rank}.npz"))
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts["world"]["backend"] == "nccl"
        for name in only:
            expected, _ = scenarios.reference(name)
            tolerance = 1e-9 if scenarios.SCENARIOS[name][1] == "float64" else 1e-5
            for i, want in enumerate(expected):
                np.testing.assert_allclose(arrays[f"{name}/{i}"], want, rtol=0, atol=tolerance)
