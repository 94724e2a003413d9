"""save_on_cpu and save_as: saved activations offloaded or compressed, gradients and memory measured."""
import contextlib

import numpy as np
import pytest

import minidl as mdl
from minidl import memory, nn
from minidl.checkpoint import save_as, save_on_cpu


def _model(dtype=np.float32):
    mdl.manual_seed(7)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(),
                         nn.Linear(32, 4)).to(dtype=dtype)


def _step(model, x, hooks):
    """Gradients of every parameter and the input, and the tracker over forward + backward."""
    model.zero_grad()
    x = x.detach().requires_grad_()
    with memory.track() as m:
        with hooks:
            loss = (model(x) ** 2).mean()
        loss.backward()
    return [x.grad.numpy()] + [mdl.backend.to_numpy(p.grad.array) for p in model.parameters()], m


def _pass_through():
    """Hooks that pack every saved array as it is: the tracker then counts what the graph keeps
    under saved-tensor hooks, at full width (a buffer saved by two nodes counted once)."""
    return mdl.autograd.saved_tensors_hooks(lambda t: t, lambda t: t)


def test_save_on_cpu_on_the_cpu_is_a_pass_through():
    model, x = _model(np.float64), mdl.randn(8, 16, dtype=np.float64)
    plain, m_plain = _step(model, x, contextlib.nullcontext())
    hooked, m_hooked = _step(model, x, save_on_cpu())
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)
    # The same arrays, packed as they are; fewer are held: under saved-tensor hooks a node holds only
    # what its backward reads (Tanh's input, the Linear output, is an edge without values there).
    assert 0.5 * m_plain.peak_bytes < m_hooked.peak_bytes <= m_plain.peak_bytes


def test_save_on_cpu_moves_saved_arrays_to_the_host_and_back_exactly(standin_or_gpu):
    model, x = _model().to("cuda"), mdl.randn(8, 16, device="cuda")
    plain, m_plain = _step(model, x, contextlib.nullcontext())
    hooked, m_hooked = _step(model, x, save_on_cpu())
    for a, b in zip(plain, hooked):
        np.testing.assert_array_equal(a, b)  # offload is exact: the same bytes come back
    assert m_plain.by_device["cuda:0"] >= 8 * (16 + 32 + 32 + 32 + 32) * 4  # x and the activations (float32)
    # Offloaded: what the graph holds for backward under the hooks (a pass-through pack counts it) is in
    # host memory, as many bytes; on the GPU only the batch x (a leaf, the first Linear's edge to its
    # own gradient) stays.
    _, m_kept = _step(model, x, _pass_through())
    kept = m_kept.by_device["cuda:0"] - 8 * 16 * 4
    assert m_hooked.by_device.get("cuda:0", 0) <= 8 * 16 * 4
    # each packed array copied to the host: a buffer two nodes save becomes two copies (at most 25 % more here)
    assert kept <= m_hooked.by_device["cpu"] <= 1.25 * kept


def test_save_on_cpu_without_pinned_memory(standin_or_gpu):
    x = mdl.randn(4, 5, device="cuda", requires_grad=True)
    with save_on_cpu(pin_memory=False):
        y = (x * x).sum()
    y.backward()
    np.testing.assert_array_equal(mdl.backend.to_numpy(x.grad.array), 2 * mdl.backend.to_numpy(x.array))


# Tolerances: 8 units of the storage precision, relative to the largest gradient entry (measured:
# 3e-4, 4e-3 and 7e-3; each saved value is rounded once, and errors partly cancel in the sums).
@pytest.mark.parametrize("dtype, ratio, tolerance", [
    ("float16", 0.5, 8 * 2.0**-11),   # 2⁻¹¹ relative per saved value
    ("bfloat16", 0.5, 8 * 2.0**-8),   # 2⁻⁸ relative per saved value
    ("int8", 0.25, 8 * 2.0**-8),      # s/2 per value with s = max|a| / 127: 2⁻⁸ of the largest value
])
def test_save_as_stores_fewer_bytes_and_rounds_gradients_to_the_storage_precision(dtype, ratio, tolerance):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    model, x = _model(), mdl.randn(64, 16)
    plain, m_plain = _step(model, x, contextlib.nullcontext())
    small, m_small = _step(model, x, save_as(dtype))
    _, m_kept = _step(model, x, _pass_through())  # what the graph keeps under the hooks, at full width
    # The tracker sees the stored bytes: the kept float32 arrays at 16 or 8 bits, one compressed copy per
    # node that saves a buffer (measured: 1.15 times the ratio here, as two nodes save some buffers), and
    # less than the plain graph holds.
    assert ratio * m_kept.peak_bytes <= m_small.peak_bytes <= 1.25 * ratio * m_kept.peak_bytes
    assert m_small.peak_bytes <= ratio * m_plain.peak_bytes
    worst = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(plain, small))
    assert 0 < worst < tolerance  # rounded (not exact), to the storage dtype's precision


def test_save_as_float16_matches_backward_on_rounded_values():
    """Independent check: the gradient of y = tanh(x) w with the saved tanh output and x rounded to
    float16 by hand, as NumPy computes it."""
    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.standard_normal((5, 3)).astype(np.float32), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((3, 2)).astype(np.float32), requires_grad=True)
    with save_as("float16"):
        (x.tanh() @ w).sum().backward()
    h16 = np.tanh(x.numpy()).astype(np.float16).astype(np.float32)
    w16 = w.numpy().astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(w.grad.numpy(), h16.T @ np.ones((5, 2), np.float32), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), (np.ones((5, 2), np.float32) @ w16.T) * (1 - h16 * h16), rtol=1e-6)


def test_save_as_keeps_integer_arrays_and_narrow_floats_as_they_are():
    x = mdl.tensor(np.array([[0.5, -2.0], [3.0, 0.25]], np.float32), requires_grad=True)
    with save_as("int8"):
        y = x.relu().sum() + x[mdl.tensor(np.array([1, 0]))].sum()
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[2.0, 1.0], [2.0, 2.0]])


def test_save_as_refuses_values_beyond_float16_and_unknown_dtypes():
    x = mdl.tensor(np.array([1e6, 1.0], np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=r"save_as\('float16'\).*exceeds the range.*bfloat16"):
        with save_as("float16"):
            (x * x).sum()
    with pytest.raises(ValueError, match="save_as: dtype must be 'float16', 'bfloat16' or 'int8', got 'int4'"):
        save_as("int4")


@pytest.mark.parametrize("policy", [None, "matmul"])
def test_checkpoints_inside_the_hooks_reach_every_parameter(policy):
    """A checkpoint's node finds the parameters fn used by identity: under the hooks the leaves stay
    themselves (holding the unpacked values during that backward), so every parameter gets its
    plain gradient, exactly under save_on_cpu, to float16's precision under save_as."""
    from minidl.checkpoint import checkpoint
    model, x = _model(np.float64), mdl.randn(8, 16, dtype=np.float64)

    def run(hooks):
        model.zero_grad()
        with hooks:
            h = checkpoint(lambda t: model[2](model[1](model[0](t))), x, policy=policy)
            loss = (model[5](model[4](model[3](h))) ** 2).mean()
            loss.backward()  # inside the block: the recomputation is packed too
        return [p.grad.numpy() for p in model.parameters()]

    plain = run(contextlib.nullcontext())
    for a, b in zip(plain, run(save_on_cpu())):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(plain, run(save_as("float16"))):
        np.testing.assert_allclose(b, a, rtol=0, atol=8 * 2.0**-11 * np.abs(a).max())
