"""minidl.parallel in one process: sharding, the world of one, bucketing, ZeRO's partition, launch flags."""
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
from minidl import nn, optim, parallel
from minidl.data import DataLoader, TensorDataset
from minidl.ops.loss import cross_entropy
from minidl.parallel import launch


class FakeComm(parallel.LocalComm):
    """A LocalComm that claims a rank and size, for sharding only (no collectives are made)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


# ---------------------------------------------------------------- sharding
@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), size=st.integers(1, 9))
def test_shards_cover_the_batch_in_order_and_differ_by_at_most_one(n, size):
    bounds = [parallel.shard_bounds(n, r, size) for r in range(size)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous, no gap, no overlap
    counts = [stop - start for start, stop in bounds]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_shard_bounds_rejects_a_bad_rank():
    with pytest.raises(ValueError, match="rank must lie in"):
        parallel.shard_bounds(10, 3, 3)


@pytest.mark.parametrize("size, batch, drop_last, shuffle", [(2, 8, False, True), (3, 8, False, True),
                                                              (4, 10, True, True), (2, 8, False, "once")])
def test_sharded_loaders_together_yield_the_original_batches(size, batch, drop_last, shuffle):
    x = np.arange(53 * 2, dtype=np.float32).reshape(53, 2)
    y = np.arange(53)
    original = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=shuffle, seed=4, drop_last=drop_last)
    shards = [parallel.shard_loader(DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=shuffle, seed=4,
                                               drop_last=drop_last), FakeComm(r, size)) for r in range(size)]
    for epoch in range(2):
        want = list(original)
        got = [list(s) for s in shards]
        assert all(len(g) == len(want) for g in got)
        for b, (wx, wy) in enumerate(want):
            np.testing.assert_array_equal(np.concatenate([g[b][0] for g in got]), wx)
            np.testing.assert_array_equal(np.concatenate([g[b][1] for g in got]), wy)


def test_sharded_loader_resumes_where_the_original_stood():
    x = np.arange(40, dtype=np.float32)[:, None]
    loader = DataLoader((x,), batch_size=8, shuffle=True, seed=1)
    it = iter(loader)
    next(it), next(it)
    sharded = parallel.shard_loader(loader, FakeComm(1, 2))
    rest = [b[0] for b in sharded]
    order = loader.epoch_order(0)  # the rest of epoch 0: batches 2, 3, 4; rank 1 holds their second half
    expected = [x[order[b * 8:(b + 1) * 8]][4:] for b in (2, 3, 4)]
    assert len(rest) == 3
    for got, want in zip(rest, expected):
        np.testing.assert_array_equal(got, want)


def test_shard_loader_refuses_a_batch_smaller_than_the_world():
    loader = DataLoader((np.zeros((10, 1)),), batch_size=2)
    with pytest.raises(ValueError, match="smaller than the 4 ranks"):
        parallel.shard_loader(loader, FakeComm(0, 4))


def test_shard_loader_refuses_a_loader_with_its_own_sampler():
    loader = DataLoader((np.zeros((10, 1)),), batch_size=4, sampler=[0, 1, 2, 3, 4])
    with pytest.raises(TypeError, match="no sampler= or batch_sampler="):
        parallel.shard_loader(loader, FakeComm(0, 2))


# ---------------------------------------------------------------- the world of one
def _model(dtype=np.float64):
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype=dtype)


def test_init_without_mpiexec_is_a_world_of_one(monkeypatch):
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    # nor MPI initialized in this process (another test of this worker may have started it: a world of one)
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    monkeypatch.setattr(parallel.world, "_world", None)
    comm = parallel.init()
    assert isinstance(comm, parallel.LocalComm) and (comm.rank, comm.size) == (0, 1)
    assert parallel.init() is comm and parallel.is_root()
    with pytest.raises(ValueError, match="unknown backend"):
        parallel.init("gloo")


def test_gather_object_in_a_world_of_one_gives_the_object_and_names_a_bad_root():
    comm = parallel.LocalComm()
    assert comm.gather_object({"a": 1}) == [{"a": 1}]
    with pytest.raises(ValueError, match=r"LocalComm.gather_object: root=1, but the group's ranks are 0..0"):
        comm.gather_object(1, root=1)


@pytest.mark.parametrize("bucket_bytes", [25 * 2**20, 100])
def test_sync_in_a_world_of_one_keeps_the_gradient_and_makes_new_tensors(bucket_bytes):
    model = _model()
    dp = parallel.DataParallel(model, parallel.LocalComm(), bucket_bytes=bucket_bytes)
    x, y = np.random.default_rng(0).normal(size=(5, 4)), np.array([0, 1, 2, 0, 1])
    cross_entropy(dp(mdl.tensor(x)), mdl.tensor(y)).backward()
    model[2].bias.grad = None  # a parameter without a gradient stays without one
    before = {id(p): (p.grad, None if p.grad is None else p.grad.array.copy()) for p in model.parameters()}
    dp.sync_gradients()
    for p in model.parameters():
        old, values = before[id(p)]
        if old is None:
            assert p.grad is None
            continue
        assert p.grad is not old and not np.shares_memory(p.grad.array, old.array)
        np.testing.assert_array_equal(p.grad.array, values)
        np.testing.assert_array_equal(old.array, values)  # the old buffer was not written
    assert dp.last_sync["samples"] == 5 and dp.last_sync["weight"] == 1.0
    assert dp.last_sync["buckets"] == (1 if bucket_bytes > 1000 else 4)


def test_data_parallel_keeps_the_models_state_dict_keys():
    model = _model()
    dp = parallel.DataParallel(model, parallel.LocalComm())
    assert list(dp.state_dict()) == list(model.state_dict())
    assert [n for n, _ in dp.named_parameters()] == [n for n, _ in model.named_parameters()]
    dp.load_state_dict({k: np.zeros_like(v) for k, v in model.state_dict().items()})
    assert all(not p.array.any() for p in model.parameters())


def test_distributed_optimizer_steps_like_the_wrapped_one():
    a, b = _model(), _model()
    dp = parallel.DataParallel(b, parallel.LocalComm())
    plain, wrapped = optim.Adam(a.parameters(), lr=0.01), optim.Adam(dp.parameters(), lr=0.01)
    dist = parallel.DistributedOptimizer(wrapped, dp)
    assert dist.param_groups is wrapped.param_groups
    x, y = np.random.default_rng(1).normal(size=(6, 4)), np.arange(6) % 3
    for _ in range(3):
        for model, opt in ((a, plain), (dp, dist)):
            opt.zero_grad()
            cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.array, q.array)
    assert set(dist.state_dict()["state"]) == set(plain.state_dict()["state"])


def test_zero_in_a_world_of_one_owns_everything():
    model = _model()
    zero = parallel.ZeroRedundancyOptimizer(model.parameters(), optim.Adam, parallel.LocalComm(), lr=0.01)
    cross_entropy(model(mdl.tensor(np.ones((2, 4)))), mdl.tensor(np.array([0, 1]))).backward()
    zero.step()
    report = zero.memory_report()
    assert report["saved_bytes"] == 0 and report["parameters_owned"] == 4
    assert report["state_bytes"] == 2 * sum(p.array.nbytes for p in model.parameters())  # Adam: m and v
    full = zero.consolidated_state_dict()
    assert sorted(full["state"]) == [0, 1, 2, 3] and full["param_groups"][0]["params"] == [0, 1, 2, 3]


def test_zero_with_parameter_groups_saves_and_loads_what_one_process_does():
    """Two groups (their own lr): the consolidated state is the plain optimizer's, position by position; loaded
    into a fresh ZeRO-1 (each rank cutting its chunks from it), the next steps are the plain run's, bit for bit;
    its own state_dict() loads back only into the same rank of the same layout."""
    def groups(model):
        first, second = list(model.parameters())[:2], list(model.parameters())[2:]
        return [{"params": first, "lr": 0.01}, {"params": second, "lr": 0.03}]

    def train(model, opt, steps, seed):
        x, y = np.random.default_rng(seed).normal(size=(6, 4)), np.arange(6) % 3
        for _ in range(steps):
            opt.zero_grad()
            cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
            opt.step()

    a, b = _model(), _model()
    plain = optim.Adam(groups(a))
    zero = parallel.ZeroRedundancyOptimizer(groups(b), optim.Adam, parallel.LocalComm())
    assert len(zero.units) == 2 and [len(g["params"]) for g in zero.param_groups] == [1, 1]
    train(a, plain, 2, 1)
    train(b, zero, 2, 1)
    full, want = zero.consolidated_state_dict(), plain.state_dict()
    positions = [[0, 1], [2, 3]]
    assert [g["params"] for g in full["param_groups"]] == [g["params"] for g in want["param_groups"]] == positions
    assert [g["lr"] for g in full["param_groups"]] == [0.01, 0.03]
    assert sorted(full["state"]) == sorted(want["state"]) == [0, 1, 2, 3]
    for pos, entry in want["state"].items():
        for key in ("m", "v"):
            np.testing.assert_array_equal(full["state"][pos][key], entry[key])
    c = _model()
    for p, q in zip(c.parameters(), b.parameters()):
        p.array[...] = q.array
    resumed = parallel.ZeroRedundancyOptimizer(groups(c), optim.Adam, parallel.LocalComm())
    resumed.load_state_dict(full)
    train(a, plain, 2, 2)
    train(c, resumed, 2, 2)
    for p, q in zip(a.parameters(), c.parameters()):
        np.testing.assert_array_equal(p.array, q.array)
    own = zero.state_dict()
    assert (own["zero_rank"], own["zero_size"]) == (0, 1)
    resumed.load_state_dict(own)  # the same rank of the same layout
    with pytest.raises(ValueError, match=r"ZeroRedundancyOptimizer.load_state_dict: the state holds the chunks of "
                                         r"rank 1 of 2, this is rank 0 of 1; save consolidated_state_dict\(\)"):
        resumed.load_state_dict({**own, "zero_rank": 1, "zero_size": 2})
    with pytest.raises(ValueError, match="ZeroRedundancyOptimizer.load_state_dict: the optimizer state is for 2 "
                                         "parameters"):
        resumed.load_state_dict(optim.Adam(list(a.parameters())[:2]).state_dict())


@pytest.mark.parametrize("sizes, ranks", [([10, 1, 5, 5], 2), ([3, 3, 3], 4), ([4, 8, 2, 6], 3), ([20, 1], 4)])
def test_zero_partitions_by_elements_each_rank_an_even_contiguous_chunk(sizes, ranks):
    """ZeRO-1 lays the parameters out as one flat vector and gives rank r elements r·⌈Ψ/N⌉ .. (r+1)·⌈Ψ/N⌉
    (zeros pad the end): checked against np.concatenate; each rank's Adam state is its chunk's size, so no
    rank's share depends on how the parameters' sizes fall (one of 20 elements among 21 on 4 ranks)."""
    params = [mdl.tensor(np.arange(n, dtype=np.float64) + 100 * k, requires_grad=True) for k, n in enumerate(sizes)]
    flat = np.concatenate([p.array for p in params])
    chunk = -(-flat.size // ranks)
    padded = np.concatenate([flat, np.zeros(chunk * ranks - flat.size)])
    for rank in range(ranks):
        zero = parallel.ZeroRedundancyOptimizer(params, optim.Adam, FakeComm(rank, ranks), lr=0.01)
        (unit,) = zero.units
        np.testing.assert_array_equal(unit.shard.array, padded[rank * chunk:(rank + 1) * chunk])
        owners = [k for k, n in enumerate(sizes) for _ in range(n)] + [None] * (chunk * ranks - flat.size)
        pieces = {k for k, _, _ in unit.shard.layers.pieces}
        assert pieces == {k for k in owners[rank * chunk:(rank + 1) * chunk] if k is not None}
        for p in params:  # the parameters are views of the flat buffer the chunk is a view of
            p.grad = mdl.tensor(np.ones(p.shape))
        zero.synchronize()
        grad = unit.shard.grad.array
        np.testing.assert_array_equal(grad, (np.arange(chunk) + rank * chunk < flat.size).astype(float))
        zero.optimizer.step()
        assert zero.state_bytes() == 2 * chunk * 8  # m and v of the chunk, float64
        np.testing.assert_array_equal(np.concatenate([p.array for p in params])[rank * chunk:(rank + 1) * chunk],
                                      unit.shard.array[:max(0, min(chunk, flat.size - rank * chunk))])


# ---------------------------------------------------------------- launching
def test_mpiexec_command_has_the_flags_open_mpi_needs(monkeypatch):
    monkeypatch.setattr(launch, "mpi_flavor", lambda path: "openmpi")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    cmd = launch.mpiexec_command(4, ["-m", "minidl", "train"], python="py", mpiexec="/x/mpiexec")
    assert cmd == ["/x/mpiexec", "--allow-run-as-root", "--oversubscribe", "-n", "4", "py", "-m", "mpi4py",
                   "-m", "minidl", "train"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert launch.mpiexec_flags(2, "/x/mpiexec") == []
    monkeypatch.setattr(launch, "mpi_flavor", lambda path: "mpich")
    assert launch.mpiexec_flags(8, "/x/mpiexec") == []
    with pytest.raises(ValueError, match="positive int"):
        launch.mpiexec_command(0, [])


# ---------------------------------------------------------------- overlap
def test_overlap_in_a_world_of_one_gives_the_same_gradients_and_starts_buckets_in_backward():
    from minidl import autograd
    a, b = _model(), _model()
    plain = parallel.DataParallel(a, parallel.LocalComm(), bucket_bytes=100)
    overlapped = parallel.DataParallel(b, parallel.LocalComm(), bucket_bytes=100, overlap=True)
    x, y = np.random.default_rng(2).normal(size=(5, 4)), np.array([0, 1, 2, 0, 1])
    for dp in (plain, overlapped):
        cross_entropy(dp(mdl.tensor(x)), mdl.tensor(y)).backward()
        dp.sync_gradients()
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.grad.array, q.grad.array)
    # buckets of 100 B in reverse order: [2.bias], [2.weight], [0.bias], [0.weight]; the last Linear's two
    # are final after its backward, the first's only at the last node: they start at the sync
    assert overlapped.last_sync["buckets"] == 4 and overlapped.last_sync["started_in_backward"] == 2
    assert autograd.function_hooks.active == ()  # the gradient hook is gone after the sync


def test_overlap_drops_each_packed_gradient_and_adds_the_backwards_of_an_accumulation():
    """Buckets of 100 B, in reverse: the last Linear's two start during the backward and their gradients are
    dropped (the buckets hold them); two micro-batches (5 and 3 samples) before one sync give what one
    process accumulates, the sum of each micro-batch's mean-loss gradient (each weighted 5/5 and 3/3 here)."""
    a, b = _model(), _model()
    overlapped = parallel.DataParallel(b, parallel.LocalComm(), bucket_bytes=100, overlap=True)
    rng = np.random.default_rng(3)
    batches = [(rng.normal(size=(n, 4)), rng.integers(0, 3, size=n)) for n in (5, 3)]
    dropped = []
    for x, y in batches:
        cross_entropy(a(mdl.tensor(x)), mdl.tensor(y)).backward()
        cross_entropy(overlapped(mdl.tensor(x)), mdl.tensor(y)).backward()
        dropped.append([p.grad is None for p in b.parameters()])
    assert dropped == [[False, False, True, True]] * 2
    overlapped.sync_gradients()
    assert overlapped.last_sync["samples"] == 8
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(q.grad.array, p.grad.array, rtol=1e-15, atol=1e-17)


def test_overlap_counts_the_uses_of_two_forwards_before_one_backward():
    """forward(x1), forward(x2), one loss over both: a parameter is final only after both forwards' uses."""
    a, b = _model(), _model()
    overlapped = parallel.DataParallel(b, parallel.LocalComm(), bucket_bytes=100, overlap=True)
    x1, x2 = np.random.default_rng(4).normal(size=(2, 3, 4))
    (a(mdl.tensor(x1)) * a(mdl.tensor(x2))).sum().backward()
    (overlapped(mdl.tensor(x1)) * overlapped(mdl.tensor(x2))).sum().backward()
    overlapped.sync_gradients()
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(q.grad.array, p.grad.array, rtol=1e-15, atol=1e-17)


def test_overlap_refuses_a_late_sample_count_and_recovers_from_a_forward_without_sync():
    from minidl import autograd
    dp = parallel.DataParallel(_model(), parallel.LocalComm(), overlap=True)
    x, y = np.ones((2, 4)), np.array([0, 1])
    cross_entropy(dp(mdl.tensor(x)), mdl.tensor(y)).backward()
    with pytest.raises(ValueError, match="num_samples cannot change them"):
        dp.sync_gradients(num_samples=4)
    cross_entropy(dp(mdl.tensor(x)), mdl.tensor(y)).backward()  # its hook opened during backward
    dp(mdl.tensor(x))                                            # a new forward first closes it
    assert autograd.function_hooks.active == ()


@pytest.mark.parametrize("how", ["plain", "overlap", "zero"])
def test_adahessian_under_data_parallelism_in_a_world_of_one_steps_like_the_plain_one(how):
    """The all-reduced gradients carry no graph: DistributedOptimizer probes the Hessian first (probe_gradients),
    with the same z; in a world of one the reduce is the identity and every number is the plain run's, bit for bit."""
    a, b = _model(), _model()
    plain = optim.AdaHessian(a.parameters(), lr=0.05, seed=4)
    dp = parallel.DataParallel(b, parallel.LocalComm(), overlap=how == "overlap")
    inner = (parallel.ZeroRedundancyOptimizer(dp.parameters(), optim.AdaHessian, parallel.LocalComm(), lr=0.05,
                                              seed=4) if how == "zero" else optim.AdaHessian(dp.parameters(), lr=0.05,
                                                                                             seed=4))
    dist = parallel.DistributedOptimizer(inner, dp)
    assert dist.requires_create_graph
    x, y = np.random.default_rng(1).normal(size=(6, 4)), np.arange(6) % 3
    start = [p.array.copy() for p in a.parameters()]
    for _ in range(3):
        for model, opt in ((a, plain), (dp, dist)):
            opt.zero_grad()
            cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward(create_graph=True)
            opt.step()
    assert max(np.abs(p.array - s).max() for p, s in zip(a.parameters(), start)) > 1e-2
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(p.array, q.array)
