"""CPU against "cuda" (the CuPy stand-in without a GPU) beyond single ops: every optimizer through its
fused GPU kernel, the layers with their own device code, the profiler, the memory tracker, data
parallelism and ZeRO on the local communicator, and the roofline suite's GPU branches."""
import inspect

import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim
from minidl.selftest.parity import OPTIMIZERS, compare_optimizer


def test_every_optimizer_is_listed():
    listed = {getattr(optim, n) for n in optim.__all__ if inspect.isclass(getattr(optim, n)) and issubclass(
        getattr(optim, n), optim.Optimizer) and n not in ("Optimizer", "Lookahead", "SWA", "LBFGS")}
    # LBFGS has no fused kernel (plain xp calls on the whole vector): tests/optim/test_lbfgs.py runs it on both devices
    assert listed == {getattr(optim, n) for n in OPTIMIZERS}  # classes: PyTorch's names and minidl's are one


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_on_cuda_matches_the_cpu_through_its_fused_kernel(name, standin_or_gpu):
    problems = compare_optimizer(name, "cuda")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("make,shape,integer", [
    (lambda: nn.Conv2d(2, 3, 3, padding=1, stride=2), (2, 2, 7, 7), False),
    (lambda: nn.RNN(4, 5, num_layers=2), (6, 2, 4), False),
    (lambda: nn.LSTM(4, 5, bidirectional=True), (6, 2, 4), False),
    (lambda: nn.GRU(4, 5, batch_first=True), (2, 6, 4), False),
    (lambda: nn.Embedding(7, 3), (4, 5), True),
], ids=["conv2d", "rnn", "lstm", "gru", "embedding"])
def test_layer_on_cuda_matches_the_cpu(make, shape, integer, standin_or_gpu):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 7, shape) if integer else rng.standard_normal(shape).astype(np.float32)
    results = []
    for device in ("cpu", "cuda"):
        mdl.manual_seed(0)
        layer = make().to(device)
        x = mdl.tensor(data, device=device, requires_grad=not integer)
        out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        (out * out).sum().backward()
        grads = [p.grad.numpy() for p in layer.parameters()]
        results.append((out.numpy(), grads, None if integer else x.grad.numpy()))
    (out_cpu, grads_cpu, gx_cpu), (out_cuda, grads_cuda, gx_cuda) = results
    np.testing.assert_allclose(out_cuda, out_cpu, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_cpu, grads_cuda):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    if gx_cpu is not None:
        np.testing.assert_allclose(gx_cuda, gx_cpu, rtol=1e-4, atol=1e-5)


def _mlp_step(device):
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(device)
    x = mdl.tensor(np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32), device=device)
    return model, x


@pytest.mark.parametrize("synchronize", [False, True])
def test_profiler_on_cuda_times_each_op(synchronize, standin_or_gpu):
    """With CUDA events (GPU time per row), or synchronizing around each op (wall time only)."""
    from minidl import profiler
    model, x = _mlp_step("cuda")
    with profiler.profile(synchronize=synchronize) as prof:
        model(x).sum().backward()
    rows = [r for r in prof.rows() if r.name != profiler.ENGINE]
    assert prof.cuda and rows and all(r.total > 0 for r in rows)
    assert all((r.gpu is None) == synchronize for r in rows)
    with profiler.profile(cuda=False) as cpu_prof:
        _mlp_step("cpu")[0](_mlp_step("cpu")[1]).sum().backward()
    assert {(r.name, r.phase) for r in rows} == {(r.name, r.phase) for r in cpu_prof.rows()
                                                   if r.name != profiler.ENGINE}


def test_memory_tracker_counts_the_same_bytes_on_cuda(standin_or_gpu):
    from minidl import memory
    peaks = {}
    for device in ("cpu", "cuda"):
        model, x = _mlp_step(device)
        with memory.track() as tracker:
            loss = model(x).sum()
            peaks[device] = tracker.peak_bytes
            loss.backward()
        if device == "cuda":
            assert tracker.pool_start_bytes is not None and tracker.pool_peak_bytes >= tracker.pool_start_bytes
            assert "CuPy memory pool" in tracker.report()
    assert peaks["cuda"] == peaks["cpu"] > 0


def _train(device, wrap):
    """Three Adam steps; with ``wrap`` through DataParallel or ZeRO on a one-rank local communicator that
    records the device of every buffer it is handed (the all-reduces must stay on the GPU)."""
    from minidl import parallel

    class Recording(parallel.LocalComm):
        def __init__(self):
            self.seen = []

        def allreduce_(self, array):
            self.seen.append(backend.device_of(array))
            return array

        def broadcast_(self, array, root=0):
            self.seen.append(backend.device_of(array))
            return array

        def allgather(self, array):
            self.seen.append(backend.device_of(array))
            return super().allgather(array)

    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(device)
    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.standard_normal((16, 6)).astype(np.float32), device=device)
    y = mdl.tensor(rng.integers(0, 3, 16), device=device)
    comm = Recording()
    if wrap == "zero":
        opt = parallel.ZeroRedundancyOptimizer(model.parameters(), optim.Adam, comm=comm, lr=0.01)
        net = model
    elif wrap == "dp":
        net, opt, _ = parallel.prepare_data_parallel(model, optim.Adam(model.parameters(), lr=0.01), comm=comm)
    else:
        net, opt = model, optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        mdl.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return [p.numpy() for p in model.parameters()], comm.seen


@pytest.mark.parametrize("wrap", ["dp", "zero"])
def test_data_parallel_and_zero_on_cuda_with_the_local_communicator(wrap, standin_or_gpu):
    plain, _ = _train("cpu", None)
    wrapped, seen = _train("cuda", wrap)
    for a, b in zip(plain, wrapped):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert seen and set(seen) == {"cuda:0"}, seen


def test_roofline_suite_runs_its_gpu_branches(standin_or_gpu, tmp_path):
    from minidl.roofline import suite
    from minidl.roofline.ceilings import Ceilings
    tiny = Ceilings("cuda", peak_flops=100e9, copy_bandwidth=10e9, triad_bandwidth=8e9, cache_bandwidth=30e9,
                    gemm_size=64, stream_bytes=1 << 16, threads=1)
    results = suite.run("cuda", quick=True, out_dir=str(tmp_path), machine="standin", frameworks=("minidl",),
                        ceilings=tiny, repeat=1, min_time=0.0, log=None)
    assert results["json"]


def test_roofline_ceilings_measure_on_cuda(standin_or_gpu):
    from minidl.roofline import ceilings
    measured = ceilings.measure("cuda", gemm_size=32, stream_bytes=1 << 14) if "gemm_size" in inspect.signature(
        ceilings.measure).parameters else ceilings.measure("cuda")
    assert measured.peak_flops > 0 and measured.triad_bandwidth > 0


def test_saved_tensors_keep_their_device(standin_or_gpu, tmp_path):
    x = mdl.randn(3, 2, device="cuda")
    mdl.save({"x": x}, tmp_path / "x.safetensors")
    np.testing.assert_array_equal(mdl.load(tmp_path / "x.safetensors")["x"], x.numpy())
    assert backend.is_device_array(x.array)
