"""BatchNorm1d/2d (train, eval, running statistics), LayerNorm, GroupNorm: against PyTorch and NumPy."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def to_numpy_state(module):
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def randomize_affine(theirs, torch, seed=0):
    """Non-trivial γ and β, so the affine part is tested too."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def check_step(ours, theirs, x, torch, rtol=1e-9):
    xo, xt = mdl.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    yo, yt = ours(xo), theirs(xt)
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), rtol=rtol, atol=1e-10)
    g = np.random.default_rng(x.size).normal(size=yo.shape)
    yo.backward(mdl.tensor(g))
    yt.backward(torch.tensor(g))
    np.testing.assert_allclose(xo.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=1e-10)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=rtol, atol=1e-10, err_msg=name)
        p.grad, q.grad = None, None


@pytest.mark.parametrize("layer, shape, kwargs", [
    ("BatchNorm1d", (8, 4), {}), ("BatchNorm1d", (6, 4, 5), {}), ("BatchNorm2d", (5, 4, 3, 3), {}),
    ("BatchNorm2d", (5, 4, 3, 3), dict(momentum=None)), ("BatchNorm1d", (8, 4), dict(momentum=0.3, eps=1e-3)),
    ("BatchNorm2d", (4, 4, 2, 3), dict(affine=False)),
])
def test_batchnorm_train_steps_running_stats_and_eval_match_torch(layer, shape, kwargs):
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, layer)(4, **kwargs).double()
    randomize_affine(theirs, torch)
    ours = getattr(nn, layer)(4, **kwargs).double()
    ours.load_state_dict(to_numpy_state(theirs))
    rng = np.random.default_rng(4)
    for step in range(4):
        check_step(ours, theirs, rng.normal(2.0, 3.0, size=shape), torch)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-12)
    assert int(ours.num_batches_tracked.array) == int(theirs.num_batches_tracked) == 4
    ours.eval()
    theirs.eval()
    check_step(ours, theirs, rng.normal(size=shape), torch)
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(), rtol=1e-12)


def test_batchnorm_without_running_stats_matches_torch_in_both_modes():
    torch = pytest.importorskip("torch")
    theirs = torch.nn.BatchNorm1d(3, track_running_stats=False).double()
    ours = nn.BatchNorm1d(3, track_running_stats=False).double()
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    x = np.random.default_rng(5).normal(size=(6, 3))
    check_step(ours, theirs, x, torch)
    ours.eval()
    theirs.eval()
    check_step(ours, theirs, x, torch)


def test_batchnorm_by_formula_without_torch():
    bn = nn.BatchNorm1d(3, momentum=0.5).double()
    bn.weight.array[...] = [1.0, 2.0, 3.0]
    bn.bias.array[...] = [0.0, -1.0, 1.0]
    x = np.random.default_rng(6).normal(1.0, 2.0, size=(10, 3))
    y = bn(mdl.tensor(x)).numpy()
    mu, var = x.mean(0), x.var(0)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5) * [1, 2, 3] + [0, -1, 1], rtol=1e-10)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.5 * mu, rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.5 + 0.5 * x.var(0, ddof=1), rtol=1e-12)
    bn.eval()
    z = np.random.default_rng(7).normal(size=(2, 3))
    expected = (z - 0.5 * mu) / np.sqrt(0.5 + 0.5 * x.var(0, ddof=1) + 1e-5) * [1, 2, 3] + [0, -1, 1]
    np.testing.assert_allclose(bn(mdl.tensor(z)).numpy(), expected, rtol=1e-10)


def test_batchnorm_eval_output_of_one_example_ignores_the_rest_of_the_batch():
    bn = nn.BatchNorm2d(2)
    for _ in range(3):
        bn(mdl.randn(4, 2, 3, 3) * 3 + 1)
    bn.eval()
    batch = mdl.randn(5, 2, 3, 3)
    alone = bn(batch[:1]).numpy()
    np.testing.assert_allclose(bn(batch).numpy()[:1], alone, rtol=1e-6)
    bn.train()
    assert not np.allclose(bn(batch).numpy()[:1], bn(batch[:2]).numpy()[:1])


def test_batchnorm_running_stats_survive_a_state_dict_round_trip():
    bn = nn.BatchNorm1d(3)
    bn(mdl.randn(8, 3) * 2 + 5)
    other = nn.BatchNorm1d(3)
    other.load_state_dict(bn.state_dict())
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_array_equal(getattr(other, name).array, getattr(bn, name).array)


def test_batchnorm_input_errors():
    with pytest.raises(ValueError, match="expected input \\(N, C, H, W\\) with C=3, got shape \\(2, 3\\)"):
        nn.BatchNorm2d(3)(mdl.zeros(2, 3))
    with pytest.raises(ValueError, match="C=3"):
        nn.BatchNorm1d(3)(mdl.zeros(2, 4))
    with pytest.raises(ValueError, match="more than one value per channel"):
        nn.BatchNorm1d(3)(mdl.zeros(1, 3))


@pytest.mark.parametrize("shape, normalized, kwargs", [
    ((4, 6), 6, {}), ((2, 3, 4, 5), (4, 5), {}), ((3, 5), 5, dict(bias=False)),
    ((3, 5), 5, dict(elementwise_affine=False)), ((2, 3, 4), 4, dict(eps=1e-2)),
])
def test_layernorm_matches_torch(shape, normalized, kwargs):
    torch = pytest.importorskip("torch")
    theirs = torch.nn.LayerNorm(normalized, **kwargs).double()
    randomize_affine(theirs, torch, 1)
    ours = nn.LayerNorm(normalized, **kwargs).double()
    ours.load_state_dict(to_numpy_state(theirs))
    check_step(ours, theirs, np.random.default_rng(8).normal(1.0, 2.0, size=shape), torch)


@pytest.mark.parametrize("groups, shape, kwargs", [
    (2, (3, 4, 5), {}), (4, (2, 8, 3, 3), {}), (1, (2, 6, 4), {}), (6, (2, 6, 2, 2), dict(affine=False)),
])
def test_groupnorm_matches_torch(groups, shape, kwargs):
    torch = pytest.importorskip("torch")
    theirs = torch.nn.GroupNorm(groups, shape[1], **kwargs).double()
    randomize_affine(theirs, torch, 2)
    ours = nn.GroupNorm(groups, shape[1], **kwargs).double()
    ours.load_state_dict(to_numpy_state(theirs))
    check_step(ours, theirs, np.random.default_rng(9).normal(size=shape), torch)


def test_layernorm_and_groupnorm_by_formula():
    x = np.random.default_rng(10).normal(size=(3, 4, 2))
    ln = nn.LayerNorm((4, 2)).double()
    mu, var = x.mean(axis=(1, 2), keepdims=True), x.var(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(ln(mdl.tensor(x)).numpy(), (x - mu) / np.sqrt(var + 1e-5), rtol=1e-10)
    gn = nn.GroupNorm(2, 4).double()
    grouped = x.reshape(3, 2, 4)
    mu, var = grouped.mean(axis=2, keepdims=True), grouped.var(axis=2, keepdims=True)
    expected = ((grouped - mu) / np.sqrt(var + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(gn(mdl.tensor(x)).numpy(), expected, rtol=1e-10)
    training_output = ln(mdl.tensor(x)).numpy()
    np.testing.assert_array_equal(ln.eval()(mdl.tensor(x)).numpy(), training_output)  # no mode dependence


def test_norm_gradcheck_float64():
    for layer, shape in ((nn.BatchNorm2d(2), (3, 2, 2, 2)), (nn.LayerNorm(3), (2, 3)), (nn.GroupNorm(2, 4), (2, 4, 3))):
        layer.double()
        for p in layer.parameters():
            p.array[...] = np.random.default_rng(11).normal(size=p.shape)
        x = mdl.randn(*shape, dtype=np.float64, requires_grad=True)
        assert mdl.gradcheck(lambda x, *ps: layer(x), [x] + list(layer.parameters()))


def test_norm_defaults_and_errors():
    bn = nn.BatchNorm1d(5)
    assert (bn.weight.array == 1).all() and (bn.bias.array == 0).all()
    assert (bn.running_mean.array == 0).all() and (bn.running_var.array == 1).all()
    assert bn.weight.dtype == np.float32 and bn.num_batches_tracked.dtype == np.int64
    assert [n for n, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    with pytest.raises(ValueError, match="divisible by num_groups"):
        nn.GroupNorm(3, 4)
    with pytest.raises(ValueError, match="last axes must have shape \\(4,\\)"):
        nn.LayerNorm(4)(mdl.zeros(2, 5))


def test_batchnorm_on_the_device(device):
    bn = nn.BatchNorm2d(3).to(device)
    x = (mdl.randn(4, 3, 2, 2) * 2 + 1).to(device)
    bn(x)
    assert bn.running_mean.device.startswith(device)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * x.numpy().mean(axis=(0, 2, 3)), rtol=1e-5)
    bn.eval()
    assert bn(x).device.startswith(device)


# ---------------------------------------------------------------- InstanceNorm1d/2d
@pytest.mark.parametrize("layer, shape, kwargs", [
    ("InstanceNorm1d", (3, 4, 6), {}), ("InstanceNorm1d", (4, 6), {}), ("InstanceNorm2d", (2, 4, 3, 5), {}),
    ("InstanceNorm2d", (4, 3, 5), dict(affine=True)), ("InstanceNorm1d", (3, 4, 6), dict(affine=True, eps=1e-3)),
    ("InstanceNorm2d", (2, 4, 3, 3), dict(affine=True, track_running_stats=True, momentum=0.2)),
    ("InstanceNorm1d", (4, 6), dict(track_running_stats=True)),
    ("InstanceNorm1d", (2, 4, 6), dict(track_running_stats=True, momentum=None)),
])
def test_instancenorm_train_eval_and_state_match_torch(layer, shape, kwargs):
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, layer)(4, **kwargs).double(), getattr(torch.nn, layer)(4, **kwargs).double()
    randomize_affine(theirs, torch)
    ours.load_state_dict(to_numpy_state(theirs))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    rng = np.random.default_rng(0)
    for _ in range(2):
        check_step(ours, theirs, rng.normal(size=shape) * 3 + 1, torch)
    for name, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[name], value.numpy(), rtol=1e-12, err_msg=name)
    ours.eval()
    theirs.eval()
    check_step(ours, theirs, rng.normal(size=shape), torch)
    assert repr(ours) == repr(theirs)


def test_instancenorm_defaults_by_formula():
    norm = nn.InstanceNorm2d(3)
    assert norm.weight is None and norm.bias is None and norm.running_mean is None
    assert list(norm.state_dict()) == [] and not norm.affine and not norm.track_running_stats
    x = np.random.default_rng(1).normal(size=(2, 3, 4, 5)).astype(np.float32) * 4
    y = norm(mdl.tensor(x)).numpy()
    mu, var = x.mean(axis=(2, 3), keepdims=True), x.var(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(y, (x - mu) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    norm.eval()  # without running statistics, evaluation uses the input's statistics too
    np.testing.assert_allclose(norm(mdl.tensor(x)).numpy(), y, rtol=1e-6)


def test_instancenorm_tracked_eval_uses_running_stats_by_formula():
    norm = nn.InstanceNorm1d(2, track_running_stats=True, momentum=0.5)
    x = np.random.default_rng(2).normal(size=(3, 2, 5)) * 2 + 1
    norm.double()(mdl.tensor(x))
    mean = 0.5 * x.mean(axis=2).mean(axis=0)
    var = 0.5 + 0.5 * x.var(axis=2, ddof=1).mean(axis=0)
    np.testing.assert_allclose(norm.running_mean.numpy(), mean, rtol=1e-12)
    np.testing.assert_allclose(norm.running_var.numpy(), var, rtol=1e-12)
    assert int(norm.num_batches_tracked.array) == 0  # PyTorch's InstanceNorm never counts
    norm.eval()
    np.testing.assert_allclose(norm(mdl.tensor(x)).numpy(), (x - mean[:, None]) / np.sqrt(var[:, None] + 1e-5),
                               rtol=1e-12)


def test_instancenorm_errors_and_warning():
    with pytest.raises(ValueError, match=r"InstanceNorm2d\(3\): expected input \(N, C, H, W\)"):
        nn.InstanceNorm2d(3)(mdl.zeros(2, 3))
    with pytest.raises(ValueError, match="expected 3 channels"):
        nn.InstanceNorm1d(3, affine=True)(mdl.zeros(2, 4, 5))
    with pytest.warns(UserWarning, match="expected 3 channels"):
        nn.InstanceNorm1d(3)(mdl.randn(2, 4, 5))  # PyTorch also only warns without affine parameters
    with pytest.raises(ValueError, match="num_features must be positive"):
        nn.InstanceNorm1d(0)


# ---------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("shape, normalized, kwargs", [
    ((3, 5), 5, {}), ((2, 3, 4), (3, 4), dict(eps=1e-3)), ((2, 3, 4), [4], dict(elementwise_affine=False)),
])
def test_rmsnorm_matches_torch(shape, normalized, kwargs):
    torch = pytest.importorskip("torch")
    ours, theirs = nn.RMSNorm(normalized, **kwargs).double(), torch.nn.RMSNorm(normalized, **kwargs).double()
    randomize_affine(theirs, torch)
    ours.load_state_dict(to_numpy_state(theirs))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    check_step(ours, theirs, np.random.default_rng(3).normal(size=shape), torch)
    assert repr(ours) == repr(theirs)


def test_rmsnorm_float32_by_formula_and_defaults():
    norm = nn.RMSNorm(4)
    assert norm.weight.dtype == np.float32 and (norm.weight.array == 1).all() and norm.eps is None
    norm.weight.array[...] = [1.0, 2.0, 0.5, -1.0]
    x = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    y = norm(mdl.tensor(x))
    assert y.dtype == np.float32
    want = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + np.finfo(np.float32).eps) * norm.weight.numpy()
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)
    with pytest.raises(ValueError, match=r"RMSNorm\(4,\): the input's last axes must have shape"):
        norm(mdl.zeros(4, 3))
    assert mdl.gradcheck(lambda x, w: nn.RMSNorm(4).double()(x) * w,
                         [mdl.tensor(x.astype(np.float64), requires_grad=True),
                          mdl.tensor(np.arange(4.0) + 1, requires_grad=True)])
