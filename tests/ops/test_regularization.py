"""dropout (statistics, reproducibility, gradient) and embedding (lookup, scatter-add gradient, errors)."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F


# ---------------------------------------------------------------- dropout
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_statistics(p, device):
    mdl.manual_seed(123)
    x = mdl.ones(200_000, device=device)
    y = F.dropout(x, p).numpy()
    dropped = (y == 0).mean()
    assert abs(dropped - p) < 0.01  # ~5 standard deviations at n = 2e5
    np.testing.assert_allclose(y[y != 0], 1 / (1 - p), rtol=1e-6)  # survivors scaled by 1/(1 − p)
    assert abs(y.mean() - 1.0) < 0.03  # the expectation is preserved


def test_dropout_is_reproducible_under_manual_seed():
    x = mdl.randn(50, 40)
    mdl.manual_seed(7)
    a = F.dropout(x, 0.3).numpy()
    b = F.dropout(x, 0.3).numpy()
    mdl.manual_seed(7)
    c = F.dropout(x, 0.3).numpy()
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)  # a second call draws a new mask


def test_dropout_gradient_is_the_saved_mask():
    x = mdl.tensor(np.random.default_rng(1).standard_normal((30, 20)) + 3, requires_grad=True)  # no zeros in x
    y = F.dropout(x, 0.4)
    g = np.random.default_rng(2).standard_normal((30, 20))
    y.backward(mdl.tensor(g))
    mask = y.numpy() / x.numpy()  # 0 or 1/(1 − p), exactly what forward applied
    assert set(np.round(np.unique(mask), 12)) <= {0.0, round(1 / 0.6, 12)}
    np.testing.assert_allclose(x.grad.numpy(), g * mask, rtol=1e-12)


def test_dropout_gradcheck_with_a_fixed_mask():
    x = mdl.tensor(np.random.default_rng(3).standard_normal((4, 5)), requires_grad=True)

    def fn(x):
        mdl.manual_seed(11)  # the same mask at every evaluation, so finite differences apply
        return F.dropout(x, 0.5)

    assert mdl.gradcheck(fn, [x])


def test_dropout_identity_when_off_and_float32(device):
    x = mdl.randn(5, 5, device=device, requires_grad=True)
    assert F.dropout(x, 0.5, training=False) is x
    assert F.dropout(x, 0.0) is x
    y = F.dropout(x, 0.5)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, "0.5", True])
def test_dropout_rejects_bad_p(p):
    with pytest.raises(ValueError, match=r"dropout: p is the probability .* must be in \[0, 1\)"):
        F.dropout(mdl.randn(3), p)


def test_dropout_matches_torch_statistics():
    torch = pytest.importorskip("torch")
    x = np.ones(100_000, dtype=np.float32)
    torch.manual_seed(0)
    ty = torch.nn.functional.dropout(torch.tensor(x), 0.25).numpy()
    y = F.dropout(mdl.tensor(x), 0.25).numpy()
    assert set(np.unique(y)) == set(np.unique(ty))  # same values: 0 and 1/(1 − p)
    assert abs((y == 0).mean() - (ty == 0).mean()) < 0.01


# ---------------------------------------------------------------- embedding
def test_embedding_lookup(device):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[3, 0], [1, 1]])
    y = F.embedding(idx, mdl.tensor(w, device=device))
    assert y.shape == (2, 2, 3) and y.dtype == np.float32
    np.testing.assert_array_equal(y.numpy(), [[w[3], w[0]], [w[1], w[1]]])


def test_embedding_gradient_adds_repeated_rows():
    w = mdl.tensor(np.zeros((5, 2)), requires_grad=True)
    idx = mdl.tensor(np.array([1, 3, 1, 1, 0]))  # row 1 used three times
    g = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0], [1000.0, 2000.0], [5.0, 6.0]])
    F.embedding(idx, w).backward(mdl.tensor(g))
    want = np.zeros((5, 2))
    want[1] = g[0] + g[2] + g[3]
    want[3] = g[1]
    want[0] = g[4]
    np.testing.assert_array_equal(w.grad.numpy(), want)


def test_embedding_gradcheck_and_list_indices():
    w = mdl.tensor(np.random.default_rng(4).standard_normal((4, 3)), requires_grad=True)
    assert mdl.gradcheck(lambda w: F.embedding([[0, 2], [2, 2]], w) ** 2, [w])


def test_embedding_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w, idx = rng.standard_normal((6, 4)), rng.integers(0, 6, size=(3, 5))
    g = rng.standard_normal((3, 5, 4))
    wt = mdl.tensor(w, requires_grad=True)
    y = F.embedding(idx, wt)
    y.backward(mdl.tensor(g))
    tw = torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.embedding(torch.tensor(idx), tw)
    ty.backward(torch.tensor(g))
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-12)


def test_embedding_errors():
    w = mdl.randn(4, 3)
    message = r"embedding: index 4 is out of range for 4 embeddings \(valid indices are 0..3\)"
    with pytest.raises(ValueError, match=message):
        F.embedding(np.array([0, 4]), w)
    with pytest.raises(ValueError, match=r"embedding: index -1 is out of range"):
        F.embedding(np.array([-1, 2]), w)
    with pytest.raises(TypeError, match=r"embedding: indices must be integers, got dtype float64"):
        F.embedding(np.array([0.0, 1.0]), w)
    with pytest.raises(ValueError, match=r"embedding: weight must be 2-D"):
        F.embedding(np.array([0]), mdl.randn(4))


# ---------------------------------------------------------------- channel dropout
@pytest.mark.parametrize("op,shape", [("dropout1d", (40, 50, 7)), ("dropout1d", (400, 7)),
                                      ("dropout2d", (40, 50, 3, 4)), ("dropout2d", (40, 50, 6))])
def test_channel_dropout_drops_whole_channels(op, shape, device):
    p = 0.3
    mdl.manual_seed(3)
    x = mdl.tensor((np.random.default_rng(0).random(shape) + 1).astype(np.float32), device=device)
    y = getattr(F, op)(x, p).numpy()
    channels = 1 if (op, len(shape)) == ("dropout1d", 2) else 2
    per_channel = y.reshape(int(np.prod(shape[:channels])), -1)
    ratio = per_channel / x.numpy().reshape(per_channel.shape)
    kept = ratio[:, 0] != 0
    np.testing.assert_allclose(ratio[kept], 1 / (1 - p), rtol=1e-6)  # every position of a kept channel
    assert (ratio[~kept] == 0).all()  # every position of a dropped one
    assert abs((~kept).mean() - p) < 0.05  # ~4 standard deviations at 2000 or 400 channels
    assert y.dtype == np.float32


def test_channel_dropout_gradient_is_the_saved_mask_and_gradchecks():
    x = mdl.tensor(np.random.default_rng(1).standard_normal((4, 5, 3, 2)), requires_grad=True)
    mdl.manual_seed(11)
    y = F.dropout2d(x, 0.5)
    gy = np.random.default_rng(2).standard_normal(y.shape)
    (y * mdl.tensor(gy)).sum().backward()
    scale = y.numpy() / x.numpy()
    np.testing.assert_allclose(x.grad.numpy(), gy * scale, rtol=1e-12)
    assert set(np.round(np.unique(scale), 12)) == {0.0, 2.0}

    def fixed(x):
        mdl.manual_seed(11)
        return F.dropout1d(x, 0.5)
    assert mdl.gradcheck(fixed, [mdl.tensor(np.random.default_rng(3).standard_normal((3, 4, 2)), requires_grad=True)])


def test_channel_dropout_off_identity_and_seeded():
    x = mdl.randn(2, 3, 4, 4)
    assert F.dropout2d(x, 0.5, training=False) is x
    np.testing.assert_array_equal(F.dropout1d(x[0], 0.0).numpy(), x[0].numpy())
    mdl.manual_seed(5)
    a = F.dropout2d(x, 0.5).numpy()
    mdl.manual_seed(5)
    np.testing.assert_array_equal(F.dropout2d(x, 0.5).numpy(), a)


def test_channel_dropout_errors():
    with pytest.raises(ValueError, match=r"dropout1d: expected input \(N, C, L\)"):
        F.dropout1d(mdl.randn(2, 3, 4, 5))
    with pytest.raises(ValueError, match=r"dropout2d: expected input \(N, C, H, W\)"):
        F.dropout2d(mdl.randn(2, 3))
    with pytest.raises(ValueError, match="dropout2d: p is the probability of zeroing a whole channel"):
        F.dropout2d(mdl.randn(2, 3, 4, 4), 1.0)


@pytest.mark.filterwarnings("ignore:dropout2d. Received a 3D input")
def test_channel_dropout_statistics_match_torch():
    """Same layout rules as torch: which axes share one draw, and the kept scale (masks differ: other RNGs)."""
    torch = pytest.importorskip("torch")
    for op, shape in (("dropout1d", (30, 40, 5)), ("dropout1d", (60, 5)), ("dropout2d", (30, 40, 3, 3)),
                      ("dropout2d", (30, 40, 5))):
        x = np.ones(shape, np.float32)
        ours = getattr(F, op)(mdl.tensor(x), 0.25).numpy()
        theirs = getattr(torch.nn.functional, op)(torch.tensor(x), 0.25).numpy()
        for y in (ours, theirs):
            assert np.array_equal(y, np.broadcast_to(y[..., :1], y.shape))  # constant along the last axis
            assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
            if len(shape) == 4:
                assert np.array_equal(y, np.broadcast_to(y[..., :1, :1], y.shape))
        rows = ours.reshape(-1, shape[-1])[:, 0]
        assert len(np.unique(rows)) == 2  # different channels get different draws
