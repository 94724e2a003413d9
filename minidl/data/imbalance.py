"""Class imbalance: look at it, oversample with SMOTE or ADASYN, undersample, weight the loss.

    print(class_balance(y_tr))                          # counts, shares, the imbalance ratio
    x_tr, y_tr = smote(x_tr, y_tr, seed=0)              # synthetic minority samples (training split only)
    x_tr, y_tr = adasyn(x_tr, y_tr, seed=0)             # more of them where the classes overlap
    x_tr, y_tr = random_undersample(x_tr, y_tr, seed=0) # or fewer majority samples
    x_tr, y_tr = undersample_hard(x_tr, y_tr, difficulty)   # ... keeping the hard ones
    F.cross_entropy(logits, yb, weight=mdl.tensor(class_weights(y_tr)))

The textbook's advice (chapter 4, "Training a Model", §4.5.1): oversample the
underrepresented classes, or create samples with SMOTE or ADASYN, and look at
the generated samples; or undersample the overrepresented classes keeping the
samples that are hard to classify; judge the result by F1, not accuracy.
Whatever the method, apply it to the training split only, after splitting.

SMOTE (Chawla, Bowyer, Hall and Kegelmeyer, 2002). For a class that needs n
more samples, with its k nearest neighbours within the class:

    repeat n times: pick a sample x_i of the class and one of its k neighbours x_nn at random,
                    x_new = x_i + λ (x_nn − x_i),   λ ~ U(0, 1)

a point on the segment between two real samples of the class.

ADASYN (He, Bai, Garcia and Li, 2008) decides how many to make from each
sample: r_i = (number of its k nearest neighbours, among all samples, of
another class) / k, normalized to sum to 1, and g_i = round(r_i · n) samples
are made from x_i as SMOTE makes them. Samples surrounded by the other
classes, the hard ones, get the most.

Both follow imbalanced-learn's implementation draw for draw: with the same
integer ``seed`` they return the same arrays as ``imblearn``'s ``SMOTE`` and
``ADASYN`` with ``random_state=seed`` (NumPy's legacy ``RandomState``, the
generator imbalanced-learn uses); the tests compare them. The originals come
first, then the new samples class by class, in sorted order of the labels.
"""
from __future__ import annotations

import numpy as np

from minidl.data.split import as_generator

__all__ = ["adasyn", "class_balance", "class_weights", "misclassification_counts", "random_undersample", "smote",
           "undersample_hard"]


def _xy(owner: str, x, y):
    x, y = np.asarray(x), np.asarray(y)
    if y.ndim != 1 or x.ndim == 0 or len(x) != len(y):
        raise ValueError(f"{owner}: x must have one row per label in the 1-D y; got x {x.shape}, y {y.shape}")
    if len(y) == 0:
        raise ValueError(f"{owner}: no samples")
    return x, y


def _random_state(seed) -> np.random.RandomState:
    """imbalanced-learn's generator for an int seed; for None or a Generator, one seeded from it."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return np.random.RandomState(int(seed))
    return np.random.RandomState(int(as_generator(seed).integers(2**31)))


def _neighbours(query: np.ndarray, data: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k + 1 nearest rows of ``data`` to each query row (itself first), Euclidean, in chunks."""
    out = np.empty((len(query), k + 1), dtype=np.int64)
    for start in range(0, len(query), 256):
        block = query[start:start + 256]
        d = ((block[:, None, :] - data[None, :, :]) ** 2).sum(axis=2)
        out[start:start + 256] = np.argsort(d, axis=1, kind="stable")[:, :k + 1]
    return out


def _oversampling_targets(owner: str, y: np.ndarray, k: int) -> dict:
    """{class: how many to add}: every class up to the majority's count (imbalanced-learn's 'auto')."""
    classes, counts = np.unique(y, return_counts=True)
    majority = classes[int(np.argmax(counts))]
    needed = {c: int(counts.max() - n) for c, n in zip(classes, counts) if c != majority}
    small = {c: int(n) for c, n in zip(classes, counts) if c in needed and needed[c] > 0 and n <= k}
    if small:
        c, n = next(iter(small.items()))
        raise ValueError(f"{owner}: k_neighbors={k} needs at least {k + 1} samples in every class it "
                         f"oversamples; class {c.item()!r} has {n}. Use k_neighbors <= {n - 1} "
                         f"(at least 1), or oversample_minority to repeat samples instead")
    return needed


def _check_k(owner: str, k):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{owner}: k_neighbors must be a positive integer, got {k!r}")
    return int(k)


def smote(x, y, k_neighbors: int = 5, seed=None):
    """SMOTE: add synthetic samples to every class but the largest, up to its count. Returns (x, y)."""
    k = _check_k("smote", k_neighbors)
    x, y = _xy("smote", x, y)
    flat = x.reshape(len(x), -1)
    new_x, new_y = [flat], [y]
    for c, n in _oversampling_targets("smote", y, k).items():
        if n == 0:
            continue
        members = flat[y == c]
        neighbours = _neighbours(members, members, k)[:, 1:]
        rng = _random_state(seed)                     # a fresh one per class, as imbalanced-learn does
        picks = rng.randint(low=0, high=neighbours.size, size=n)
        steps = rng.uniform(size=n)[:, None]
        rows, cols = picks // k, picks % k
        new_x.append((members[rows] + steps * (members[neighbours[rows, cols]] - members[rows])).astype(x.dtype))
        new_y.append(np.full(n, c, dtype=y.dtype))
    return np.concatenate(new_x).reshape((-1,) + x.shape[1:]), np.concatenate(new_y)


def adasyn(x, y, k_neighbors: int = 5, seed=None):
    """ADASYN: like SMOTE, with more new samples from the minority samples among other classes."""
    k = _check_k("adasyn", k_neighbors)
    x, y = _xy("adasyn", x, y)
    flat = x.reshape(len(x), -1)
    rng = _random_state(seed)
    new_x, new_y = [flat], [y]
    for c, n in _oversampling_targets("adasyn", y, k).items():
        if n == 0:
            continue
        members = flat[y == c]
        around = _neighbours(members, flat, k)[:, 1:]
        hardness = np.sum(y[around] != c, axis=1) / k
        if not hardness.sum():
            raise ValueError(f"adasyn: no sample of class {c.item()!r} has a neighbour of another class, so "
                             "ADASYN's weights are 0/0; the class is well separated: use smote instead")
        per_sample = np.rint(hardness / hardness.sum() * n).astype(int)
        total = int(per_sample.sum())
        neighbours = _neighbours(members, members, k)[:, 1:]
        rows = np.repeat(np.arange(len(members)), per_sample)
        cols = rng.choice(k, size=total)
        steps = rng.uniform(size=(total, 1))
        new_x.append((members[rows] + steps * (members[neighbours[rows, cols]] - members[rows])).astype(x.dtype))
        new_y.append(np.full(total, c, dtype=y.dtype))
    return np.concatenate(new_x).reshape((-1,) + x.shape[1:]), np.concatenate(new_y)


def random_undersample(x, y, seed=None):
    """Every class but the smallest cut to the smallest class's count, at random (imbalanced-learn's draws).

    Returns (x, y) grouped by class, in sorted order of the labels.
    """
    x, y = _xy("random_undersample", x, y)
    classes, counts = np.unique(y, return_counts=True)
    minority = classes[int(np.argmin(counts))]
    rng = _random_state(seed)
    kept = []
    for c in classes:
        members = np.flatnonzero(y == c)
        kept.append(members if c == minority else members[rng.choice(range(len(members)), size=counts.min(),
                                                                     replace=False)])
    index = np.concatenate(kept)
    return x[index], y[index]


def undersample_hard(x, y, difficulty, n_per_class: int | None = None):
    """Keep, of every class larger than ``n_per_class``, its ``n_per_class`` hardest samples.

    ``difficulty``: one number per sample, larger = harder (a model's loss on
    it, 1 − its probability of the true class, or how many of several models
    trained on subsets misclassify it, the textbook's recipe). ``n_per_class``
    defaults to the smallest class's count. Order is kept.
    """
    x, y = _xy("undersample_hard", x, y)
    difficulty = np.asarray(difficulty, dtype=np.float64)
    if difficulty.shape != y.shape:
        raise ValueError(f"undersample_hard: difficulty needs one value per sample {y.shape}, "
                         f"got shape {difficulty.shape}")
    classes, counts = np.unique(y, return_counts=True)
    n = int(counts.min()) if n_per_class is None else n_per_class
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"undersample_hard: n_per_class must be a positive integer, got {n_per_class!r}")
    keep = np.ones(len(y), dtype=bool)
    for c, count in zip(classes, counts):
        if count > n:
            members = np.flatnonzero(y == c)
            easiest = members[np.argsort(-difficulty[members], kind="stable")[n:]]
            keep[easiest] = False
    return x[keep], y[keep]


def misclassification_counts(fit_predict, x, y, n_models: int = 5, seed=None) -> np.ndarray:
    """How many of ``n_models`` models misclassify each sample: the textbook's measure of a hard sample.

    The recipe of chapter 4, §4.5.1: train several models, each on a subset
    of the overrepresented class (with every other class whole), and count
    which samples they get wrong. The largest class is cut into ``n_models``
    random disjoint parts; model m trains on part m and all other classes and
    predicts every sample. ``fit_predict(x_train, y_train, x) -> labels`` is
    your training recipe. A sample of the large class is counted only by the
    models that did not see it (so its count, 0 to n_models − 1, measures
    generalization, not memory); the other classes' counts are training
    errors. Feed the counts to :func:`undersample_hard` as the difficulty.
    """
    x, y = _xy("misclassification_counts", x, y)
    if isinstance(n_models, bool) or not isinstance(n_models, (int, np.integer)) or n_models < 1:
        raise ValueError(f"misclassification_counts: n_models must be a positive integer, got {n_models!r}")
    classes, counts = np.unique(y, return_counts=True)
    majority = classes[int(np.argmax(counts))]
    members = as_generator(seed).permutation(np.flatnonzero(y == majority))
    if n_models > len(members):
        raise ValueError(f"misclassification_counts: n_models={n_models} parts of the largest class "
                         f"({majority.item()!r}, {len(members)} samples) would leave some empty")
    others = np.flatnonzero(y != majority)
    wrong = np.zeros(len(y), dtype=np.int64)
    seen_by = np.full(len(y), -1)
    for m, part in enumerate(np.array_split(members, n_models)):
        seen_by[part] = m
        train = np.sort(np.concatenate([part, others]))
        predicted = np.asarray(fit_predict(x[train], y[train], x)).reshape(-1)
        if predicted.shape != y.shape:
            raise ValueError(f"misclassification_counts: fit_predict returned {predicted.shape} labels for "
                             f"{len(y)} samples")
        wrong += (predicted != y) & (seen_by != m)
    return wrong


def class_weights(y, num_classes: int | None = None) -> np.ndarray:
    """w_c = N / (K · N_c): "balanced" weights, mean 1 over the samples, for ``F.cross_entropy(weight=...)``.

    scikit-learn's ``compute_class_weight("balanced")``. With them, every class
    contributes the same total weight to a weighted loss. float32, one per
    class 0..K−1; a class with no sample is an error (its weight is infinite).
    """
    y = np.asarray(y)
    if y.ndim != 1 or len(y) == 0 or y.dtype.kind not in "iu" or y.min() < 0:
        raise ValueError(f"class_weights: y must be non-empty integer labels 0..K-1, got shape {y.shape}, "
                         f"dtype {y.dtype}")
    k = int(y.max()) + 1 if num_classes is None else int(num_classes)
    counts = np.bincount(y, minlength=k)
    if len(counts) > k or np.any(counts == 0):
        missing = np.flatnonzero(counts[:k] == 0).tolist()
        raise ValueError(f"class_weights: classes {missing} have no sample in y (of {k} classes); a weight "
                         "N / (K·N_c) needs N_c > 0")
    return (len(y) / (k * counts)).astype(np.float32)


def class_balance(y, class_names=None) -> str:
    """A table of each class's count and share, and the imbalance ratio (largest / smallest count)."""
    y = np.asarray(y)
    if y.ndim != 1 or len(y) == 0:
        raise ValueError(f"class_balance: y must be a non-empty 1-D array of labels, got shape {y.shape}")
    classes, counts = np.unique(y, return_counts=True)
    names = [str(c) for c in classes] if class_names is None else [str(class_names[int(c)]) for c in classes]
    width = max(len(n) for n in names + ["class"])
    lines = [f"{'class':<{width}}  {'count':>7}  {'share':>6}  bar"]
    for name, count in zip(names, counts):
        share = count / len(y)
        lines.append(f"{name:<{width}}  {count:>7}  {share:>6.1%}  {'#' * max(1, round(40 * count / counts.max()))}")
    lines.append(f"{len(classes)} classes, {len(y)} samples; imbalance ratio {counts.max() / counts.min():.1f} "
                 f"(largest / smallest class)")
    return "\n".join(lines)
