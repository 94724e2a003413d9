"""Confidence intervals: Wilson's for accuracy, the percentile bootstrap for F1, the validation-size check."""
import math
import warnings

import numpy as np
import pytest

from minidl.train import metrics as M


def test_wilson_hand_values():
    z = 1.959963984540054
    # 0 right out of 10: the interval is [0, z²/(n + z²)] (the center formula with p̂ = 0)
    low, high = M.wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-15) and high == pytest.approx(z * z / (10 + z * z), rel=1e-12)
    # 5 of 10: symmetric around 1/2, half-width z·sqrt(n/4 + z²/4) / (n + z²)
    low, high = M.wilson_interval(5, 10)
    half = z * math.sqrt(10 / 4 + z * z / 4) / (10 + z * z)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-12)


def test_wilson_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for k, n, c in [(983, 1000, 0.95), (3, 7, 0.9), (199, 200, 0.99), (0, 1, 0.95)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=c, method="wilson")
        assert M.wilson_interval(k, n, c) == pytest.approx((ci.low, ci.high), abs=1e-12)


def test_accuracy_interval_and_format():
    y = np.zeros(1000, dtype=np.int64)
    pred = y.copy()
    pred[:17] = 1                                        # 983 of 1000 right
    acc, low, high = M.accuracy_interval(y, pred)
    assert acc == 0.983 and (low, high) == M.wilson_interval(983, 1000)
    assert M.format_interval(acc, low, high) == f"98.3 % ± {100 * (high - low) / 2:.1f}"
    assert M.format_interval(acc, low, high) == "98.3 % ± 0.8"


def test_bootstrap_of_accuracy_agrees_with_the_normal_interval():
    # For n = 2000 and p = 0.9 the bootstrap distribution of a mean is close to normal:
    # its 95 % interval is p ± 1.96 sqrt(p(1-p)/n) = ± 0.0131; Monte Carlo error with 2000 draws ~ 0.001.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 2000)
    pred = np.where(rng.random(2000) < 0.9, y, (y + 1) % 3)
    acc, low, high = M.bootstrap_interval("accuracy", y, pred, n_resamples=2000, seed=1)
    half = 1.959964 * math.sqrt(acc * (1 - acc) / 2000)
    assert acc == M.accuracy(y, pred)
    assert low == pytest.approx(acc - half, abs=0.003) and high == pytest.approx(acc + half, abs=0.003)
    assert M.bootstrap_interval(M.macro_f1, y, pred, seed=3) == M.bootstrap_interval(M.macro_f1, y, pred, seed=3)


def test_bootstrap_f1_matches_scipy_percentile_bootstrap():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    y = rng.integers(0, 4, 300)
    pred = np.where(rng.random(300) < 0.75, y, rng.integers(0, 4, 300))
    f1, low, high = M.bootstrap_interval(M.macro_f1, y, pred, n_resamples=3000, seed=0)
    ref = stats.bootstrap((y, pred), lambda a, b: M.macro_f1(a, b, 4), paired=True, vectorized=False,
                          n_resamples=3000, method="percentile", random_state=0).confidence_interval
    # two independent Monte Carlo estimates of the same quantiles (standard error ~ 0.003 here)
    assert low == pytest.approx(ref.low, abs=0.012) and high == pytest.approx(ref.high, abs=0.012)
    assert low < f1 < high


def test_smallest_difference_and_the_warning():
    # 100 samples at 90 %: Wilson [0.826, 0.945]; the result above whose lower bound clears 0.945.
    d = M.smallest_difference(100, 0.9)
    assert M.wilson_interval(90, 100)[1] == pytest.approx(M._wilson(0.9 + d, 100, 1.959963984540054)[0])
    assert 0.07 < d < 0.1
    # near 100 % no better result fits in [0, 1], and a worse one is told apart: it looks both ways
    d = M.smallest_difference(100, 1.0)
    assert M._wilson(1.0 - d, 100, 1.959963984540054)[1] == pytest.approx(M.wilson_interval(100, 100)[0])
    assert M.smallest_difference(1, 0.5) == float("inf")
    assert M.smallest_difference(100_000, 0.9) < 0.01 < M.smallest_difference(1000, 0.9)
    needed = f"{100 * M.smallest_difference(200, 0.9):.1f}"
    with pytest.warns(M.ValidationSizeWarning, match=f"200 samples at 90.0% accuracy .* more than {needed} points"):
        assert M.check_validation_size(200, 0.9, difference=0.01) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert M.check_validation_size(100_000, 0.9, difference=0.01) is True


def test_interval_bad_input():
    with pytest.raises(ValueError, match="successes=11, n=10"):
        M.wilson_interval(11, 10)
    with pytest.raises(ValueError, match="confidence must be a number in \\(0, 1\\), e.g. 0.95; got 95"):
        M.wilson_interval(1, 10, 95)
    with pytest.raises(ValueError, match="n_resamples must be an integer >= 2, got 1"):
        M.bootstrap_interval("f1", [0, 1], [0, 1], n_resamples=1)
    with pytest.raises(ValueError, match="no samples"):
        M.accuracy_interval([], [])


def test_interval_note_by_hand():
    note = M.interval_note(0.9, 180, 0.95, 180)
    low, high = M.wilson_interval(162, 180)
    assert note.startswith(f"test accuracy 90.0 % ± {100 * (high - low) / 2:.1f} (180 samples); warning: 180 ")
    assert f"more than {100 * M.smallest_difference(180, 0.95):.1f} points apart" in note
    assert "warning" not in M.interval_note(0.9, 180, 0.95, 200_000)


def test_train_and_predict_print_the_intervals(tmp_path, capsys):
    import json

    from minidl.cli import main
    folder = tmp_path / "run"
    assert main(["train", "--epochs", "1", "--quiet", "--out", str(folder)]) == 0
    test = [json.loads(line) for line in open(folder / "metrics.jsonl")][-1]
    right = round(test["accuracy"] * 180)                  # the digits' test split has 180 samples
    figure = M.format_interval(right / 180, *M.wilson_interval(right, 180))
    assert f"with 95 % intervals: test accuracy {figure} (180 samples)" in capsys.readouterr().out
    assert main(["predict", str(folder), "--out", str(tmp_path / "p")]) == 0
    assert f"with 95 % intervals: accuracy {figure}, macro F1 " in capsys.readouterr().out
