"""KFold, StratifiedKFold, GroupKFold, TimeSeriesSplit: scikit-learn's folds, and their guarantees."""
import numpy as np
import pytest

from minidl.data import GroupKFold, KFold, StratifiedKFold, TimeSeriesSplit


def _folds(splitter, *args, **kwargs):
    return [(tr.tolist(), te.tolist()) for tr, te in splitter.split(*args, **kwargs)]


def test_kfold_by_hand():
    # 7 samples, 3 folds: the first 7 % 3 = 1 fold holds one sample more.
    assert [te for _, te in _folds(KFold(3), np.zeros(7))] == [[0, 1, 2], [3, 4], [5, 6]]
    assert _folds(KFold(3), np.zeros(7))[1][0] == [0, 1, 2, 5, 6]


def test_stratified_by_hand():
    # class 1 first (numbered by appearance), 6 of it and 3 of class 0, in 3 folds: 2 + 1 per fold.
    y = np.array([1, 1, 0, 1, 0, 1, 1, 0, 1])
    tests = [te for _, te in _folds(StratifiedKFold(3), np.zeros(9), y)]
    assert tests == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_group_kfold_by_hand():
    # group sizes a:4, b:3, c:2, d:1 -> a to fold 0, b to 1, c to 1 (3 < 4), d to 0? no: loads 4, 5 -> fold 0.
    groups = np.array(list("aaaabbbccd"))
    tests = [te for _, te in _folds(GroupKFold(2), np.zeros(10), groups=groups)]
    assert tests == [[0, 1, 2, 3, 9], [4, 5, 6, 7, 8]]


def test_time_series_by_hand():
    folds = _folds(TimeSeriesSplit(3), np.zeros(8))      # test_size = 8 // 4 = 2
    assert folds == [([0, 1], [2, 3]), ([0, 1, 2, 3], [4, 5]), ([0, 1, 2, 3, 4, 5], [6, 7])]
    folds = _folds(TimeSeriesSplit(2, gap=1, max_train_size=2, test_size=2), np.zeros(9))
    assert folds == [([2, 3], [5, 6]), ([4, 5], [7, 8])]


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_sample_is_tested_once_and_classes_and_groups_are_respected(shuffle):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, size=103)
    groups = rng.integers(0, 17, size=103)
    for splitter, kwargs in ((KFold(5, shuffle=shuffle, seed=1), {}),
                             (StratifiedKFold(5, shuffle=shuffle, seed=1), {"y": y}),
                             (GroupKFold(5, shuffle=shuffle, seed=1), {"groups": groups})):
        folds = list(splitter.split(np.zeros(103), **kwargs))
        assert len(folds) == 5
        tested = np.concatenate([te for _, te in folds])
        assert sorted(tested.tolist()) == list(range(103))
        for tr, te in folds:
            assert np.intersect1d(tr, te).size == 0 and len(tr) + len(te) == 103
            if isinstance(splitter, StratifiedKFold):       # each class's count: its share, rounded
                share = np.bincount(y, minlength=4) / 5
                assert np.all(np.abs(np.bincount(y[te], minlength=4) - share) < 1)
            if isinstance(splitter, GroupKFold):
                assert np.intersect1d(groups[tr], groups[te]).size == 0


def test_shuffle_follows_the_seed():
    a = _folds(KFold(4, shuffle=True, seed=3), np.zeros(20))
    assert a == _folds(KFold(4, shuffle=True, seed=3), np.zeros(20))
    assert a != _folds(KFold(4, shuffle=True, seed=4), np.zeros(20))


def test_same_folds_as_scikit_learn():
    model_selection = pytest.importorskip("sklearn.model_selection")
    rng = np.random.default_rng(5)
    for n in (16, 37, 100):
        x = np.zeros((n, 2))
        y = rng.choice([3, 1, 7], size=n, p=[0.6, 0.25, 0.15])
        y[:15] = np.repeat([3, 1, 7], 5)        # every class has at least 5 samples
        rng.shuffle(y)
        groups = rng.integers(0, max(6, n // 4), size=n)
        groups[:6] = np.arange(6)               # at least 6 groups
        for k in (2, 3, 5):
            pairs = [(KFold(k), model_selection.KFold(k), {}),
                     (StratifiedKFold(k), model_selection.StratifiedKFold(k), {"y": y}),
                     (GroupKFold(k), model_selection.GroupKFold(k), {"groups": groups}),
                     (TimeSeriesSplit(k), model_selection.TimeSeriesSplit(k), {}),
                     (TimeSeriesSplit(k, gap=1, max_train_size=4),
                      model_selection.TimeSeriesSplit(k, gap=1, max_train_size=4), {})]
            for ours, theirs, kwargs in pairs:
                assert _folds(ours, x, **kwargs) == _folds(theirs, x, **kwargs), (ours, n, k)


def test_bad_numbers_of_folds_name_the_values():
    with pytest.raises(ValueError, match=r"n_splits=4 is larger than the smallest class \(label 2 has 3"):
        next(StratifiedKFold(4).split(np.zeros(11), np.array([0] * 8 + [2] * 3)))
    with pytest.raises(ValueError, match="n_splits=6 is larger than the number of samples 5"):
        next(KFold(6).split(np.zeros(5)))
    with pytest.raises(ValueError, match="n_splits=3 is larger than the number of groups 2"):
        next(GroupKFold(3).split(np.zeros(4), groups=[0, 0, 1, 1]))
    with pytest.raises(ValueError, match="GroupKFold.split needs groups"):
        next(GroupKFold(2).split(np.zeros(4)))
    with pytest.raises(ValueError, match="at least 2, got 1"):
        KFold(1)
    with pytest.raises(ValueError, match="leave no training sample out of 6"):
        next(TimeSeriesSplit(2, test_size=3).split(np.zeros(6)))
