"""conv1d / conv2d / im2col: values against a naive loop, gradients against finite differences."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
import minidl.functional as F
from minidl.backend import to_numpy


def naive_conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0)):
    """Direct four-loop cross-correlation, the definition itself."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, padding
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]  # (n, c, kh, kw)
            for f in range(o):
                y[:, f, i, j] = (window * w[f]).sum(axis=(1, 2, 3))
    if b is not None:
        y += b.reshape(1, o, 1, 1)
    return y


def t64(shape, rng, grad=True):
    return mdl.tensor(rng.standard_normal(shape), dtype="float64", requires_grad=grad)


CONFIGS = [  # (x shape, w shape, stride, padding)
    ((2, 3, 5, 5), (4, 3, 3, 3), 1, 0),
    ((2, 3, 5, 5), (4, 3, 3, 3), 1, 1),
    ((1, 2, 6, 5), (3, 2, 3, 2), 2, 1),
    ((2, 2, 5, 6), (2, 2, 2, 3), (2, 1), (0, 1)),
    ((1, 1, 4, 4), (2, 1, 4, 4), 1, 0),
    ((1, 2, 3, 3), (2, 2, 1, 1), 3, 2),
]


@pytest.mark.parametrize("xs, ws, stride, padding", CONFIGS)
def test_conv2d_matches_naive_loop(xs, ws, stride, padding):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    pair = lambda v: (v, v) if isinstance(v, int) else v  # noqa: E731
    got = F.conv2d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b), stride, padding).numpy()
    want = naive_conv2d(x, w, b, pair(stride), pair(padding))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("xs, ws, stride, padding", CONFIGS[:5])
def test_conv2d_gradcheck(xs, ws, stride, padding):
    rng = np.random.default_rng(2)
    x, w, b = t64(xs, rng), t64(ws, rng), t64(ws[0], rng)
    assert mdl.gradcheck(lambda x, w, b: F.conv2d(x, w, b, stride, padding), [x, w, b])


@pytest.mark.parametrize("stride, padding", [(1, 0), (2, 1)])
def test_conv2d_gradgradcheck(stride, padding):
    rng = np.random.default_rng(3)
    x, w, b = t64((1, 2, 4, 4), rng), t64((2, 2, 2, 2), rng), t64(2, rng)
    assert mdl.gradgradcheck(lambda x, w, b: F.conv2d(x, w, b, stride, padding), [x, w, b])


def test_conv2d_second_derivative_of_a_loss_is_exact():
    """d²/dw² of Σ conv(x, w)² is 2·Σ (∂y/∂w)² — compare a Hessian-vector product with finite differences."""
    rng = np.random.default_rng(4)
    x = mdl.tensor(rng.standard_normal((2, 1, 4, 4)), dtype="float64")
    w = t64((1, 1, 2, 2), rng)
    v = rng.standard_normal((1, 1, 2, 2))

    def grad_at(wv):
        wt = mdl.tensor(wv, requires_grad=True)
        (g,) = mdl.grad((F.conv2d(x, wt) ** 2).sum(), [wt])
        return g.numpy()

    (g,) = mdl.grad((F.conv2d(x, w) ** 2).sum(), [w], create_graph=True)
    (hv,) = mdl.grad((g * mdl.tensor(v)).sum(), [w])
    eps = 1e-5
    numeric = (grad_at(w.numpy() + eps * v) - grad_at(w.numpy() - eps * v)) / (2 * eps)
    np.testing.assert_allclose(hv.numpy(), numeric, rtol=1e-6, atol=1e-8)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), o=st.integers(1, 3), h=st.integers(3, 7),
       w=st.integers(3, 7), k=st.integers(1, 3), s=st.integers(1, 3), p=st.integers(0, 2))
def test_conv2d_random_shapes_match_naive(n, c, o, h, w, k, s, p):
    rng = np.random.default_rng(n * 1000 + c * 100 + h * 10 + w)
    x, wt = rng.standard_normal((n, c, h, w)), rng.standard_normal((o, c, k, k))
    got = F.conv2d(mdl.tensor(x), mdl.tensor(wt), stride=s, padding=p).numpy()
    np.testing.assert_allclose(got, naive_conv2d(x, wt, None, (s, s), (p, p)), rtol=1e-10, atol=1e-10)


def test_conv2d_on_device_matches_naive(device):
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    xt = mdl.tensor(x, device=device, requires_grad=True)
    wt = mdl.tensor(w, device=device, requires_grad=True)
    y = F.conv2d(xt, wt, mdl.tensor(b, device=device), stride=2, padding=1)
    assert y.device.startswith(device)
    np.testing.assert_allclose(y.numpy(), naive_conv2d(x, w, b, (2, 2), (1, 1)), rtol=1e-10)
    y.sum().backward()
    # d(Σ y)/dW[o, c, p, q] = Σ_{n,i,j} x_pad[n, c, 2i + p, 2j + q], the same for every o
    x_pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((3, 3, 3))
    for p in range(3):
        for q in range(3):
            want[:, p, q] = x_pad[:, :, p:p + 5:2, q:q + 5:2].sum(axis=(0, 2, 3))
    np.testing.assert_allclose(to_numpy(wt.grad.array), np.broadcast_to(want, (4, 3, 3, 3)), rtol=1e-10)


def test_conv2d_float32_stays_float32():
    x = mdl.randn(2, 3, 5, 5, requires_grad=True)
    w = mdl.randn(4, 3, 3, 3, requires_grad=True)
    b = mdl.zeros(4, requires_grad=True)
    y = F.conv2d(x, w, b, padding=1)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == np.float32


def test_conv1d_matches_naive_and_gradchecks():
    rng = np.random.default_rng(6)
    x, w, b = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 3, 3)), rng.standard_normal(2)
    got = F.conv1d(mdl.tensor(x), mdl.tensor(w), mdl.tensor(b), stride=2, padding=1).numpy()
    want = naive_conv2d(x[:, :, None, :], w[:, :, None, :], b, (1, 2), (0, 1))[:, :, 0, :]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    xt, wt, bt = t64((1, 2, 5), rng), t64((2, 2, 2), rng), t64(2, rng)
    assert mdl.gradcheck(lambda x, w, b: F.conv1d(x, w, b, 1, 1), [xt, wt, bt])
    assert mdl.gradgradcheck(lambda x, w: F.conv1d(x, w, stride=2), [xt, wt])


def test_im2col_and_col2im_are_adjoint():
    """⟨im2col(x), c⟩ = ⟨x, col2im(c)⟩: the defining property that makes each the other's gradient."""
    rng = np.random.default_rng(7)
    x = t64((2, 3, 5, 4), rng)
    cols = F.im2col(x, (3, 2), stride=(2, 1), padding=1)
    c = rng.standard_normal(cols.shape)
    (back,) = mdl.grad(cols, [x], grad_outputs=[mdl.tensor(c)])
    lhs = (cols.numpy() * c).sum()
    rhs = (x.numpy() * back.numpy()).sum()
    assert abs(lhs - rhs) < 1e-10 * max(1.0, abs(lhs))
    assert mdl.gradgradcheck(lambda x: F.im2col(x, 2, 1, 1) ** 2, [mdl.tensor(x.numpy()[:1, :1], requires_grad=True)])


def test_conv2d_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    x, w, b = rng.standard_normal((3, 4, 9, 7)), rng.standard_normal((5, 4, 3, 2)), rng.standard_normal(5)
    g = rng.standard_normal((3, 5, 4, 8))
    xt, wt, bt = (mdl.tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.conv2d(xt, wt, bt, stride=(2, 1), padding=(0, 1))
    y.backward(mdl.tensor(g))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=(2, 1), padding=(0, 1))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    for mine, theirs in ((xt, tx), (wt, tw), (bt, tb)):
        np.testing.assert_allclose(mine.grad.numpy(), theirs.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_conv1d_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, 3, 11)), rng.standard_normal((4, 3, 5))
    got = F.conv1d(mdl.tensor(x), mdl.tensor(w), stride=3, padding=2).numpy()
    want = torch.nn.functional.conv1d(torch.tensor(x), torch.tensor(w), stride=3, padding=2).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- bad input
def test_conv2d_errors_name_the_problem():
    x, w = mdl.randn(2, 3, 5, 5), mdl.randn(4, 3, 3, 3)
    with pytest.raises(ValueError, match=r"conv2d: input of shape \(2, 2, 5, 5\) has 2 channels but weight"):
        F.conv2d(mdl.randn(2, 2, 5, 5), w)
    with pytest.raises(ValueError, match=r"conv2d: input must be 4-D"):
        F.conv2d(mdl.randn(3, 5, 5), w)
    with pytest.raises(ValueError, match=r"conv2d: weight must be 4-D"):
        F.conv2d(x, mdl.randn(4, 3, 3))
    with pytest.raises(ValueError, match=r"larger than the padded input"):
        F.conv2d(mdl.randn(1, 3, 2, 2), w)
    with pytest.raises(ValueError, match=r"conv2d: stride must be an int ≥ 1"):
        F.conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match=r"conv2d: padding must be an int ≥ 0"):
        F.conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match=r"conv2d: bias must have shape \(4,\)"):
        F.conv2d(x, w, mdl.randn(3))
    with pytest.raises(TypeError, match=r"conv2d: input is float64 but weight is float32"):
        F.conv2d(x.double(), w)
    with pytest.raises(ValueError, match=r"conv1d: input must be 3-D \(N, C, L\)"):
        F.conv1d(x, mdl.randn(4, 3, 3))
