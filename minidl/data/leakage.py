"""Duplicates inside a data set and samples shared between its splits.

    groups = find_duplicates(x_train)                     # [array([3, 17]), array([40, 41, 99]), ...]
    find_duplicates(images, normalize="sample", decimals=1)   # near duplicates: brightness/contrast changed
    check_leakage(x_tr, x_va, x_te)                        # raises if a sample is in two splits
    report = check_leakage(x_tr, x_va, on_leak="report")   # {("train", "val"): array of index pairs}

The textbook's first step in training is to look at the data for corrupted
samples, duplicates and wrong labels (chapter 4, "Training a Model",
§4.5.1); a sample that is both in the training and the test split makes the
test score a memory test. Both functions reduce every sample to a key: its
bytes after an optional normalization and rounding, looked up in a hash
table (a Python dict), so the cost is one pass over the data, not a
comparison of every pair. Two samples share a key exactly when their
normalized, rounded values are equal, so there are no false matches.

Normalizations (``normalize``):

- ``None``: the values as stored (exact duplicates; ``decimals`` rounds them).
- ``"sample"``: each sample minus its mean, divided by its standard deviation
  (a constant sample becomes zeros): the same image brighter or with more
  contrast is a duplicate. For images.
- ``"feature"``: each feature (column) standardized with the mean and
  standard deviation of all the data given (every split together, in
  ``check_leakage``), so features in different units weigh the same. For
  tabular rows.

Near duplicates are equal after rounding to ``decimals``. Rounding cuts the
line into cells, so two values on either side of a cell boundary are missed
however close they are: a near match found is certain, a near match missed
is possible.
"""
from __future__ import annotations

import warnings

import numpy as np

__all__ = ["check_leakage", "find_duplicates", "sample_keys"]

_NORMALIZE = (None, "sample", "feature")


def _features(data, owner: str) -> np.ndarray:
    """The samples' features, one row each: an array, a TensorDataset's first array, or (x, y)'s x."""
    if hasattr(data, "arrays"):                   # TensorDataset
        data = data.arrays[0]
    elif isinstance(data, tuple):
        data = data[0]
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__") and not hasattr(data, "shape") \
            and not isinstance(data, list):
        items = [data[i] for i in range(len(data))]     # any Dataset: the first field of every item
        data = np.stack([np.asarray(item[0] if isinstance(item, tuple) else item) for item in items])
    if hasattr(data, "numpy") and callable(data.numpy):
        data = data.numpy()
    x = np.asarray(data)
    if x.ndim == 0:
        raise ValueError(f"{owner}: expected samples along axis 0 (an array, a TensorDataset or (x, y)), "
                         f"got a scalar")
    return x.reshape(len(x), -1)


def _check_options(owner: str, normalize, decimals):
    if normalize not in _NORMALIZE:
        raise ValueError(f"{owner}: normalize must be one of {_NORMALIZE}, got {normalize!r}")
    if decimals is not None and (isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer))):
        raise ValueError(f"{owner}: decimals must be an integer (digits kept after rounding) or None, "
                         f"got {decimals!r}")


def _normalized(x: np.ndarray, normalize, decimals, stats=None) -> np.ndarray:
    if x.dtype.kind not in "fc" and normalize is None and decimals is None:
        return np.ascontiguousarray(x)                     # integers, bytes: compare as stored
    x = x.astype(np.float64)
    if normalize == "sample":
        x = x - x.mean(axis=1, keepdims=True)
        std = x.std(axis=1, keepdims=True)
        x = np.divide(x, std, out=np.zeros_like(x), where=std > 0)
    elif normalize == "feature":
        mean, std = stats if stats is not None else (x.mean(axis=0), x.std(axis=0))
        x = np.divide(x - mean, std, out=np.zeros_like(x), where=std > 0)
    if decimals is not None:
        x = np.round(x, decimals)
    return np.ascontiguousarray(x + 0.0)                   # + 0.0 turns -0.0 into 0.0: one key for zero


def _keys(x: np.ndarray, normalize, decimals, stats=None) -> list:
    return [row.tobytes() for row in _normalized(x, normalize, decimals, stats)]


def sample_keys(data, normalize=None, decimals=None) -> list:
    """One hashable key (bytes) per sample: equal keys = equal samples after normalizing and rounding."""
    _check_options("sample_keys", normalize, decimals)
    return _keys(_features(data, "sample_keys"), normalize, decimals)


def find_duplicates(data, normalize=None, decimals=None) -> list:
    """Groups of samples that are duplicates of each other: a list of sorted index arrays (2+ each).

    ``data``: an array (N, ...), a ``TensorDataset`` or ``(x, y)`` (the
    features are compared, not the labels). Groups come in the order of their
    first sample. See the module docstring for ``normalize`` and ``decimals``.
    """
    _check_options("find_duplicates", normalize, decimals)
    buckets: dict = {}
    for i, key in enumerate(sample_keys(data, normalize, decimals)):
        buckets.setdefault(key, []).append(i)
    return [np.array(members, dtype=np.int64) for members in buckets.values() if len(members) > 1]


def check_leakage(*splits, names=None, normalize=None, decimals=None, on_leak: str = "raise") -> dict:
    """Samples found in two splits: ``{(name_a, name_b): pairs}``, ``pairs[k] = (index in a, index in b)``.

    ``splits``: two or more arrays / datasets / (x, y) tuples, e.g. train,
    validation, test; ``names`` defaults to ``("train", "val", "test")``. Every
    pair of splits is compared; pairs with no shared sample are left out, so an
    empty dict means no leak. ``on_leak``: ``"raise"`` (ValueError naming the
    counts), ``"warn"`` (a warning, then the report) or ``"report"``.
    """
    if len(splits) < 2:
        raise ValueError(f"check_leakage: give at least two splits (train, val[, test]), got {len(splits)}")
    if on_leak not in ("raise", "warn", "report"):
        raise ValueError(f"check_leakage: on_leak must be 'raise', 'warn' or 'report', got {on_leak!r}")
    _check_options("check_leakage", normalize, decimals)
    if names is None:
        names = ("train", "val", "test")[: len(splits)] if len(splits) <= 3 else \
            tuple(f"split{i}" for i in range(len(splits)))
    if len(names) != len(splits):
        raise ValueError(f"check_leakage: {len(splits)} splits but {len(names)} names {tuple(names)}")
    features = [_features(s, "check_leakage") for s in splits]
    widths = {f.shape[1] for f in features}
    if len(widths) != 1:
        raise ValueError("check_leakage: the splits' samples differ in size: "
                         + ", ".join(f"{n} {f.shape}" for n, f in zip(names, features)))
    stats = None
    if normalize == "feature":                    # one scale for every split, or equal rows would differ
        everything = np.concatenate(features).astype(np.float64)
        stats = (everything.mean(axis=0), everything.std(axis=0))
    keys = [_keys(f, normalize, decimals, stats) for f in features]
    report = {}
    for a in range(len(splits)):
        first_index: dict = {}
        for i, key in enumerate(keys[a]):
            first_index.setdefault(key, []).append(i)
        for b in range(a + 1, len(splits)):
            pairs = [(i, j) for j, key in enumerate(keys[b]) for i in first_index.get(key, ())]
            if pairs:
                report[(names[a], names[b])] = np.array(sorted(pairs), dtype=np.int64)
    if report and on_leak != "report":
        message = "check_leakage: samples shared between splits: " + "; ".join(
            f"{a}/{b}: {len(p)} pairs ({len(np.unique(p[:, 1]))} {b} samples also in {a}, first at "
            f"{a}[{p[0, 0]}] = {b}[{p[0, 1]}])" for (a, b), p in report.items()) + \
            ". Deduplicate before splitting (find_duplicates), or split by group (GroupKFold)."
        if on_leak == "raise":
            raise ValueError(message)
        warnings.warn(message, stacklevel=2)
    return report
