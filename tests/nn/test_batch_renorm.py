"""BatchRenorm1d/2d (Ioffe 2017) against its formula, BatchNorm, and finite differences; remove_normalization."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def renorm_by_formula(x, running_mean, running_var, gamma, beta, eps, r_max, d_max):
    """The paper's Algorithm 1 in NumPy, for (N, C) or (N, C, H, W)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mu_b, sigma_b = x.mean(axis=axes), np.sqrt(x.var(axis=axes) + eps)
    sigma = np.sqrt(running_var + eps)
    r = np.clip(sigma_b / sigma, 1 / r_max, r_max)
    d = np.clip((mu_b - running_mean) / sigma, -d_max, d_max)
    x_hat = (x - mu_b.reshape(shape)) / sigma_b.reshape(shape) * r.reshape(shape) + d.reshape(shape)
    return x_hat * gamma.reshape(shape) + beta.reshape(shape)


@pytest.mark.parametrize("layer, shape", [(nn.BatchRenorm1d, (6, 3)), (nn.BatchRenorm2d, (4, 3, 2, 2))])
def test_batch_renorm_training_output_and_running_stats_by_formula(layer, shape):
    rng = np.random.default_rng(0)
    m = layer(3, momentum=0.1, r_max=1.5, d_max=0.5).double()
    m.weight.array[...] = rng.normal(size=3)
    m.bias.array[...] = rng.normal(size=3)
    m.running_mean.array[...] = [0.2, -3.0, 0.0]   # channel 1: d clipped at -0.5... channel 2: free
    m.running_var.array[...] = [1.0, 0.05, 9.0]     # channel 1: r clipped at 1.5; channel 2: r at 1/1.5
    x = rng.normal(size=shape) * 1.3 + 0.4
    expected = renorm_by_formula(x, m.running_mean.array.copy(), m.running_var.array.copy(), m.weight.array,
                                 m.bias.array, 1e-5, 1.5, 0.5)
    old_mean, old_var = m.running_mean.array.copy(), m.running_var.array.copy()
    np.testing.assert_allclose(m(mdl.tensor(x)).numpy(), expected, rtol=1e-12, atol=1e-12)
    axes = (0,) + tuple(range(2, x.ndim))
    np.testing.assert_allclose(m.running_mean.array, 0.9 * old_mean + 0.1 * x.mean(axis=axes), rtol=1e-12)
    np.testing.assert_allclose(m.running_var.array, 0.9 * old_var + 0.1 * x.var(axis=axes, ddof=1), rtol=1e-12)
    m.eval()  # evaluation: the running statistics, as BatchNorm
    y = m(mdl.tensor(x)).numpy()
    shape_c = (1, -1) + (1,) * (x.ndim - 2)
    by_hand = ((x - m.running_mean.array.reshape(shape_c)) / np.sqrt(m.running_var.array.reshape(shape_c) + 1e-5)
               * m.weight.array.reshape(shape_c) + m.bias.array.reshape(shape_c))
    np.testing.assert_allclose(y, by_hand, rtol=1e-12, atol=1e-12)


def test_unclipped_training_output_equals_the_running_normalization():
    """Where r and d are inside their clips, x̂ = (x − μ)/σ: training already sees what evaluation will give."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(16, 4)) * 2 + 1
    m = nn.BatchRenorm1d(4, r_max=100, d_max=100, affine=False).double()
    m.running_mean.array[...] = rng.normal(size=4)
    m.running_var.array[...] = rng.uniform(0.5, 3, size=4)
    expected = (x - m.running_mean.array) / np.sqrt(m.running_var.array + 1e-5)
    np.testing.assert_allclose(m(mdl.tensor(x)).numpy(), expected, rtol=1e-10, atol=1e-12)


def test_r_max_1_d_max_0_is_batch_norm_in_value_and_gradient():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 3, 2, 2))
    g = rng.normal(size=x.shape)
    grads = []
    for layer in (nn.BatchRenorm2d(3, r_max=1.0, d_max=0.0), nn.BatchNorm2d(3)):
        layer.double()
        layer.running_var.array[...] = 7.0  # would matter only if r, d were not clipped to 1, 0
        xt = mdl.tensor(x, requires_grad=True)
        y = layer(xt)
        y.backward(mdl.tensor(g))
        grads.append((y.numpy(), xt.grad.numpy(), layer.weight.grad.numpy(), layer.bias.grad.numpy()))
    for ours, bn in zip(*grads):
        np.testing.assert_allclose(ours, bn, rtol=1e-10, atol=1e-12)


def test_gradient_is_batch_norms_scaled_by_r():
    """r and d are constants in backward: the input gradient is r times BatchNorm's (affine off, d added only)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 2))
    g = rng.normal(size=x.shape)
    renorm = nn.BatchRenorm1d(2, affine=False, r_max=10, d_max=10).double()
    renorm.running_var.array[...] = [4.0, 0.25]
    r, _ = renorm.corrections(mdl.tensor(x))
    xt = mdl.tensor(x, requires_grad=True)
    renorm(xt).backward(mdl.tensor(g))
    xb = mdl.tensor(x, requires_grad=True)
    nn.BatchNorm1d(2, affine=False).double()(xb).backward(mdl.tensor(g))
    np.testing.assert_allclose(xt.grad.numpy(), r * xb.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_gradcheck_float64_where_the_clips_hold_r_and_d():
    """With r and d at their clips, they are locally constant, so the whole layer's true derivative is its
    backward: finite differences check it with nothing held fixed."""
    rng = np.random.default_rng(4)
    m = nn.BatchRenorm2d(2, r_max=1.2, d_max=0.1).double()
    m.weight.array[...] = rng.normal(size=2)
    m.bias.array[...] = rng.normal(size=2)
    m.running_mean.array[...] = [5.0, -5.0]   # |μ_B − μ|/σ ≫ d_max
    m.running_var.array[...] = [100.0, 1e-3]  # σ_B/σ far outside [1/1.2, 1.2]
    state = {k: v.copy() for k, v in ((n, b.array) for n, b in m.named_buffers())}

    def fn(x, w, b):
        for name, buf in m.named_buffers():  # each evaluation starts from the same running statistics
            buf.array[...] = state[name]
        return m(x)

    x = mdl.tensor(rng.normal(size=(3, 2, 2, 2)), requires_grad=True)
    r, d = m.corrections(x)
    assert set(np.round(np.abs(r.ravel()), 6)) <= {1.2, round(1 / 1.2, 6)} and np.allclose(np.abs(d), 0.1)
    assert mdl.gradcheck(fn, [x, m.weight, m.bias])


def test_batch_renorm_errors():
    with pytest.raises(ValueError, match="r_max >= 1"):
        nn.BatchRenorm1d(3, r_max=0.5)
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchRenorm1d(3, momentum=None)
    with pytest.raises(ValueError, match="more than one value per channel"):
        nn.BatchRenorm1d(3)(mdl.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        nn.BatchRenorm2d(3)(mdl.zeros(2, 3))


def test_remove_normalization_replaces_every_norm_layer_and_keeps_the_rest():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(),
                          nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.BatchRenorm1d(6)), nn.Linear(6, 2))
    x = mdl.tensor(np.random.default_rng(5).normal(size=(5, 4)).astype(np.float32))
    plain = nn.utils.remove_normalization(model)
    kinds = [type(m).__name__ for _, m in plain.named_modules()]
    assert not any("Norm" in k for k in kinds) and kinds.count("Identity") == 3
    assert any("Norm" in type(m).__name__ for _, m in model.named_modules())  # the original is untouched
    by_hand = model[4](model[3][0](model[2](model[0](x))))
    np.testing.assert_allclose(plain(x).numpy(), by_hand.numpy(), rtol=1e-6)
    assert plain[0].weight is not model[0].weight  # a copy
    same = nn.utils.remove_normalization(model, inplace=True)
    assert same is model and isinstance(model[1], nn.Identity)
    with pytest.raises(TypeError, match="expected a Module"):
        nn.utils.remove_normalization([1, 2])


def test_batch_renorm_on_the_device_matches_the_cpu(device):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(4, 3, 2, 2)).astype(np.float32) * 2 + 1
    g = rng.normal(size=x.shape).astype(np.float32)
    results = []
    for where in ("cpu", device):
        m = nn.BatchRenorm2d(3, momentum=0.2, r_max=1.5, d_max=0.5).to(where)
        m.running_var.array[...] = 2.0
        xt = mdl.tensor(x, requires_grad=True, device=where)
        y = m(xt)
        y.backward(mdl.tensor(g, device=where))
        assert y.device.startswith(where)
        results.append((y.numpy(), xt.grad.numpy(), m.running_mean.numpy(), m.eval()(xt).numpy()))
    for ours, cpu in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, cpu, rtol=1e-5, atol=1e-6)
