"""Grouped, dilated, 'same'-padded and transposed convolutions: against the definition, PyTorch and each other."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl.backend import to_numpy


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def naive_conv(x, w, b=None, stride=1, padding=((0, 0), (0, 0)), dilation=1, groups=1):
    """The definition: y[n,o,i,j] = b[o] + Σ W[o,c,p,q] x_pad[n, g·C/G+c, i·sh+p·dh, j·sw+q·dw]."""
    (sh, sw), (dh, dw) = pair(stride), pair(dilation)
    n, cin, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = padding
    xp = np.zeros((n, cin, h + pt + pb, wd + pl + pr))
    xp[:, :, pt:pt + h, pl:pl + wd] = x
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow))
    og = o // groups
    for f in range(o):
        g = f // og
        for i in range(oh):
            for j in range(ow):
                for p in range(kh):
                    for q in range(kw):
                        y[:, f, i, j] += xp[:, g * cg:(g + 1) * cg, i * sh + p * dh, j * sw + q * dw] @ w[f, :, p, q]
    return y if b is None else y + b.reshape(1, o, 1, 1)


def naive_conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
    """The definition by scattering: every input pixel adds x · W[c, o] at i·s + p·d − pad."""
    (sh, sw), (dh, dw), (ph, pw), (oph, opw) = pair(stride), pair(dilation), pair(padding), pair(output_padding)
    n, cin, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = cin // groups
    out_h = (h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    out_w = (wd - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    full = np.zeros((n, og * groups, out_h + 2 * ph + sh + dh * kh, out_w + 2 * pw + sw + dw * kw))
    for c in range(cin):
        g = c // cg
        for i in range(h):
            for j in range(wd):
                for p in range(kh):
                    for q in range(kw):
                        full[:, g * og:(g + 1) * og, i * sh + p * dh, j * sw + q * dw] += np.outer(x[:, c, i, j],
                                                                                                 w[c, :, p, q])
    y = full[:, :, ph:ph + out_h, pw:pw + out_w]
    return y if b is None else y + b.reshape(1, -1, 1, 1)


CONV_CONFIGS = [  # x shape, w shape, stride, padding, dilation, groups
    ((2, 4, 7, 6), (6, 2, 3, 2), (2, 1), (1, 2), (2, 1), 2),
    ((2, 4, 6, 6), (8, 1, 3, 3), 1, 1, 1, 4),             # depthwise, channel multiplier 2
    ((1, 3, 8, 7), (2, 3, 3, 3), 2, 0, 2, 1),
    ((2, 6, 5, 5), (3, 2, 1, 2), 1, 0, (1, 3), 3),
    ((1, 4, 7, 6), (4, 4, 4, 3), 1, "same", (1, 2), 1),   # even kernel: one more row after than before
    ((1, 2, 5, 6), (4, 1, 2, 2), 1, "same", 2, 2),
    ((1, 2, 5, 6), (3, 2, 3, 3), 2, "valid", 1, 1),
]


def _sides(padding, w, dilation):
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        totals = [d * (k - 1) for k, d in zip(w[2:], pair(dilation))]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in pair(padding))


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CONFIGS)
def test_conv2d_matches_the_definition(xs, ws, stride, padding, dilation, groups):
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    got = F.conv2d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b), stride, padding, dilation, groups).numpy()
    want = naive_conv(x, w, b, stride, _sides(padding, ws, dilation), dilation, groups)
    assert got.shape == want.shape
    if padding == "same":
        assert got.shape[2:] == xs[2:]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CONFIGS)
def test_conv2d_matches_torch_values_and_gradients(xs, ws, stride, padding, dilation, groups):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) for s in (xs, ws, (ws[0],))]
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv2d(*ours, stride, padding, dilation, groups)
    ty = torch.nn.functional.conv2d(*theirs, stride, padding, dilation, groups)
    g = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, other in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad.numpy(), other.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("stride, padding, dilation, groups", [
    (2, 1, 1, 1), (1, 2, 3, 2), (1, "same", 2, 4), (1, "same", 1, 1), (3, "valid", 1, 2),
])
def test_conv1d_matches_torch(stride, padding, dilation, groups):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(s) for s in ((2, 4, 11), (8, 4 // groups, 4), (8,))]
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv1d(*ours, stride, padding, dilation, groups)
    ty = torch.nn.functional.conv1d(*theirs, stride, padding, dilation, groups)
    g = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, other in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad.numpy(), other.grad.numpy(), rtol=1e-10, atol=1e-12)
    # and against the 2-D definition with height 1
    sides = _sides(padding if isinstance(padding, str) else (0, padding), (8, 4, 1, 4), (1, dilation))
    want = naive_conv(arrays[0][:, :, None], arrays[1][:, :, None], arrays[2], (1, stride), sides, (1, dilation),
                      groups)
    np.testing.assert_allclose(y.numpy(), want[:, :, 0], rtol=1e-12, atol=1e-12)


def test_pytorch_defaults_are_accepted_and_change_nothing():
    """F.conv2d(x, w, b, 1, 0, 1, 1): every default spelled out gives the plain convolution."""
    rng = np.random.default_rng(3)
    x, w = mdl.tensor(rng.standard_normal((2, 3, 5, 5))), mdl.tensor(rng.standard_normal((4, 3, 3, 3)))
    plain = F.conv2d(x, w).numpy()
    np.testing.assert_array_equal(F.conv2d(x, w, None, 1, 0, 1, 1).numpy(), plain)
    np.testing.assert_array_equal(F.conv2d(x, w, stride=(1, 1), padding="valid", dilation=(1, 1), groups=1).numpy(),
                                  plain)
    x1, w1 = mdl.tensor(rng.standard_normal((2, 3, 9))), mdl.tensor(rng.standard_normal((4, 3, 3)))
    np.testing.assert_array_equal(F.conv1d(x1, w1, None, 1, 0, 1, 1).numpy(), F.conv1d(x1, w1).numpy())


def test_grouped_conv_is_independent_convolutions():
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 6, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    y = F.conv2d(mdl.tensor(x), mdl.tensor(w), padding=1, groups=2).numpy()
    for g in range(2):
        part = F.conv2d(mdl.tensor(x[:, 3 * g:3 * g + 3]), mdl.tensor(w[2 * g:2 * g + 2]), padding=1).numpy()
        np.testing.assert_allclose(y[:, 2 * g:2 * g + 2], part, rtol=1e-12)


@pytest.mark.parametrize("padding, dilation, groups, channels", [(1, 1, 1, 2), (0, 2, 2, 4), ("same", (2, 1), 3, 3)])
def test_conv2d_gradcheck_and_gradgradcheck(padding, dilation, groups, channels):
    rng = np.random.default_rng(5)
    x = mdl.tensor(rng.standard_normal((1, channels, 5, 5)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((channels, channels // groups, 2, 3)), requires_grad=True)
    b = mdl.tensor(rng.standard_normal(channels), requires_grad=True)
    f = lambda x, w, b: F.conv2d(x, w, b, 1, padding, dilation, groups)  # noqa: E731
    assert mdl.gradcheck(f, [x, w, b])
    assert mdl.gradgradcheck(f, [x, w, b])


# ---------------------------------------------------------------- transposed convolution
TRANSPOSE_CONFIGS = [  # x shape, w shape, stride, padding, output_padding, dilation, groups
    ((2, 3, 4, 5), (3, 2, 3, 3), 1, 0, 0, 1, 1),
    ((2, 3, 4, 5), (3, 2, 3, 2), 2, 1, 1, 1, 1),
    ((1, 4, 3, 4), (4, 3, 2, 3), (2, 3), (1, 0), (1, 2), (1, 2), 2),
    ((2, 4, 3, 3), (4, 1, 3, 3), 2, 1, 0, 1, 4),
    ((1, 2, 4, 4), (2, 3, 3, 2), 1, 0, 1, 2, 1),  # output_padding < dilation with stride 1
    ((1, 2, 3, 3), (2, 2, 4, 4), 3, 2, 2, 1, 1),
]


@pytest.mark.parametrize("xs, ws, stride, padding, output_padding, dilation, groups", TRANSPOSE_CONFIGS)
def test_conv_transpose2d_matches_the_definition(xs, ws, stride, padding, output_padding, dilation, groups):
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[1] * groups)
    got = F.conv_transpose2d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b), stride, padding, output_padding, groups,
                             dilation).numpy()
    want = naive_conv_transpose(x, w, b, stride, padding, output_padding, dilation, groups)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xs, ws, stride, padding, output_padding, dilation, groups", TRANSPOSE_CONFIGS)
def test_conv_transpose2d_matches_torch_values_and_gradients(xs, ws, stride, padding, output_padding, dilation,
                                                            groups):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) for s in (xs, ws, (ws[1] * groups,))]
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv_transpose2d(*ours, stride, padding, output_padding, groups, dilation)
    ty = torch.nn.functional.conv_transpose2d(*theirs, stride, padding, output_padding, groups, dilation)
    g = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, other in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad.numpy(), other.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stride, padding, output_padding, dilation, groups", [
    (1, 0, 0, 1, 1), (2, 1, 1, 1, 2), (3, 2, 1, 2, 1), (1, 1, 1, 2, 4),
])
def test_conv_transpose1d_matches_torch(stride, padding, output_padding, dilation, groups):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    arrays = [rng.standard_normal(s) for s in ((2, 4, 6), (4, 2, 3), (2 * groups,))]
    ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    y = F.conv_transpose1d(*ours, stride, padding, output_padding, groups, dilation)
    ty = torch.nn.functional.conv_transpose1d(*theirs, stride, padding, output_padding, groups, dilation)
    g = rng.standard_normal(y.shape)
    y.backward(mdl.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, other in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad.numpy(), other.grad.numpy(), rtol=1e-10, atol=1e-12)
    want = naive_conv_transpose(arrays[0][:, :, None], arrays[1][:, :, None], arrays[2], (1, stride), (0, padding),
                                (0, output_padding), (1, dilation), groups)
    np.testing.assert_allclose(y.numpy(), want[:, :, 0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride, padding, dilation, groups", [(1, 0, 1, 1), (2, 1, 1, 2), (2, 2, 2, 1)])
def test_conv_transpose_is_the_adjoint_of_conv(stride, padding, dilation, groups):
    """⟨conv2d(x, W), y⟩ = ⟨x, conv_transpose2d(y, W)⟩ with the same W: the defining property."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((4, 4 // groups, 3, 3))
    x = rng.standard_normal((2, 4, 9, 8))
    cx = F.conv2d(mdl.tensor(x), mdl.tensor(w), None, stride, padding, dilation, groups).numpy()
    y = rng.standard_normal(cx.shape)
    # output_padding recovers x's size when the stride left rows over
    extra = [(s - 1) * stride - 2 * padding + dilation * 2 + 1 for s in cx.shape[2:]]
    output_padding = tuple(n - e for n, e in zip(x.shape[2:], extra))
    ty = F.conv_transpose2d(mdl.tensor(y), mdl.tensor(w), None, stride, padding, output_padding, groups,
                            dilation).numpy()
    assert ty.shape == x.shape
    np.testing.assert_allclose((cx * y).sum(), (x * ty).sum(), rtol=1e-12)


def test_conv_transpose2d_gradgradcheck():
    rng = np.random.default_rng(10)
    x = mdl.tensor(rng.standard_normal((1, 2, 3, 3)), requires_grad=True)
    w = mdl.tensor(rng.standard_normal((2, 2, 2, 2)), requires_grad=True)
    b = mdl.tensor(rng.standard_normal(4), requires_grad=True)
    f = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2)  # noqa: E731
    assert mdl.gradcheck(f, [x, w, b])
    assert mdl.gradgradcheck(f, [x, w, b])


def test_float32_stays_float32(device):
    x = mdl.randn(2, 4, 5, 5, device=device, requires_grad=True)
    w = mdl.randn(4, 2, 3, 3, device=device, requires_grad=True)
    wt = mdl.randn(4, 3, 3, 3, device=device, requires_grad=True)
    y = F.conv2d(x, w, padding="same", dilation=2, groups=2)
    z = F.conv_transpose2d(x, wt, stride=2, groups=2)
    assert y.dtype == z.dtype == np.float32 and y.device.startswith(device)
    (y.sum() + z.sum()).backward()
    assert x.grad.dtype == w.grad.dtype == wt.grad.dtype == np.float32
    cpu = F.conv_transpose2d(x.detach().cpu(), wt.detach().cpu(), stride=2, groups=2)
    np.testing.assert_allclose(to_numpy(z.array), cpu.numpy(), rtol=1e-5, atol=1e-5)


def test_errors_name_the_problem():
    x, w = mdl.randn(2, 4, 5, 5), mdl.randn(6, 2, 3, 3)
    with pytest.raises(ValueError, match=r"conv2d: input of shape \(2, 4, 5, 5\) has 4 channels but weight of "
                                         r"shape \(6, 2, 3, 3\) expects 6 .*groups=3"):
        F.conv2d(x, w, groups=3)
    with pytest.raises(ValueError, match=r"conv2d: weight of shape \(6, 2, 3, 3\) has 6 output channels, not "
                                         r"divisible by groups=4"):
        F.conv2d(mdl.randn(2, 8, 5, 5), w, groups=4)
    with pytest.raises(ValueError, match=r"conv2d: groups must be an int ≥ 1"):
        F.conv2d(x, w, groups=0)
    with pytest.raises(ValueError, match=r"conv2d: padding='same' needs stride 1"):
        F.conv2d(x, w, stride=2, padding="same", groups=2)
    with pytest.raises(ValueError, match=r"conv1d: padding must be an int, a pair of ints, 'same' or 'valid'"):
        F.conv1d(mdl.randn(1, 2, 5), mdl.randn(1, 2, 3), padding="full")
    with pytest.raises(ValueError, match=r"conv2d: dilation must be an int ≥ 1"):
        F.conv2d(x, w, dilation=0, groups=2)
    with pytest.raises(ValueError, match=r"conv2d: kernel of size \(3, 3\) \(dilation \(3, 3\)\) is larger"):
        F.conv2d(x, w, dilation=3, groups=2)
    with pytest.raises(ValueError, match=r"conv_transpose2d: output_padding \(2, 2\) must be smaller than the "
                                         r"stride \(2, 2\) or the dilation \(1, 1\)"):
        F.conv_transpose2d(x, mdl.randn(4, 3, 3, 3), stride=2, output_padding=2)
    with pytest.raises(ValueError, match=r"conv_transpose2d: input of shape \(2, 4, 5, 5\) has 4 channels but "
                                         r"weight of shape \(3, 3, 3, 3\) expects 3 \(weight is \(in_channels"):
        F.conv_transpose2d(x, mdl.randn(3, 3, 3, 3))
    with pytest.raises(ValueError, match=r"conv_transpose2d: bias must have shape \(6,\)"):
        F.conv_transpose2d(x, mdl.randn(4, 3, 3, 3), mdl.randn(3), groups=2)
    with pytest.raises(ValueError, match=r"conv_transpose1d: padding \(3,\) leaves no output"):
        F.conv_transpose1d(mdl.randn(1, 2, 2), mdl.randn(2, 1, 2), padding=3)
