"""Pure 16-bit training: stochastic rounding (unbiased, by value), Kahan-compensated updates, and the wrapper."""
import ml_dtypes
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.optim.low_precision import kahan_update, rounding_neighbours, stochastic_round

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)


def spacing(x, dtype):
    """The gap between the two dtype values around |x|, from the dtype's own eps and exponent."""
    info = ml_dtypes.finfo(dtype)
    exponent = np.maximum(np.floor(np.log2(np.maximum(np.abs(x), float(info.smallest_normal)))), np.log2(
        float(info.smallest_normal)))
    return 2.0 ** exponent * float(info.eps)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_neighbours_bracket_x_one_gap_apart(dtype):
    x = np.array([1.0 + 1e-4, -3.3, 1e-3, 0.0, 1.0, -1e-6, 700.5], np.float32)
    lo, hi = rounding_neighbours(x, dtype)
    lo64, hi64 = lo.astype(np.float64), hi.astype(np.float64)
    assert np.all(np.abs(lo64) <= np.abs(x)) and np.all(np.abs(x) < np.abs(hi64))
    np.testing.assert_array_equal(np.abs(hi64) - np.abs(lo64), spacing(lo64, dtype))
    np.testing.assert_array_equal(np.sign(lo64[x != 0]), np.sign(x[x != 0]))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_stochastic_rounding_is_unbiased_by_value(dtype):
    # x between neighbours lo and hi: each rounding is lo or hi, and the mean of N roundings equals x
    # within 5 standard deviations of a binomial mean: sqrt(p(1-p)/N)·(hi - lo) <= (hi - lo)/(2·sqrt(N)).
    x = np.array([1.0 + 1e-4, 1.0 + 2**-8 - 1e-5, -3.3, 1e-3, 5e-6, 123.4], np.float32)
    n = 20000
    rounded = stochastic_round(np.broadcast_to(x, (n, x.size)), dtype, rng=np.random.default_rng(0))
    assert rounded.dtype == dtype
    lo, hi = (v.astype(np.float64) for v in rounding_neighbours(x, dtype))
    values = rounded.astype(np.float64)
    assert np.all((values == lo) | (values == hi))
    p = (x - lo) / (hi - lo)
    sigma = np.sqrt(p * (1 - p) / n) * np.abs(hi - lo)
    np.testing.assert_array_less(np.abs(values.mean(0) - x), 5 * sigma + 1e-12)
    np.testing.assert_array_less(5 * sigma, np.abs(x - x.astype(dtype).astype(np.float64)) + 1e-12)  # a real test
    np.testing.assert_allclose(values.var(0), p * (1 - p) * (hi - lo) ** 2, rtol=0.1)  # the variance p(1-p)Δ²


def test_stochastic_rounding_keeps_representable_values_and_specials():
    x = np.array([1.0, -0.5, 0.0, np.inf, -np.inf, np.nan, 1e6], np.float32)
    out = stochastic_round(x, F16).astype(np.float64)
    np.testing.assert_array_equal(out[:5], x[:5])
    assert np.isnan(out[5]) and out[6] == np.inf        # beyond float16's range: what round-to-nearest gives


def test_stochastic_rounding_follows_manual_seed():
    x = np.full(64, 1.0 + 1e-3, np.float32)
    mdl.manual_seed(3)
    a = stochastic_round(x, BF16)
    mdl.manual_seed(3)
    np.testing.assert_array_equal(a, stochastic_round(x, BF16))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_kahan_sum_matches_float64_reference(dtype):
    # 3000 steps of about a fifth of a gap each, summed into a 16-bit w: round-to-nearest loses every one,
    # the compensated sum ends within one gap of the float64 sum (the final rounding of w is half a gap;
    # the 16-bit buffer c rounds |c| <= gap/2 to 2^-8 relative each step, at most 3000·2^-9·gap/2 < gap/2 more).
    rng = np.random.default_rng(1)
    w0 = 1.0
    gap = spacing(w0, dtype)
    deltas = (rng.uniform(0.0, 0.4, 3000) * gap).astype(np.float32)
    reference = w0 + deltas.astype(np.float64).sum()
    w, c = np.full(1, w0, dtype), np.zeros(1, dtype)
    plain = np.full(1, w0, dtype)
    for d in deltas:
        kahan_update(w, np.full(1, d, np.float32), c)
        plain[...] = (plain.astype(np.float32) + d).astype(dtype)
    assert float(plain[0]) == w0                                   # every update lost
    assert abs(float(w[0]) - reference) <= spacing(reference, dtype)
    assert abs(float(w[0]) - w0) > 100 * gap                       # it really moved


def least_squares_run(dtype, rounding=None, steps=1500, lr=2e-4):
    """Full-batch SGD on a 16-input linear regression from w = 1: the loss, weights and data."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 16)).astype(np.float32)
    y = x @ rng.standard_normal((16, 1)).astype(np.float32)
    model = nn.Linear(16, 1, bias=False)
    with mdl.no_grad():
        model.weight.array[...] = 1.0
    model = model.to(dtype)
    opt = optim.SGD(model.parameters(), lr=lr)
    if rounding is not None:
        opt = optim.LowPrecisionOptimizer(opt, rounding)
    xt, yt = mdl.tensor(x.astype(dtype)), mdl.tensor(y.astype(dtype))
    for _ in range(steps):
        loss = F.mse_loss(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.weight.numpy().astype(np.float64).ravel(), x


def sr_sigma(gap, x, steps, lr):
    """The standard deviation bound of stochastic rounding's drift from the float32 run, per weight.

    Unbiased, each step adds variance <= gap²/4 per weight, and gradient descent contracts an error by
    (1 - lr·λ) per step (λ the curvature, 2XᵀX/N): after n steps the error's variance is at most
    gap²/4 · Σ_k (1 - lr·λ_min)^(2k) <= gap²/4 · min(n, 1/(2·lr·λ_min)).
    """
    lam_min = np.linalg.eigvalsh(2 * x.T.astype(np.float64) @ x / len(x)).min()
    return gap / 2 * np.sqrt(min(steps, 1 / (2 * lr * lam_min)))


def test_plain_bfloat16_sgd_loses_updates_that_stochastic_rounding_and_kahan_keep():
    steps, lr = 1500, 2e-4
    w32, x = least_squares_run(np.float32, steps=steps, lr=lr)
    assert np.abs(w32 - 1.0).max() > 1.0                              # float32 moves the weights a long way
    for rounding in (None, "nearest"):                                # |lr·g| < half a gap: nothing moves
        w, _ = least_squares_run(BF16, rounding, steps, lr)
        np.testing.assert_array_equal(w, 1.0)
    gap = spacing(np.abs(w32).max() + 1.0, BF16)                      # the coarsest gap the weights reach
    # Kahan: the step taken equals the step wanted up to what c's own rounding loses; the weight ends
    # within a gap of float32's (see the summation test), plus float32's own rounding (far smaller).
    w_kahan, _ = least_squares_run(BF16, "kahan", steps, lr)
    np.testing.assert_array_less(np.abs(w_kahan - w32), gap)
    w_sr, _ = least_squares_run(BF16, "stochastic", steps, lr)      # within 5σ of the drift bound
    np.testing.assert_array_less(np.abs(w_sr - w32), 5 * sr_sigma(gap, x, steps, lr))
    assert np.abs(w_sr - 1.0).max() > 1.0


def test_float16_stochastic_rounding_tracks_float32_where_nearest_drifts():
    # float16's gap is 8 times finer: the 5σ bound is a fifth of the distance moved, and round-to-nearest,
    # which loses the updates smaller than half a gap near the end, ends outside it
    steps, lr = 1500, 2e-4
    w32, x = least_squares_run(np.float32, steps=steps, lr=lr)
    tolerance = 5 * sr_sigma(spacing(np.abs(w32).max() + 1.0, F16), x, steps, lr)
    assert tolerance < 0.2 * np.abs(w32 - 1.0).max()
    w_sr, _ = least_squares_run(F16, "stochastic", steps, lr)
    np.testing.assert_array_less(np.abs(w_sr - w32), tolerance)
    w_nearest, _ = least_squares_run(F16, "nearest", steps, lr)
    assert np.abs(w_nearest - w32).max() > tolerance


@pytest.mark.parametrize("rounding", ["kahan", "stochastic"])
def test_state_is_16_bit_and_a_saved_state_resumes_the_same_trajectory(rounding, tmp_path):
    x = mdl.tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(BF16))

    def make():
        mdl.manual_seed(0)
        model = nn.Linear(4, 2).to(BF16)
        return model, optim.LowPrecisionOptimizer(optim.SGD(model.parameters(), lr=0.01, momentum=0.9), rounding)

    def steps(model, opt, n):
        for _ in range(n):
            opt.zero_grad()
            (model(x) ** 2).sum().backward()
            opt.step()

    model, opt = make()
    steps(model, opt, 3)
    assert model.weight.dtype == BF16 and opt.state[0]["b"].dtype == BF16
    assert rounding != "kahan" or opt.compensation[0].dtype == BF16
    mdl.save(model.state_dict(), str(tmp_path / "model.safetensors"))
    mdl.save(opt.state_dict(), str(tmp_path / "opt.safetensors"))
    twin, twin_opt = make()
    twin.load_state_dict(mdl.load(str(tmp_path / "model.safetensors")))
    twin_opt.load_state_dict(mdl.load(str(tmp_path / "opt.safetensors")))
    mdl.manual_seed(1)
    steps(model, opt, 3)
    mdl.manual_seed(1)
    steps(twin, twin_opt, 3)
    np.testing.assert_array_equal(twin.weight.numpy(), model.weight.numpy())
    with pytest.raises(ValueError, match=f"saved with rounding='{rounding}'"):
        other = "nearest"
        optim.LowPrecisionOptimizer(optim.SGD(model.parameters(), lr=0.1), other).load_state_dict(opt.state_dict())


def test_bad_input_is_refused_clearly():
    with pytest.raises(TypeError, match="LowPrecisionOptimizer: parameter 0 .* float32.*model.to"):
        optim.LowPrecisionOptimizer(optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
    with pytest.raises(ValueError, match="rounding must be one of"):
        optim.LowPrecisionOptimizer(optim.SGD(nn.Linear(2, 2).to(F16).parameters(), lr=0.1), "up")
    with pytest.raises(TypeError, match="stochastic_round: expected a 16-bit float dtype"):
        stochastic_round(np.ones(2, np.float32), np.float32)


def test_float16_updates_on_the_device(standin_or_gpu):
    x = np.full(256, 1.0 + 1e-4, np.float32)
    rounded = stochastic_round(mdl.tensor(x, device=standin_or_gpu).array, F16)
    values = mdl.backend.to_numpy(rounded).astype(np.float64)
    assert set(np.unique(values)) <= {1.0, 1.0 + 2.0**-10}
    model = nn.Linear(4, 2).to(F16).to(standin_or_gpu)
    opt = optim.LowPrecisionOptimizer(optim.SGD(model.parameters(), lr=0.1, momentum=0.9), "kahan")
    before = model.weight.numpy().copy()
    model(mdl.tensor(np.ones((3, 4), np.float16), device=standin_or_gpu)).sum().backward()
    opt.step()
    assert model.weight.device.startswith("cuda") and opt.compensation[0].dtype == F16
    np.testing.assert_allclose(model.weight.numpy(), before - 0.1 * 3, atol=2.0**-9)   # dW = 3 for every entry
