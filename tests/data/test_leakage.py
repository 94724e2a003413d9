"""find_duplicates, check_leakage and split_ratios."""
import numpy as np
import pytest

from minidl.data import TensorDataset, check_leakage, find_duplicates, split_ratios


def _brute_force_groups(x):
    """Duplicate groups by comparing every pair (the O(N²) definition)."""
    n = len(x)
    seen, groups = set(), []
    for i in range(n):
        if i in seen:
            continue
        same = [j for j in range(i, n) if np.array_equal(x[i], x[j])]
        seen.update(same)
        if len(same) > 1:
            groups.append(same)
    return groups


def test_exact_duplicates_match_pairwise_comparison():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(200, 3)).astype(np.float32)    # 27 distinct rows: many repeats
    assert [g.tolist() for g in find_duplicates(x)] == _brute_force_groups(x)
    assert [g.tolist() for g in find_duplicates(TensorDataset(x, np.zeros(200)))] == _brute_force_groups(x)


def test_near_duplicates_of_images():
    rng = np.random.default_rng(1)
    images = rng.random((5, 8, 8)).astype(np.float32)
    brighter = 0.5 * images[2] + 0.2                  # the same picture, darker contrast, brighter
    noisy = images[4] + 1e-6 * rng.standard_normal((8, 8)).astype(np.float32)
    x = np.concatenate([images, brighter[None], noisy[None]])
    assert find_duplicates(x) == []                   # no two are bit-for-bit equal
    groups = [g.tolist() for g in find_duplicates(x, normalize="sample", decimals=2)]
    assert [2, 5] in groups
    # -0.0 and 0.0 are the same value
    assert [g.tolist() for g in find_duplicates(np.array([[0.0, 1.0], [-0.0, 1.0]]))] == [[0, 1]]


def test_feature_normalization_uses_one_scale_for_every_split():
    # rows in different units: (metres, grams). A scaled copy of a row is not a duplicate, a row is.
    train = np.array([[1.70, 70000.0], [1.80, 82000.0], [1.60, 55000.0]])
    val = np.array([[1.80, 82000.0], [1.75, 64000.0]])
    report = check_leakage(train, val, normalize="feature", decimals=3, on_leak="report")
    assert list(report) == [("train", "val")]
    assert report[("train", "val")].tolist() == [[1, 0]]


def test_check_leakage_finds_every_shared_pair_and_raises():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((30, 4))
    train, val, test = x[:20], np.concatenate([x[20:25], x[[3]]]), np.concatenate([x[25:], x[[3, 21]]])
    assert check_leakage(x[:10], x[10:20], x[20:]) == {}
    report = check_leakage(train, val, test, on_leak="report")
    assert report[("train", "val")].tolist() == [[3, 5]]
    assert report[("train", "test")].tolist() == [[3, 5]]
    assert report[("val", "test")].tolist() == [[1, 6], [5, 5]]
    with pytest.raises(ValueError, match=r"train/val: 1 pairs .* first at train\[3\] = val\[5\]"):
        check_leakage(train, val, test)
    with pytest.warns(UserWarning, match="val/test: 2 pairs"):
        check_leakage(train, val, test, on_leak="warn")


def test_leakage_bad_input():
    with pytest.raises(ValueError, match="at least two splits"):
        check_leakage(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"differ in size: train \(3, 2\), val \(2, 3\)"):
        check_leakage(np.zeros((3, 2)), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="normalize must be one of"):
        find_duplicates(np.zeros((3, 2)), normalize="pixel")


def test_split_ratios_are_the_chapters_at_its_examples():
    assert split_ratios(500) == (0.8, 0.15, 0.05)
    assert split_ratios(10_000) == (0.8, 0.15, 0.05)
    assert np.allclose(split_ratios(1_000_000), (0.95, 0.04, 0.01))
    assert np.allclose(split_ratios(100_000_000), (0.99, 0.009, 0.001))
    assert split_ratios(10**10) == split_ratios(10**8)
    # between examples: the geometric mean of the neighbours' fractions at the geometric mean of n
    assert np.allclose(split_ratios(100_000)[1:], (np.sqrt(0.15 * 0.04), np.sqrt(0.05 * 0.01)))
    sizes = [10**4, 10**5, 10**6, 10**7, 10**8]
    val = [split_ratios(n)[1] * n for n in sizes]
    assert all(b > a for a, b in zip(val, val[1:]))      # the validation set keeps growing in samples
    assert all(abs(sum(split_ratios(n)) - 1) < 1e-12 for n in sizes)
    with pytest.raises(ValueError, match="positive integer; got 0"):
        split_ratios(0)
