"""The debugging recipe: each check passes on a healthy model and fails on a model broken in its way."""
import math
import warnings

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.data import Standardizer, gaussian_blobs
from minidl.ops.loss import cross_entropy
from minidl.train import diagnostics as D


def _blobs(n=400, seed=0):
    x, y = gaussian_blobs(n=n, centers=4, std=0.8, seed=seed)
    return Standardizer().fit(x).transform(x), y


def _healthy(seed=0):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 4))


class _Zero(nn.Module):
    """The bug: the input never reaches the model (think: the wrong tensor fed in)."""

    def forward(self, x):
        return x * 0.0


def _snapshot(model):
    return {k: np.array(v) for k, v in model.state_dict().items()}


def test_initial_loss_close_to_ln_k_and_overconfident_model_fails():
    x, y = _blobs()
    good = D.check_initial_loss(_healthy(), x, y)
    assert good.passed and abs(good.value - math.log(4)) < 0.25 * math.log(4)
    broken = _healthy()
    broken[2].weight.array[...] *= 100.0   # a last layer initialized far too large
    bad = D.check_initial_loss(broken, x, y)
    assert bad.passed is False and bad.value > 2 * math.log(4) and "last layer" in bad.message
    with mdl.no_grad():  # the value is the mean cross-entropy itself
        assert bad.value == pytest.approx(cross_entropy(broken(mdl.tensor(x)), mdl.tensor(y)).item(), rel=1e-5)


def test_overfit_two_samples_passes_and_double_softmax_fails():
    x, y = _blobs()
    model = _healthy()
    before = _snapshot(model)
    good = D.overfit_small_batch(model, x, y, steps=150)
    # seeds 0 to 5 end between 5e-4 and 1.3e-3 from a start of 1.1 to 1.7: a 40x margin on the bar
    assert good.passed and good.value < 0.05 and good.losses[0] > 0.3
    for k, v in _snapshot(model).items():   # the model is left as it was
        np.testing.assert_array_equal(v, before[k])
    # A softmax before the cross-entropy squeezes the logits into [0, 1]: the loss cannot go below
    # ln(1 + (K-1)/e) = 0.79 for K = 4, however long it trains.
    broken = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 4), nn.Softmax(dim=1))
    bad = D.overfit_small_batch(broken, x, y, steps=150)
    assert bad.passed is False and bad.value > math.log(1 + 3 / math.e) - 1e-3


def test_real_data_beats_zeroed_inputs_unless_the_input_is_lost():
    x, y = _blobs()
    xv, yv = _blobs(seed=1)
    good = D.compare_with_zeroed_inputs(_healthy(), x, y, xv, yv, steps=80, lr=1e-2)
    assert good.passed and good.real < 0.5 * good.zeroed
    mdl.manual_seed(0)
    broken = nn.Sequential(_Zero(), nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 4))
    bad = D.compare_with_zeroed_inputs(broken, x, y, xv, yv, steps=80, lr=1e-2)
    assert bad.passed is False and bad.real == pytest.approx(bad.zeroed, rel=1e-6)
    assert "ignores its input" in bad.message


def test_real_data_beats_random_inputs_with_the_datas_scale():
    x, y = _blobs()
    xv, yv = _blobs(seed=1)
    good = D.compare_with_random_inputs(_healthy(), x, y, xv, yv, steps=80, lr=1e-2)
    assert good.passed and good.real < 0.5 * good.random and good.name == "real data beats random inputs"
    mdl.manual_seed(0)
    broken = nn.Sequential(_Zero(), nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 4))
    bad = D.compare_with_random_inputs(broken, x, y, xv, yv, steps=80, lr=1e-2)
    assert bad.passed is False and bad.real == pytest.approx(bad.random, rel=1e-6)
    scaled = x * np.array([10.0, 0.1], np.float32) + np.array([5.0, -1.0], np.float32)
    noise = D._baseline_inputs("random", scaled, np.random.default_rng(0))(np.repeat(scaled, 50, axis=0))
    np.testing.assert_allclose(noise.mean(axis=0), scaled.mean(axis=0), atol=0.05 * scaled.std(axis=0).max())
    np.testing.assert_allclose(noise.std(axis=0), scaled.std(axis=0), rtol=0.05)
    assert noise.dtype == np.float32


def test_layer_statistics_match_numpy():
    x, y = _blobs(n=64)
    model = _healthy()
    model[0].bias.array[:8] = -100.0   # units 0..7 never fire: 8 of 32 dead
    rows = D.layer_statistics(model, x, y)
    assert [r["layer"] for r in rows] == ["0", "1", "2"]
    w0, b0 = model[0].weight.array.astype(np.float64), model[0].bias.array.astype(np.float64)
    hidden = np.maximum(x @ w0.T + b0, 0)
    relu = rows[1]
    assert relu["type"] == "ReLU" and relu["shape"] == (64, 32)
    assert relu["mean"] == pytest.approx(hidden.mean(), rel=1e-5)
    assert relu["std"] == pytest.approx(hidden.std(), rel=1e-5)
    assert relu["dead"] == pytest.approx(np.mean(np.all(hidden <= 0, axis=0))) and relu["dead"] >= 8 / 32
    # ||g|| / ||w|| against an independent backward pass
    model.zero_grad()
    cross_entropy(model(mdl.tensor(x)), mdl.tensor(y)).backward()
    g = model[2].weight.grad.array
    assert rows[2]["grad_ratio"] == pytest.approx(np.linalg.norm(g) / np.linalg.norm(model[2].weight.array), rel=1e-4)
    text = D.format_statistics(rows)
    assert "dead ReLU" in text and "||g||/||w||" in text and len(text.splitlines()) == 5
    assert any("dead" in w for w in D.statistics_warnings([{**relu, "dead": 0.9}]))


def test_dropout_with_batchnorm_warns():
    mixed = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match="variance shift"):
        result = D.check_dropout_batchnorm(mixed)
    assert result.passed is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert D.check_dropout_batchnorm(_healthy()).passed is True


def test_diagnose_report_runs_every_check():
    x, y = _blobs()
    xv, yv = _blobs(seed=1)
    report = D.diagnose(_healthy(), x, y, xv, yv, overfit_steps=100, baseline_steps=60)
    assert [c.passed for c in report["checks"]] == [True] * 5
    text = D.format_report(report)
    assert text.count("[PASS]") == 5 and "random inputs" in text and "per-layer statistics" in text


def test_the_overfit_samples_come_from_different_classes_first():
    """overfit_small_batch's samples: the first sample of each new class in order, then the earliest others."""
    from minidl.train.diagnostics import _distinct_class_indices
    np.testing.assert_array_equal(_distinct_class_indices(np.array([0, 0, 0, 1, 1, 2]), 3), [0, 3, 5])
    np.testing.assert_array_equal(_distinct_class_indices(np.array([4, 4, 7]), 3), [0, 2, 1])
    np.testing.assert_array_equal(_distinct_class_indices(np.array([[0.1], [0.2], [0.3]]), 2), [0, 1])
