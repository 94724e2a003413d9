"""nn.init: fans, gains, the statistics of each rule, orthogonality, truncation, seeds, bias rules."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.nn import init


def param(*shape, dtype=np.float32, device="cpu"):
    return nn.Parameter(mdl.zeros(*shape, dtype=dtype, device=device))


# ---------------------------------------------------------------- fans and gains
@pytest.mark.parametrize("shape, fans", [
    ((7, 5), (5, 7)),                    # Linear (out, in)
    ((16, 3, 5), (15, 80)),              # Conv1d (out, in, k): 3·5 and 16·5
    ((32, 8, 3, 3), (72, 288)),          # Conv2d (out, in, kh, kw): 8·9 and 32·9
    ((4, 2, 3, 5, 7), (210, 420)),       # Conv3d: 2·105 and 4·105
])
def test_fans_by_hand(shape, fans):
    assert init._calculate_fan_in_and_fan_out(param(*shape)) == fans


def test_fans_match_torch_for_conv_kernels():
    torch = pytest.importorskip("torch")
    for shape in [(7, 5), (16, 3, 5), (32, 8, 3, 3), (6, 1, 2, 4)]:
        expected = torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
        assert init._calculate_fan_in_and_fan_out(param(*shape)) == expected


def test_fans_of_a_vector_are_an_error():
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        init.kaiming_normal_(param(10))


@pytest.mark.parametrize("name, param_, expected", [
    ("linear", None, 1.0), ("conv2d", None, 1.0), ("sigmoid", None, 1.0), ("tanh", None, 5 / 3),
    ("relu", None, math.sqrt(2)), ("leaky_relu", None, math.sqrt(2 / (1 + 0.01 ** 2))),
    ("leaky_relu", 0.2, math.sqrt(2 / 1.04)), ("leaky_relu", math.sqrt(5), math.sqrt(1 / 3)),
    ("selu", None, 0.75),
])
def test_gains_table(name, param_, expected):
    assert init.calculate_gain(name, param_) == pytest.approx(expected, rel=1e-12)


def test_unknown_gain_is_an_error():
    with pytest.raises(ValueError, match="unsupported nonlinearity 'swish'"):
        init.calculate_gain("swish")


# ---------------------------------------------------------------- statistics on big tensors
def test_kaiming_normal_std_is_sqrt_2_over_fan_in():
    w = init.kaiming_normal_(param(256, 1024), nonlinearity="relu")
    assert w.array.std() == pytest.approx(math.sqrt(2 / 1024), rel=0.01)
    assert abs(w.array.mean()) < 0.01 * math.sqrt(2 / 1024) * 10


def test_kaiming_normal_fan_out_mode_on_a_conv_kernel():
    w = init.kaiming_normal_(param(64, 16, 3, 3), mode="fan_out", nonlinearity="relu")
    assert w.array.std() == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.02)


def test_kaiming_uniform_bound_and_std():
    w = init.kaiming_uniform_(param(512, 400), nonlinearity="relu")
    bound = math.sqrt(3) * math.sqrt(2 / 400)
    assert np.abs(w.array).max() <= bound
    assert np.abs(w.array).max() > 0.99 * bound
    assert w.array.std() == pytest.approx(math.sqrt(2 / 400), rel=0.01)


def test_xavier_uniform_bound_is_sqrt_6_over_fan_sum():
    w = init.xavier_uniform_(param(300, 500), gain=init.calculate_gain("tanh"))
    k = 5 / 3 * math.sqrt(6 / 800)
    assert np.abs(w.array).max() <= k and np.abs(w.array).max() > 0.99 * k
    assert w.array.std() == pytest.approx(k / math.sqrt(3), rel=0.01)


def test_xavier_normal_std():
    w = init.xavier_normal_(param(300, 500))
    assert w.array.std() == pytest.approx(math.sqrt(2 / 800), rel=0.01)


def test_uniform_normal_and_constants():
    w = init.uniform_(param(100_000), -2.0, 3.0)
    assert w.array.min() >= -2 and w.array.max() < 3
    assert w.array.mean() == pytest.approx(0.5, abs=0.02)
    n = init.normal_(param(100_000), 1.5, 0.5)
    assert n.array.mean() == pytest.approx(1.5, abs=0.01) and n.array.std() == pytest.approx(0.5, rel=0.01)
    assert (init.zeros_(param(3, 2)).array == 0).all()
    assert (init.ones_(param(3, 2)).array == 1).all()
    assert (init.constant_(param(4), 0.25).array == 0.25).all()


def test_trunc_normal_stays_within_two_sigma_and_has_the_truncated_std():
    w = init.trunc_normal_(param(200_000), mean=0.5, std=0.02)
    assert w.array.min() >= 0.5 - 0.04 and w.array.max() <= 0.5 + 0.04
    # the std of N(0,1) cut at ±2 is √(1 − 2·2φ(2)/(2Φ(2) − 1)) ≈ 0.8796
    phi = math.exp(-2) / math.sqrt(2 * math.pi)
    mass = math.erf(2 / math.sqrt(2))
    assert w.array.std() == pytest.approx(0.02 * math.sqrt(1 - 4 * phi / mass), rel=0.01)
    assert w.array.mean() == pytest.approx(0.5, abs=1e-3)


def test_trunc_normal_with_absolute_bounds_and_bad_bounds():
    w = init.trunc_normal_(param(50_000), std=1.0, a=-0.5, b=1.0)
    assert w.array.min() >= -0.5 and w.array.max() <= 1.0
    assert w.array.min() < -0.49 and w.array.max() > 0.99
    with pytest.raises(ValueError, match="a < b"):
        init.trunc_normal_(param(3), a=1.0, b=0.0)
    with pytest.raises(ValueError, match="widen the bounds"):
        init.trunc_normal_(param(3), std=1.0, a=5.0, b=6.0)


@pytest.mark.parametrize("shape", [(50, 20), (20, 50), (8, 4, 3, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal(shape):
    w = init.orthogonal_(param(*shape, dtype=np.float64), gain=2.0)
    flat = w.array.reshape(shape[0], -1) / 2.0
    if flat.shape[0] >= flat.shape[1]:
        np.testing.assert_allclose(flat.T @ flat, np.eye(flat.shape[1]), atol=1e-12)
    else:
        np.testing.assert_allclose(flat @ flat.T, np.eye(flat.shape[0]), atol=1e-12)


# ---------------------------------------------------------------- in place, dtypes, seeds, devices
def test_init_writes_in_place_and_keeps_the_dtype():
    w = param(10, 4)
    array = w.array
    assert init.kaiming_normal_(w) is w
    assert w.array is array and w.dtype == np.float32
    w64 = param(10, 4, dtype=np.float64)
    init.xavier_uniform_(w64)
    assert w64.dtype == np.float64
    w16 = init.normal_(param(10, 4, dtype=np.float16))
    assert w16.dtype == np.float16 and np.isfinite(w16.array).all()


@pytest.mark.parametrize("fn", [init.kaiming_normal_, init.xavier_uniform_, init.orthogonal_,
                                init.trunc_normal_, init.uniform_])
def test_manual_seed_reproduces_every_initializer(fn):
    mdl.manual_seed(123)
    a = fn(param(6, 5)).array.copy()
    mdl.manual_seed(123)
    b = fn(param(6, 5)).array.copy()
    mdl.manual_seed(124)
    c = fn(param(6, 5)).array.copy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_layers_are_reproducible_under_manual_seed():
    mdl.manual_seed(7)
    a = nn.Sequential(nn.Linear(5, 4), nn.Conv2d(2, 3, 3), nn.LSTM(3, 2)).state_dict()
    mdl.manual_seed(7)
    b = nn.Sequential(nn.Linear(5, 4), nn.Conv2d(2, 3, 3), nn.LSTM(3, 2)).state_dict()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])


def test_initializers_on_the_device(device):
    w = init.kaiming_normal_(param(64, 128, device=device), nonlinearity="relu")
    assert w.device.startswith(device)
    assert float(w.array.std()) == pytest.approx(math.sqrt(2 / 128), rel=0.05)
    t = init.trunc_normal_(param(1000, device=device), std=0.5)
    assert float(abs(t.array).max()) <= 1.0
    q = init.orthogonal_(param(6, 4, device=device, dtype=np.float64)).numpy()
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-12)


# ---------------------------------------------------------------- bias rules
def test_imbalanced_binary_bias_predicts_the_base_rate():
    b = init.init_bias_imbalanced_binary(param(1), n_pos=10, n_neg=990)
    assert b.array[0] == pytest.approx(math.log(10 / 990), rel=1e-6)
    assert 1 / (1 + math.exp(-float(b.array[0]))) == pytest.approx(0.01, rel=1e-5)
    with pytest.raises(ValueError, match="n_pos > 0"):
        init.init_bias_imbalanced_binary(param(1), 0, 5)


def test_class_prior_bias_softmax_gives_the_frequencies():
    b = init.init_bias_class_priors(param(3), [10, 30, 60])
    p = np.exp(b.array) / np.exp(b.array).sum()
    np.testing.assert_allclose(p, [0.1, 0.3, 0.6], rtol=1e-6)


def test_regression_bias_is_the_target_mean():
    targets = np.array([[1.0, 10.0], [2.0, 20.0], [6.0, 60.0]])
    b = init.init_bias_regression(param(2), targets)
    np.testing.assert_allclose(b.array, [3.0, 30.0], rtol=1e-6)
    b1 = init.init_bias_regression(param(1), mdl.tensor([2.0, 4.0, 9.0]))
    assert b1.array[0] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="bias has shape"):
        init.init_bias_regression(param(3), targets)


def test_regression_bias_makes_the_first_loss_the_target_variance():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(200, 3)).astype(np.float32), rng.normal(50.0, 2.0, size=(200, 1)).astype(np.float32)
    layer = nn.Linear(3, 1)
    init.zeros_(layer.weight)
    init.init_bias_regression(layer.bias, y)
    loss = ((layer(mdl.tensor(x)) - mdl.tensor(y)) ** 2).mean().item()
    assert loss == pytest.approx(y.var(), rel=1e-4)


def test_lstm_gate_bias_rule_on_every_layer_and_direction():
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    init.init_lstm_gate_biases(lstm)
    for name, p in lstm.named_parameters():
        if name.startswith("bias_ih"):
            np.testing.assert_array_equal(p.array, [-1] * 4 + [1] * 4 + [0] * 4 + [-1] * 4)  # i, f, g, o
        elif name.startswith("bias_hh"):
            np.testing.assert_array_equal(p.array, np.zeros(16))
    with pytest.raises(ValueError, match="no bias_ih"):
        init.init_lstm_gate_biases(nn.LSTM(3, 4, bias=False))


def test_relu_bias():
    assert (init.relu_bias_(param(5)).array == np.float32(0.01)).all()
    assert (init.relu_bias_(param(5), 0.1).array == np.float32(0.1)).all()
