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


@pytest.mark.parametrize("stage", [2, 3])
def test_consolidated_state_is_what_one_process_keeps_and_loads_back_into_the_shards(stage):
    # a world of one trains as the plain model bit for bit (above), so the consolidated state must
    # equal the plain optimizer's state_dict exactly: every moment in its parameter's shape
    plain = make_sequential()
    plain_opt = make_optimizer("adam", plain.parameters())
    train_sequential(plain, plain_opt, 12)
    sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    weights, state = sharded.consolidated_state_dict(), opt.consolidated_state_dict()
    if stage == 3:
        assert all(p.data.size == 0 for p in sharded.module.parameters())  # freed again after the gather
    want = plain_opt.state_dict()
    assert [g["params"] for g in state["param_groups"]] == [g["params"] for g in want["param_groups"]]
    assert sorted(state["state"]) == sorted(want["state"])
    for pos, entry in want["state"].items():
        assert sorted(state["state"][pos]) == sorted(entry)
        for key, value in entry.items():
            np.testing.assert_array_equal(np.asarray(state["state"][pos][key]), np.asarray(value))
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(weights[name], value)
    # loaded into a fresh sharded model, the shards and their state are those of the trained one
    again = parallel.ShardedDataParallel(make_sequential(seed=5), parallel.LocalComm(), stage=stage)
    again_opt = parallel.DistributedOptimizer(make_optimizer("adam", again.parameters()), again)
    again.load_state_dict(weights)
    again_opt.check_state_dict(state)
    again_opt.load_state_dict(state)
    for got, want_shard in zip(again.parameters(), sharded.parameters()):
        np.testing.assert_array_equal(got.data, want_shard.data)
    for (_, got), (_, want_entry) in zip(sorted(again_opt.optimizer.state.items()),
                                         sorted(opt.optimizer.state.items())):
        for key in want_entry:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want_entry[key]))


@pytest.mark.parametrize("stage", [2, 3])
def test_a_state_that_does_not_fit_names_the_parameter_and_the_shapes(stage):
    sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    before = [p.data.copy() for p in sharded.parameters()]
    # the per-parameter state of a model with a wider first layer
    other = nn.Sequential(nn.Linear(7, 13, bias=False), nn.Tanh(), nn.Linear(13, 5), nn.Tanh(),
                          nn.Linear(5, 3, bias=False)).to(dtype=np.float64)
    other_opt = make_optimizer("adam", other.parameters())
    _one_step(other, other_opt)
    with pytest.raises(ValueError, match=r"state 'm' of parameter 0.weight has shape \(13, 7\), the model's "
                                         r"parameter has shape \(13, 6\)"):
        opt.load_state_dict(other_opt.state_dict())
    with pytest.raises(ValueError, match=r"0.weight.*\(13, 6\).*\(13, 7\)"):
        sharded.load_state_dict(other.state_dict())
    # the state over the shards (not consolidated): one entry per shard, not per parameter
    with pytest.raises(ValueError, match=rf"optimizer state is for {1 if stage == 2 else 3} parameters, the model "
                                         "has 4; load a consolidated checkpoint"):
        opt.load_state_dict(opt.state_dict())
    for got, want in zip(sharded.parameters(), before):  # nothing changed
        np.testing.assert_array_equal(got.data, want)
    if stage == 3:
        assert all(p.data.size == 0 for p in sharded.module.parameters())


def _one_step(model, opt):
    import minidl as mdl
    from minidl import functional as F
    opt.zero_grad()
    F.cross_entropy(model(mdl.tensor(np.ones((4, 7)))), mdl.tensor(np.array([0, 1, 2, 0]))).backward()
    opt.step()


@pytest.mark.parametrize("low", ["float16", "bfloat16"])
def test_a_world_of_one_at_stage_3_under_autocast_trains_as_the_plain_model(low):
    # under autocast a layer's weights reach its ops through casts, which the backward walk may run after
    # the unit's boundary: their gradients are reduced after the backward, none is lost
    if low == "bfloat16":
        pytest.importorskip("ml_dtypes")
    import minidl as mdl
    from minidl import amp
    from minidl.ops.loss import cross_entropy

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3, 8, 6)).astype(np.float32), rng.integers(0, 3, size=(3, 8))
    results = []
    for sharded in (False, True):
        model = make_sequential().to(dtype=np.float32)
        net = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=3) if sharded else model
        opt = optim.SGD(net.parameters(), lr=0.1)
        opt = parallel.DistributedOptimizer(opt, net) if sharded else opt
        for step in range(3):
            with amp.autocast("cpu", dtype=getattr(mdl, low)):
                loss = cross_entropy(net(mdl.tensor(x[step])), mdl.tensor(y[step]))
            loss.backward()
            opt.step()
            opt.zero_grad()
        if sharded:
            net.gather_parameters()
        results.append([p.data.copy() for p in model.parameters()])
    moved = max(float(np.abs(a - b).max()) for a, b in zip(results[0], [p.data for p in
                                                                         make_sequential().parameters()]))
    assert moved > 1e-3  # the plain model trained
    for got, want in zip(results[1], results[0]):
        np.testing.assert_array_equal(got, want)


def test_whole_module_lends_the_whole_weights_and_the_histograms_read_them():
    from minidl.train import Trainer
    from minidl.train.tensorboard import TensorBoardLogger, histogram_values

    x, y = np.random.default_rng(1).normal(size=(4, 6)), np.array([0, 1, 2, 0])
    plain = make_sequential()
    want = histogram_values(Trainer(plain, optim.SGD(plain.parameters()), [], progress=False), (x, y))
    for stage in (2, 3):
        sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=stage)
        trainer = Trainer(sharded, optim.SGD(sharded.parameters()), [], progress=False)
        got = histogram_values(trainer, (x, y))
        assert [tag for tag, _ in got] == [tag for tag, _ in want]  # the plain model's names, not shard0...
        for (tag, g), (_, w) in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"stage {stage}: {tag}")
        if stage == 3:  # lent for the reading only: freed again
            assert all(p.data.size == 0 for p in sharded.module.parameters())
        assert histogram_values(trainer, (x, y), compute=False) == []
    # the ranks other than 0 take part without a writer (nor tensorboardX), and count validations alike
    silent = TensorBoardLogger("unused", write=False, histogram_every=2)
    for step in (1, 2, 3):
        silent.on_evaluate(trainer, {"step": step, "val_loss": 1.0})
    assert silent.writer is None and silent.state_dict() == {"validations": 3}
