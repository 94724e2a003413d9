"""Pooling beyond the basics: dilation, ceil_mode, indices, unpooling, divisors, adaptive bins, 1-D forms."""
import itertools

import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def distinct(shape, seed=0):
    """A permutation of well-separated values: no ties, so max is differentiable and its argmax unique."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.37


def windows_along(size, k, s, p, d, ceil_mode):
    """Start of each window along one axis, from PyTorch's documented output-size formula."""
    span = (size + 2 * p - d * (k - 1) - 1) / s
    count = int(np.ceil(span) if ceil_mode else np.floor(span)) + 1
    if ceil_mode and (count - 1) * s >= size + p:
        count -= 1
    return [i * s - p for i in range(count)]


def naive_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=False, kind="max",
               count_include_pad=True, divisor_override=None):
    """Loop over windows; returns (values, flat argmax in the (H, W) plane) for max, values for avg."""
    (kh, kw), (ph, pw), (dh, dw) = pair(kernel), pair(padding), pair(dilation)
    sh, sw = pair(kernel if stride is None else stride)
    n, c, h, w = x.shape
    rows = windows_along(h, kh, sh, ph, dh, ceil_mode)
    cols = windows_along(w, kw, sw, pw, dw, ceil_mode)
    y = np.zeros((n, c, len(rows), len(cols)))
    index = np.zeros(y.shape, dtype=np.int64)
    for i, r in enumerate(rows):
        for j, q in enumerate(cols):
            taps = [(r + a * dh, q + b * dw) for a in range(kh) for b in range(kw)]
            inside = [(u, v) for u, v in taps if 0 <= u < h and 0 <= v < w]
            values = np.stack([x[:, :, u, v] for u, v in inside], axis=-1)
            if kind == "max":
                best = values.argmax(axis=-1)  # first maximum in row-major order
                y[:, :, i, j] = values.max(axis=-1)
                flat = np.array([u * w + v for u, v in inside])
                index[:, :, i, j] = flat[best]
                continue
            if divisor_override:
                divisor = divisor_override
            elif count_include_pad:  # the window clipped to the padded input
                divisor = (min(r + kh, h + ph) - r) * (min(q + kw, w + pw) - q)
            else:
                divisor = len(inside)
            y[:, :, i, j] = values.sum(axis=-1) / divisor
    return (y, index) if kind == "max" else y


MAX_CONFIGS = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 2, 7, 6), 2, None, 0, 1, True),
    ((1, 2, 7, 8), 3, 2, 1, 1, True),
    ((2, 1, 9, 8), 3, 2, 1, 2, False),
    ((1, 3, 8, 7), (2, 3), (1, 2), (1, 1), (2, 1), True),
    ((1, 2, 5, 5), 2, 3, 1, 1, True),   # the last ceil window would start in the padding: dropped
    ((1, 1, 6, 6), 3, 3, 0, 2, True),
]


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil_mode", MAX_CONFIGS)
def test_max_pool2d_matches_the_definition(shape, kernel, stride, padding, dilation, ceil_mode):
    x = distinct(shape)
    y, index = F.max_pool2d(mdl.tensor(x), kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    want, want_index = naive_pool(x, kernel, stride, padding, dilation, ceil_mode)
    np.testing.assert_array_equal(y.numpy(), want)
    np.testing.assert_array_equal(index.numpy(), want_index)
    assert index.dtype == np.int64 and not index.requires_grad


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil_mode", MAX_CONFIGS)
def test_max_pool2d_matches_torch_values_indices_and_gradients(shape, kernel, stride, padding, dilation, ceil_mode):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal(shape)
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, index = F.max_pool2d(xt, kernel, stride, padding, dilation, ceil_mode, True)
    ty, tindex = torch.nn.functional.max_pool2d(tx, kernel, stride, padding, dilation, ceil_mode, True)
    g = np.random.default_rng(2).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(index.numpy(), tindex.numpy())
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kernel, stride, padding, dilation, ceil_mode", [
    (3, None, 0, 1, False), (3, 2, 1, 1, True), (2, 1, 1, 3, False), (4, 3, 2, 1, True),
])
def test_max_pool1d_matches_torch_and_the_2d_definition(kernel, stride, padding, dilation, ceil_mode):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((2, 3, 11))
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, index = F.max_pool1d(xt, kernel, stride, padding, dilation, ceil_mode, True)
    ty, tindex = torch.nn.functional.max_pool1d(tx, kernel, stride, padding, dilation, ceil_mode, True)
    g = np.random.default_rng(4).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(index.numpy(), tindex.numpy())
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    want, _ = naive_pool(x[:, :, None], (1, kernel), (1, kernel if stride is None else stride), (0, padding),
                         (1, dilation), ceil_mode)
    np.testing.assert_array_equal(y.numpy(), want[:, :, 0])


def test_max_pool_defaults_are_accepted():
    x = mdl.tensor(distinct((1, 2, 6, 6)))
    np.testing.assert_array_equal(F.max_pool2d(x, 2, None, 0, 1, False, False).numpy(), F.max_pool2d(x, 2).numpy())
    y, index = F.max_pool2d(x, 2, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), F.max_pool2d(x, 2).numpy())
    # the indices read the maxima back out of each plane
    planes = x.numpy().reshape(2, 36)
    np.testing.assert_array_equal(np.take_along_axis(planes, index.numpy().reshape(2, -1), 1).reshape(y.shape),
                                  y.numpy())


# ---------------------------------------------------------------- unpooling
@pytest.mark.parametrize("shape, kernel, stride, padding, output_size", [
    ((2, 3, 6, 8), 2, None, 0, None), ((1, 2, 7, 7), 2, 2, 1, (7, 7)),
    ((1, 2, 7, 9), 2, 2, 0, (7, 9)), ((1, 2, 6, 6), 2, 2, 1, None),
    ((1, 2, 5, 6), (2, 3), (2, 3), 0, None),
])
def test_max_unpool2d_matches_torch_and_inverts_the_pool(shape, kernel, stride, padding, output_size):
    torch = pytest.importorskip("torch")
    x = distinct(shape)
    y, index = F.max_pool2d(mdl.tensor(x), kernel, stride, padding, return_indices=True)
    values = mdl.tensor(y.numpy(), requires_grad=True)
    out = F.max_unpool2d(values, index, kernel, stride, padding, output_size)
    ty, tindex = torch.nn.functional.max_pool2d(torch.tensor(x), kernel, stride, padding, return_indices=True)
    tvalues = ty.detach().requires_grad_()
    tout = torch.nn.functional.max_unpool2d(tvalues, tindex, kernel, stride, padding, output_size)
    np.testing.assert_array_equal(out.numpy(), tout.detach().numpy())
    # by the definition: each maximum back at its place, zeros elsewhere
    want = np.zeros(out.shape)
    n, c, oh, ow = out.shape
    want.reshape(n, c, -1)[np.arange(n)[:, None, None], np.arange(c)[None, :, None],
                           index.numpy().reshape(n, c, -1)] = y.numpy().reshape(n, c, -1)
    np.testing.assert_array_equal(out.numpy(), want)
    g = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(mdl.tensor(g))
    tout.backward(torch.tensor(g))
    np.testing.assert_array_equal(values.grad.numpy(), tvalues.grad.numpy())


def test_max_unpool_with_repeated_indices_puts_the_mean():
    """Overlapping windows can share one maximum: its copies are averaged (the same value, as PyTorch's),
    and each copy's gradient is dy / copies (PyTorch gives each copy all of dy)."""
    x = distinct((1, 1, 5, 5))
    y, index = F.max_pool2d(mdl.tensor(x), 3, 1, return_indices=True)
    counts = np.bincount(index.numpy().ravel(), minlength=25)
    assert counts.max() > 1
    values = mdl.tensor(y.numpy(), requires_grad=True)
    out = F.max_unpool2d(values, index, 3, 1)
    want = np.zeros(25)
    want[index.numpy().ravel()] = y.numpy().ravel()
    np.testing.assert_array_equal(out.numpy().ravel(), want)
    out.sum().backward()
    np.testing.assert_allclose(values.grad.numpy().ravel(), 1.0 / counts[index.numpy().ravel()])
    distinct_values = mdl.tensor(np.random.default_rng(6).standard_normal(y.shape), requires_grad=True)
    assert mdl.gradcheck(lambda v: F.max_unpool2d(v, index, 3, 1), [distinct_values])


def test_max_unpool1d_matches_torch():
    torch = pytest.importorskip("torch")
    x = distinct((2, 3, 9))
    y, index = F.max_pool1d(mdl.tensor(x), 3, 2, 1, return_indices=True)
    ty, tindex = torch.nn.functional.max_pool1d(torch.tensor(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(F.max_unpool1d(y, index, 3, 2, 1).numpy(),
                                  torch.nn.functional.max_unpool1d(ty, tindex, 3, 2, 1).numpy())


# ---------------------------------------------------------------- average pooling
AVG_CONFIGS = [  # shape, kernel, stride, padding, ceil_mode
    ((2, 2, 7, 6), 2, None, 0, True),
    ((1, 2, 7, 8), 3, 2, 1, True),
    ((1, 2, 6, 6), 3, 2, 1, False),
    ((1, 3, 8, 7), (2, 3), (3, 2), (1, 1), True),
    ((1, 2, 5, 5), 2, 3, 1, True),
]


@pytest.mark.parametrize("count_include_pad, divisor_override", [(True, None), (False, None), (True, 5)])
@pytest.mark.parametrize("shape, kernel, stride, padding, ceil_mode", AVG_CONFIGS)
def test_avg_pool2d_matches_the_definition_and_torch(shape, kernel, stride, padding, ceil_mode, count_include_pad,
                                                     divisor_override):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(7).standard_normal(shape)
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.avg_pool2d(xt, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    want = naive_pool(x, kernel, stride, padding, 1, ceil_mode, "avg", count_include_pad, divisor_override)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-14)
    ty = torch.nn.functional.avg_pool2d(tx, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    g = np.random.default_rng(8).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode, count_include_pad", [
    (3, None, 0, False, True), (3, 2, 1, True, False), (4, 3, 2, True, True), (2, 1, 1, False, False),
])
def test_avg_pool1d_matches_torch_and_the_definition(kernel, stride, padding, ceil_mode, count_include_pad):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(9).standard_normal((2, 3, 10))
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.avg_pool1d(xt, kernel, stride, padding, ceil_mode, count_include_pad)
    ty = torch.nn.functional.avg_pool1d(tx, kernel, stride, padding, ceil_mode, count_include_pad)
    g = np.random.default_rng(10).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)
    want = naive_pool(x[:, :, None], (1, kernel), (1, kernel if stride is None else stride), (0, padding), 1,
                      ceil_mode, "avg", count_include_pad)
    np.testing.assert_allclose(y.numpy(), want[:, :, 0], rtol=1e-12)


def test_avg_pool_gradgradcheck_with_uneven_divisors():
    x = mdl.tensor(np.random.default_rng(11).standard_normal((1, 2, 5, 5)), requires_grad=True)
    f = lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False) ** 2  # noqa: E731
    assert mdl.gradcheck(f, [x])
    assert mdl.gradgradcheck(f, [x])


# ---------------------------------------------------------------- adaptive pooling
def naive_adaptive(x, out, kind):
    """PyTorch's bins, ⌊i·H/OH⌋ … ⌈(i+1)·H/OH⌉, reduced one at a time."""
    n, c, h, w = x.shape
    oh, ow = out
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        r0, r1 = (i * h) // oh, -(-((i + 1) * h) // oh)
        for j in range(ow):
            c0, c1 = (j * w) // ow, -(-((j + 1) * w) // ow)
            block = x[:, :, r0:r1, c0:c1]
            y[:, :, i, j] = block.max(axis=(2, 3)) if kind == "max" else block.mean(axis=(2, 3))
    return y


SIZES = [1, 2, 3, (5, 2), (7, 6), (4, None), (2, 7), (10, 12)]


@pytest.mark.parametrize("output_size", SIZES)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pool2d_matches_the_definition_and_torch(kind, output_size):
    torch = pytest.importorskip("torch")
    x = distinct((2, 3, 7, 6), seed=12)
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    if kind == "avg":
        y = F.adaptive_avg_pool2d(xt, output_size)
        ty = torch.nn.functional.adaptive_avg_pool2d(tx, output_size)
    else:
        y, index = F.adaptive_max_pool2d(xt, output_size, return_indices=True)
        ty, tindex = torch.nn.functional.adaptive_max_pool2d(tx, output_size, return_indices=True)
        np.testing.assert_array_equal(index.numpy(), tindex.numpy())
    sizes = pair(output_size)
    sizes = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(sizes))
    np.testing.assert_allclose(y.numpy(), naive_adaptive(x, sizes, kind), rtol=1e-12, atol=1e-14)
    g = np.random.default_rng(13).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("output_size", [1, 3, 4, 7, 9])
def test_adaptive_pool1d_matches_torch(output_size):
    torch = pytest.importorskip("torch")
    x = distinct((2, 3, 7), seed=14)
    for ours, theirs in ((F.adaptive_avg_pool1d, torch.nn.functional.adaptive_avg_pool1d),
                         (F.adaptive_max_pool1d, torch.nn.functional.adaptive_max_pool1d)):
        xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        y, ty = ours(xt, output_size), theirs(tx, output_size)
        g = np.random.default_rng(15).standard_normal(y.shape)
        y.backward(mdl.tensor(g))
        ty.backward(torch.tensor(g))
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12)
        np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    _, index = F.adaptive_max_pool1d(mdl.tensor(x), output_size, return_indices=True)
    _, tindex = torch.nn.functional.adaptive_max_pool1d(torch.tensor(x), output_size, return_indices=True)
    np.testing.assert_array_equal(index.numpy(), tindex.numpy())


@pytest.mark.parametrize("kind", ["avg", "max"])
def test_pooling_on_device_float32(kind, device):
    x = distinct((2, 3, 7, 6)).astype(np.float32)
    xt = mdl.tensor(x, device=device, requires_grad=True)
    ys = [F.adaptive_avg_pool2d(xt, (3, 4)), F.avg_pool2d(xt, 3, 2, 1, True, False)] if kind == "avg" else \
         [F.adaptive_max_pool2d(xt, (3, 4)), F.max_pool2d(xt, 3, 2, 1, 2, True)]
    wants = [naive_adaptive(x.astype(np.float64), (3, 4), kind)]
    wants.append(naive_pool(x.astype(np.float64), 3, 2, 1, 1, True, "avg", False) if kind == "avg"
                 else naive_pool(x.astype(np.float64), 3, 2, 1, 2, True)[0])
    for y, want in zip(ys, wants):
        assert y.dtype == np.float32 and y.device.startswith(device)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    sum(y.sum() for y in ys).backward()
    assert xt.grad.dtype == np.float32


def test_pool_errors_name_the_problem():
    x = mdl.randn(1, 2, 4, 4)
    with pytest.raises(ValueError, match=r"max_pool1d: input must be 3-D \(N, C, L\)"):
        F.max_pool1d(x, 2)
    with pytest.raises(ValueError, match=r"max_pool2d: dilation must be an int ≥ 1"):
        F.max_pool2d(x, 2, dilation=0)
    with pytest.raises(ValueError, match=r"max_pool2d: kernel \(3, 3\) is larger than the padded input .*dilation"):
        F.max_pool2d(x, 3, dilation=2)
    with pytest.raises(ValueError, match=r"avg_pool1d: padding 2 must be at most half the kernel size 3"):
        F.avg_pool1d(mdl.randn(1, 2, 6), 3, padding=2)
    with pytest.raises(ValueError, match=r"avg_pool2d: divisor_override must be a positive int"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(ValueError, match=r"adaptive_avg_pool2d: output_size must be an int or 2 of them"):
        F.adaptive_avg_pool2d(x, (1, 2, 3))
    with pytest.raises(ValueError, match=r"adaptive_max_pool1d: output sizes must be ints ≥ 1"):
        F.adaptive_max_pool1d(mdl.randn(1, 2, 6), 0)
    _, index = F.max_pool2d(x, 2, return_indices=True)
    with pytest.raises(ValueError, match=r"max_unpool2d: indices must be integers of the input's shape"):
        F.max_unpool2d(mdl.randn(1, 2, 3, 3), index, 2)
    with pytest.raises(ValueError, match=r"max_unpool2d: indices must lie in \[0, 4\)"):
        F.max_unpool2d(mdl.randn(1, 2, 2, 2), index, 1)
    with pytest.raises(ValueError, match=r"max_unpool2d: output_size \(9, 9\) must be within a stride"):
        F.max_unpool2d(mdl.randn(1, 2, 2, 2), index, 2, output_size=(9, 9))


def test_every_window_size_rule_agrees_with_torch():
    """Output sizes over a grid of sizes, kernels, strides, paddings, dilations and ceil_mode."""
    torch = pytest.importorskip("torch")
    for size, k, s, p, d, ceil in itertools.product(range(3, 9), (1, 2, 3), (1, 2, 3), (0, 1), (1, 2), (False, True)):
        if 2 * p > k or size + 2 * p < d * (k - 1) + 1:
            continue
        x = np.zeros((1, 1, size, 2))
        ours = F.max_pool2d(mdl.tensor(x), (k, 1), (s, 1), (p, 0), (d, 1), ceil).shape
        theirs = tuple(torch.nn.functional.max_pool2d(torch.tensor(x), (k, 1), (s, 1), (p, 0), (d, 1), ceil).shape)
        assert ours == theirs, (size, k, s, p, d, ceil)
        if d == 1:
            assert F.avg_pool2d(mdl.tensor(x), (k, 1), (s, 1), (p, 0), ceil).shape == tuple(
                torch.nn.functional.avg_pool2d(torch.tensor(x), (k, 1), (s, 1), (p, 0), ceil).shape)


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(4, 2, 0, 1), (5, 3, 0, 1), (3, 3, 0, 2), (5, 3, 2, 2),
                                                               ((4, 6), (3, 5), (1, 0), 1)])
def test_ceil_mode_with_a_kernel_wider_than_the_input_gives_pytorchs_window(kernel, stride, padding, dilation):
    """ceil_mode rounds the window count up: a kernel wider than the (padded) input by less than a
    stride still has one window, the max (or mean) of what it covers."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(7).standard_normal((1, 2, 3, 4))
    xt, tx = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y = F.max_pool2d(xt, kernel, stride, padding, dilation, ceil_mode=True)
    ty = torch.nn.functional.max_pool2d(tx, kernel, stride, padding, dilation, ceil_mode=True)
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    g = np.random.default_rng(8).standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    if dilation == 1:
        a = F.avg_pool2d(mdl.tensor(x), kernel, stride, padding, ceil_mode=True)
        ta = torch.nn.functional.avg_pool2d(torch.tensor(x), kernel, stride, padding, ceil_mode=True)
        np.testing.assert_allclose(a.numpy(), ta.numpy(), rtol=1e-13)


def test_ceil_mode_window_over_the_whole_input_is_its_max():
    x = np.random.default_rng(9).standard_normal((1, 1, 3, 4))
    y = F.max_pool2d(mdl.tensor(x), 5, 3, ceil_mode=True)
    assert y.shape == (1, 1, 1, 1) and y.item() == x.max()
    with pytest.raises(ValueError, match="larger than the padded input"):
        F.max_pool2d(mdl.tensor(x), 5, 3)  # without ceil_mode there is no window, in PyTorch too
