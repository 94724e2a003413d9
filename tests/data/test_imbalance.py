"""SMOTE, ADASYN and undersampling against imbalanced-learn; class weights against scikit-learn and the loss."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import data


def _imbalanced(seed=0, d=3):
    rng = np.random.default_rng(seed)
    counts = {0: 60, 1: 25, 2: 12}
    x = np.concatenate([rng.standard_normal((n, d)) + 1.5 * c for c, n in counts.items()])
    y = np.concatenate([np.full(n, c) for c, n in counts.items()])
    order = rng.permutation(len(y))
    return x[order], y[order]


def test_smote_samples_lie_between_a_sample_and_one_of_its_class_neighbours():
    x, y = _imbalanced()
    x_new, y_new = data.smote(x, y, k_neighbors=4, seed=0)
    assert np.bincount(y_new).tolist() == [60, 60, 60]
    np.testing.assert_array_equal(x_new[:len(x)], x)                  # the originals first, unchanged
    for c in (1, 2):
        members = x[y == c]
        d = ((members[:, None] - members[None]) ** 2).sum(-1)
        neighbours = np.argsort(d, axis=1, kind="stable")[:, 1:5]
        for point in x_new[len(x):][y_new[len(x):] == c]:
            # some member i and neighbour j with point = x_i + λ (x_j − x_i), 0 <= λ <= 1
            found = False
            for i, js in enumerate(neighbours):
                for j in js:
                    seg = members[j] - members[i]
                    lam = np.dot(point - members[i], seg) / np.dot(seg, seg)
                    if -1e-9 <= lam <= 1 + 1e-9 and np.allclose(members[i] + lam * seg, point, atol=1e-9):
                        found = True
            assert found


def test_same_samples_as_imbalanced_learn():
    over = pytest.importorskip("imblearn.over_sampling")
    under = pytest.importorskip("imblearn.under_sampling")
    for seed in (0, 7):
        x, y = _imbalanced(seed)
        for ours, theirs in [(data.smote(x, y, k_neighbors=5, seed=seed),
                              over.SMOTE(k_neighbors=5, random_state=seed).fit_resample(x, y)),
                             (data.adasyn(x, y, k_neighbors=5, seed=seed),
                              over.ADASYN(n_neighbors=5, random_state=seed).fit_resample(x, y)),
                             (data.random_undersample(x, y, seed=seed),
                              under.RandomUnderSampler(random_state=seed).fit_resample(x, y))]:
            np.testing.assert_array_equal(ours[1], theirs[1])
            np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-12, atol=1e-12)


def test_adasyn_makes_more_from_the_samples_among_other_classes():
    # class 1: ten samples deep inside its own cluster and ten among class 0
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal((80, 2)), rng.standard_normal((10, 2)) * 0.3 + 8,
                        rng.standard_normal((10, 2)) * 0.5])
    y = np.array([0] * 80 + [1] * 20)
    x_new, y_new = data.adasyn(x, y, k_neighbors=5, seed=0)
    made = x_new[len(x):]
    near_zero = np.linalg.norm(made, axis=1) < 4
    assert abs(len(made) - 60) <= 5                  # 60 asked, each of the 10 shares rounded: at most ±0.5 each
    assert near_zero.all()                           # every new sample comes from the ten in class 0's zone
    with pytest.raises(ValueError, match="no sample of class 1 has a neighbour of another class"):
        data.adasyn(x[:90], y[:90])


def test_oversampling_keeps_image_shapes():
    x, y = data.imbalanced_digits(imbalance=10, seed=0)
    assert np.bincount(y).tolist() == [178, 141, 106, 85, 65, 51, 39, 30, 22, 18]
    x_new, y_new = data.smote(x, y, seed=0)
    assert x_new.shape == (1780, 8, 8) and x_new.dtype == np.float32 and np.bincount(y_new).tolist() == [178] * 10


def test_undersampling():
    x, y = _imbalanced()
    x_small, y_small = data.random_undersample(x, y, seed=0)
    assert np.bincount(y_small).tolist() == [12, 12, 12]
    assert all(any(np.array_equal(row, r) for r in x) for row in x_small)    # real samples, no duplicates
    assert len(np.unique(x_small, axis=0)) == 36
    difficulty = -np.abs(x[:, 0] - 1.5 * y)            # far from the class centre along axis 0 = hard
    x_hard, y_hard = data.undersample_hard(x, y, difficulty, n_per_class=12)
    for c in (0, 1, 2):
        kept = np.sort(difficulty[y == c])[::-1][:12]
        np.testing.assert_array_equal(np.sort(-np.abs(x_hard[y_hard == c][:, 0] - 1.5 * c))[::-1], kept)


def test_class_weights_balance_the_loss():
    y = np.array([0] * 6 + [1] * 3 + [2] * 1)
    w = data.class_weights(y)
    np.testing.assert_allclose(w, [10 / 18, 10 / 9, 10 / 3], rtol=1e-6)      # N / (K N_c)
    assert np.allclose(np.bincount(y, weights=w[y]), 10 / 3)                 # every class weighs the same
    logits = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    loss = F.cross_entropy(mdl.tensor(logits), y, weight=mdl.tensor(w)).item()
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert loss == pytest.approx(-(w[y] * log_p[np.arange(10), y]).sum() / w[y].sum(), rel=1e-5)


def test_class_weights_match_scikit_learn():
    utils = pytest.importorskip("sklearn.utils.class_weight")
    y = np.random.default_rng(3).integers(0, 5, 200)
    np.testing.assert_allclose(data.class_weights(y), utils.compute_class_weight("balanced", classes=np.arange(5),
                                                                                  y=y), rtol=1e-6)


def test_class_balance_report():
    text = data.class_balance(np.array([0, 0, 0, 1]), class_names=["cat", "dog"])
    assert "cat          3   75.0%" in text and "dog          1   25.0%" in text
    assert text.endswith("2 classes, 4 samples; imbalance ratio 3.0 (largest / smallest class)")


def test_imbalance_bad_input():
    x, y = _imbalanced()
    with pytest.raises(ValueError, match="k_neighbors=12 needs at least 13 samples .* class 2 has 12"):
        data.smote(x, y, k_neighbors=12)
    with pytest.raises(ValueError, match="k_neighbors must be a positive integer, got 0"):
        data.adasyn(x, y, k_neighbors=0)
    with pytest.raises(ValueError, match=r"classes \[1\] have no sample"):
        data.class_weights(np.array([0, 2]))
    with pytest.raises(ValueError, match=r"difficulty needs one value per sample \(97,\)"):
        data.undersample_hard(x, y, np.zeros(3))
    with pytest.raises(ValueError, match="imbalance is the largest class over the smallest"):
        data.imbalanced_digits(imbalance=0.5)


def _nearest_centroid(x_train, y_train, x):
    centroids = np.stack([x_train[y_train == c].mean(axis=0) for c in range(3)])
    return ((x[:, None] - centroids[None]) ** 2).sum(-1).argmin(axis=1)


def test_misclassification_counts_follow_the_recipe():
    x, y = _imbalanced(2)
    calls = []

    def recorded(x_train, y_train, x_all):
        calls.append(np.bincount(y_train, minlength=3).tolist())
        return _nearest_centroid(x_train, y_train, x_all)

    wrong = data.misclassification_counts(recorded, x, y, n_models=4, seed=0)
    assert calls == [[15, 25, 12]] * 4                       # a quarter of class 0, every other sample
    assert wrong[y == 0].max() <= 3 and wrong.min() >= 0     # a class-0 sample is judged by the 3 other models
    # by hand: recompute the four models and count, for each sample, the models that did not train on it
    members = np.random.default_rng(0).permutation(np.flatnonzero(y == 0))
    expected = np.zeros(len(y), dtype=int)
    for part in np.array_split(members, 4):
        train = np.sort(np.concatenate([part, np.flatnonzero(y != 0)]))
        miss = _nearest_centroid(x[train], y[train], x) != y
        miss[part] = False
        expected += miss
    np.testing.assert_array_equal(wrong, expected)
    assert wrong[y == 0].sum() > 0                          # the clusters overlap: some are hard
    x_kept, y_kept = data.undersample_hard(x, y, wrong, n_per_class=12)
    assert np.bincount(y_kept).tolist() == [12, 12, 12]
    with pytest.raises(ValueError, match="n_models=61 parts of the largest class"):
        data.misclassification_counts(recorded, x, y, n_models=61)
