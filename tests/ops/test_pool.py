"""max_pool2d / avg_pool2d: values against loops, gradients against finite differences and PyTorch."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def naive_pool(x, kernel, stride, padding, kind):
    """Loop over output positions; max pads with −inf, avg pads with 0 and divides by KH·KW."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x.shape
    fill = -np.inf if kind == "max" else 0.0
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), fill)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            y[:, :, i, j] = window.max(axis=(2, 3)) if kind == "max" else window.sum(axis=(2, 3)) / (kh * kw)
    return y


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


CONFIGS = [  # (x shape, kernel, stride, padding)
    ((2, 2, 4, 4), 2, None, 0),
    ((1, 2, 5, 5), 2, 1, 0),
    ((1, 2, 5, 6), 3, 2, 1),
    ((2, 1, 6, 5), (3, 2), (1, 2), (1, 1)),
    ((1, 3, 4, 5), (2, 3), None, (1, 0)),
]


def distinct_values(shape, rng):
    """A permutation of well-separated values: no ties, so max is differentiable at the point."""
    return rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.1


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape, kernel, stride, padding", CONFIGS)
def test_pool_matches_naive_loop(kind, shape, kernel, stride, padding):
    x = np.random.default_rng(1).standard_normal(shape)
    pool = F.max_pool2d if kind == "max" else F.avg_pool2d
    got = pool(mdl.tensor(x), kernel, stride, padding).numpy()
    want = naive_pool(x, pair(kernel), pair(kernel if stride is None else stride), pair(padding), kind)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape, kernel, stride, padding", CONFIGS)
def test_max_pool_gradcheck(shape, kernel, stride, padding):
    x = mdl.tensor(distinct_values(shape, np.random.default_rng(2)), requires_grad=True)
    assert mdl.gradcheck(lambda x: F.max_pool2d(x, kernel, stride, padding), [x])


@pytest.mark.parametrize("shape, kernel, stride, padding", CONFIGS)
def test_avg_pool_gradcheck_and_gradgradcheck(shape, kernel, stride, padding):
    x = mdl.tensor(np.random.default_rng(3).standard_normal(shape), requires_grad=True)
    assert mdl.gradcheck(lambda x: F.avg_pool2d(x, kernel, stride, padding), [x])
    # avg pool is linear; square it so the second derivative is non-zero
    assert mdl.gradgradcheck(lambda x: F.avg_pool2d(x, kernel, stride, padding) ** 2, [x])


def test_max_pool_gradient_goes_to_argmax_and_overlaps_add():
    x = np.array([[[[1.0, 5.0, 2.0],
                    [0.0, 3.0, 4.0],
                    [6.0, 0.5, 0.2]]]])
    xt = mdl.tensor(x, requires_grad=True)
    y = F.max_pool2d(xt, 2, stride=1)  # windows overlap: 5 is the max of two windows
    np.testing.assert_array_equal(y.numpy(), [[[[5.0, 5.0], [6.0, 4.0]]]])
    y.backward(mdl.tensor(np.array([[[[1.0, 10.0], [100.0, 1000.0]]]])))
    want = np.zeros((1, 1, 3, 3))
    want[0, 0, 0, 1] = 11.0
    want[0, 0, 2, 0] = 100.0
    want[0, 0, 1, 2] = 1000.0
    np.testing.assert_array_equal(xt.grad.numpy(), want)


def test_max_pool_ties_go_to_the_first_maximum():
    xt = mdl.tensor(np.ones((1, 1, 2, 2)), requires_grad=True)
    F.max_pool2d(xt, 2).sum().backward()
    np.testing.assert_array_equal(xt.grad.numpy()[0, 0], [[1.0, 0.0], [0.0, 0.0]])


def test_max_pool_second_order_is_linear_in_upstream():
    """max_pool's backward is a scatter that is linear in dy; its own gradient (a gather) must agree."""
    x = mdl.tensor(distinct_values((1, 2, 4, 4), np.random.default_rng(4)), requires_grad=True)
    g = mdl.tensor(np.random.default_rng(5).standard_normal((1, 2, 2, 2)), requires_grad=True)
    (dx,) = mdl.grad(F.max_pool2d(x, 2), [x], grad_outputs=[g], create_graph=True)
    assert mdl.gradcheck(lambda g: mdl.grad(F.max_pool2d(x, 2), [x], grad_outputs=[g], create_graph=True)[0],
                         [g])
    assert dx.shape == x.shape


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_on_device_float32(kind, device):
    x = np.random.default_rng(6).standard_normal((2, 3, 6, 6)).astype(np.float32)
    xt = mdl.tensor(x, device=device, requires_grad=True)
    pool = F.max_pool2d if kind == "max" else F.avg_pool2d
    y = pool(xt, 3, 2, 1)
    assert y.dtype == np.float32 and y.device.startswith(device)
    np.testing.assert_allclose(y.numpy(), naive_pool(x.astype(np.float64), (3, 3), (2, 2), (1, 1), kind), rtol=1e-6)
    y.sum().backward()
    assert xt.grad.dtype == np.float32


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape, kernel, stride, padding", CONFIGS)
def test_pool_matches_torch(kind, shape, kernel, stride, padding):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    xt = mdl.tensor(x, requires_grad=True)
    pool = F.max_pool2d if kind == "max" else F.avg_pool2d
    y = pool(xt, kernel, stride, padding)
    g = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    tx = torch.tensor(x, requires_grad=True)
    tpool = torch.nn.functional.max_pool2d if kind == "max" else torch.nn.functional.avg_pool2d
    ty = tpool(tx, kernel, stride, padding)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_pool_errors_name_the_problem():
    x = mdl.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match=r"max_pool2d: input must be 4-D"):
        F.max_pool2d(mdl.randn(2, 4, 4), 2)
    with pytest.raises(ValueError, match=r"avg_pool2d: padding \(2, 2\) must be at most half the kernel size"):
        F.avg_pool2d(x, 3, padding=2)
    with pytest.raises(ValueError, match=r"max_pool2d: kernel \(5, 5\) is larger than the padded input"):
        F.max_pool2d(x, 5)
    with pytest.raises(ValueError, match=r"max_pool2d: kernel_size must be an int ≥ 1"):
        F.max_pool2d(x, 0)
    with pytest.raises(ValueError, match=r"avg_pool2d: stride must be an int ≥ 1"):
        F.avg_pool2d(x, 2, stride=(1, 0))
    with pytest.raises(TypeError, match=r"max_pool2d: input must be floating point, got dtype int64"):
        F.max_pool2d(mdl.tensor(np.ones((1, 1, 2, 2), dtype=np.int64)), 2)
