"""Linear, Flatten, activation modules, Dropout, Embedding: values and gradients against PyTorch and NumPy."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def copy_from_torch(ours, theirs):
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})


def backward_both(ours_out, theirs_out, torch, seed=0):
    """Backpropagate the same random upstream gradient through both outputs."""
    g = np.random.default_rng(seed).normal(size=ours_out.shape)
    ours_out.backward(mdl.tensor(g, dtype=ours_out.dtype))
    theirs_out.backward(torch.tensor(g, dtype=theirs_out.dtype))


# ---------------------------------------------------------------- Linear
def test_linear_matches_torch_values_and_gradients():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.Linear(5, 3).double()
    ours = nn.Linear(5, 3).double()
    copy_from_torch(ours, theirs)
    x = np.random.default_rng(1).normal(size=(2, 4, 5))
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = ours(xo), theirs(xt)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-12)
    backward_both(yo, yt, torch)
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.bias.grad.numpy(), theirs.bias.grad.numpy(), rtol=1e-12)


def test_linear_without_torch_is_x_w_transpose_plus_b():
    layer = nn.Linear(3, 2)
    x = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)
    expected = x @ layer.weight.array.T + layer.bias.array
    np.testing.assert_allclose(layer(mdl.tensor(x)).numpy(), expected, rtol=1e-6)
    no_bias = nn.Linear(3, 2, bias=False)
    np.testing.assert_allclose(no_bias(mdl.tensor(x)).numpy(), x @ no_bias.weight.array.T, rtol=1e-6)


def test_linear_default_init_is_uniform_one_over_sqrt_fan_in():
    layer = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)
    for p in (layer.weight, layer.bias):
        assert p.dtype == np.float32
        assert np.abs(p.array).max() <= bound and np.abs(p.array).max() > 0.95 * bound
    assert layer.weight.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.01)


def test_linear_input_errors_are_clear():
    with pytest.raises(ValueError, match="input of shape \\(2, 4\\) has 4 features .* expected 3"):
        nn.Linear(3, 2)(mdl.zeros(2, 4))
    with pytest.raises(ValueError, match="must be positive"):
        nn.Linear(0, 2)
    with pytest.raises(TypeError, match="floating point"):
        nn.Linear(2, 2, dtype=np.int32)


def test_linear_dtype_and_device_arguments(device):
    layer = nn.Linear(3, 2, device=device, dtype=np.float64)
    assert layer.weight.dtype == np.float64 and layer.weight.device.startswith(device)
    assert layer(mdl.randn(4, 3, device=device, dtype=np.float64)).shape == (4, 2)


# ---------------------------------------------------------------- Flatten and activations
def test_flatten_shapes():
    x = mdl.randn(2, 3, 4, 5)
    assert nn.Flatten()(x).shape == (2, 60)
    assert nn.Flatten(0, -1)(x).shape == (120,)
    assert nn.Flatten(1, 2)(x).shape == (2, 12, 5)
    np.testing.assert_array_equal(nn.Flatten()(x).numpy(), x.numpy().reshape(2, 60))


@pytest.mark.parametrize("make", [
    lambda m: m.ReLU(), lambda m: m.LeakyReLU(0.2), lambda m: m.ELU(0.7), lambda m: m.GELU(),
    lambda m: m.GELU(approximate="tanh"), lambda m: m.Tanh(), lambda m: m.Sigmoid(), lambda m: m.Softmax(dim=1),
])
def test_activation_modules_match_torch(make):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).normal(size=(4, 6)) * 3
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = make(nn)(xo), make(torch.nn)(xt)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    backward_both(yo, yt, torch)
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_activation_modules_by_formula():
    x = np.linspace(-3, 3, 13)
    t = mdl.tensor(x)
    np.testing.assert_allclose(nn.ReLU()(t).numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(nn.LeakyReLU(0.1)(t).numpy(), np.where(x > 0, x, 0.1 * x))
    np.testing.assert_allclose(nn.ELU(2.0)(t).numpy(), np.where(x > 0, x, 2 * np.expm1(x)))
    np.testing.assert_allclose(nn.Sigmoid()(t).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-12)
    np.testing.assert_allclose(nn.Tanh()(t).numpy(), np.tanh(x), rtol=1e-12)
    np.testing.assert_allclose(nn.Softmax()(t).numpy(), np.exp(x) / np.exp(x).sum(), rtol=1e-12)


# ---------------------------------------------------------------- Dropout
def test_dropout_training_drops_and_rescales_and_eval_is_identity():
    layer = nn.Dropout(0.25)
    x = mdl.ones(200, 500)
    y = layer(x).numpy()
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert (y == 0).mean() == pytest.approx(0.25, abs=0.01)
    assert y.mean() == pytest.approx(1.0, abs=0.01)
    layer.eval()
    assert layer(x) is x


def test_dropout_gradient_uses_the_same_mask():
    x = mdl.randn(50, 40, requires_grad=True)
    y = nn.Dropout(0.5)(x)
    y.sum().backward()
    kept = y.numpy() != 0
    np.testing.assert_array_equal(x.grad.numpy(), np.where(kept, 2.0, 0.0))


def test_dropout_is_reproducible_under_manual_seed_and_p_edges():
    mdl.manual_seed(5)
    a = nn.Dropout(0.5)(mdl.ones(10, 10)).numpy()
    mdl.manual_seed(5)
    b = nn.Dropout(0.5)(mdl.ones(10, 10)).numpy()
    np.testing.assert_array_equal(a, b)
    x = mdl.randn(3, 3)
    np.testing.assert_array_equal(nn.Dropout(0.0)(x).numpy(), x.numpy())
    assert (nn.Dropout(1.0)(x).numpy() == 0).all()
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(1.5)


# ---------------------------------------------------------------- Embedding
def test_embedding_matches_torch_with_repeated_indices():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.Embedding(7, 3).double()
    ours = nn.Embedding(7, 3).double()
    copy_from_torch(ours, theirs)
    idx = np.array([[0, 2, 2], [6, 0, 2]])
    yo, yt = ours(mdl.tensor(idx)), theirs(torch.tensor(idx))
    np.testing.assert_array_equal(yo.numpy(), yt.detach().numpy())
    backward_both(yo, yt, torch)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-12)


def test_embedding_padding_row_starts_at_zero_and_gets_no_gradient():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.Embedding(5, 2, padding_idx=1).double()
    ours = nn.Embedding(5, 2, padding_idx=1).double()
    assert (ours.weight.array[1] == 0).all()
    copy_from_torch(ours, theirs)
    idx = np.array([1, 3, 1, 4])
    yo, yt = ours(idx), theirs(torch.tensor(idx))
    np.testing.assert_array_equal(yo.numpy(), yt.detach().numpy())
    backward_both(yo, yt, torch)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-12)
    assert (ours.weight.grad.numpy()[1] == 0).all()


def test_embedding_default_init_is_standard_normal_and_lookup_by_hand():
    layer = nn.Embedding(1000, 64)
    assert layer.weight.array.std() == pytest.approx(1.0, rel=0.02)
    idx = np.array([3, 999, 3])
    np.testing.assert_array_equal(layer(idx).numpy(), layer.weight.array[idx])
    with pytest.raises(ValueError, match="out of range"):
        layer(np.array([1000]))
