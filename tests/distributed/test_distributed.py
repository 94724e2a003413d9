"""minidl.distributed and DistributedDataParallel: PyTorch's names over minidl's communicators.

The MPI tests start real jobs (mpiexec, 2 ranks) and compare with one process or a NumPy formula.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import minidl as mdl
import minidl.distributed as dist
import minidl.functional as F
from minidl import nn
from minidl.parallel import DistributedDataParallel, launch, world

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MPI_REASON = launch.mpi_unavailable_reason()
needs_mpi = pytest.mark.skipif(MPI_REASON is not None, reason=f"MPI not installed: {MPI_REASON}")


def _env(**extra):
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1", PYTHONPATH=REPO)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    env.update(extra)
    return env


@pytest.fixture
def fresh_world():
    """Each test starts without a process group and leaves none behind."""
    world.leave()
    yield
    world.leave()


# ---------------------------------------------------------------- one process
def test_one_process_group_without_mpi(fresh_world, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        dist.get_rank()
    dist.init_process_group()
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    t = mdl.tensor([1.0, -2.0, 3.0])
    dist.all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), [1.0, -2.0, 3.0])  # the sum over one rank
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    np.testing.assert_array_equal(t.numpy(), [1.0, -2.0, 3.0])
    with pytest.raises(RuntimeError, match="twice"):
        dist.init_process_group()
    dist.destroy_process_group()
    assert not dist.is_initialized()


def test_torchrun_variables_world_of_one(fresh_world, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    dist.init_process_group(backend="gloo")
    assert dist.get_world_size() == 1


def test_torchrun_variables_of_several_processes_without_mpi_say_what_to_run(fresh_world, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"mpiexec -n 2 python -m minidl.distributed.run"):
        dist.init_process_group(backend="gloo")
    assert not dist.is_initialized()


def test_unknown_backend_and_op_are_refused(fresh_world):
    with pytest.raises(ValueError, match="unknown backend 'tcp'.*'gloo'"):
        dist.init_process_group(backend="tcp")
    dist.init_process_group()
    with pytest.raises(ValueError, match="unknown op"):
        dist.all_reduce(mdl.tensor([1.0]), op="median")
    with pytest.raises(TypeError, match="expected a minidl Tensor"):
        dist.all_reduce(np.ones(3))


def test_ddp_needs_a_process_group_and_one_device(fresh_world):
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedDataParallel(nn.Linear(2, 2))
    dist.init_process_group()
    with pytest.raises(ValueError, match=r"device_ids=\[0, 1\].*pass device_ids=\[0\]"):
        DistributedDataParallel(nn.Linear(2, 2), device_ids=[0, 1])
    assert isinstance(DistributedDataParallel(nn.Linear(2, 2), device_ids=[0]).module, nn.Linear)


def _accumulate(model, batches, use_no_sync):
    """Two micro-batches' gradients accumulated, the first without the sync, the second with it."""
    (x1, y1), (x2, y2) = batches
    if use_no_sync:
        with model.no_sync():
            F.mse_loss(model(mdl.tensor(x1)), mdl.tensor(y1)).backward()
    else:
        model.require_backward_grad_sync = False
        F.mse_loss(model(mdl.tensor(x1)), mdl.tensor(y1)).backward()
        model.require_backward_grad_sync = True
    F.mse_loss(model(mdl.tensor(x2)), mdl.tensor(y2)).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("use_no_sync", [False, True], ids=["attribute", "no_sync"])
def test_ddp_of_one_rank_accumulates_as_the_plain_model(fresh_world, use_no_sync):
    dist.init_process_group()
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(5, 3)), rng.normal(size=(5, 2))) for _ in range(2)]
    mdl.manual_seed(3)
    plain = nn.Linear(3, 2).double()
    mdl.manual_seed(3)
    wrapped = DistributedDataParallel(nn.Linear(3, 2).double())
    expected = []
    for x, y in batches:
        F.mse_loss(plain(mdl.tensor(x)), mdl.tensor(y)).backward()
    expected = [p.grad.numpy() for p in plain.parameters()]
    got = _accumulate(wrapped, batches, use_no_sync)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=0)
    assert wrapped.require_backward_grad_sync is True


# ---------------------------------------------------------------- two ranks under mpiexec
@needs_mpi
def test_collectives_under_mpiexec_match_numpy(tmp_path):
    cmd = launch.mpiexec_command(2, [os.path.join(HERE, "collectives_worker.py"), str(tmp_path)],
                                 use_mpi4py_runner=False)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    base = [np.arange(6, dtype=np.float64).reshape(2, 3) + 10 * r for r in range(2)]
    stacked = np.stack(base)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert (got["rank"], got["size"], got["initialized"], got["initialized_after"]) == (r, 2, True, False)
        np.testing.assert_array_equal(got["SUM"], stacked.sum(0))
        np.testing.assert_array_equal(got["AVG"], stacked.mean(0))
        np.testing.assert_array_equal(got["PRODUCT"], stacked.prod(0))
        np.testing.assert_array_equal(got["MIN"], stacked.min(0))
        np.testing.assert_array_equal(got["MAX"], stacked.max(0))
        np.testing.assert_array_equal(got["column"], stacked[:, :, 1].sum(0))
        np.testing.assert_array_equal(got["broadcast"], base[1])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name in range(2):  # weight, bias
        np.testing.assert_array_equal(ranks[0]["weights"][name], ranks[1]["weights"][name])  # rank 0's everywhere
        mean = (np.array(ranks[0]["plain_both"][name]) + np.array(ranks[1]["plain_both"][name])) / 2
        for r in range(2):
            # inside no_sync: this rank's own gradient; after the synced backward: the ranks' mean of the sums
            np.testing.assert_allclose(ranks[r]["after_no_sync"][name], ranks[r]["plain_first"][name], rtol=1e-12)
            np.testing.assert_allclose(ranks[r]["after_sync"][name], mean, rtol=1e-12, atol=1e-15)
        assert not np.allclose(ranks[0]["plain_first"][name], ranks[1]["plain_first"][name])


@needs_mpi
def test_nanogpt_ddp_loop_under_mpiexec_equals_one_process(tmp_path):
    """nanoGPT's DDP path (gradient accumulation with require_backward_grad_sync, clipping, AdamW) on 2 ranks
    started torchrun-style gives one process's evaluation losses and weights."""
    script = os.path.join(HERE, "nanogpt_ddp.py")
    one = subprocess.run([sys.executable, script, str(tmp_path / "one.json")], capture_output=True, text=True,
                         timeout=300, env=_env())
    assert one.returncode == 0, one.stderr[-3000:]
    cmd = launch.mpiexec_command(2, ["-m", "minidl.distributed.run", script, str(tmp_path / "two.json")],
                                 use_mpi4py_runner=False)
    two = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
    assert two.returncode == 0, two.stderr[-3000:]
    a = json.loads((tmp_path / "one.json").read_text())
    b = json.loads((tmp_path / "two.json").read_text())
    assert (a["world_size"], b["world_size"]) == (1, 2)
    assert len(a["eval"]) == len(b["eval"]) == 4
    for ea, eb in zip(a["eval"], b["eval"]):
        for split in ("train", "val"):
            assert eb[split] == pytest.approx(ea[split], rel=1e-5)
    # the runs trained: the weights moved away from the start (evaluation 0) by more than they differ
    assert a["eval"][0] != a["eval"][-1]
    for name, weights in a["weights"].items():
        np.testing.assert_allclose(b["weights"][name], weights, rtol=1e-4, atol=1e-6)
