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

Error bars. A score measured on N samples is an estimate; its confidence
interval says how far the true score may lie. Accuracy is a proportion, k
right out of n, and gets Wilson's score interval (Wilson, 1927): with
p̂ = k/n and z the normal quantile of the confidence (1.96 for 95 %),

    center = (p̂ + z²/(2n)) / (1 + z²/n)
    half   = z / (1 + z²/n) · sqrt(p̂(1 − p̂)/n + z²/(4n²))
    [low, high] = [center − half, center + half]

which, unlike the textbook p̂ ± z·sqrt(p̂(1 − p̂)/n), stays inside [0, 1] and
does not shrink to a point at 0 % or 100 % errors. F1 (and any other score)
gets a percentile bootstrap (Efron, 1979): draw n samples with replacement
B times, score each draw, and take the (1 − c)/2 and (1 + c)/2 quantiles of
the B scores. ``format_interval`` prints "98.3 % ± 0.9": the figure and half
the interval's width, in percentage points.

    accuracy_interval(y_true, logits)        # (0.983, 0.972, 0.990)
    bootstrap_interval(macro_f1, y_true, logits, seed=0)
    check_validation_size(n_val, 0.97, difference=0.01)   # warns: too few samples to tell 1 point apart
"""
from __future__ import annotations

import functools
import statistics
import warnings

import numpy as np

from minidl import backend
from minidl.data.split import as_generator


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


def _z(confidence, owner: str) -> float:
    """The two-sided normal quantile: P(|Z| <= z) = confidence."""
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 < confidence < 1.0:
        raise ValueError(f"{owner}: confidence must be a number in (0, 1), e.g. 0.95; got {confidence!r}")
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple:
    """Wilson's score interval ``(low, high)`` for a proportion of ``successes`` out of ``n``."""
    z = _z(confidence, "wilson_interval")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 \
            or not isinstance(successes, (int, np.integer)) or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: needs whole numbers 0 <= successes <= n and n >= 1; "
                         f"got successes={successes!r}, n={n!r}")
    return _wilson(successes / n, n, z)


def _wilson(p_hat: float, n: int, z: float) -> tuple:
    denominator = 1 + z * z / n
    center = (p_hat + z * z / (2 * n)) / denominator
    half = z / denominator * np.sqrt(p_hat * (1 - p_hat) / n + z * z / (4 * n * n))
    return float(max(0.0, center - half)), float(min(1.0, center + half))


def accuracy_interval(y_true, y_pred, confidence: float = 0.95) -> tuple:
    """``(accuracy, low, high)``: the accuracy and its Wilson interval."""
    y_true, y_pred = _labels(y_true, y_pred, "accuracy_interval")
    if len(y_true) == 0:
        raise ValueError("accuracy_interval: no samples; an interval needs at least one")
    right = int(np.sum(y_true == y_pred))
    return (right / len(y_true), *wilson_interval(right, len(y_true), confidence))


def bootstrap_interval(metric, y_true, y_pred, confidence: float = 0.95, n_resamples: int = 1000,
                       seed=None) -> tuple:
    """``(score, low, high)``: ``metric(y_true, y_pred)`` and its percentile-bootstrap interval.

    ``metric``: a function of (labels, predicted labels) such as ``macro_f1``,
    or one of the names in ``METRICS``. ``seed``: an int, a Generator, or
    ``None`` for minidl's generator. The number of classes is fixed from the
    full set, so a resample that misses a class still scores it (as 0).
    """
    _z(confidence, "bootstrap_interval")
    metric = METRICS[metric] if isinstance(metric, str) and metric in METRICS else metric
    if not callable(metric):
        raise ValueError(f"bootstrap_interval: metric must be a function or one of {sorted(METRICS)}, "
                         f"got {metric!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 2:
        raise ValueError(f"bootstrap_interval: n_resamples must be an integer >= 2, got {n_resamples!r}")
    y_true, y_pred = _labels(y_true, y_pred, "bootstrap_interval")
    n = len(y_true)
    if n == 0:
        raise ValueError("bootstrap_interval: no samples; an interval needs at least one")
    rng = as_generator(seed)
    fixed = metric
    if metric in (macro_f1, macro_precision, macro_recall):    # the classes of the full set, in every draw
        fixed = functools.partial(metric, num_classes=int(max(y_true.max(), y_pred.max())) + 1)
    draws = rng.integers(0, n, size=(n_resamples, n))
    scores = np.array([fixed(y_true[i], y_pred[i]) for i in draws])
    low, high = np.quantile(scores, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(fixed(y_true, y_pred)), float(low), float(high)


def format_interval(value: float, low: float, high: float) -> str:
    """"98.3 % ± 0.9": the score in percent and half the interval's width in percentage points."""
    return f"{100 * value:.1f} % ± {100 * (high - low) / 2:.1f}"


def smallest_difference(n: int, accuracy_value: float, confidence: float = 0.95) -> float:
    """The smallest accuracy difference two results on ``n`` samples need for their intervals not to overlap.

    Two runs scoring p and p ± d on validation sets of n samples are told apart
    (their Wilson intervals disjoint) when d exceeds about the sum of the two
    half-widths: this returns the smallest d, above or below p, found by
    bisection (``inf`` when no accuracy in [0, 1] is told apart). Disjoint
    intervals are a conservative test (a paired test on the same samples,
    McNemar's, can resolve less), so this is the difference one can trust.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"smallest_difference: n must be a positive integer, got {n!r}")
    if not 0.0 <= accuracy_value <= 1.0:
        raise ValueError(f"smallest_difference: accuracy must be in [0, 1], got {accuracy_value!r}")
    z = _z(confidence, "smallest_difference")
    base_low, base_high = _wilson(accuracy_value, n, z)
    found = []
    for sign, room in ((1, 1.0 - accuracy_value), (-1, accuracy_value)):   # a better result, a worse one

        def apart(d, sign=sign):
            bounds = _wilson(accuracy_value + sign * d, n, z)
            return bounds[0] > base_high if sign > 0 else bounds[1] < base_low

        if room > 0 and apart(room):
            lo, hi = 0.0, room
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if apart(mid) else (mid, hi)
            found.append(hi)
    return min(found, default=float("inf"))   # inf: not even 0 % or 100 % is told apart from this result


def interval_note(test_accuracy: float, n_test: int, val_accuracy: float, n_val: int) -> str:
    """One line for a run's end: the test accuracy with its 95 % interval, and what the validation set resolves.

    ``test_accuracy`` is a fraction of ``n_test`` samples (the count right is
    recovered by rounding). The validation part says how far apart two runs'
    validation accuracies must be to be told apart, when that is more than one
    percentage point (a validation set too small to rank runs that close).
    """
    right = int(round(test_accuracy * n_test))
    line = f"test accuracy {format_interval(right / n_test, *wilson_interval(right, n_test))} ({n_test} samples)"
    needed = smallest_difference(n_val, min(max(val_accuracy, 0.0), 1.0)) if n_val else float("inf")
    if needed > 0.01:
        line += (f"; warning: {n_val} validation samples tell apart only runs more than {100 * needed:.1f} "
                 f"points apart")
    return line


class ValidationSizeWarning(UserWarning):
    """A validation set too small to tell apart the results being compared."""


def check_validation_size(n: int, accuracy_value: float, difference: float = 0.01,
                          confidence: float = 0.95) -> bool:
    """True if ``n`` samples tell apart accuracies ``difference`` apart; else warn and return False."""
    needed = smallest_difference(n, accuracy_value, confidence)
    if needed <= difference:
        return True
    warnings.warn(f"a validation set of {n} samples at {accuracy_value:.1%} accuracy tells apart only results "
                  f"more than {100 * needed:.1f} points apart ({confidence:.0%} intervals), not the "
                  f"{100 * difference:.1f} points asked; use a larger validation set or cross-validation",
                  ValidationSizeWarning, stacklevel=2)
    return False


# Names the Trainer and the CLI accept for ``metrics=[...]``: each maps (y_true, scores) -> float.
METRICS = {
    "accuracy": accuracy,
    "precision": macro_precision,
    "recall": macro_recall,
    "f1": macro_f1,
}
