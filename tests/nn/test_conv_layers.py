"""Conv1d, Conv2d, ConvTranspose1d/2d, MaxPool2d, AvgPool2d layers: against PyTorch with copied weights, and by hand."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def compare_with_torch(ours, theirs, x, torch, rtol=1e-10):
    """Same output and the same gradients for the input and every parameter."""
    if list(theirs.state_dict()):
        ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = ours(xo), theirs(xt)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=rtol, atol=1e-12)
    g = np.random.default_rng(9).normal(size=yo.shape)
    yo.backward(mdl.tensor(g))
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=1e-12)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=rtol, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=(2, 3), padding=(1, 0)),
    dict(kernel_size=3, bias=False), dict(kernel_size=3, groups=2), dict(kernel_size=4, padding="same"),
    dict(kernel_size=3, padding="same"), dict(kernel_size=3, padding="valid"),
])
@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv2d_matches_torch(kwargs):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).normal(size=(2, 4, 7, 6))
    compare_with_torch(nn.Conv2d(4, 6, **kwargs).double(), torch.nn.Conv2d(4, 6, **kwargs).double(), x, torch)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3), dict(kernel_size=5, stride=2, padding=2), dict(kernel_size=2, groups=3, bias=False),
    dict(kernel_size=4, padding="same"),
])
@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_conv1d_matches_torch(kwargs):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).normal(size=(3, 3, 11))
    compare_with_torch(nn.Conv1d(3, 6, **kwargs).double(), torch.nn.Conv1d(3, 6, **kwargs).double(), x, torch)


@pytest.mark.parametrize("layer, kwargs", [
    ("MaxPool2d", dict(kernel_size=2)), ("MaxPool2d", dict(kernel_size=3, stride=2, padding=1)),
    ("AvgPool2d", dict(kernel_size=2)), ("AvgPool2d", dict(kernel_size=3, stride=1, padding=1)),
    ("MaxPool2d", dict(kernel_size=(2, 3), stride=(1, 2))),
])
def test_pools_match_torch(layer, kwargs):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).normal(size=(2, 3, 6, 7))
    compare_with_torch(getattr(nn, layer)(**kwargs), getattr(torch.nn, layer)(**kwargs), x, torch)


def test_conv2d_by_hand_without_torch():
    layer = nn.Conv2d(2, 3, 2, stride=1, padding=0).double()
    x = np.random.default_rng(3).normal(size=(1, 2, 3, 4))
    y = layer(mdl.tensor(x)).numpy()
    w, b = layer.weight.array, layer.bias.array
    expected = np.zeros((1, 3, 2, 3))
    for o in range(3):
        for i in range(2):
            for j in range(3):
                expected[0, o, i, j] = (w[o] * x[0, :, i:i + 2, j:j + 2]).sum() + b[o]
    np.testing.assert_allclose(y, expected, rtol=1e-12)


def test_grouped_conv_is_two_independent_convolutions():
    layer = nn.Conv1d(4, 2, 3, groups=2).double()
    x = mdl.randn(2, 4, 8, dtype=np.float64)
    y = layer(x).numpy()
    for g in range(2):
        part = nn.Conv1d(2, 1, 3).double()
        part.load_state_dict({"weight": layer.weight.array[g:g + 1], "bias": layer.bias.array[g:g + 1]})
        np.testing.assert_allclose(y[:, g:g + 1], part(x[:, 2 * g:2 * g + 2]).numpy(), rtol=1e-12)


def test_pools_by_hand():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(nn.MaxPool2d(2)(mdl.tensor(x)).numpy(), [[[[5, 7], [13, 15]]]])
    np.testing.assert_array_equal(nn.AvgPool2d(2)(mdl.tensor(x)).numpy(), [[[[2.5, 4.5], [10.5, 12.5]]]])


def test_conv_gradcheck_float64():
    layer = nn.Conv2d(2, 2, 2, stride=2, padding=1, groups=2).double()
    x = mdl.randn(1, 2, 3, 3, dtype=np.float64, requires_grad=True)
    assert mdl.gradcheck(lambda x, w, b: layer(x), [x, layer.weight, layer.bias])


def test_conv_default_init_uses_the_kernel_fan_in():
    layer = nn.Conv2d(16, 32, 3)
    bound = 1 / math.sqrt(16 * 9)
    assert layer.weight.shape == (32, 16, 3, 3) and layer.weight.dtype == np.float32
    for p in (layer.weight, layer.bias):
        assert np.abs(p.array).max() <= bound and np.abs(p.array).max() > 0.9 * bound
    assert layer.weight.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.03)
    grouped = nn.Conv1d(8, 4, 5, groups=4)
    assert grouped.weight.shape == (4, 2, 5)
    assert np.abs(grouped.weight.array).max() <= 1 / math.sqrt(2 * 5)


def test_conv_and_pool_errors_are_clear():
    with pytest.raises(ValueError, match="expected input \\(N, C, H, W\\) with C=3, got shape \\(2, 4, 5, 5\\)"):
        nn.Conv2d(3, 4, 3)(mdl.zeros(2, 4, 5, 5))
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        nn.Conv1d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="kernel_size must be an int or 2 ints"):
        nn.Conv2d(3, 4, (1, 2, 3))
    with pytest.raises(ValueError, match="expected input \\(N, C, H, W\\)"):
        nn.MaxPool2d(2)(mdl.zeros(3, 4, 4))
    with pytest.raises(NotImplementedError, match="padding_mode='reflect' is not implemented"):
        nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        nn.Conv2d(3, 4, 3, padding_mode="mirror")
    with pytest.raises(ValueError, match="ConvTranspose2d: padding must be ints"):
        nn.ConvTranspose2d(3, 4, 3, padding="same")
    with pytest.raises(ValueError, match=r"output_size \(9, 9\) must lie between \(7, 7\) and \(8, 8\)"):
        nn.ConvTranspose2d(3, 4, 3, stride=2)(mdl.zeros(1, 3, 3, 3), output_size=(9, 9))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, dilation=2), dict(kernel_size=3, dilation=(1, 2), padding=2, groups=2),
    dict(kernel_size=3, padding="same", dilation=2), dict(kernel_size=(2, 3), groups=4, padding="same"),
    dict(kernel_size=3, stride=2, padding=(0, 1), dilation=(2, 1), groups=4, bias=False),
])
@pytest.mark.filterwarnings("ignore:Using padding='same'")
def test_dilated_and_grouped_conv2d_match_torch(kwargs):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).normal(size=(2, 4, 9, 8))
    compare_with_torch(nn.Conv2d(4, 8, **kwargs).double(), torch.nn.Conv2d(4, 8, **kwargs).double(), x, torch)


@pytest.mark.parametrize("layer, kwargs", [
    ("ConvTranspose2d", dict(kernel_size=3)), ("ConvTranspose2d", dict(kernel_size=3, stride=2, padding=1)),
    ("ConvTranspose2d", dict(kernel_size=(2, 3), stride=(2, 1), output_padding=(1, 0), groups=2)),
    ("ConvTranspose2d", dict(kernel_size=3, dilation=2, bias=False)),
    ("ConvTranspose1d", dict(kernel_size=4, stride=2, padding=1)),
    ("ConvTranspose1d", dict(kernel_size=3, stride=3, output_padding=2, groups=4, dilation=2)),
    ("Conv1d", dict(kernel_size=3, dilation=3, groups=4)),
])
def test_transposed_and_1d_layers_match_torch(layer, kwargs):
    torch = pytest.importorskip("torch")
    shape = (2, 4, 5, 6) if layer.endswith("2d") else (2, 4, 9)
    x = np.random.default_rng(5).normal(size=shape)
    compare_with_torch(getattr(nn, layer)(4, 8, **kwargs).double(), getattr(torch.nn, layer)(4, 8, **kwargs).double(),
                       x, torch)


def test_conv_transpose_output_size_picks_the_output_padding():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1).double(), torch.nn.ConvTranspose2d(
        2, 3, 3, stride=2, padding=1).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(6).normal(size=(1, 2, 4, 5))
    for size in [(7, 9), (8, 10), (1, 3, 8, 9)]:
        y = ours(mdl.tensor(x), output_size=size)
        ty = theirs(torch.tensor(x), output_size=size)
        assert y.shape == tuple(ty.shape) and y.shape[-2:] == tuple(size[-2:])
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_conv_transpose_default_init_uses_its_own_fan_in():
    """PyTorch's default: kaiming_uniform_(a=√5) on a (C_in, C_out/groups, k, k) weight, so fan_in = C_out/groups·k²."""
    layer = nn.ConvTranspose2d(16, 8, 3, groups=2)
    bound = 1 / math.sqrt(4 * 9)
    assert layer.weight.shape == (16, 4, 3, 3) and layer.bias.shape == (8,)
    assert bound >= np.abs(layer.weight.array).max() > 0.9 * bound
    assert bound >= np.abs(layer.bias.array).max() > 0.5 * bound  # 8 draws of U(−bound, bound)
    assert layer.weight.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert "output_padding" not in repr(layer) and "groups=2" in repr(layer)
    assert "output_padding=(1,)" in repr(nn.ConvTranspose1d(2, 2, 3, stride=2, output_padding=1))


def test_conv_on_the_device(device):
    layer = nn.Conv2d(3, 4, 3, padding=1).to(device)
    x = mdl.randn(2, 3, 5, 5).to(device)
    y = layer(x)
    assert y.shape == (2, 4, 5, 5) and y.device.startswith(device)
    cpu = nn.Conv2d(3, 4, 3, padding=1)
    cpu.load_state_dict(layer.state_dict())
    np.testing.assert_allclose(cpu(x.cpu()).numpy(), y.numpy(), rtol=1e-4, atol=1e-5)
