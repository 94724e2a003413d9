"""Metrics against hand-computed values and plain loop formulas."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
from minidl.train import metrics as M

Y_TRUE = [0, 0, 1, 1, 2, 2, 2]
Y_PRED = [0, 1, 1, 1, 2, 0, 2]


def test_hand_computed_example():
    # Confusion matrix by hand: class 0 -> (0: 1, 1: 1), class 1 -> (1: 2), class 2 -> (0: 1, 2: 2).
    np.testing.assert_array_equal(M.confusion_matrix(Y_TRUE, Y_PRED), [[1, 1, 0], [0, 2, 0], [1, 0, 2]])
    assert M.accuracy(Y_TRUE, Y_PRED) == pytest.approx(5 / 7)
    # precision: 1/2, 2/3, 2/2;  recall: 1/2, 2/2, 2/3;  F1: 1/2, 0.8, 0.8
    p, r, f1, support = M.per_class_precision_recall_f1(Y_TRUE, Y_PRED)
    np.testing.assert_allclose(p, [0.5, 2 / 3, 1.0])
    np.testing.assert_allclose(r, [0.5, 1.0, 2 / 3])
    np.testing.assert_allclose(f1, [0.5, 0.8, 0.8])
    np.testing.assert_array_equal(support, [2, 2, 3])
    macro = M.precision_recall_f1(Y_TRUE, Y_PRED)
    assert macro["precision"] == pytest.approx((0.5 + 2 / 3 + 1) / 3)
    assert macro["recall"] == pytest.approx((0.5 + 1 + 2 / 3) / 3)
    assert macro["f1"] == pytest.approx(0.7)  # mean of per-class F1, not F1 of the means
    assert M.macro_f1(Y_TRUE, Y_PRED) == pytest.approx(0.7)


def test_scores_are_reduced_by_argmax_and_tensors_accepted():
    scores = np.eye(3)[Y_PRED] * 2.0 - 0.5   # the argmax of each row is Y_PRED
    assert M.accuracy(Y_TRUE, scores) == pytest.approx(5 / 7)
    assert M.accuracy(mdl.tensor(np.array(Y_TRUE)), mdl.tensor(scores)) == pytest.approx(5 / 7)


def test_class_never_predicted_has_zero_precision_and_absent_class_zero_recall():
    p, r, f1, _ = M.per_class_precision_recall_f1([0, 0, 1], [0, 0, 0], num_classes=3)
    np.testing.assert_allclose(p, [2 / 3, 0.0, 0.0])
    np.testing.assert_allclose(r, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(f1, [0.8, 0.0, 0.0])


def _loop_metrics(y_true, y_pred, k):
    """The definitions, one sample at a time."""
    c = [[0] * k for _ in range(k)]
    for t, p in zip(y_true, y_pred):
        c[t][p] += 1
    f1s, ps, rs = [], [], []
    for cls in range(k):
        tp = c[cls][cls]
        fp = sum(c[i][cls] for i in range(k)) - tp
        fn = sum(c[cls][j] for j in range(k)) - tp
        prec = tp / (tp + fp) if tp + fp else 0.0
        rec = tp / (tp + fn) if tp + fn else 0.0
        ps.append(prec)
        rs.append(rec)
        f1s.append(2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    return c, sum(ps) / k, sum(rs) / k, sum(f1s) / k


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6).flatmap(lambda k: st.tuples(
    st.just(k), st.lists(st.tuples(st.integers(0, k - 1), st.integers(0, k - 1)), min_size=1, max_size=60))))
def test_against_loop_definitions(case):
    k, pairs = case
    y_true = [a for a, _ in pairs]
    y_pred = [b for _, b in pairs]
    c, p, r, f1 = _loop_metrics(y_true, y_pred, k)
    np.testing.assert_array_equal(M.confusion_matrix(y_true, y_pred, k), c)
    macro = M.precision_recall_f1(y_true, y_pred, k)
    assert macro["precision"] == pytest.approx(p)
    assert macro["recall"] == pytest.approx(r)
    assert macro["f1"] == pytest.approx(f1)
    assert M.accuracy(y_true, y_pred) == pytest.approx(np.mean(np.array(y_true) == np.array(y_pred)))


def test_report_lists_every_class():
    text = M.classification_report(Y_TRUE, Y_PRED, class_names=["a", "b", "c"])
    assert "macro avg" in text and "accuracy" in text
    assert all(line.split()[0] in {"class", "a", "b", "c", "macro", "accuracy"} for line in text.splitlines())


@pytest.mark.parametrize("y_true, y_pred, message", [
    ([0, 1], [0], "2 samples but y_pred has 1"),
    ([0, -1], [0, 1], "negative"),
    ([[0, 1]], [0, 1], "labels"),
    ([0.5, 1.0], [0, 1], "integer class labels"),
])
def test_bad_input(y_true, y_pred, message):
    with pytest.raises(ValueError, match=message):
        M.accuracy(y_true, y_pred)


def test_num_classes_too_small():
    with pytest.raises(ValueError, match="num_classes=2"):
        M.confusion_matrix([0, 2], [0, 1], num_classes=2)
