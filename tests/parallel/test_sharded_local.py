"""ZeRO stages 2 and 3 in one process: a world of one equals plain training, and the checks made at the start.

The multi-rank proof (2 and 4 MPI ranks, memory and traffic against the formulas) is in test_model_parallel.py.
"""
import numpy as np
import pytest

import minidl as mdl
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
        np.testing.assert_array_equal(got.array, want)


def test_stage_2_in_buckets_reduce_scatters_each_during_the_backward_and_trains_as_the_plain_model():
    """bucket_bytes=600 (float64): units cut from the last parameter back, [W1] (624 B), [W2] (520 B),
    [b2, W3] (160 B); the backward finishes the last two at the middle Linear and reduce-scatters them there,
    freeing their gradients; W1's is final at the walk's last node, so the sync reduces it."""
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=2, bucket_bytes=600)
    assert [p.shape for p in sharded.parameters()] == [(78,), (65,), (20,)]
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    w1, w2, b2, w3 = model.parameters()
    seen = []
    train_sequential(sharded, opt, 12, after_backward=lambda: seen.append(
        ([p.grad is None for p in (w1, w2, b2, w3)], [s.grad is None for s in sharded.parameters()])))
    assert seen[0] == ([False, True, True, True], [True, False, False])
    for got, want in zip(model.parameters(), zero_reference("zero3_adam")):
        np.testing.assert_array_equal(got.array, want)


@pytest.mark.parametrize("how", ["accumulate", "two_forwards"])
def test_stage_2_in_buckets_adds_the_backwards_before_one_sync(how):
    """Two micro-batches before one sync (each backward reduce-scatters its finished units; the shards' gradients
    add), or two forwards before one backward (a parameter is final only after both forwards' uses): the
    shards' gradients are one process's accumulated gradients laid out flat."""
    plain, model = make_sequential(), make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=2, bucket_bytes=600)
    xs = np.random.default_rng(5).normal(size=(2, 4, 6))
    for net in (plain, sharded):
        if how == "accumulate":
            for x in xs:
                (net(mdl.tensor(x)) ** 2).sum().backward()
        else:
            (net(mdl.tensor(xs[0])) * net(mdl.tensor(xs[1]))).sum().backward()
    with pytest.raises(ValueError, match="num_samples cannot change them"):
        sharded.sync_gradients(num_samples=8)
    sharded.sync_gradients()
    want = np.concatenate([p.grad.array.reshape(-1) for p in plain.parameters()])
    got = np.concatenate([s.grad.array for s in sharded.parameters()])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_world_of_one_trains_with_adahessian_as_the_plain_model(stage):
    """The Hessian is probed over the whole weights before the reduce-scatter (probe_gradients): z drawn for the
    whole parameters in one process's order, D cut into the shard; stage 3 keeps each unit whole from its forward
    until the sync (the second backward needs the weights, and a graph without packed values)."""
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("adahessian", sharded.parameters()), sharded)
    assert opt.requires_create_graph
    seen = []
    train_sequential(sharded, opt, 12, after_backward=lambda: seen.append(
        [p.array.size for p in model.parameters()]), create_graph=True)
    assert seen[0] == [78, 65, 5, 15]    # whole after the backward, at stage 3 too, until the sync
    if stage == 3:
        assert all(p.array.size == 0 for p in model.parameters())  # freed by the sync
    sharded.gather_parameters()
    # stage 2 is the plain graph: bit for bit; stage 3's unit boundaries (nodes of their own) change the walk's
    # order, and so the order in which the second backward adds some of its terms: 2e-16 apart after 4 steps
    tolerance = 0 if stage == 2 else 1e-14
    for got, want in zip(model.parameters(), zero_reference("zero3_adahessian")):
        np.testing.assert_allclose(got.array, want, rtol=0, atol=tolerance)


def test_stage_3_keeps_only_the_shards_between_steps_and_frees_after_an_evaluation_forward():
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=3)
    assert all(p.array.size == 0 for p in model.parameters())
    assert [p.shape for p in sharded.parameters()] == [(78,), (70,), (15,)]
    sharded.eval()
    out = sharded(np.ones((2, 6)))
    assert out.shape == (2, 3) and all(p.array.size == 0 for p in model.parameters())
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
    assert all(p.array.size == 0 for p in model.parameters())  # after the forward: the shards only
    gathered_for_forward = comm.traffic["allgather"]
    loss.backward()
    assert gathered_for_forward == 163 * 8  # every weight, float64, once before its unit's forward
    assert comm.traffic["allgather"] == 2 * gathered_for_forward  # and once more before its backward
    assert all(p.array.size == 0 for p in model.parameters())  # freed again after the backward
    units = [[plain[0].weight], [plain[2].weight, plain[2].bias], [plain[4].weight]]
    for (_, unit), params in zip(sharded.units[::2], units):
        want = np.concatenate([p.grad.array.ravel() for p in params])
        np.testing.assert_allclose(unit.shard.grad.array[:want.size], want, rtol=1e-15, atol=1e-16)


@pytest.mark.parametrize("kind", ["adam", "lamb", "novograd", "switch"])
@pytest.mark.parametrize("stage", [2, 3])
def test_consolidated_state_is_what_one_process_keeps_and_loads_back_into_the_shards(stage, kind):
    # a world of one trains as the plain model bit for bit with Adam (above), so its consolidated state
    # must equal the plain optimizer's state_dict exactly: every moment in its parameter's shape. The
    # layer-wise optimizers add each norm's squares in another order (by parameter, from the flat shard):
    # equal to float64 rounding, and NovoGrad's v one 0-d array per parameter, as one process keeps it.
    tolerance = dict(rtol=0, atol=0) if kind == "adam" else dict(rtol=1e-12, atol=1e-15)
    plain = make_sequential()
    plain_opt = make_optimizer(kind, plain.parameters())
    train_sequential(plain, plain_opt, 12)
    sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer(kind, sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    weights, state = sharded.consolidated_state_dict(), opt.consolidated_state_dict()
    if stage == 3:
        assert all(p.array.size == 0 for p in sharded.module.parameters())  # freed again after the gather
    want = plain_opt.state_dict()
    assert [g["params"] for g in state["param_groups"]] == [g["params"] for g in want["param_groups"]]
    assert sorted(state["state"]) == sorted(want["state"])
    for pos, entry in want["state"].items():
        assert sorted(state["state"][pos]) == sorted(entry)
        for key, value in entry.items():
            got = state["state"][pos][key]
            assert np.shape(got) == np.shape(value) and type(got) is type(value), (pos, key, got, value)
            np.testing.assert_allclose(np.asarray(got), np.asarray(value), **tolerance)
    for name, value in plain.state_dict().items():
        np.testing.assert_allclose(weights[name], value, **tolerance)
    assert state.get("switch") == want.get("switch")  # SWATS's estimate and step, kept as one process keeps them
    # it resumes in one process: a plain optimizer loads it (its checks: each entry's keys, shapes, dtypes)
    resumed = make_sequential()
    resumed.load_state_dict(weights)
    resumed_opt = make_optimizer(kind, resumed.parameters())
    resumed_opt.load_state_dict(state)
    # loaded into a fresh sharded model, the shards and their state are those of the trained one
    again = parallel.ShardedDataParallel(make_sequential(seed=5), parallel.LocalComm(), stage=stage)
    again_opt = parallel.DistributedOptimizer(make_optimizer(kind, again.parameters()), again)
    again.load_state_dict(weights)
    again_opt.check_state_dict(state)
    again_opt.load_state_dict(state)
    for got, want_shard in zip(again.parameters(), sharded.parameters()):
        np.testing.assert_array_equal(got.array, want_shard.array)
    for (_, got), (_, want_entry) in zip(sorted(again_opt.optimizer.state.items()),
                                         sorted(opt.optimizer.state.items())):
        for key in want_entry:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want_entry[key]))
    # and both go on as one: a step more of each, from the same batch
    train_sequential(again, again_opt, 12)
    train_sequential(sharded, opt, 12)
    for got, want_shard in zip(again.parameters(), sharded.parameters()):
        np.testing.assert_array_equal(got.array, want_shard.array)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_state_that_does_not_fit_names_the_parameter_and_the_shapes(stage):
    sharded = parallel.ShardedDataParallel(make_sequential(), parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    before = [p.array.copy() for p in sharded.parameters()]
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
        np.testing.assert_array_equal(got.array, want)
    if stage == 3:
        assert all(p.array.size == 0 for p in sharded.module.parameters())


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
        results.append([p.array.copy() for p in model.parameters()])
    moved = max(float(np.abs(a - b).max()) for a, b in zip(results[0], [p.array for p in
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
            assert all(p.array.size == 0 for p in sharded.module.parameters())
        assert histogram_values(trainer, (x, y), compute=False) == []
    # the ranks other than 0 take part without a writer (nor tensorboardX), and count validations alike
    silent = TensorBoardLogger("unused", write=False, histogram_every=2)
    for step in (1, 2, 3):
        silent.on_evaluate(trainer, {"step": step, "val_loss": 1.0})
    assert silent.writer is None and silent.state_dict() == {"validations": 3}


# ---------------------------------------------------------------- the layer-wise optimizers on the shards
@pytest.mark.parametrize("stage", [2, 3])
def test_the_shards_norms_are_the_parameters_norms_and_spread_back_over_their_elements(stage):
    model = make_sequential()
    params = [p.array.copy() for p in model.parameters()]
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=stage)
    groups = [params] if stage == 2 else [[params[0]], [params[1], params[2]], [params[3]]]
    for shard, arrays in zip(sharded.parameters(), groups):
        layers = shard.layers
        want = np.array([np.sqrt((a ** 2).sum()) for a in arrays])
        np.testing.assert_allclose(layers.layer_norms(shard.array), want, rtol=1e-14)
        assert layers.layer_norms(shard.array).shape == (len(arrays),)
        assert list(layers.ndims) == [a.ndim for a in arrays]
        sizes = [a.size for a in arrays]
        np.testing.assert_array_equal(layers.ndim, np.repeat([a.ndim for a in arrays], sizes))
        spread = layers.per_element(np.arange(1.0, len(arrays) + 1))
        np.testing.assert_array_equal(spread, np.repeat(np.arange(1.0, len(arrays) + 1), sizes))
        np.testing.assert_allclose(layers.norm(shard.array), np.repeat(want, sizes), rtol=1e-14)  # per element


class _SecondOfTwo(parallel.LocalComm):
    """Rank 1 of 2, alone: its all-reduce leaves its own part (what that rank adds to the sum)."""
    rank, size = 1, 2


def test_the_padding_enters_no_norm_and_takes_no_value():
    from minidl.parallel.sharded import FlatShard
    rng = np.random.default_rng(3)
    weight, bias = nn.Parameter(rng.normal(size=(3, 4))), nn.Parameter(rng.normal(size=3))
    unit = FlatShard([weight, bias], _SecondOfTwo(), "a layer", keep_full=True)
    # 15 elements on 2 ranks: chunks of 8, rank 1 holds weight's last 4, the bias, and 1 of padding
    assert (unit.chunk, unit.padded) == (8, 16)
    x = unit.shard.array.copy()
    np.testing.assert_array_equal(x[:7], np.concatenate([weight.array.ravel()[8:], bias.array]))
    x[7] = 1e6  # whatever the padding holds, it must not count
    want = [np.sqrt((weight.array.ravel()[8:] ** 2).sum()), np.sqrt((bias.array ** 2).sum())]
    np.testing.assert_allclose(unit.shard.layers.layer_norms(x), want, rtol=1e-14)
    np.testing.assert_array_equal(unit.shard.layers.per_element(np.array([2.0, 3.0])), [2, 2, 2, 2, 3, 3, 3, 0])
    np.testing.assert_array_equal(unit.shard.layers.ndim, [2, 2, 2, 2, 1, 1, 1, 0])  # LARS leaves the padding alone


LAYERWISE = {
    "lamb": lambda params: optim.LAMB(params, lr=0.01, weight_decay=0.01),
    "lars": lambda params: optim.LARS(params, lr=0.5, momentum=0.9, trust_coefficient=0.02, weight_decay=0.01),
    "novograd": lambda params: optim.NovoGrad(params, lr=0.05, weight_decay=0.01),
    "rangerlars": lambda params: optim.RangerLARS(params, lr=0.01, weight_decay=0.01, k=2),
}


@pytest.mark.parametrize("kind", list(LAYERWISE))
@pytest.mark.parametrize("stage", [2, 3])
def test_a_world_of_one_trains_with_a_layerwise_optimizer_as_the_plain_model(stage, kind):
    """Trust ratios and NovoGrad's v per parameter, not per shard: the plain run's weights to float64
    rounding (each norm adds its squares in another order), though the first stage-2 step alone moves
    the weights by more than 1e-3 from where one norm over the whole shard would take them."""
    plain = make_sequential()
    start = [p.array.copy() for p in plain.parameters()]
    train_sequential(plain, LAYERWISE[kind](plain.parameters()), 12)
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=stage)
    opt = parallel.DistributedOptimizer(LAYERWISE[kind](sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    sharded.gather_parameters()
    assert max(np.abs(p.array - s).max() for p, s in zip(plain.parameters(), start)) > 1e-2  # it trained
    for got, want in zip(model.parameters(), plain.parameters()):
        np.testing.assert_allclose(got.array, want.array, rtol=0, atol=1e-13)


def test_one_norm_over_a_whole_shard_would_not_be_the_plain_step():
    """What the shard's layers fix: one LAMB step over the stage-2 shard equals the plain step of each
    parameter with their norm, and misses it by far with one norm over the whole shard (so the tests can fail)."""
    from minidl.optim import layerwise
    from minidl.optim.layerwise import lamb_update
    rng = np.random.default_rng(4)
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=2)
    shard = sharded.units[0][1].shard
    grads = [rng.normal(size=p.shape) * scale for p, scale in zip(model.parameters(), (1.0, 0.01, 3.0, 0.1))]
    want = []
    for p, g in zip(model.parameters(), grads):
        w = p.array.copy()
        lamb_update(w, g, np.zeros_like(w), np.zeros_like(w), t=1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6,
                    weight_decay=0.01)
        want.append(w.ravel())
    want = np.concatenate(want)
    g = np.concatenate([g.ravel() for g in grads])
    for norm, close in ((shard.layers.norm, True), (layerwise.norm, False)):
        w = shard.array.copy()
        lamb_update(w, g, np.zeros_like(w), np.zeros_like(w), t=1, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-6,
                    weight_decay=0.01, norm=norm)
        if close:
            np.testing.assert_allclose(w, want, rtol=0, atol=1e-14)
        else:
            assert np.abs(w - want).max() > 1e-3


def test_a_layerwise_optimizer_inside_a_wrapper_still_takes_the_norms_per_parameter():
    """OffloadedOptimizer steps each parameter through ``update_parameter``, so the shard's layers reach LAMB."""
    from minidl.optim.offload import OffloadedOptimizer
    plain = make_sequential()
    train_sequential(plain, LAYERWISE["lamb"](plain.parameters()), 12)
    model = make_sequential()
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=2)
    opt = parallel.DistributedOptimizer(OffloadedOptimizer(LAYERWISE["lamb"](sharded.parameters())), sharded)
    with pytest.warns(UserWarning, match="on the CPU"):
        train_sequential(sharded, opt, 12)
    sharded.gather_parameters()
    for got, want in zip(model.parameters(), plain.parameters()):
        np.testing.assert_allclose(got.array, want.array, rtol=0, atol=1e-13)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_world_of_one_switches_from_adam_to_sgd_as_the_plain_model(stage):
    """SWATS on the shards: its sums pᵀp and pᵀg are the pieces' (one per parameter, summed as one process
    sums its tensors), so it switches after the same step with the same rate Λ, and the weights are the
    plain run's bit for bit, the SGD step after the switch included. The all-reduce of the two sums is
    counted once per Adam step (2 float64 numbers), none on SGD."""
    from .mp_scenarios import STEPS, SWITCH_AT
    plain = make_sequential()
    plain_opt = make_optimizer("switch", plain.parameters())
    train_sequential(plain, plain_opt, 12)
    assert plain_opt.switched_at == [SWITCH_AT] and SWITCH_AT < STEPS  # it switched, and SGD stepped after
    model = make_sequential()
    comm = parallel.LocalComm()
    sharded = parallel.ShardedDataParallel(model, comm, stage=stage)
    opt = parallel.DistributedOptimizer(make_optimizer("switch", sharded.parameters()), sharded)
    comm.reset_traffic()
    train_sequential(sharded, opt, 12)
    assert opt.optimizer.switch == plain_opt.switch
    assert opt.param_groups[0]["lr"] == plain_opt.param_groups[0]["lr"] == plain_opt.switch[0]["estimate"]
    assert comm.traffic["allreduce"] == SWITCH_AT * 2 * 8
    sharded.gather_parameters()
    for got, want in zip(model.parameters(), plain.parameters()):
        np.testing.assert_array_equal(got.array, want.array)


def test_the_swats_sums_take_each_shards_pieces_without_the_padding():
    """``dots`` over rank 1's shard of a unit of 15 elements on 2 ranks: one term per piece, Σ aᵢbᵢ of its
    parameter's elements, whatever the padding holds; ``complete_sums_`` all-reduces the group's sums in
    place (16 bytes for two float64 numbers). A group mixing shards with whole parameters is refused."""
    from minidl.optim.layerwise import WholeParameter
    from minidl.parallel.sharded import FlatShard
    rng = np.random.default_rng(3)
    weight, bias = nn.Parameter(rng.normal(size=(3, 4))), nn.Parameter(rng.normal(size=3))
    comm = _SecondOfTwo()
    unit = FlatShard([weight, bias], comm, "a layer", keep_full=True)
    a, b = rng.normal(size=8), rng.normal(size=8)
    a[7] = b[7] = 1e6  # the padding: it must not count
    want = [sum(a[i] * b[i] for i in range(4)), sum(a[i] * b[i] for i in range(4, 7))]
    np.testing.assert_allclose([float(x) for x in unit.shard.layers.dots(a, b)], want, rtol=1e-14)
    assert WholeParameter(1).dots(a, b)[0] == (a * b).sum()
    sums = np.array([1.0, 2.0])
    comm.reset_traffic()
    assert unit.shard.layers.complete_sums_(sums) is sums and comm.traffic == {"allreduce": 16}
    assert WholeParameter(1).complete_sums_(sums) is sums
    extra = nn.Parameter(np.ones(3))
    extra.grad, unit.shard.grad = nn.Parameter(np.ones(3)), nn.Parameter(np.ones(8))
    opt = optim.SwitchOptimizer([unit.shard, extra])
    with pytest.raises(ValueError, match=r"SwitchOptimizer: parameter group 0 mixes .*ShardLayers.*"
                                         r"WholeParameter.* separate parameter groups"):
        opt.step()


def test_stage_3_splits_a_block_larger_than_a_bucket_into_its_layers():
    """A nested Sequential holding more than bucket_bytes is gathered layer by layer (its own units), one that
    fits stays one unit; either way the run is the plain model's (the nested blocks are the same chain)."""
    plain = make_sequential()
    layers = list(make_sequential())
    model = nn.Sequential(nn.Sequential(*layers[:3]), nn.Sequential(*layers[3:]))  # 148 and 15 float64 numbers
    sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=3, bucket_bytes=600)
    assert [p.shape for p in sharded.parameters()] == [(78,), (70,), (15,)]
    assert [unit.name for _, unit in sharded.units if unit is not None] == [
        "layer 0.0 (Linear)", "layer 0.2 (Linear)", "layer 1 (Sequential)"]
    opt = parallel.DistributedOptimizer(make_optimizer("adam", sharded.parameters()), sharded)
    train_sequential(sharded, opt, 12)
    reference = make_optimizer("adam", plain.parameters())
    train_sequential(plain, reference, 12)
    sharded.gather_parameters()
    for got, want in zip(model.parameters(), plain.parameters()):
        np.testing.assert_array_equal(got.array, want.array)
