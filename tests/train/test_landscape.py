"""Loss slices, interpolation, sharpness and the ReLU rescaling, checked against NumPy by value."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn
from minidl.optim import hessian_vector_product
from minidl.train.landscape import (
    filter_normalized_direction,
    interpolate,
    loss_landscape,
    rescale_relu_layers,
    sharpness,
)

RNG = np.random.default_rng(0)
X = RNG.normal(size=(20, 3))
T = RNG.normal(size=(20, 2))


def linear_model(seed=0):
    mdl.manual_seed(seed)
    return nn.Linear(3, 2, bias=False).double()


def mse_numpy(w):
    return float(((X @ w.T - T) ** 2).mean())


def test_filter_normalized_direction_has_each_rows_norm_and_zero_biases():
    mdl.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Conv2d(5, 3, 2))
    d = filter_normalized_direction(model, seed=3)
    for p, di in zip(model.parameters(), d):
        w = p.numpy()
        if w.ndim == 1:
            assert (di == 0).all()
        else:
            np.testing.assert_allclose(np.linalg.norm(di.reshape(len(di), -1), axis=1),
                                       np.linalg.norm(w.reshape(len(w), -1), axis=1), rtol=1e-5)


def test_one_and_two_dimensional_slices_equal_the_loss_by_numpy():
    model = linear_model()
    w0 = model.weight.numpy().copy()
    one = loss_landscape(model, F.mse_loss, (X, T), directions=1, steps=5, span=(-2, 2))
    d = one.directions[0][0]
    np.testing.assert_allclose(one.losses, [mse_numpy(w0 + a * d) for a in one.alphas], rtol=1e-12)
    assert one.losses[2] == pytest.approx(mse_numpy(w0), rel=1e-12)  # α = 0 is the model itself
    two = loss_landscape(model, F.mse_loss, (X, T), directions=2, steps=4, seed=5)
    d1, d2 = two.directions[0][0], two.directions[1][0]
    expected = [[mse_numpy(w0 + a * d1 + b * d2) for b in two.betas] for a in two.alphas]
    np.testing.assert_allclose(two.losses, expected, rtol=1e-12)
    np.testing.assert_array_equal(model.weight.numpy(), w0)  # the model is put back
    assert model.training
    with pytest.raises(ValueError, match="directions must be 1 or 2"):
        loss_landscape(model, F.mse_loss, (X, T), directions=3)


def test_interpolate_between_two_models_by_numpy():
    a, b = linear_model(0), linear_model(1)
    wa, wb = a.weight.numpy().copy(), b.weight.numpy().copy()
    alphas = [0.0, 0.25, 0.5, 1.0, 1.5]
    losses = interpolate(a, b, alphas, F.mse_loss, (X, T))
    np.testing.assert_allclose(losses, [mse_numpy((1 - t) * wa + t * wb) for t in alphas], rtol=1e-12)
    np.testing.assert_array_equal(a.weight.numpy(), wa)
    with pytest.raises(ValueError, match="differ in shape"):
        interpolate(a, nn.Linear(3, 4).double(), alphas, F.mse_loss, (X, T))


def test_interpolate_mixes_batchnorm_running_statistics_too():
    mdl.manual_seed(2)
    a, b = nn.Sequential(nn.BatchNorm1d(3)).double(), nn.Sequential(nn.BatchNorm1d(3)).double()
    b[0].running_mean.array[...] = 2.0
    # in eval mode a BatchNorm with γ=1, β=0 maps x to (x − μ)/√(σ² + eps); the loss against 0 is its mean square
    losses = interpolate(a, b, [0.5], lambda out, y: (out * out).mean(), (X, np.zeros(20)))
    assert losses[0] == pytest.approx(float((((X - 1.0) / np.sqrt(1 + 1e-5)) ** 2).mean()), rel=1e-12)
    assert (a[0].running_mean.array == 0).all()


def test_sharpness_of_a_quadratic_matches_its_hessian():
    """MSE of a linear model: H = (2/(N·2))·XᵀX for each of the 2 output rows. With orthogonal columns of X
    the Hessian is diagonal, so every Rademacher sample of Hutchinson's estimate is exact."""
    q, _ = np.linalg.qr(RNG.normal(size=(20, 3)))
    x = q * np.array([3.0, 1.0, 0.5])
    model = linear_model()
    row = sharpness({"linear": model}, F.mse_loss, (x, T), samples=4, iters=200)[0]
    block = 2 * x.T @ x / (len(x) * 2)
    assert row["trace"] == pytest.approx(2 * np.trace(block), rel=1e-9)
    assert row["top_eigenvalue"] == pytest.approx(np.linalg.eigvalsh(block)[-1], rel=1e-6)
    assert row["loss"] == pytest.approx(float(((x @ model.weight.numpy().T - T) ** 2).mean()), rel=1e-12)
    assert row["name"] == "linear"


def exact_block_traces(model, x, y):
    """tr of the Hessian's diagonal block of each parameter, by Hessian-vector products with basis vectors."""
    params = list(model.parameters())
    loss = F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y))
    traces = []
    for k, p in enumerate(params):
        total = 0.0
        for i in range(p.numel()):
            e = [np.zeros(q.shape) for q in params]
            e[k].reshape(-1)[i] = 1.0
            total += float(hessian_vector_product(loss, params, e)[k].numpy().reshape(-1)[i])
        traces.append(total)
    return np.array(traces)


def test_rescaling_keeps_the_function_and_scales_the_hessian_blocks():
    mdl.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)).double()
    y = np.arange(20) % 3
    sharp = rescale_relu_layers(model, "0", "2", alpha=5.0)
    x = mdl.tensor(X)
    np.testing.assert_allclose(sharp(x).numpy(), model(x).numpy(), rtol=1e-12, atol=1e-12)  # the same function
    before, after = exact_block_traces(model, X, y), exact_block_traces(sharp, X, y)
    # blocks: W1, b1 (scaled by α: Hessian / α²), W2 (scaled by 1/α: Hessian · α²), b2 (unchanged)
    np.testing.assert_allclose(after, before * np.array([1 / 25, 1 / 25, 25, 1]), rtol=1e-8)
    assert np.allclose(model[0].weight.numpy() * 5, sharp[0].weight.numpy())  # a copy was rescaled
    with pytest.raises(ValueError, match="alpha must be a positive"):
        rescale_relu_layers(model, "0", "2", alpha=-1.0)
    with pytest.raises(ValueError, match="'1' is not a layer with a weight"):
        rescale_relu_layers(model, "1", "2", alpha=2.0)


def test_slices_interpolation_and_sharpness_on_the_device_match_the_cpu(device):
    results = []
    for where in ("cpu", device):
        a, b = linear_model(0).to(where), linear_model(1).to(where)
        one = loss_landscape(a, F.mse_loss, (X, T), directions=1, steps=3)
        line = interpolate(a, b, [0.0, 0.5], F.mse_loss, (X, T))
        row = sharpness(a, F.mse_loss, (X, T), samples=2, iters=5)[0]
        assert a.weight.device.startswith(where)
        results.append(np.concatenate([one.losses, line, [row["trace"], row["top_eigenvalue"]]]))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-9)
