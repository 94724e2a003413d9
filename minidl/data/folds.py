"""Cross-validation splitters: k-fold, stratified k-fold, group k-fold, forward chaining.

    for train_idx, val_idx in StratifiedKFold(5, shuffle=True, seed=0).split(x, y):
        model = fit(x[train_idx], y[train_idx]); scores.append(score(model, x[val_idx], y[val_idx]))
    print(np.mean(scores), np.std(scores))        # a mean and a spread, not one lucky split

Each splitter yields ``(train_indices, test_indices)`` pairs of sorted int64
arrays, ``n_splits`` of them, and every sample is a test sample exactly once
(``TimeSeriesSplit`` excepted: the first block is only ever trained on). The
names, arguments and folds are scikit-learn's (``sklearn.model_selection``),
so code written for one runs with the other:

- ``KFold``: consecutive blocks; the first ``n % k`` folds hold one sample more.
- ``StratifiedKFold``: every fold keeps the class proportions. The samples of
  the classes, sorted, are dealt round robin to the folds to decide how many
  of each class a fold gets; each class then fills the folds in order of
  appearance (scikit-learn's allocation, so the folds are the same).
- ``GroupKFold``: no group (a patient, a speaker, a photo session) is in two
  folds; the largest groups are placed first, each into the fold with the
  fewest samples so far.
- ``TimeSeriesSplit``: forward chaining. Fold i trains on everything before
  its test block, never after (``gap`` samples left out between them), so no
  future sample informs a prediction of the past.

Two deliberate differences: with ``shuffle=True`` the order comes from
minidl's generators (``seed``: an int, a Generator, or ``None`` for
``minidl.manual_seed``'s), so the folds are shuffled differently from
scikit-learn's ``random_state``; and ``StratifiedKFold`` refuses ``n_splits``
larger than the smallest class (scikit-learn only warns, then leaves that
class out of some folds, whose scores then mean something else).
"""
from __future__ import annotations

import numpy as np

from minidl.data.split import as_generator

__all__ = ["GroupKFold", "KFold", "StratifiedKFold", "TimeSeriesSplit"]


def _num_samples(x, owner: str) -> int:
    if isinstance(x, (int, np.integer)):
        return int(x)
    if hasattr(x, "__len__"):
        return len(x)
    raise TypeError(f"{owner}.split: X must be an array, a dataset or a sample count, got {type(x).__name__}")


def _check_n_splits(owner: str, n_splits) -> int:
    if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or n_splits < 2:
        raise ValueError(f"{owner}: n_splits must be an integer of at least 2, got {n_splits!r}")
    return int(n_splits)


def _one_label_per_sample(owner: str, name: str, values, n: int) -> np.ndarray:
    if values is None:
        raise ValueError(f"{owner}.split needs {name}: one value per sample, e.g. split(x, {name[0]}=...)")
    values = np.asarray(values)
    if values.ndim != 1 or len(values) != n:
        raise ValueError(f"{owner}.split: {name} must be a 1-D array with one entry per sample ({n}); "
                         f"got shape {values.shape}")
    return values


class _Splitter:
    """Folds from test masks: the training indices are every sample not under test."""

    def __init__(self, n_splits: int = 5, *, shuffle: bool = False, seed=None):
        self.n_splits = _check_n_splits(type(self).__name__, n_splits)
        self.shuffle = bool(shuffle)
        self.seed = seed

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return self.n_splits

    def split(self, X, y=None, groups=None):
        n = _num_samples(X, type(self).__name__)
        for test in self._test_indices(n, y, groups):
            mask = np.zeros(n, dtype=bool)
            mask[test] = True
            yield np.flatnonzero(~mask), np.flatnonzero(mask)

    def __repr__(self):
        return f"{type(self).__name__}(n_splits={self.n_splits}, shuffle={self.shuffle}, seed={self.seed!r})"


class KFold(_Splitter):
    """k consecutive folds (after one shuffle when ``shuffle=True``); sizes differ by at most one."""

    def _test_indices(self, n, y, groups):
        if self.n_splits > n:
            raise ValueError(f"KFold: n_splits={self.n_splits} is larger than the number of samples {n}; "
                             f"use at most {n} folds")
        order = as_generator(self.seed).permutation(n) if self.shuffle else np.arange(n)
        sizes = np.full(self.n_splits, n // self.n_splits)
        sizes[: n % self.n_splits] += 1
        yield from np.split(order, np.cumsum(sizes)[:-1])


class StratifiedKFold(_Splitter):
    """k folds, each with the class proportions of ``y`` (counts per class differ by at most one)."""

    def split(self, X, y, groups=None):
        return super().split(X, y, groups)

    def _test_indices(self, n, y, groups):
        y = _one_label_per_sample("StratifiedKFold", "y", y, n)
        # Classes numbered by first appearance, as scikit-learn numbers them.
        _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
        rank_of = np.argsort(np.argsort(first))
        encoded = rank_of[inverse]
        counts = np.bincount(encoded, minlength=len(first))
        smallest = int(counts.min())
        if self.n_splits > smallest:
            label = y[first[int(np.argmin(counts))]].item()
            raise ValueError(f"StratifiedKFold: n_splits={self.n_splits} is larger than the smallest class "
                             f"(label {label!r} has {smallest} samples), so some folds would miss that class; "
                             f"use n_splits <= {smallest} or gather more samples of it")
        # How many of each class each fold tests: deal the sorted labels round robin.
        ordered = np.sort(encoded)
        allocation = np.stack([np.bincount(ordered[i::self.n_splits], minlength=len(counts))
                               for i in range(self.n_splits)])
        fold_of = np.empty(n, dtype=np.int64)
        rng = as_generator(self.seed) if self.shuffle else None
        for c in range(len(counts)):
            folds = np.repeat(np.arange(self.n_splits), allocation[:, c])
            if rng is not None:
                folds = rng.permutation(folds)
            fold_of[encoded == c] = folds
        for f in range(self.n_splits):
            yield np.flatnonzero(fold_of == f)


class GroupKFold(_Splitter):
    """k folds with no group in two of them; the largest groups go first, each to the lightest fold.

    With ``shuffle=True`` the groups are shuffled instead and cut into k runs of
    (nearly) equal numbers of groups, as scikit-learn does.
    """

    def split(self, X, y=None, groups=None):
        return super().split(X, y, groups)

    def _test_indices(self, n, y, groups):
        groups = _one_label_per_sample("GroupKFold", "groups", groups, n)
        unique, group_of = np.unique(groups, return_inverse=True)
        if self.n_splits > len(unique):
            raise ValueError(f"GroupKFold: n_splits={self.n_splits} is larger than the number of groups "
                             f"{len(unique)}; use at most {len(unique)} folds")
        if self.shuffle:
            order = as_generator(self.seed).permutation(len(unique))
            for chunk in np.array_split(order, self.n_splits):
                yield np.flatnonzero(np.isin(group_of, chunk))
            return
        sizes = np.bincount(group_of)
        load = np.zeros(self.n_splits, dtype=np.int64)
        fold_of_group = np.zeros(len(unique), dtype=np.int64)
        for g in np.argsort(sizes, kind="stable")[::-1]:     # largest first
            lightest = int(np.argmin(load))
            load[lightest] += sizes[g]
            fold_of_group[g] = lightest
        fold_of = fold_of_group[group_of]
        for f in range(self.n_splits):
            yield np.flatnonzero(fold_of == f)


class TimeSeriesSplit:
    """Forward chaining: fold i trains on samples ``[0, t_i − gap)`` and tests ``[t_i, t_i + test_size)``.

    The samples must be in time order. ``test_size`` defaults to
    ``n // (n_splits + 1)``, so the first training block is as large as a test
    block; the test blocks are the last ``n_splits · test_size`` samples.
    ``max_train_size`` keeps only the latest samples of each training block (a
    sliding window instead of a growing one); ``gap`` drops samples between
    training and test (a forecast made ``gap`` steps ahead).
    """

    def __init__(self, n_splits: int = 5, *, max_train_size: int | None = None, test_size: int | None = None,
                 gap: int = 0):
        self.n_splits = _check_n_splits("TimeSeriesSplit", n_splits)
        for name, value in (("max_train_size", max_train_size), ("test_size", test_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                      or value < 1):
                raise ValueError(f"TimeSeriesSplit: {name} must be a positive integer or None, got {value!r}")
        if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or gap < 0:
            raise ValueError(f"TimeSeriesSplit: gap must be a non-negative integer, got {gap!r}")
        self.max_train_size, self.test_size, self.gap = max_train_size, test_size, int(gap)

    def get_n_splits(self, X=None, y=None, groups=None) -> int:
        return self.n_splits

    def split(self, X, y=None, groups=None):
        n = _num_samples(X, "TimeSeriesSplit")
        k = self.n_splits
        test_size = self.test_size if self.test_size is not None else n // (k + 1)
        if k + 1 > n:
            raise ValueError(f"TimeSeriesSplit: n_splits={k} needs at least {k + 1} samples, got {n}")
        if n - self.gap - test_size * k <= 0:
            raise ValueError(f"TimeSeriesSplit: {k} test blocks of {test_size} samples and gap={self.gap} "
                             f"leave no training sample out of {n}; use fewer splits or a smaller test_size")
        indices = np.arange(n)
        for start in range(n - k * test_size, n, test_size):
            end = start - self.gap
            first = 0 if not self.max_train_size or self.max_train_size >= end else end - self.max_train_size
            yield indices[first:end], indices[start:start + test_size]

    def __repr__(self):
        return (f"TimeSeriesSplit(n_splits={self.n_splits}, max_train_size={self.max_train_size}, "
                f"test_size={self.test_size}, gap={self.gap})")

