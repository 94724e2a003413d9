"""Bundled digits and the synthetic teaching sets."""
import configparser
import fnmatch
import math
import os

import numpy as np
import pytest

import minidl
from minidl.data import (
    digits,
    gaussian_blobs,
    polynomial_features,
    polynomial_regression,
    polynomial_target,
    two_spirals,
)
from minidl.data.datasets import DIGITS_PATH

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_digits_is_the_uci_set():
    x, y = digits()
    assert x.shape == (1797, 8, 8) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 16.0 and np.all(x == np.round(x))
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert int(x.sum()) == 561718  # checksum of the pixel values
    # The first sample of the UCI file is a 0 whose top row is 0 0 5 13 9 1 0 0.
    assert y[0] == 0 and x[0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0]
    flat, y2 = digits(flatten=True)
    assert flat.shape == (1797, 64)
    np.testing.assert_array_equal(flat, x.reshape(1797, 64))
    np.testing.assert_array_equal(y, y2)


def test_digits_file_is_compact_and_safe():
    with np.load(DIGITS_PATH, allow_pickle=False) as f:
        assert sorted(f.files) == ["images", "labels"]
        assert f["images"].dtype == np.uint8 and f["labels"].dtype == np.int64
    assert os.path.getsize(DIGITS_PATH) < 100_000


def test_digits_license_and_packaging():
    folder = os.path.dirname(DIGITS_PATH)
    text = open(os.path.join(folder, "DIGITS_LICENSE.txt")).read()
    assert "CC BY 4.0" in text and "Alpaydin" in text and "UCI" in text
    assert "CC BY 4.0" in digits.__doc__ and "Alpaydin" in digits.__doc__
    setup_cfg = os.path.join(ROOT, "setup.cfg")
    if not os.path.exists(setup_cfg):
        pytest.skip("not a source checkout")
    config = configparser.ConfigParser()
    config.read(setup_cfg)
    patterns = [p.strip() for p in config["options.package_data"]["minidl"].replace("\n", ",").split(",")]
    for name in ("digits.npz", "DIGITS_LICENSE.txt"):
        assert any(fnmatch.fnmatch(f"data/{name}", p) for p in patterns), (name, patterns)


def test_two_spirals_lie_on_their_arms():
    x, y = two_spirals(n=301, noise=0.0, seed=0, turns=1.5)
    assert x.shape == (301, 2) and x.dtype == np.float32 and y.dtype == np.int64
    assert np.bincount(y).tolist() == [151, 150]
    r = np.hypot(x[:, 0], x[:, 1]).astype(np.float64)
    angle = 2 * math.pi * 1.5 * r + math.pi * y        # r = t on both arms
    np.testing.assert_allclose(x[:, 0], r * np.cos(angle), atol=1e-5)
    np.testing.assert_allclose(x[:, 1], r * np.sin(angle), atol=1e-5)
    assert 0.05 <= r.min() and r.max() <= 1.0 + 1e-6


def test_two_spirals_are_not_linearly_separable_and_seeded():
    x, y = two_spirals(n=1000, noise=0.02, seed=1)
    design = np.c_[x, np.ones(len(x))].astype(np.float64)
    w = np.linalg.lstsq(design, 2.0 * y - 1.0, rcond=None)[0]
    assert ((design @ w > 0) == y).mean() < 0.75
    np.testing.assert_array_equal(two_spirals(50, 0.1, seed=3)[0], two_spirals(50, 0.1, seed=3)[0])
    assert not np.array_equal(two_spirals(50, 0.1, seed=3)[0], two_spirals(50, 0.1, seed=4)[0])


def test_polynomial_truth_by_hand():
    x, y = polynomial_regression(n=50, noise=0.0, seed=0)
    assert x.shape == (50, 1) and y.shape == (50, 1) and x.dtype == y.dtype == np.float32
    assert -1 <= x.min() and x.max() <= 1
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, 5 + 1.2 * x64 - 1.7 * x64**2 + (5.6 / 6) * x64**3, rtol=1e-6)
    np.testing.assert_allclose(polynomial_target(np.array([2.0])), [5 + 2.4 - 6.8 + 5.6 * 8 / 6], rtol=1e-6)
    features = polynomial_features(np.array([2.0]), degree=4)
    np.testing.assert_allclose(features, [[1, 2, 2, 8 / 6, 16 / 24]], rtol=1e-6)


def test_polynomial_noise_level():
    x, y = polynomial_regression(n=20000, noise=0.3, seed=1)
    residual = y.astype(np.float64) - polynomial_target(x).astype(np.float64)
    assert abs(residual.std() - 0.3) < 0.01 and abs(residual.mean()) < 0.01


def test_few_samples_make_a_high_degree_fit_overfit():
    x, y = polynomial_regression(n=10, noise=0.1, seed=1)
    x_test, y_test = polynomial_regression(n=1000, noise=0.1, seed=101)
    errors = {}
    for degree in (1, 3, 9):
        design = polynomial_features(x, degree).astype(np.float64)
        coef = np.linalg.lstsq(design, y.astype(np.float64), rcond=None)[0]
        train = np.mean((design @ coef - y) ** 2)
        test = np.mean((polynomial_features(x_test, degree) @ coef - y_test) ** 2)
        errors[degree] = (train, test)
    assert errors[9][0] < 1e-8                          # interpolates the 10 points
    assert errors[9][1] > 10 * errors[3][1]             # and generalizes far worse
    assert errors[1][0] > 10 * errors[3][0]             # degree 1 underfits


def test_gaussian_blobs_imbalance_and_centers():
    x, y = gaussian_blobs(n=3000, centers=3, imbalance=9.0, std=0.5, seed=0)
    counts = np.bincount(y)
    assert x.shape == (3000, 2) and x.dtype == np.float32 and y.dtype == np.int64
    assert counts.sum() == 3000 and counts[0] > counts[1] > counts[2]
    assert abs(counts[0] / counts[2] - 9.0) < 0.2
    assert abs(counts[0] / counts[1] - 3.0) < 0.1          # geometric: 9 ** (1/2)
    for k in range(3):
        angle = 2 * math.pi * k / 3
        np.testing.assert_allclose(x[y == k].mean(axis=0), [4 * math.cos(angle), 4 * math.sin(angle)],
                                   atol=0.1)
        assert abs(x[y == k].std(axis=0).mean() - 0.5) < 0.05


def test_gaussian_blobs_with_proportions_and_own_centers():
    x, y = gaussian_blobs(n=1000, centers=np.zeros((2, 5)), imbalance=(0.95, 0.05), seed=2)
    assert x.shape == (1000, 5) and np.bincount(y).tolist() == [950, 50]
    x, y = gaussian_blobs(n=10, centers=4, seed=2)
    assert sorted(np.bincount(y).tolist()) == [2, 2, 3, 3]
    minidl.manual_seed(3)
    a = gaussian_blobs(n=20, seed=None)[0]
    minidl.manual_seed(3)
    np.testing.assert_array_equal(a, gaussian_blobs(n=20, seed=None)[0])


def test_bad_arguments():
    with pytest.raises(ValueError, match="imbalance ratio"):
        gaussian_blobs(imbalance=0.5)
    with pytest.raises(ValueError, match="one per class"):
        gaussian_blobs(centers=3, imbalance=(0.5, 0.5))
    with pytest.raises(ValueError, match="n=2 is smaller"):
        gaussian_blobs(n=2, centers=3)
    with pytest.raises(ValueError, match="noise"):
        two_spirals(noise=-1)
    with pytest.raises(ValueError, match="x_range"):
        polynomial_regression(x_range=(1, -1))
