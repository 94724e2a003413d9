"""Convolution by FFT: the same numbers as the im2col convolution, forward and every gradient; clear refusals."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.ops.fft_conv import fft_conv2d


def _inputs(dtype, x_shape=(2, 3, 9, 7), w_shape=(4, 3, 3, 5), seed=0):
    rng = np.random.default_rng(seed)
    return [mdl.tensor(rng.standard_normal(s).astype(dtype), requires_grad=True)
            for s in (x_shape, w_shape, (w_shape[0],))]


@pytest.mark.parametrize("padding", [0, 1, (2, 0), (1, 4)])
def test_equals_conv2d_forward_and_gradients_in_float64(padding):
    x, w, b = _inputs(np.float64)
    y = fft_conv2d(x, w, b, padding=padding)
    want = F.conv2d(x, w, b, padding=padding)
    assert y.shape == want.shape and y.dtype == np.float64
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=0, atol=1e-12)
    gy = np.random.default_rng(1).standard_normal(y.shape)
    ours = mdl.grad([y], [x, w, b], grad_outputs=[mdl.tensor(gy)])
    theirs = mdl.grad([want], [x, w, b], grad_outputs=[mdl.tensor(gy)])
    for g, h in zip(ours, theirs):
        np.testing.assert_allclose(g.numpy(), h.numpy(), rtol=0, atol=1e-11)


def test_float32_stays_float32_within_the_ffts_rounding():
    x, w, b = _inputs(np.float32, (2, 4, 32, 32), (8, 4, 7, 7))
    y = fft_conv2d(x, w, b, padding=3)
    want = F.conv2d(x.double(), w.double(), b.double(), padding=3).numpy()
    assert y.dtype == np.float32
    # an FFT's error is about log2(grid)·ε relative to the transformed values' size, not per product
    scale = np.abs(x.numpy()).max() * np.abs(w.numpy()).sum(axis=(1, 2, 3)).max()
    assert np.abs(y.numpy() - want).max() <= 64 * np.finfo(np.float32).eps * scale


def test_a_large_kernel_on_a_large_image_agrees_with_pytorch():
    torch = pytest.importorskip("torch")
    x, w, b = _inputs(np.float64, (1, 2, 40, 33), (3, 2, 15, 11))
    want = torch.nn.functional.conv2d(*(torch.from_numpy(t.numpy()) for t in (x, w, b)), padding=(7, 5))
    np.testing.assert_allclose(fft_conv2d(x, w, b, padding=(7, 5)).numpy(), want.numpy(), rtol=0, atol=1e-11)


def test_second_derivatives():
    x, w, b = _inputs(np.float64, (1, 2, 5, 6), (2, 2, 3, 2))
    assert mdl.gradgradcheck(lambda x, w, b: fft_conv2d(x, w, b, padding=1), [x, w, b])


@pytest.mark.parametrize("kwargs,inputs,message", [
    ({"padding": 3}, ((1, 1, 8, 8), (1, 1, 3, 3)), "between 0 and kernel − 1"),
    ({}, ((1, 2, 8, 8), (1, 3, 3, 3)), "same C"),
    ({}, ((1, 1, 2, 2), (1, 1, 3, 3)), "larger than the padded image"),
])
def test_refusals_name_the_op_and_the_fix(kwargs, inputs, message):
    x, w = (mdl.tensor(np.ones(s)) for s in inputs)
    with pytest.raises(ValueError, match=message):
        fft_conv2d(x, w, **kwargs)


def test_mixed_dtypes_are_refused():
    with pytest.raises(TypeError, match="fft_conv2d: input is float32 but weight is float64"):
        fft_conv2d(mdl.tensor(np.ones((1, 1, 4, 4), np.float32)), mdl.tensor(np.ones((1, 1, 3, 3))))
