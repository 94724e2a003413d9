"""checkpoint and checkpoint_sequential: the same gradients as the plain run, less memory held, clear errors."""
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import autograd, backend, memory, nn
from minidl.checkpoint import CheckpointFunction, checkpoint, checkpoint_sequential, resolve_storage_dtype
from tests.checkpoint._helpers import assert_same_step, cnn, data, mlp, residual_net, step


# ---------------------------------------------------------------- gradients equal the plain run
@pytest.mark.parametrize("segments", [1, 2, 3, 4, 8])
def test_mlp_gradients_are_exactly_the_plain_ones(segments):
    model = mlp()
    assert_same_step(model, lambda x: checkpoint_sequential(model, segments, x), data(5, 12, requires_grad=True))


def test_cnn_gradients_are_exactly_the_plain_ones():
    model = cnn()
    assert_same_step(model, lambda x: checkpoint_sequential(model, 3, x), data(2, 2, 8, 8, requires_grad=True))


def test_residual_gradients_are_exactly_the_plain_ones():
    model = residual_net()
    x = data(4, 6, requires_grad=True)
    assert_same_step(model, lambda x: checkpoint_sequential(model, 4, x), x)
    # one Residual block checkpointed whole, with the function form
    assert_same_step(model, lambda x: model[2:](checkpoint(model[1], model[0](x))), x)


def test_dropout_draws_the_same_masks_and_the_stream_goes_on():
    model = mlp(dropout=0.4)
    x = data(6, 12, requires_grad=True)
    assert_same_step(model, lambda x: checkpoint_sequential(model, 4, x), x)
    mdl.manual_seed(7)
    model(x).sum().backward()
    after_plain = mdl.rand(3).numpy()
    mdl.manual_seed(7)
    checkpoint_sequential(model, 4, x).sum().backward()
    np.testing.assert_array_equal(mdl.rand(3).numpy(), after_plain)


def test_without_preserved_rng_state_the_masks_differ():
    model = mlp(dropout=0.5)
    x = data(6, 12)
    plain = step(model, model, x)
    loose = step(model, lambda x: checkpoint_sequential(model, 4, x, preserve_rng_state=False), x)
    assert loose[0] == plain[0]  # the forward pass is the same...
    assert any(not np.array_equal(a, b) for a, b in zip(loose[1], plain[1]))  # ...the recomputed masks are not


def test_batchnorm_statistics_are_updated_once():
    x = data(8, 12, requires_grad=True)
    plain_model, checked_model = mlp(batchnorm=True), mlp(batchnorm=True)
    plain = step(plain_model, plain_model, x)
    checked = step(checked_model, lambda x: checkpoint_sequential(checked_model, 4, x), x)
    assert checked[0] == plain[0]
    for a, b in zip(checked[1] + [checked[2]], plain[1] + [plain[2]]):
        np.testing.assert_array_equal(a, b)
    for (name, a), b in zip(checked_model.named_buffers(), plain_model.buffers()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        if name.endswith("num_batches_tracked"):
            assert int(a.item()) == 1  # forward once, recomputation undone


def test_nested_checkpoints():
    model = mlp(layers=6)

    def inner(x):
        return checkpoint(model[2], checkpoint(model[1], x))

    def forward(x):
        h = checkpoint(lambda x: inner(model[0](x)), x)
        return checkpoint_sequential(list(model)[3:], 2, h)
    assert_same_step(model, forward, data(5, 12, requires_grad=True))


def test_several_inputs_and_outputs_and_mdl_grad():
    mdl.manual_seed(4)
    layer = nn.Linear(3, 3).double()
    a, b = data(4, 3, requires_grad=True), data(4, 3, requires_grad=True, seed=1)
    scale = 0.5  # a non-tensor argument passes through

    def fn(a, s, b):
        h = layer(a * b) * s
        return h.tanh(), (h * a).sum(axis=1)

    targets = [a, b, layer.weight, layer.bias]
    u, v = fn(a, scale, b)
    plain = mdl.grad((u * u).sum() + v.sum(), targets)
    u, v = checkpoint(fn, a, scale, b)
    assert isinstance(u.creator, CheckpointFunction)
    checked = mdl.grad((u * u).sum() + v.sum(), targets)  # returned, not accumulated: works through the node
    for g, h in zip(checked, plain):
        np.testing.assert_array_equal(g.numpy(), h.numpy())
    assert layer.weight.grad is None


def test_input_without_gradient_still_trains_the_parameters():
    """PyTorch's reentrant checkpoint drops parameter gradients when no input requires grad; this one does not."""
    model = mlp()
    x = data(5, 12)  # requires_grad=False: the usual first segment
    y = checkpoint(model, x)
    assert y.requires_grad
    assert_same_step(model, lambda x: checkpoint(model, x), x)
    assert_same_step(model, lambda x: checkpoint_sequential(model, 8, x), x)


def test_a_function_without_parameters_and_no_grad_input_records_nothing():
    x = data(3, 3)
    y = checkpoint(lambda t: t.tanh(), x)
    assert not y.requires_grad and y.creator is None
    with mdl.no_grad():
        z = checkpoint(mlp(), data(2, 12, requires_grad=True))
    assert z.creator is None


def test_repeated_input_gets_its_gradient_once():
    x = data(4, requires_grad=True)
    y = checkpoint(lambda a, b: a * b, x, x)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), 2 * x.numpy())


def test_hessian_vector_products_through_a_checkpoint():
    model = mlp(layers=4, width=5)
    params = list(model.parameters())
    x = data(3, 5, requires_grad=True)
    v = [data(*p.shape, seed=i) for i, p in enumerate(params + [x])]

    def hvp(forward):
        out = forward(x)
        grads = mdl.grad((out * out).sum(), params + [x], create_graph=True)
        return [h.numpy() for h in mdl.grad(sum((g * w).sum() for g, w in zip(grads, v)), params + [x])]
    for a, b in zip(hvp(lambda x: checkpoint_sequential(model, 3, x)), hvp(model)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_a_tensor_fn_captures_gets_its_gradient():
    """Neither an input nor a parameter: found as an op input while fn runs, then a node input."""
    w = data(3, requires_grad=True, seed=2)
    x = data(4, 3)
    y = checkpoint(lambda t: (t * w).tanh(), x)
    assert any(t is w for t in y.creator.inputs)
    (g,) = mdl.grad(y.sum(), [w])
    expected = ((1 - np.tanh(x.numpy() * w.numpy()) ** 2) * x.numpy()).sum(axis=0)  # Σₙ (1 − tanh²) x
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-12)


def test_the_hook_that_watches_fn_is_gone_afterwards_even_when_fn_raises():
    model = mlp(layers=2)
    checkpoint(model, data(2, 12))
    assert autograd.function_hooks.active == ()

    def broken(x):
        model(x)
        raise KeyError("fn failed")
    with pytest.raises(KeyError):
        checkpoint(broken, data(2, 12))
    assert autograd.function_hooks.active == ()


# ---------------------------------------------------------------- memory
def test_checkpointing_holds_what_the_model_says():
    """L equal Linear→ReLU layers: plain holds L·(input + pre-activation); k segments hold
    (k − 1) segment inputs + the last segment's L/k layers at the end of the forward pass."""
    L, n, w = 16, 8, 32
    model = nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.ReLU()) for _ in range(L)])
    x = mdl.randn(n, w)
    act = n * w * 4  # one activation
    layer = 2 * act  # Linear keeps its input, ReLU its input (the Linear's output)
    peaks = {}
    for k in (1, 4, L):
        with memory.track() as m:
            checkpoint_sequential(model, k, x).sum().backward()
        peaks[k] = m.peak_bytes
    assert peaks[1] == L * layer + act  # + the output, held by the final Sum
    assert peaks[4] == 3 * act + 4 * layer + act
    assert peaks[L] == (L - 1) * act + layer + act
    assert peaks[4] < peaks[1] / 2


def test_16_bit_storage_refuses_what_it_cannot_do(monkeypatch):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3))
    x = mdl.randn(2, 3, requires_grad=True)
    out = checkpoint_sequential(model, 3, x, storage_dtype="float16")
    with pytest.raises(RuntimeError, match="create_graph=True.*16 bits"):
        mdl.grad(out.sum(), [x], create_graph=True)  # higher order from rounded inputs would be wrong: refused
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # as on a machine without ml_dtypes
    with pytest.raises(ValueError, match="NumPy has no bfloat16.*ml_dtypes"):
        resolve_storage_dtype("bfloat16")
    with pytest.raises(ValueError, match="'float16' or 'bfloat16'"):
        resolve_storage_dtype("int8")
    big = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3))
    big[0].weight.array[...] = 1e5
    with pytest.raises(ValueError, match="exceeds the range"):
        checkpoint_sequential(big, 3, x, storage_dtype="float16")


# ---------------------------------------------------------------- bad input
def test_bad_input_messages():
    model = mlp(layers=4)
    x = data(2, 12)
    for segments in (0, 5, -1):
        with pytest.raises(ValueError, match="between 1 and the number of layers \\(4\\)"):
            checkpoint_sequential(model, segments, x)
    with pytest.raises(ValueError, match="increasing segment starts"):
        checkpoint_sequential(model, [1, 2], x)
    with pytest.raises(TypeError, match="element 1 of the list is a function, not a Module"):
        checkpoint_sequential([model[0], lambda t: t], 1, x)
    with pytest.raises(TypeError, match="nn.Sequential or a list of Modules"):
        checkpoint_sequential(model[0][0], 1, x)
    with pytest.raises(TypeError, match="input must be a Tensor"):
        checkpoint_sequential(model, 2, x.numpy())
    with pytest.raises(TypeError, match="fn must be callable"):
        checkpoint(3, x)
    with pytest.raises(TypeError, match="must return a Tensor or a tuple of Tensors"):
        checkpoint(lambda t: t.numpy(), data(2, requires_grad=True))


def test_on_the_device(device):
    model = mlp(dropout=0.3).float().to(device)
    x = mdl.randn(5, 12, device=device)
    plain = step(model, model, x)
    checked = step(model, lambda x: checkpoint_sequential(model, 4, x), x)
    for a, b in zip(checked[1], plain[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert backend.device_of(model[0][0].weight.grad.array) == ("cpu" if device == "cpu" else "cuda:0")
