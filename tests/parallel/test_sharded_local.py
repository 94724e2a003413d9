"""ZeRO stages 2 and 3 in one process: a world of one equals plain training, and the checks made at the start.

The multi-rank proof (2 and 4 MPI ranks, memory and traffic against the formulas) is in test_model_parallel.py.
"""
import numpy as np
import pytest

from minidl import nn, optim, parallel

from .mp_scenarios import make_optimizer, make_sequential, train_sequential, zero_reference


@pytest.mark.parametrize("stage", [2, 3])
def test_a_world_of_one_trains_as_the_plain_model(stage):
    model = make_sequential()
    comm = parallel.LocalComm()
    sharded = parallel.ShardedDataParallel(model, comm, stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    sharded.gather_parameters()
    for got, want in zip(model.parameters(), zero_reference("zero3_adam")):
        np.testing.assert_array_equal(got.data, want)


def test_stage_3_keeps_only_the_shards_between_steps_and_frees_after_an_evaluation_forward():
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=3)
    assert all(p.data.size == 0 for p in model.parameters())
    assert [p.shape for p in sharded.parameters()] == [(78,), (70,), (15,)]
    sharded.eval()
    out = sharded(np.ones((2, 6)))
    assert out.shape == (2, 3) and all(p.data.size == 0 for p in model.parameters())
    sharded.gather_parameters()
    assert [p.shape for p in model.parameters()] == [(13, 6), (5, 13), (5,), (3, 5)]


def test_bad_settings_are_refused_before_any_work():
    with pytest.raises(ValueError, match="stage must be 2 .* or 3 .* got 1; for stage 1 use ZeroRedundancyOptimizer"):
        parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    with pytest.raises(TypeError, match="stage=3\\) shards an nn.Sequential layer by layer, got Net"):
        parallel.ShardedDataParallel(Net(), parallel.LocalComm(), stage=3)
    sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=2)
    with pytest.raises(ValueError, match="LAMB needs whole tensors"):
        parallel.DistributedOptimizer(optim.LAMB(sharded.parameters()), sharded)
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to(dtype=np.float64))
    with pytest.raises(ValueError, match="must share one dtype and device"):
        parallel.ShardedDataParallel(mixed, parallel.LocalComm(), stage=2)


def test_reduce_scatter_needs_a_flat_array_that_divides():
    with pytest.raises(ValueError, match=r"divides by the 1 ranks; got shape \(2, 2\)"):
        parallel.LocalComm().reduce_scatter(np.zeros((2, 2)))
    np.testing.assert_array_equal(parallel.LocalComm().reduce_scatter(np.arange(4.0)), np.arange(4.0))


def test_stage_3_frees_each_unit_after_its_forward_and_gathers_it_again_for_its_backward():
    """Only the shards are held between the forward and the backward; the backward all-gathers each unit
    again (twice the all-gather payload of a step) and gives the plain model's gradients."""
    x = np.random.default_rng(0).standard_normal((4, 6))
    plain = make_sequential()
    (plain(x) ** 2).mean().backward()
    comm = parallel.LocalComm()
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, comm, stage=3)
    comm.reset_traffic()
    loss = (sharded(x) ** 2).mean()
    assert all(p.data.size == 0 for p in model.parameters())  # after the forward: the shards only
    gathered_for_forward = comm.traffic["allgather"]
    loss.backward()
    assert gathered_for_forward == 163 * 8  # every weight, float64, once before its unit's forward
    assert comm.traffic["allgather"] == 2 * gathered_for_forward  # and once more before its backward
    assert all(p.data.size == 0 for p in model.parameters())  # freed again after the backward
    units = [[plain[0].weight], [plain[2].weight, plain[2].bias], [plain[4].weight]]
    for (_, unit), params in zip(sharded.units[::2], units):
        want = np.concatenate([p.grad.data.ravel() for p in params])
        np.testing.assert_allclose(unit.shard.grad.data[:want.size], want, rtol=1e-15, atol=1e-16)
