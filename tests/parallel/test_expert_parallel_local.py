"""All-to-all and expert parallelism in one process: the world of one, NCCL's grouped calls laid out by hand,
the cost formulas by hand, a Trainer run equal to the plain model's, and bad input."""
import types

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim, parallel
from minidl.parallel import comm as comm_module
from minidl.parallel import cost_model
from minidl.parallel.expert import ExpertParallel, ExpertParallelMoE, ExpertParallelOptimizer, expert_parallel


class FakeComm(parallel.LocalComm):
    """A LocalComm that claims a rank and size, to build layers (no collective is made)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


# ---------------------------------------------------------------- the world of one
def test_all_to_all_of_one_rank_is_a_copy_and_is_counted():
    world = parallel.LocalComm()
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    y = world.all_to_all(x)
    np.testing.assert_array_equal(y, x)
    assert y is not x and not np.shares_memory(x, y)
    rows = np.arange(10, dtype=np.float64).reshape(5, 2)
    got, counts = world.all_to_all_v(rows, [5])
    np.testing.assert_array_equal(got, rows)
    assert counts == [5] and got is not rows
    # the block exchange's 24 bytes, the count (one int64) and the 80 bytes of rows
    assert world.traffic == {"all_to_all": 24 + 8, "all_to_all_v": 80}


def test_all_to_all_refuses_shapes_and_counts_that_do_not_fit_the_world():
    world = FakeComm(0, 3)
    with pytest.raises(ValueError, match=r"all_to_all takes an array of shape \(3, \.\.\.\), one row per rank; "
                                         r"got shape \(2, 4\)"):
        parallel.LocalComm.all_to_all(world, np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"send_counts must be 3 whole counts >= 0 .* adding up to send's 4 rows"):
        world.all_to_all_v(np.zeros((4, 2)), [1, 1, 1])
    with pytest.raises(ValueError, match="send_counts must be 3 whole counts"):
        world.all_to_all_v(np.zeros((4, 2)), [5, -1, 0])
    with pytest.raises(ValueError, match=r"recv_counts must be 3 counts >= 0"):
        world.all_to_all_v(np.zeros((4, 2)), [2, 2, 0], recv_counts=[1, 1])


# ---------------------------------------------------------------- NCCL: the grouped sends and receives, laid out
def test_nccl_all_to_all_v_sends_and_receives_each_peers_bytes_inside_one_group():
    """ncclGroupStart, then per peer an ncclSend of its rows and an ncclRecv of the rows from it (as bytes, at the
    offsets the counts give; nothing for an empty block), then ncclGroupEnd, then the watchdog's event: read from
    a recording binding (the real binding's argument checks: test_nccl_binding.py)."""
    calls = []

    class Buffer:
        def __init__(self, shape, dtype, ptr):
            self.shape, self.dtype, self.size = tuple(shape), np.dtype(dtype), int(np.prod(shape))
            self.flags = types.SimpleNamespace(c_contiguous=True)
            self.data = types.SimpleNamespace(ptr=ptr)

    binding = types.SimpleNamespace(NCCL_UINT8=1, groupStart=lambda: calls.append("start"),
                                    groupEnd=lambda: calls.append("end"))
    world = object.__new__(comm_module.NCCLComm)
    world.nccl_module, world.mpi, world.rank, world.size = binding, None, 1, 3
    world.cp = types.SimpleNamespace(empty=lambda shape, dtype: Buffer(shape, dtype, 5000),
                                     cuda=types.SimpleNamespace(
                                         get_current_stream=lambda: types.SimpleNamespace(ptr=9),
                                         Event=lambda **_: types.SimpleNamespace(
                                             record=lambda stream: calls.append(("watch", stream.ptr)), done=True)))
    world.comm = types.SimpleNamespace(send=lambda *a: calls.append(("send",) + a),
                                       recv=lambda *a: calls.append(("recv",) + a))
    send = Buffer((5, 2), "float32", 1000)  # 8 bytes a row: 2 rows for rank 0, none for rank 1, 3 for rank 2
    out = world._all_to_all_v(send, [2, 0, 3], [1, 4, 0])
    assert out.shape == (5, 2) and out.dtype == np.float32
    assert calls == ["start",
                     ("send", 1000, 16, 1, 0, 9), ("recv", 5000, 8, 1, 0, 9),
                     ("recv", 5008, 32, 1, 1, 9),
                     ("send", 1016, 24, 1, 2, 9),
                     "end", ("watch", 9)]  # the watchdog's event, after the group is launched


# ---------------------------------------------------------------- the cost model by hand
def test_all_to_all_and_expert_parallel_bytes_by_hand():
    assert cost_model.all_to_all_bytes(1000, 4) == pytest.approx(750)  # 3 of the 4 rows leave
    assert cost_model.all_to_all_bytes(1000, 1) == 0.0
    # 6 rows out, 4 in; in = 8, out = 4 features; float32: forward 6·8 + 4·4, backward 6·4 + 4·8 values
    payloads = cost_model.expert_parallel_step_payloads(6, 4, 8, 4, experts=4, itemsize=4, replicated_bytes=100)
    assert payloads == {"all_to_all": 32, "all_to_all_v": (48 + 16 + 24 + 32) * 4, "allreduce": 100}
    assert cost_model.expert_parallel_step_payloads(6, 4, 8, 4, 4, input_grad=False)["all_to_all_v"] == 88 * 4
    assert cost_model.expert_parallel_step_bytes(2, rows_sent=6, rows_received=4, in_features=8, out_features=4,
                                                 experts=4, replicated_bytes=100) == pytest.approx(
        0.5 * 32 + 0.5 * 480 + 100)  # all-to-alls send half, the all-reduce 2·(1/2) of its payload


# ---------------------------------------------------------------- the layer and the wrapper
def _net(groups=1):
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.MoE(8, 5, 4, num_experts=4, k=2, capacity_factor=0.75, groups=groups),
                         nn.Linear(4, 3)).to(dtype=np.float64)


def test_a_rank_keeps_its_block_of_experts_under_the_plain_names():
    plain = _net()
    layer = ExpertParallelMoE(_net()[1], FakeComm(1, 2))
    names = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    assert list(layer.state_dict()) == ["router.weight"] + [f"experts.{e}.{n}" for e in (2, 3) for n in names]
    for key, value in layer.state_dict().items():
        np.testing.assert_array_equal(value, plain[1].state_dict()[key])


def test_in_a_world_of_one_a_trainer_run_equals_the_plain_models():
    from minidl.train import Trainer
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(8, 6)), rng.integers(0, 3, 8)) for _ in range(3)]
    states = []
    for wrap in (False, True):
        model = _net()
        opt = optim.Adam(model.parameters(), lr=0.01)
        if wrap:
            model = expert_parallel(model, parallel.LocalComm())
            opt = ExpertParallelOptimizer(opt, model)
        moe = model[1] if not wrap else model.module[1]
        loss_fn = lambda out, y, moe=moe: mdl.functional.cross_entropy(out, y) + 0.1 * moe.aux_loss  # noqa: E731
        Trainer(model, opt, batches, loss_fn=loss_fn, max_grad_norm=0.2, progress=False, metrics=()).fit(epochs=1)
        states.append((model.consolidated_state_dict() if wrap else model.state_dict(),
                       opt.consolidated_state_dict() if wrap else opt.state_dict()))
        assert moe.dropped_tokens > 0  # capacity 0.75: the run drops tokens, and still matches
    (plain, plain_opt), (split, split_opt) = states
    assert list(split) == list(plain)
    for key in plain:
        np.testing.assert_allclose(np.asarray(split[key]), np.asarray(plain[key]), rtol=1e-12, atol=1e-15)
    assert sorted(split_opt["state"]) == sorted(plain_opt["state"])
    for pos, entry in plain_opt["state"].items():
        for k, v in entry.items():
            np.testing.assert_allclose(np.asarray(split_opt["state"][pos][k]), np.asarray(v), rtol=1e-12, atol=1e-15)


def test_a_whole_state_loads_back_and_the_rank_keeps_its_experts():
    world = parallel.LocalComm()
    source = _net()
    with mdl.no_grad():
        for p in source.parameters():
            p.array[...] += 1.0
    model = expert_parallel(_net(), world)
    model.load_state_dict(source.state_dict())
    for key, value in source.state_dict().items():
        np.testing.assert_array_equal(model.state_dict()[key], value)


def test_bad_layouts_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"4 experts do not divide among 3 ranks; run on 1, 2, 4 ranks"):
        ExpertParallelMoE(_net()[1], FakeComm(0, 3))
    with pytest.raises(ValueError, match="the plain layer has groups=2; .* build the layer with groups=1"):
        ExpertParallelMoE(_net(groups=2)[1], FakeComm(0, 2))
    with pytest.raises(ValueError, match="has no expert-parallel MoE layer"):
        ExpertParallel(nn.Linear(2, 2), parallel.LocalComm())
    with pytest.raises(TypeError, match="model must be an ExpertParallel"):
        ExpertParallelOptimizer(optim.SGD(_net().parameters(), lr=0.1), _net())


def test_the_exchange_op_of_one_rank_is_the_identity_in_both_modes():
    """AllToAllV in a world of one: y = x, its backward (the exchange reversed) and its tangent rule (the same
    exchange) the identity too, checked by finite differences and forward mode (2 and 4 ranks: the MPI test)."""
    from minidl.parallel.expert import all_to_all_v
    world = parallel.LocalComm()
    x = mdl.tensor(np.random.default_rng(6).normal(size=(4, 3)), requires_grad=True)
    f = lambda t: all_to_all_v(t, world, [4], [4]) * 2.0  # noqa: E731
    assert mdl.gradcheck(f, (x,))
    v = mdl.tensor(np.random.default_rng(7).normal(size=(4, 3)))
    y, tangent = mdl.func.jvp(f, (x,), (v,))
    np.testing.assert_array_equal(y.numpy(), 2.0 * x.numpy())
    np.testing.assert_array_equal(tangent.numpy(), 2.0 * v.numpy())
