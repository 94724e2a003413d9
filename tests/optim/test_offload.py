"""Offloaded optimizer state: on "cuda" (the CuPy stand-in, or a GPU) the updates are the on-device
optimizer's and the device holds no state between steps; on the CPU a warning says nothing changes."""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim
from minidl.optim.offload import OffloadedOptimizer, offload, state_bytes
from tests.conftest import REAL_GPU


def _model(device):
    mdl.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    return model.to(device)


def _train(model, opt, device, steps=3):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = mdl.tensor(rng.standard_normal((8, 6)).astype(np.float32)).to(device)
        opt.zero_grad()
        (model(x) ** 2).mean().backward()
        opt.step()
    return [backend.to_numpy(p.array) for p in model.parameters()]


def _same(a, b, exact):
    if exact:
        np.testing.assert_array_equal(a, b)
    else:  # NumPy on the host against the fused CUDA kernel: a few roundings apart at most
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


MAKERS = {"Adam": lambda ps: optim.Adam(ps, lr=1e-2), "AMSGrad": lambda ps: optim.AMSGrad(ps, lr=1e-2),
          "SGDM": lambda ps: optim.SGDM(ps, lr=0.1, beta=0.9), "LAMB": lambda ps: optim.LAMB(ps, lr=1e-2)}


@pytest.mark.parametrize("mode,chunk_bytes", [("host", 2**26), ("stream", 2**26), ("stream", 300)])
@pytest.mark.parametrize("name", list(MAKERS))
def test_offloaded_updates_are_the_on_device_optimizers(standin_or_gpu, name, mode, chunk_bytes):
    make = MAKERS[name]
    plain_model, off_model = _model("cuda"), _model("cuda")
    plain_opt = make(plain_model.parameters())
    off_opt = offload(make(off_model.parameters()), mode=mode, chunk_bytes=chunk_bytes)
    expected, got = _train(plain_model, plain_opt, "cuda"), _train(off_model, off_opt, "cuda")
    for a, b in zip(got, expected):  # the same kernels (stream), or the stand-in's NumPy arithmetic
        _same(a, b, exact=mode == "stream" or not REAL_GPU)
    # the state: all on the device without offload, all on the host with it
    param_bytes = sum(p.array.nbytes for p in plain_model.parameters())
    moments = {"Adam": 2, "AMSGrad": 3, "SGDM": 1, "LAMB": 2}[name]
    assert state_bytes(plain_opt) == {"cpu": 0, "device": moments * param_bytes}
    assert off_opt.state_bytes() == {"cpu": moments * param_bytes, "device": 0}
    assert all(isinstance(v, np.ndarray) for s in off_opt.state.values() for v in s.values()
               if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0)
    # during a step: nothing on the device updating on the host; one chunk of parameters' state streaming
    sizes = [p.array.nbytes for p in off_model.parameters()]
    chunks, size = [], 0
    for nbytes in sizes:
        if chunks and size + nbytes <= chunk_bytes:
            chunks[-1] += nbytes
            size += nbytes
        else:
            chunks.append(nbytes)
            size = nbytes
    assert off_opt.peak_device_state_bytes == (0 if mode == "host" else moments * max(chunks))
    if mode == "stream" and chunk_bytes == 300:  # 16·16·4 = 1024 bytes: some parameters stream alone
        assert max(chunks) < param_bytes


def test_the_first_adam_step_by_hand(standin_or_gpu):
    # t = 1: m̂ = g and v̂ = g², so w moves by −lr·g/(|g| + ε) ≈ −lr·sign(g)
    model = _model("cuda")
    opt = offload(optim.Adam(model.parameters(), lr=0.01), mode="stream")
    before = [backend.to_numpy(p.array) for p in model.parameters()]
    x = mdl.tensor(np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)).to("cuda")
    (model(x) ** 2).mean().backward()
    grads = [backend.to_numpy(p.grad.array).astype(np.float64) for p in model.parameters()]
    opt.step()
    for w0, g, p in zip(before, grads, model.parameters()):
        np.testing.assert_allclose(backend.to_numpy(p.array), w0 - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-5, atol=1e-7)


def test_state_dict_round_trip_keeps_the_state_on_the_host(standin_or_gpu):
    plain_model, off_model = _model("cuda"), _model("cuda")
    plain_opt = optim.Adam(plain_model.parameters(), lr=1e-2)
    off_opt = offload(optim.Adam(off_model.parameters(), lr=1e-2))
    _train(plain_model, plain_opt, "cuda", steps=2)
    _train(off_model, off_opt, "cuda", steps=2)
    saved = off_opt.state_dict()
    for position, entry in plain_opt.state_dict()["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(saved["state"][position][key], value)
    off_opt.load_state_dict(saved)  # the wrapped optimizer puts it on the parameters' device; offload takes it back
    assert off_opt.state_bytes()["device"] == 0 and off_opt.state_bytes()["cpu"] > 0
    for a, b in zip(_train(off_model, off_opt, "cuda", steps=1), _train(plain_model, plain_opt, "cuda", steps=1)):
        _same(a, b, exact=not REAL_GPU)


def test_on_the_cpu_offload_warns_and_changes_nothing():
    plain_model, off_model = _model("cpu"), _model("cpu")
    plain_opt = optim.Adam(plain_model.parameters(), lr=1e-2)
    off_opt = offload(optim.Adam(off_model.parameters(), lr=1e-2), mode="stream")
    expected = _train(plain_model, plain_opt, "cpu")
    with pytest.warns(UserWarning, match="on the CPU.*host memory already.*changes nothing"):
        got = _train(off_model, off_opt, "cpu")
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    assert off_opt.state_bytes()["device"] == 0 and off_opt.peak_device_state_bytes == 0


def test_bad_input_names_the_fix():
    params = _model("cpu").parameters()
    with pytest.raises(TypeError, match="Lookahead has its own step"):
        offload(optim.Lookahead(optim.Adam(list(params))))
    with pytest.raises(ValueError, match="mode must be 'host'.*or 'stream'.*got 'disk'"):
        offload(optim.Adam(list(_model("cpu").parameters())), mode="disk")
    with pytest.raises(ValueError, match="chunk_bytes must be a positive number of bytes, got 0"):
        OffloadedOptimizer(optim.Adam(list(_model("cpu").parameters())), chunk_bytes=0)
    with pytest.raises(TypeError, match="expected a minidl.optim optimizer"):
        offload([1, 2])
