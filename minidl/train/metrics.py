"""Classification metrics on NumPy arrays: accuracy, confusion matrix, macro precision/recall/F1.

    accuracy(y_true, logits)                 # fraction right (argmax of scores or labels)
    C = confusion_matrix(y_true, y_pred, 3)  # C[i, j]: samples of class i predicted as j
    precision_recall_f1(y_true, y_pred)      # macro averages

Definitions, per class c, from the confusion matrix C (rows: true, columns: predicted):

    TP_c = C[c, c]      FP_c = sum_i C[i, c] - TP_c      FN_c = sum_j C[c, j] - TP_c
    precision_c = TP_c / (TP_c + FP_c)     recall_c = TP_c / (TP_c + FN_c)
    F1_c = 2 precision_c recall_c / (precision_c + recall_c)

A ratio whose denominator is zero (a class never predicted, or absent) is 0.
Macro averaging is the plain mean over classes, so every class counts the same
however rare it is -- the number to watch on an imbalanced set, where accuracy
rewards predicting the majority class.

Every function accepts predicted labels ``(N,)`` or scores ``(N, K)`` (logits
or probabilities; the argmax is taken), as NumPy arrays, CuPy arrays or Tensors.
"""
from __future__ import annotations

import numpy as np

from minidl import backend


def _as_numpy(values) -> np.ndarray:
    if hasattr(values, "numpy") and callable(values.numpy):  # a Tensor
        values = values.numpy()
    return np.asarray(backend.to_numpy(values) if hasattr(values, "dtype") else values)


def _labels(y_true, y_pred, op: str):
    """(true labels, predicted labels) as int64 arrays of equal length."""
    y_true = _as_numpy(y_true)
    y_pred = _as_numpy(y_pred)
    if y_pred.ndim == 2:
        y_pred = y_pred.argmax(axis=1)
    if y_true.ndim != 1 or y_pred.ndim != 1:
        raise ValueError(f"{op}: y_true must be labels (N,) and y_pred labels (N,) or scores (N, K); "
                         f"got shapes {y_true.shape} and {y_pred.shape}")
    if len(y_true) != len(y_pred):
        raise ValueError(f"{op}: y_true has {len(y_true)} samples but y_pred has {len(y_pred)}")
    for name, arr in (("y_true", y_true), ("y_pred", y_pred)):
        if arr.size and arr.dtype.kind == "f" and not np.all(arr == np.round(arr)):
            raise ValueError(f"{op}: {name} must hold integer class labels, got non-integer values")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{op}: {name} holds a negative class label ({arr.min()})")
    return y_true.astype(np.int64), y_pred.astype(np.int64)


def accuracy(y_true, y_pred) -> float:
    """Fraction of samples whose predicted label equals the true label (0.0 for no samples)."""
    y_true, y_pred = _labels(y_true, y_pred, "accuracy")
    if len(y_true) == 0:
        return 0.0
    return float(np.mean(y_true == y_pred))


def confusion_matrix(y_true, y_pred, num_classes: int | None = None) -> np.ndarray:
    """``C[i, j]`` = number of samples of true class ``i`` predicted as class ``j`` (int64, K x K).

    ``num_classes`` defaults to one more than the largest label seen.
    """
    y_true, y_pred = _labels(y_true, y_pred, "confusion_matrix")
    seen = int(max(y_true.max(initial=-1), y_pred.max(initial=-1))) + 1
    k = seen if num_classes is None else int(num_classes)
    if k < seen:
        raise ValueError(f"confusion_matrix: num_classes={num_classes} but a label {seen - 1} occurs; "
                         f"labels must lie in 0..{k - 1}")
    # One bincount over the pair index i*K + j fills the whole matrix at once.
    return np.bincount(y_true * k + y_pred, minlength=k * k).reshape(k, k).astype(np.int64)


def _safe_ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    out = np.zeros(numerator.shape, dtype=np.float64)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def per_class_precision_recall_f1(y_true, y_pred, num_classes: int | None = None):
    """Arrays ``(precision, recall, f1, support)``, one entry per class (support = true count)."""
    c = confusion_matrix(y_true, y_pred, num_classes).astype(np.float64)
    tp = np.diag(c)
    predicted = c.sum(axis=0)   # TP + FP
    actual = c.sum(axis=1)      # TP + FN
    precision = _safe_ratio(tp, predicted)
    recall = _safe_ratio(tp, actual)
    f1 = _safe_ratio(2 * precision * recall, precision + recall)
    return precision, recall, f1, actual.astype(np.int64)


def precision_recall_f1(y_true, y_pred, num_classes: int | None = None) -> dict:
    """Macro-averaged ``{"precision", "recall", "f1"}``: the unweighted mean over classes.

    Macro F1 is the mean of the per-class F1 scores (not the F1 of the mean
    precision and recall), as scikit-learn computes it.
    """
    precision, recall, f1, _ = per_class_precision_recall_f1(y_true, y_pred, num_classes)
    if len(f1) == 0:
        return {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    return {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1": float(f1.mean())}


def macro_precision(y_true, y_pred, num_classes: int | None = None) -> float:
    return precision_recall_f1(y_true, y_pred, num_classes)["precision"]


def macro_recall(y_true, y_pred, num_classes: int | None = None) -> float:
    return precision_recall_f1(y_true, y_pred, num_classes)["recall"]


def macro_f1(y_true, y_pred, num_classes: int | None = None) -> float:
    return precision_recall_f1(y_true, y_pred, num_classes)["f1"]


def classification_report(y_true, y_pred, num_classes: int | None = None, class_names=None) -> str:
    """A plain-text table: precision, recall, F1 and support per class, then the macro averages and accuracy."""
    precision, recall, f1, support = per_class_precision_recall_f1(y_true, y_pred, num_classes)
    names = [str(n) for n in class_names] if class_names is not None else [str(i) for i in range(len(f1))]
    width = max([len(n) for n in names] + [9])
    lines = [f"{'class':<{width}}  precision  recall     f1  support"]
    for name, p, r, f, s in zip(names, precision, recall, f1, support):
        lines.append(f"{name:<{width}}  {p:9.3f}  {r:6.3f}  {f:5.3f}  {s:7d}")
    lines.append(f"{'macro avg':<{width}}  {precision.mean():9.3f}  {recall.mean():6.3f}  "
                 f"{f1.mean():5.3f}  {support.sum():7d}")
    lines.append(f"{'accuracy':<{width}}  {accuracy(y_true, y_pred):24.3f}  {support.sum():7d}")
    return "\n".join(lines)


# Names the Trainer and the CLI accept for ``metrics=[...]``: each maps (y_true, scores) -> float.
METRICS = {
    "accuracy": accuracy,
    "precision": macro_precision,
    "recall": macro_recall,
    "f1": macro_f1,
}
