"""Batch-size scaling study: steps to a target, the fit, the regions and the noise-scale prediction, exactly."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.train.batch_scaling import (
    REGIONS,
    batch_size_study,
    classify_regions,
    fit_steps_model,
    noise_scale_at,
    scaling_efficiency,
    steps_to_target,
)


# ---------------------------------------------------------------- steps to a target on scripted curves
def test_steps_to_target_is_the_first_step_at_or_below_the_target():
    losses = [5.0, 4.0, 3.0, 2.5, 2.0, 1.9, 2.2, 1.0]
    assert steps_to_target(losses, 2.0) == 4          # equal counts as reached
    assert steps_to_target(losses, 1.95) == 5         # the first crossing, not a later, lower point
    assert steps_to_target(losses, 5.0) == 0          # already there before training
    assert steps_to_target(losses, 0.5) is None
    assert steps_to_target(losses, 2.0, steps=[0, 10, 20, 30, 40, 50, 60, 70]) == 40
    assert steps_to_target([3.0, float("nan"), float("inf"), 0.9], 1.0) == 3  # NaN/inf never count
    with pytest.raises(ValueError, match="3 losses but 2 steps"):
        steps_to_target([1, 2, 3], 1.0, steps=[0, 1])
    with pytest.raises(ValueError, match="increase"):
        steps_to_target([1, 2, 3], 1.0, steps=[0, 2, 2])


# ---------------------------------------------------------------- the fit and the regions
def test_fit_recovers_the_steps_model_exactly_and_skips_unreached_sizes():
    b = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    s = [100 * (1 + 50 / bi) for bi in b]
    s_min, b_crit = fit_steps_model(b, s)
    assert s_min == pytest.approx(100, rel=1e-12) and b_crit == pytest.approx(50, rel=1e-12)
    s[3] = None
    assert fit_steps_model(b, s) == pytest.approx((100, 50), rel=1e-12)
    with pytest.raises(ValueError, match="two batch sizes"):
        fit_steps_model([1, 2, 4], [None, 10, None])
    with pytest.raises(ValueError, match="increasing"):
        fit_steps_model([2, 1], [10, 20])


def test_efficiency_and_regions_against_a_hand_computation():
    b, s = [1, 2, 4, 8], [80, 40, 25, 24]
    between = [1.0, math.log(40 / 25) / math.log(2), math.log(25 / 24) / math.log(2)]  # 1, 0.678, 0.059
    expected = [between[0], (between[0] + between[1]) / 2, (between[1] + between[2]) / 2, between[2]]
    assert scaling_efficiency(b, s) == pytest.approx(expected, rel=1e-12)
    assert classify_regions(b, s) == ["perfect scaling", "perfect scaling", "diminishing returns", "stagnation"]
    assert classify_regions(b, s, perfect=0.9, stagnant=0.4) == [
        "perfect scaling", "diminishing returns", "stagnation", "stagnation"]
    # Perfect 1/B scaling is efficiency 1 everywhere; a flat curve is 0; uneven spacing uses log B.
    assert scaling_efficiency([1, 3, 9], [90, 30, 10]) == pytest.approx([1, 1, 1], rel=1e-12)
    assert scaling_efficiency([1, 2, 8], [7, 7, 7]) == [0.0, 0.0, 0.0]
    # An unreached size has no efficiency and breaks the intervals beside it.
    assert scaling_efficiency([1, 2, 4, 8], [80, None, 20, 10]) == [None, None, 1.0, 1.0]
    assert classify_regions([1, 2, 4, 8], [80, None, 20, 10])[:2] == [None, None]
    with pytest.raises(ValueError, match="stagnant < perfect"):
        classify_regions(b, s, perfect=0.2, stagnant=0.8)


def test_regions_follow_the_model_borders_at_a_quarter_and_four_times_b_crit():
    # S = S_min (1 + Bc/B) has efficiency Bc/(B + Bc): >= 0.8 below Bc/4, <= 0.2 above 4 Bc.
    b = [2.0 ** k for k in range(0, 15)]
    s = [10 * (1 + 256 / bi) for bi in b]
    regions = dict(zip(b, classify_regions(b, s)))
    assert all(regions[bi] == REGIONS[0] for bi in b if bi <= 256 / 8)
    assert all(regions[bi] == REGIONS[1] for bi in b if 256 / 2 <= bi <= 256 * 2)
    assert all(regions[bi] == REGIONS[2] for bi in b if bi >= 256 * 8)


# ---------------------------------------------------------------- the noise-scale prediction
def _linear_problem(n=512, d=4, sigma=0.5, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.geomspace(1, 0.5, d)
    y = x @ rng.standard_normal((d, 1)) + sigma * rng.standard_normal((n, 1))
    return x, y


def _linear(d=4, seed=0):
    mdl.manual_seed(seed)
    return nn.Linear(d, 1).to(dtype=np.float64)


def _mse(out, y):
    return ((out - y) ** 2).mean()


def test_noise_scale_at_matches_the_estimator_by_hand():
    x, y = _linear_problem()
    model = _linear()
    w, b0 = model.weight.array.copy(), model.bias.array.copy()
    got = noise_scale_at(model, _mse, x, y, batch_size=16, batches=10, seed=3)
    rng = np.random.default_rng(3)
    grads = []
    for _ in range(10):
        idx = rng.choice(len(x), size=16, replace=False)
        r = x[idx] @ w.T + b0 - y[idx]                     # residuals of the batch
        grads.append(np.concatenate([(2 / 16 * r.T @ x[idx]).ravel(), [2 / 16 * r.sum()]]))
    g = np.stack(grads)
    mean = g.mean(axis=0)
    trace_sigma = 16 * ((g - mean) ** 2).sum() / 9
    norm2 = mean @ mean - trace_sigma / (10 * 16)
    assert got == pytest.approx(trace_sigma / norm2, rel=1e-9)


def test_noise_scale_estimates_the_per_example_definition():
    x, y = _linear_problem(n=2048)
    model = _linear()
    w, b0 = model.weight.array, model.bias.array
    r = x @ w.T + b0 - y
    per_example = np.concatenate([2 * r * x, 2 * r], axis=1)        # each example's gradient
    G = per_example.mean(axis=0)
    exact = ((per_example - G) ** 2).sum(axis=1).mean() / (G @ G)   # tr(Σ) / ‖G‖²
    estimate = noise_scale_at(model, _mse, x, y, batch_size=32, batches=400, seed=0)
    assert estimate == pytest.approx(exact, rel=0.15)


# ---------------------------------------------------------------- the study end to end
def _sgd_steps_by_hand(x, y, w, b0, batch_size, lr, target, max_steps, seed):
    """Plain NumPy SGD with the study's batch order: steps until the full-data MSE <= target."""
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(len(x)), 0
    for step in range(1, max_steps + 1):
        if at + batch_size > len(x):
            order, at = rng.permutation(len(x)), 0
        idx = order[at:at + batch_size]
        at += batch_size
        r = x[idx] @ w.T + b0 - y[idx]
        w = w - lr * 2 / batch_size * r.T @ x[idx]
        b0 = b0 - lr * 2 / batch_size * r.sum(axis=0)
        if np.mean((x @ w.T + b0 - y) ** 2) <= target:
            return step
    return None


def test_study_steps_are_those_of_plain_sgd_at_the_best_rate(tmp_path):
    x, y = _linear_problem(n=256)
    target = 0.35
    lrs = [0.05, 0.1, 0.2, 0.4]
    study = batch_size_study(_linear, x, y, [1, 4, 16, 64, 256], target, lrs, loss_fn=_mse, max_steps=3000,
                             noise_batch_size=16, noise_batches=16)
    init = _linear()
    w, b0 = init.weight.array.copy(), init.bias.array.copy()
    for bs, steps, lr in zip(study.batch_sizes, study.steps, study.lrs):
        by_hand = {r: _sgd_steps_by_hand(x, y, w, b0, bs, r, target, 3000, 0) for r in lrs}
        reached = {r: s for r, s in by_hand.items() if s is not None}
        assert steps == min(reached.values()), bs
        assert by_hand[lr] == steps
    assert study.regions == classify_regions(study.batch_sizes, study.steps)
    assert (study.s_min, study.b_crit) == fit_steps_model(study.batch_sizes, study.steps)
    assert study.steps[0] > 2 * study.steps[-1]  # small batches do need more steps
    assert study.noise_scale == pytest.approx(np.mean(study.noise_path)) and len(study.noise_path) == study.steps[-1]
    assert np.isfinite(study.noise_scale_at_target) and study.noise_scale_at_target > 0
    table = study.table()
    assert "predicted critical batch" in table and len(table.splitlines()) == 2 + 5
    study.plot(tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_study_rejects_bad_batch_sizes():
    x, y = _linear_problem(n=64)
    with pytest.raises(ValueError, match="batch sizes"):
        batch_size_study(_linear, x, y, [4, 2], 0.3, [0.1], loss_fn=_mse)
    with pytest.raises(ValueError, match="batch sizes"):
        batch_size_study(_linear, x, y, [1, 128], 0.3, [0.1], loss_fn=_mse)
    with pytest.raises(ValueError, match="no run reached"):
        batch_size_study(_linear, x, y, [8], 0.0, [0.1], loss_fn=_mse, max_steps=5)


def test_the_plot_draws_every_part_and_nothing_is_clipped():
    pytest.importorskip("matplotlib")
    from minidl.train.batch_scaling import BatchScalingStudy, plot_batch_scaling
    from tests.test_figures_not_clipped import assert_nothing_clipped

    b = [1, 2, 4, 8, 16, 32, 64]
    s = [round(10 * (1 + 8 / bi)) for bi in b]
    study = BatchScalingStudy(b, s, [0.1] * 7, 0.5, 12.0, regions=classify_regions(b, s))
    study.s_min, study.b_crit = fit_steps_model(b, s)
    fig = plot_batch_scaling(study)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert set(REGIONS) <= set(labels)
    assert any("predicted" in t and "12" in t for t in labels) and any("measured" in t for t in labels)
    assert_nothing_clipped(fig, "batch scaling plot")


@pytest.mark.parametrize("b_crit, drawn", [(8.0, True), (1.0, True), (64.0, True), (0.5, False), (65.0, False)])
def test_the_measured_critical_batch_is_marked_only_inside_the_measured_sizes(b_crit, drawn):
    """The vertical line at the fitted B_crit is drawn when B_crit lies within [min B, max B], ends included."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from minidl.train.batch_scaling import BatchScalingStudy, plot_batch_scaling
    b = [1, 2, 4, 8, 16, 32, 64]
    s = [round(10 * (1 + 8 / bi)) for bi in b]
    study = BatchScalingStudy(b, s, [0.1] * 7, 0.5, math.nan, regions=classify_regions(b, s))
    study.s_min, study.b_crit = 10.0, b_crit
    fig = plot_batch_scaling(study)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    plt.close(fig)
    assert any(t.startswith("measured $B_{crit}$") for t in labels) is drawn


def test_the_perfect_scaling_line_runs_up_to_twice_the_critical_batch():
    """S_min·B_crit/B is drawn where it is at least S_min/2, i.e. from the smallest batch to 2·B_crit."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from minidl.train.batch_scaling import BatchScalingStudy, plot_batch_scaling
    b = [1, 2, 4, 8, 16, 32, 64]
    s = [round(10 * (1 + 8 / bi)) for bi in b]
    study = BatchScalingStudy(b, s, [0.1] * 7, 0.5, math.nan, regions=classify_regions(b, s))
    study.s_min, study.b_crit = 10.0, 8.0
    fig = plot_batch_scaling(study)
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("perfect scaling $"))
    x, y = line.get_xdata(), line.get_ydata()
    plt.close(fig)
    assert x.min() == pytest.approx(1.0) and 14.0 < x.max() <= 16.0
    np.testing.assert_allclose(y, 10.0 * 8.0 / x)
