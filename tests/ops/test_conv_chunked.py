"""conv2d over a batch split into im2col chunks (IM2COL_LIMIT_BYTES) and max pooling of channels-last
inputs (a conv's output): values and gradients against PyTorch and against the unchunked path."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
import minidl.ops.conv as conv
from minidl import gradcheck
from minidl.ops.pool import _channels_last


def _grads(x, w, b, **kw):
    y = F.conv2d(x, w, b, **kw)
    (y * y).sum().backward()
    out = y.numpy().copy(), x.grad.numpy().copy(), w.grad.numpy().copy(), b.grad.numpy().copy()
    x.grad = w.grad = b.grad = None
    return out


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=1, groups=2), dict(dilation=2)])
def test_chunked_conv_matches_unchunked_and_torch(monkeypatch, kw):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = mdl.tensor(rng.standard_normal((5, 4, 7, 6)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((6, 4 // kw.get("groups", 1), 3, 3)), requires_grad=True)
    b = mdl.tensor(rng.standard_normal(6), requires_grad=True)
    whole = _grads(x, w, b, **kw)
    per_sample = np.prod(F.conv2d(x, w, **kw).shape[2:]) * 9 * 4 * 8  # one sample's columns, float64
    monkeypatch.setattr(conv, "IM2COL_LIMIT_BYTES", 2 * per_sample)  # chunks of 2, 2, 1
    assert conv.batch_chunk(x.shape, w.shape, conv.as_pair(kw.get("stride", 1), "", "", 1),
                            conv._sides(conv.as_pair(kw.get("padding", 0), "", "", 0)),
                            conv.as_pair(kw.get("dilation", 1), "", "", 1), 8) == 2
    chunked = _grads(x, w, b, **kw)
    xt, wt, bt = (torch.tensor(a.numpy(), requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, **kw)
    (yt * yt).sum().backward()
    reference = yt.detach().numpy(), xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()
    for got, same, want in zip(chunked, whole, reference):
        np.testing.assert_allclose(got, same, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_chunked_conv_gradcheck(monkeypatch):
    rng = np.random.default_rng(1)
    monkeypatch.setattr(conv, "IM2COL_LIMIT_BYTES", 1)  # one sample per chunk
    x = mdl.tensor(rng.standard_normal((3, 2, 4, 4)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((3, 2, 3, 3)), requires_grad=True)
    assert gradcheck(lambda x, w: F.conv2d(x, w, padding=1), [x, w])


def test_chunk_bounds_the_column_buffer():
    shape, weight = (64, 64, 32, 32), (64, 64, 3, 3)  # 144 MiB of float32 columns unchunked
    chunk = conv.batch_chunk(shape, weight, (1, 1), ((1, 1), (1, 1)), (1, 1), 4)
    per_sample = 32 * 32 * 9 * 64 * 4
    assert chunk * per_sample <= conv.IM2COL_LIMIT_BYTES < (chunk + 1) * per_sample * 2
    assert conv.batch_chunk((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 4) == 2  # small: whole


@pytest.mark.parametrize("args", [(2,), (3, 2, 1), (3, 1, 1, 2, True)])
def test_max_pool_of_channels_last_input(args):
    """A conv's output is an (N, C, H, W) view of a channels-last array: pooling works in that layout."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = mdl.tensor(rng.permutation(2 * 7 * 7 * 3).reshape(2, 7, 7, 3).astype(np.float64) / 10,
                   requires_grad=True)
    xc = x.permute(0, 3, 1, 2)  # (2, 3, 7, 7), channels-last in memory
    assert _channels_last(xc.array)
    y = F.max_pool2d(xc, *args)
    gy = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(gy))
    xt = torch.tensor(x.numpy(), requires_grad=True)
    yt = torch.nn.functional.max_pool2d(xt.permute(0, 3, 1, 2), *args)
    yt.backward(torch.tensor(gy))
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy())
    _, idx = F.max_pool2d(xc, *args, return_indices=True)
    _, idxt = torch.nn.functional.max_pool2d(xt.permute(0, 3, 1, 2), *args, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), idxt.numpy())
    assert gradcheck(lambda v: F.max_pool2d(v.permute(0, 3, 1, 2), *args), [mdl.tensor(x.numpy(),
                                                                                      requires_grad=True)])
    assert mdl.gradgradcheck(lambda v: F.max_pool2d(v.permute(0, 3, 1, 2), *args),
                             [mdl.tensor(x.numpy(), requires_grad=True)])


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_one_by_one_conv_is_a_batched_product(layout):
    """The 1×1 path (y[n] = W x[n]) against PyTorch, values and all three gradients, and gradcheck."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    data = rng.standard_normal((3, 4, 5, 6))
    x = mdl.tensor(data if layout == "nchw" else np.ascontiguousarray(data.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
                   requires_grad=True)
    w = mdl.tensor(rng.standard_normal((7, 4, 1, 1)), requires_grad=True)
    b = mdl.tensor(rng.standard_normal(7), requires_grad=True)
    y = F.conv2d(x, w, b)
    gy = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(gy))
    xt, wt, bt = (torch.tensor(a.numpy(), requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt)
    yt.backward(torch.tensor(gy))
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, want in ((x, xt), (w, wt), (b, bt)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12, atol=1e-12)
    assert gradcheck(lambda x, w, b: F.conv2d(x, w, b), [mdl.tensor(data, requires_grad=True),
                                                         mdl.tensor(w.numpy(), requires_grad=True),
                                                         mdl.tensor(b.numpy(), requires_grad=True)])
    assert mdl.gradgradcheck(lambda x, w: F.conv2d(x, w), [mdl.tensor(data, requires_grad=True),
                                                           mdl.tensor(w.numpy(), requires_grad=True)])


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # PyTorch's note on its own copy
@pytest.mark.parametrize("kw, kernel", [(dict(padding="same"), (2, 4)), (dict(padding=(2, 1), dilation=(2, 1)), (3, 3)),
                                        (dict(padding=0), (3, 2)), (dict(padding=(0, 2), dilation=2), (2, 2))])
def test_stride1_conv_input_gradient_is_a_flipped_conv(kw, kernel):
    """Conv2dStride1: dx as the correlation of dy with the flipped kernel, against PyTorch (values, all
    gradients) with asymmetric 'same' padding, dilation and unpadded sides; then gradgradcheck."""
    torch = pytest.importorskip("torch")
    from minidl.ops.conv import Conv2dStride1
    rng = np.random.default_rng(4)
    x = mdl.tensor(rng.standard_normal((2, 3, 6, 7)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((4, 3) + kernel), requires_grad=True)
    b = mdl.tensor(rng.standard_normal(4), requires_grad=True)
    seen = []

    class Spy(mdl.autograd.FunctionHook):
        def forward_preprocess(self, function, inputs):
            seen.append(type(function))
    with Spy():
        y = F.conv2d(x, w, b, **kw)
    assert Conv2dStride1 in seen
    gy = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(gy))
    xt, wt, bt = (torch.tensor(a.numpy(), requires_grad=True) for a in (x, w, b))
    yt = torch.nn.functional.conv2d(xt, wt, bt, **kw)
    yt.backward(torch.tensor(gy))
    np.testing.assert_allclose(y.numpy(), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    for got, want in ((x, xt), (w, wt), (b, bt)):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-12, atol=1e-12)
    small = [mdl.tensor(rng.standard_normal((1, 2, 4, 5)), requires_grad=True),
             mdl.tensor(rng.standard_normal((2, 2) + kernel), requires_grad=True)]
    assert mdl.gradgradcheck(lambda x, w: F.conv2d(x, w, **kw), small)
