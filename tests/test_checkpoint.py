"""Gradient checkpointing: the same gradients as the plain run, less memory held, clear errors."""
import itertools
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import backend, memory, nn
from minidl.checkpoint import (
    CheckpointFunction,
    balanced_segments,
    checkpoint,
    checkpoint_sequential,
    choose_segments,
    flatten_layers,
    profile_layers,
    resolve_storage_dtype,
    sqrt_segments,
    storage_report,
    uniform_boundaries,
)


# ---------------------------------------------------------------- models (float64, seeded)
def mlp(layers=8, width=12, dropout=0.0, batchnorm=False):
    mdl.manual_seed(1)
    blocks = []
    for _ in range(layers):
        block = [nn.Linear(width, width)] + ([nn.BatchNorm1d(width)] if batchnorm else []) + [nn.Tanh()]
        blocks.append(nn.Sequential(*block, *([nn.Dropout(dropout)] if dropout else [])))
    return nn.Sequential(*blocks).double()


def cnn():
    mdl.manual_seed(2)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Conv2d(4, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3)).double()


def residual_net():
    mdl.manual_seed(3)

    def block():
        return nn.Residual(nn.Sequential(nn.Linear(10, 10), nn.Tanh(), nn.Linear(10, 10)))
    return nn.Sequential(nn.Linear(6, 10), block(), nn.ReLU(), block(), nn.Tanh(), block(),
                         nn.Linear(10, 2)).double()


def data(*shape, requires_grad=False, seed=0):
    return mdl.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=requires_grad)


def step(model, forward, x, seed=7):
    """One loss.backward(); returns the loss, every parameter's gradient and x's gradient."""
    model.zero_grad()
    x.grad = None
    mdl.manual_seed(seed)
    out = forward(x)
    loss = (out * out).sum()
    loss.backward()
    return loss.item(), [p.grad.numpy().copy() for p in model.parameters()], (
        None if x.grad is None else x.grad.numpy().copy())


def assert_same_step(model, forward, x, **kw):
    plain = step(model, model, x, **kw)
    checked = step(model, forward, x, **kw)
    assert checked[0] == plain[0]
    for a, b in zip(checked[1], plain[1]):
        np.testing.assert_array_equal(a, b)  # exact: the same float64 operations in the same order
    if plain[2] is not None:
        np.testing.assert_array_equal(checked[2], plain[2])


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


def test_16_bit_storage_halves_the_stored_inputs_with_a_bounded_error():
    L, n, w = 8, 16, 32
    mdl.manual_seed(0)
    # a smooth activation: the error is float16's rounding (2⁻¹¹ ≈ 4.9e-4 relative) carried through
    # a few layers; with ReLU a unit within rounding distance of 0 can flip its mask (see storage_report)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(w, w), nn.Tanh()) for _ in range(L)])
    x = mdl.randn(n, w)
    report = storage_report(model, x, L, "float16")
    # L − 2 segment inputs are stored (not the user's input, not the last segment's): each halves
    assert report["saved_bytes"] == (L - 2) * n * w * 2
    assert 0 < report["relative_grad_error"] < 4 * 2.0 ** -11
    assert 0 < report["max_relative_grad_error"] < 4 * 2.0 ** -11
    with mdl.no_grad():
        plain = model(x).numpy()
    stored = checkpoint_sequential(model, L, x, storage_dtype="float16")
    np.testing.assert_array_equal(stored.numpy(), plain)  # the forward pass itself is untouched


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
    big[0].weight.data[...] = 1e5
    with pytest.raises(ValueError, match="exceeds the range"):
        checkpoint_sequential(big, 3, x, storage_dtype="float16")


def test_bfloat16_storage_where_ml_dtypes_is_installed():
    pytest.importorskip("ml_dtypes")
    model = mlp().float()
    report = storage_report(model, mdl.randn(4, 12), 8, "bfloat16")
    assert report["saved_bytes"] > 0 and 0 < report["relative_grad_error"] < 4 * 2.0 ** -8  # 8 significant bits


# ---------------------------------------------------------------- segments
def test_uniform_boundaries_are_pytorchs():
    assert uniform_boundaries(10, 3) == [0, 3, 6]  # the last segment takes the rest: 6..9
    assert uniform_boundaries(100, 16) == [i * 6 for i in range(16)]
    assert sqrt_segments(100) == 10 and sqrt_segments(64) == 8 and sqrt_segments(1) == 1


def varying_net():
    mdl.manual_seed(5)
    widths = [8, 80, 8, 8, 80, 80, 8, 40, 8, 80, 8]
    return nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths, widths[1:])])


def test_balanced_segments_find_the_least_modeled_peak():
    model, x = varying_net(), mdl.randn(16, 8)
    profile = profile_layers(model, x)
    L = profile.num_layers
    for k in (2, 3, 4):
        plan = balanced_segments(model, x, k, profile)
        brute = min(profile.peak_bytes([0, *rest]) for rest in itertools.combinations(range(1, L), k - 1))
        assert plan.peak_bytes() == brute
        assert plan.peak_bytes() <= profile.peak_bytes(uniform_boundaries(L, k))
        with memory.track() as m:
            out = checkpoint_sequential(model, plan, x)
            out.sum().backward()
        # the measured peak, by the model: inputs of earlier segments + this segment's layers (+ the
        # output, held by the final Sum, while the last segment's graph is alive)
        starts, held, expected = plan.boundaries + [L], 0, 0
        for a, b in zip(starts, starts[1:]):
            expected = max(expected, held + sum(profile.layer_bytes[a:b]) + (out.data.nbytes if b == L else 0))
            held += profile.input_bytes[a]
        assert m.peak_bytes == expected


def test_profile_measures_layers_and_leaves_state_alone():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 2))
    x = mdl.randn(5, 4)
    before = [b.numpy().copy() for b in model.buffers()]
    mdl.manual_seed(3)
    expected_draw = mdl.rand(2).numpy()
    mdl.manual_seed(3)
    profile = profile_layers(model, x)
    np.testing.assert_array_equal(mdl.rand(2).numpy(), expected_draw)  # the dry run's dropout drew nothing
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, model.buffers()))
    assert all(p.grad is None for p in model.parameters())
    assert profile.input_bytes == [5 * 4 * 4, 5 * 6 * 4, 5 * 6 * 4, 5 * 6 * 4]
    assert profile.layer_bytes[0] == 5 * 4 * 4  # Linear keeps its input
    assert profile.layer_bytes[2] == 2 * 5 * 6 * 4  # Dropout keeps its input and its scaled mask


def test_choose_segments_default_and_time_budget():
    model, x = varying_net(), mdl.randn(16, 8)
    profile = profile_layers(model, x)
    assert choose_segments(model, x, profile=profile).segments == sqrt_segments(10)
    assert choose_segments(model, x, 1.0, profile).boundaries == [0]  # no time to spare: no checkpoint
    previous = None
    for budget in (1.1, 1.3, 2.0):
        plan = choose_segments(model, x, budget, profile)
        assert plan.slowdown() <= budget
        assert previous is None or plan.peak_bytes() <= previous  # more time never costs memory
        previous = plan.peak_bytes()
    with pytest.raises(ValueError, match="at least 1"):
        choose_segments(model, x, 0.5, profile)


def test_boundaries_never_cut_a_residual_block():
    model = residual_net()
    layers = flatten_layers(nn.Sequential(model[0], nn.Sequential(model[1], model[2]), *list(model)[3:]))
    assert [type(layer).__name__ for layer in layers] == [
        "Linear", "Residual", "ReLU", "Residual", "Tanh", "Residual", "Linear"]
    plan = balanced_segments(layers, data(4, 6), 3)
    assert len(plan.layer_bytes) == 7  # a Residual is one layer: a boundary can only fall between blocks
    assert nn.Residual.checkpoint_atomic


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
    with pytest.raises(ValueError, match="between 1 and the number of layers"):
        balanced_segments(model, x, 9)


def test_on_the_device(device):
    model = mlp(dropout=0.3).float().to(device)
    x = mdl.randn(5, 12, device=device)
    plain = step(model, model, x)
    checked = step(model, lambda x: checkpoint_sequential(model, 4, x), x)
    for a, b in zip(checked[1], plain[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert backend.device_of(model[0][0].weight.grad.data) == ("cpu" if device == "cpu" else "cuda:0")
