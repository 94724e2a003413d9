"""Pooling, unpooling, adaptive pooling and resampling layers: against the torch.nn modules of the same name."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def distinct(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.37


def compare(ours, theirs, x, torch):
    """Same outputs (and indices, when returned) and the same input gradient."""
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = ours(xo), theirs(xt)
    if isinstance(yt, tuple):
        np.testing.assert_array_equal(yo[1].numpy(), yt[1].numpy())
        yo, yt = yo[0], yt[0]
    assert yo.shape == tuple(yt.shape)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    g = np.random.default_rng(1).normal(size=yo.shape)
    yo.backward(mdl.tensor(g))
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("layer, kwargs, shape", [
    ("MaxPool2d", dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True), (2, 3, 9, 8)),
    ("MaxPool2d", dict(kernel_size=2, return_indices=True), (2, 3, 6, 7)),
    ("MaxPool2d", dict(kernel_size=(3, 2), stride=(2, 1), ceil_mode=True, return_indices=True), (1, 2, 8, 5)),
    ("MaxPool1d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, return_indices=True), (2, 3, 10)),
    ("MaxPool1d", dict(kernel_size=2, dilation=3), (2, 3, 10)),
    ("AvgPool2d", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), (2, 3, 8, 7)),
    ("AvgPool2d", dict(kernel_size=2, divisor_override=3), (1, 2, 6, 6)),
    ("AvgPool1d", dict(kernel_size=4, stride=3, padding=2, ceil_mode=True), (2, 3, 11)),
    ("AvgPool1d", dict(kernel_size=3, count_include_pad=False, padding=1), (2, 3, 11)),
    ("AdaptiveAvgPool2d", dict(output_size=(3, 4)), (2, 3, 7, 9)),
    ("AdaptiveAvgPool2d", dict(output_size=1), (2, 3, 5, 5)),
    ("AdaptiveAvgPool2d", dict(output_size=(None, 2)), (2, 3, 5, 5)),
    ("AdaptiveAvgPool1d", dict(output_size=4), (2, 3, 10)),
    ("AdaptiveMaxPool2d", dict(output_size=(3, 4), return_indices=True), (2, 3, 7, 9)),
    ("AdaptiveMaxPool2d", dict(output_size=2), (2, 3, 6, 6)),
    ("AdaptiveMaxPool1d", dict(output_size=3, return_indices=True), (2, 3, 10)),
    ("Upsample", dict(scale_factor=2), (1, 2, 3, 4)),
    ("Upsample", dict(size=(5, 7), mode="bilinear"), (1, 2, 3, 4)),
    ("Upsample", dict(scale_factor=1.5, mode="bilinear", align_corners=True), (1, 2, 3, 4)),
    ("Upsample", dict(scale_factor=2.5, mode="linear"), (2, 2, 5)),
    ("Upsample", dict(size=3, mode="nearest-exact"), (2, 2, 7)),
    ("PixelShuffle", dict(upscale_factor=2), (2, 8, 3, 4)),
    ("PixelUnshuffle", dict(downscale_factor=3), (1, 2, 6, 9)),
])
def test_layer_matches_torch(layer, kwargs, shape):
    torch = pytest.importorskip("torch")
    compare(getattr(nn, layer)(**kwargs), getattr(torch.nn, layer)(**kwargs), distinct(shape), torch)


def test_max_unpool_layers_match_torch():
    torch = pytest.importorskip("torch")
    for dims, shape in ((2, (2, 3, 6, 8)), (1, (2, 3, 9))):
        x = distinct(shape)
        pool = getattr(nn, f"MaxPool{dims}d")(2, stride=2, return_indices=True)
        tpool = getattr(torch.nn, f"MaxPool{dims}d")(2, stride=2, return_indices=True)
        unpool, tunpool = getattr(nn, f"MaxUnpool{dims}d")(2), getattr(torch.nn, f"MaxUnpool{dims}d")(2)
        y, index = pool(mdl.tensor(x))
        ty, tindex = tpool(torch.tensor(x))
        out = unpool(y, index, output_size=shape[2:])
        tout = tunpool(ty, tindex, output_size=shape[2:])
        assert out.shape == shape
        np.testing.assert_array_equal(out.numpy(), tout.numpy())


def test_a_small_encoder_decoder_matches_torch_end_to_end():
    """Conv → MaxPool (indices) → MaxUnpool → ConvTranspose → Upsample → PixelShuffle, weights copied."""
    torch = pytest.importorskip("torch")

    def build(lib):
        return [lib.Conv2d(2, 8, 3, padding=1, groups=2), lib.MaxPool2d(2, return_indices=True), lib.MaxUnpool2d(2),
                lib.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1),
                lib.Upsample(scale_factor=0.5, mode="bilinear"), lib.PixelShuffle(2), lib.AdaptiveAvgPool2d((3, 3))]

    ours, theirs = build(nn), build(torch.nn)
    for a, b in zip(ours, theirs):
        a.double()
        b.double()
        if list(b.state_dict()):
            a.load_state_dict({k: v.detach().numpy() for k, v in b.state_dict().items()})

    def run(layers, x):
        conv, pool, unpool, deconv, up, shuffle, head = layers
        y, index = pool(conv(x))
        return head(shuffle(up(deconv(unpool(y, index)))))

    x = np.random.default_rng(2).normal(size=(2, 2, 8, 8))
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = run(ours, xo), run(theirs, xt)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-12)
    yo.sum().backward()
    yt.sum().backward()
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, theirs):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


def test_layers_without_torch():
    x = mdl.tensor(np.arange(16.0).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(nn.AdaptiveAvgPool2d(1)(x).numpy(), [[[[7.5]]]])
    np.testing.assert_array_equal(nn.AdaptiveMaxPool2d((2, 1))(x).numpy(), [[[[7.0], [15.0]]]])
    np.testing.assert_array_equal(nn.Upsample(scale_factor=2)(x).numpy()[0, 0, :2, :4], [[0, 0, 1, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(nn.MaxPool1d(2)(mdl.tensor(np.array([[[1.0, 3, 2, 0]]]))).numpy(), [[[3.0, 2.0]]])
    np.testing.assert_array_equal(nn.AvgPool1d(2)(mdl.tensor(np.array([[[1.0, 3, 2, 0]]]))).numpy(), [[[2.0, 1.0]]])
    assert nn.PixelUnshuffle(2)(nn.PixelShuffle(2)(mdl.randn(1, 8, 2, 2))).shape == (1, 8, 2, 2)


def test_reprs_and_input_checks():
    assert repr(nn.MaxPool2d(3, 2, 1)) == "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)"
    assert repr(nn.AvgPool1d(2)) == "AvgPool1d(kernel_size=2, stride=2, padding=0)"
    assert repr(nn.AdaptiveAvgPool2d((3, 4))) == "AdaptiveAvgPool2d(output_size=(3, 4))"
    assert repr(nn.Upsample(scale_factor=2)) == "Upsample(scale_factor=2.0, mode='nearest')"
    assert repr(nn.PixelShuffle(3)) == "PixelShuffle(upscale_factor=3)"
    with pytest.raises(ValueError, match=r"MaxPool1d: expected input \(N, C, L\), got shape \(2, 3, 4, 4\)"):
        nn.MaxPool1d(2)(mdl.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"AdaptiveAvgPool2d: expected input \(N, C, H, W\)"):
        nn.AdaptiveAvgPool2d(1)(mdl.zeros(2, 3, 4))
