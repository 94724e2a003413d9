"""train_val_test_split and oversample_minority."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl
from minidl.data import oversample_minority, train_val_test_split

ratio_triples = st.tuples(st.integers(0, 10), st.integers(0, 10), st.integers(0, 10)).filter(
    lambda t: sum(t) > 0).map(lambda t: tuple(v / sum(t) for v in t))


@given(n=st.integers(0, 60), ratios=ratio_triples, seed=st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_parts_are_disjoint_cover_everything_and_have_rounded_sizes(n, ratios, seed):
    ids = np.arange(n)
    x = np.stack([ids, -ids], axis=1).astype(np.float32)
    (x_tr, i_tr), (x_va, i_va), (x_te, i_te) = train_val_test_split(x, ids, ratios=ratios, seed=seed)
    together = np.concatenate([i_tr, i_va, i_te])
    np.testing.assert_array_equal(np.sort(together), ids)
    for xs, ids_part, r in [(x_tr, i_tr, ratios[0]), (x_va, i_va, ratios[1]), (x_te, i_te, ratios[2])]:
        assert abs(len(ids_part) - n * r) < 1.0  # n * ratio, rounded up or down
        np.testing.assert_array_equal(xs[:, 0], ids_part)  # rows stay aligned
        assert xs.dtype == np.float32 and ids_part.dtype == ids.dtype


@given(labels=st.lists(st.integers(0, 4), min_size=1, max_size=80), ratios=ratio_triples,
       seed=st.integers(0, 2**31))
@settings(max_examples=80, deadline=None)
def test_stratified_parts_keep_each_class_proportion(labels, ratios, seed):
    y = np.array(labels, dtype=np.int64)
    n = len(y)
    ids = np.arange(n)
    parts = train_val_test_split(ids, y, ratios=ratios, stratify=True, seed=seed)
    plain_sizes = [len(p[0]) for p in train_val_test_split(ids, ratios=ratios, seed=seed)]
    assert [len(p[0]) for p in parts] == plain_sizes  # same part sizes as an unstratified split
    np.testing.assert_array_equal(np.sort(np.concatenate([p[0] for p in parts])), ids)
    for (part_ids, part_y), r in zip(parts, ratios):
        np.testing.assert_array_equal(part_y, y[part_ids])
        for c in np.unique(y):
            share = np.sum(y == c) * r
            assert abs(np.sum(part_y == c) - share) < 1.0, (c, share, np.sum(part_y == c))


def test_stratified_split_of_an_imbalanced_set_by_hand():
    y = np.array([0] * 90 + [1] * 10)
    (y_tr,), (y_va,), (y_te,) = train_val_test_split(y, ratios=(0.8, 0.1, 0.1), stratify=True, seed=0)
    assert np.bincount(y_tr).tolist() == [72, 8]
    assert np.bincount(y_va).tolist() == [9, 1]
    assert np.bincount(y_te).tolist() == [9, 1]
    # A label array other than the last input can be given explicitly.
    (tr,), _, _ = train_val_test_split(np.arange(100), ratios=(0.5, 0.0, 0.5), stratify=y, seed=1)
    assert np.bincount(y[tr]).tolist() == [45, 5]


def test_split_is_seeded_and_shuffled():
    ids = np.arange(200)
    a = train_val_test_split(ids, seed=3)
    b = train_val_test_split(ids, seed=3)
    c = train_val_test_split(ids, seed=4)
    np.testing.assert_array_equal(a[0][0], b[0][0])
    assert not np.array_equal(a[0][0], c[0][0])
    assert not np.array_equal(np.sort(a[0][0]), a[0][0])
    minidl.manual_seed(9)
    d = train_val_test_split(ids)
    minidl.manual_seed(9)
    np.testing.assert_array_equal(d[2][0], train_val_test_split(ids)[2][0])


@pytest.mark.parametrize("ratios", [(0.5, 0.5, 0.5), (0.9, 0.2, -0.1), (0.8, 0.2)])
def test_bad_ratios(ratios):
    with pytest.raises(ValueError, match="ratios"):
        train_val_test_split(np.arange(10), ratios=ratios)


def test_bad_lengths_and_labels():
    with pytest.raises(ValueError, match=r"\(10,\), \(9,\)"):
        train_val_test_split(np.arange(10), np.arange(9))
    with pytest.raises(ValueError, match="one label per sample"):
        train_val_test_split(np.arange(10), stratify=np.zeros(5))


def test_oversampling_balances_the_training_split_with_copies_of_its_own_samples():
    y = np.array([0] * 50 + [1] * 7 + [2] * 20, dtype=np.int64)
    x = np.arange(len(y), dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    xo, yo = oversample_minority(x, y, seed=0)
    assert np.bincount(yo).tolist() == [50, 50, 50]
    assert xo.dtype == np.float32 and yo.dtype == np.int64
    ids = xo[:, 0].astype(int)
    np.testing.assert_array_equal(y[ids], yo)           # every copy keeps its own label
    assert set(ids.tolist()) == set(range(len(y)))      # all originals kept
    assert np.bincount(ids[yo == 0]).max() == 1         # the majority class is not duplicated
    half = oversample_minority(x, y, seed=0, ratio=0.5)[1]
    assert np.bincount(half).tolist() == [50, 25, 25]   # 20 < 25 raised to 25; a class above stays
    again = oversample_minority(x, y, seed=0)
    np.testing.assert_array_equal(again[0], xo)


def test_oversampling_docstring_warns_to_split_first():
    doc = oversample_minority.__doc__
    assert "AFTER" in doc and "validation" in doc and "test" in doc


def test_oversampling_errors():
    with pytest.raises(ValueError, match="one row per label"):
        oversample_minority(np.zeros((5, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="ratio"):
        oversample_minority(np.zeros((5, 2)), np.zeros(5), ratio=0)
