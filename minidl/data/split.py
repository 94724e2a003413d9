"""Train/validation/test splits and oversampling of minority classes.

    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = train_val_test_split(
        x, y, ratios=(0.8, 0.1, 0.1), stratify=True, seed=0)
    x_tr, y_tr = oversample_minority(x_tr, y_tr, seed=0)   # training split only
    split_ratios(len(x))                                    # (0.8, 0.15, 0.05) up to 10,000 samples
    train, val = random_split(dataset, [0.9, 0.1], generator=np.random.default_rng(42))   # Subsets

Order matters: split first, then oversample (or augment, or fit a
Standardizer) on the training split alone. Oversampling before the split
copies the same minority samples into training *and* validation/test, so the
model is evaluated on samples it memorized and the reported score is too good.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np

from minidl import backend
from minidl.data.dataset import Subset


def as_generator(seed) -> np.random.Generator:
    """A generator from a seed, a Generator, or minidl's global one (seed=None)."""
    if seed is None:
        return backend.rng("cpu")
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def _split_sizes(n: int, ratios: np.ndarray) -> np.ndarray:
    """Integer sizes summing to ``n``, closest to ``n * ratios`` (largest remainder)."""
    exact = n * ratios
    sizes = np.floor(exact).astype(np.int64)
    leftover = n - int(sizes.sum())
    order = np.argsort(-(exact - sizes), kind="stable")
    sizes[order[:leftover]] += 1
    return sizes


def _stratified_counts(class_sizes: np.ndarray, split_sizes: np.ndarray, ratios: np.ndarray) -> np.ndarray:
    """counts[c, s]: samples of class c in split s.

    Row sums are the class sizes and column sums the split sizes (so the
    parts have exactly the sizes of an unstratified split); each count is its
    exact share ``class_size * ratio`` rounded down or up. Which cells round up
    is a bipartite matching between the classes' and the parts' missing units
    (augmenting paths), tried in order of largest remainder first.
    """
    exact = class_sizes[:, None] * ratios[None, :]
    counts = np.floor(exact).astype(np.int64)
    remainder = exact - counts
    can_round_up = remainder > 1e-9
    rounded_up = np.zeros_like(can_round_up)
    spare = split_sizes - counts.sum(axis=0)   # units each part still takes
    preference = np.argsort(-remainder, axis=1, kind="stable")

    def place(c, visited):
        """Round up one cell of class c, moving other classes' units along if needed."""
        for s in preference[c]:
            if not can_round_up[c, s] or rounded_up[c, s] or s in visited:
                continue
            visited.add(s)
            if spare[s] > 0:
                spare[s] -= 1
                rounded_up[c, s] = True
                return True
            for other in np.flatnonzero(rounded_up[:, s]):
                if place(other, visited):       # other class moves its unit out of part s
                    rounded_up[other, s] = False
                    rounded_up[c, s] = True
                    return True
        return False

    for c in np.argsort(-remainder.max(axis=1, initial=0.0), kind="stable"):
        for _ in range(int(class_sizes[c] - counts[c].sum())):
            if not place(c, set()):
                # No exact rounding with these part sizes: take the part with room
                # whose share is closest (keeps sizes exact; never seen in practice).
                s = int(np.argmax(np.where(spare > 0, remainder[c], -np.inf)))
                counts[c, s] += 1
                spare[s] -= 1
    return counts + rounded_up


# The textbook's three examples (chapter 4, "Training a Model", §4.5.1): the
# validation and test sets need a number of samples, not a fraction, so their
# share falls as the data set grows.
_CHAPTER_SPLITS = ((1e4, (0.80, 0.15, 0.05)), (1e6, (0.95, 0.04, 0.01)), (1e8, (0.990, 0.009, 0.001)))


def split_ratios(n: int) -> tuple:
    """(train, val, test) fractions for a data set of ``n`` samples, following the textbook.

    The chapter gives 80-15-5 for 10,000 samples, 95-4-1 for a million and
    99.0-0.9-0.1 for 100 million (chapter 4, "Training a Model", §4.5.1). Below
    10,000 the first holds, above 100 million the last; in between, the
    validation and test fractions follow a power law between the two nearest
    examples (a straight line on log-log axes), and training takes the rest.
    So the validation set keeps growing in samples (1,500 at 10⁴, 40,000 at
    10⁶, 900,000 at 10⁸) while its share shrinks.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"split_ratios: n is the number of samples, a positive integer; got {n!r}")
    sizes = np.array([s for s, _ in _CHAPTER_SPLITS])
    fractions = np.array([r for _, r in _CHAPTER_SPLITS])
    if n <= sizes[0]:
        return tuple(float(f) for f in fractions[0])
    if n >= sizes[-1]:
        return tuple(float(f) for f in fractions[-1])
    log_n = np.log10(n)
    val, test = (10 ** np.interp(log_n, np.log10(sizes), np.log10(fractions[:, i])) for i in (1, 2))
    return (float(1.0 - val - test), float(val), float(test))


def train_val_test_split(*arrays, ratios=(0.8, 0.1, 0.1), stratify=None, seed=None):
    """Split arrays of equal length into training, validation and test parts.

    Args:
        *arrays: arrays indexed by sample along axis 0 (e.g. ``x, y``).
        ratios: the fractions (train, validation, test); non-negative, summing to 1.
            A zero gives an empty part.
        stratify: ``None`` for a plain random split; ``True`` to keep the class
            proportions of the last array (the labels) in every part; or an
            array of labels to stratify by.
        seed: an int, a ``numpy.random.Generator``, or ``None`` for minidl's
            global generator (set by ``minidl.manual_seed``).

    Returns:
        ``(train, val, test)``, each a tuple with one array per input array.
        Part sizes are ``n * ratios`` rounded so they sum to ``n``; with
        stratification every class is split in the same ratios, rounded to
        whole samples (each class's count in a part is its exact share
        ``class_size * ratio`` rounded up or down).
    """
    if not arrays:
        raise ValueError("train_val_test_split: give at least one array, e.g. train_val_test_split(x, y)")
    arrays = tuple(np.asarray(a) for a in arrays)
    n = len(arrays[0])
    if any(a.ndim == 0 or len(a) != n for a in arrays):
        raise ValueError("train_val_test_split: arrays must have the same length along axis 0, got shapes "
                         + ", ".join(str(a.shape) for a in arrays))
    ratios = np.asarray(ratios, dtype=np.float64)
    if ratios.shape != (3,) or np.any(ratios < 0) or not np.isclose(ratios.sum(), 1.0, atol=1e-6):
        raise ValueError(f"train_val_test_split: ratios must be three non-negative fractions "
                         f"(train, val, test) summing to 1, got {tuple(ratios.tolist())}")
    ratios = ratios / ratios.sum()
    rng = as_generator(seed)
    sizes = _split_sizes(n, ratios)

    if stratify is None or stratify is False:
        order = rng.permutation(n)
        bounds = np.cumsum(sizes)[:-1]
        parts = np.split(order, bounds)
    else:
        labels = arrays[-1] if stratify is True else np.asarray(stratify)
        if labels.shape[:1] != (n,) or labels.ndim != 1:
            raise ValueError(f"train_val_test_split: stratify needs one label per sample, a 1-D array of "
                             f"length {n}; got shape {labels.shape}")
        classes, class_of = np.unique(labels, return_inverse=True)
        members = [rng.permutation(np.flatnonzero(class_of == c)) for c in range(len(classes))]
        counts = _stratified_counts(np.array([len(m) for m in members]), sizes, ratios)
        parts = [[], [], []]
        for c, idx in enumerate(members):
            for s, chunk in enumerate(np.split(idx, np.cumsum(counts[c])[:-1])):
                parts[s].append(chunk)
        # Shuffle inside each part so the classes are interleaved, not in blocks.
        parts = [rng.permutation(np.concatenate(p)) for p in parts]
    return tuple(tuple(a[idx] for a in arrays) for idx in parts)


def oversample_minority(x, y, seed=None, ratio: float = 1.0):
    """Repeat samples of the smaller classes until each has ``ratio`` x the largest class's count.

    Apply it AFTER splitting, to the training split only. Oversampling before
    the split puts copies of the same minority samples in training and in
    validation/test, so evaluation measures memorization and looks better than
    the model is. Validation and test keep the real class distribution.

    Extra samples are drawn with replacement from each class (originals are
    all kept). Returns ``(x, y)`` new arrays, shuffled, with the dtypes of the
    inputs. ``seed``: an int, a Generator, or ``None`` for minidl's generator.
    """
    x = np.asarray(x)
    y = np.asarray(y)
    if y.ndim != 1 or x.ndim == 0 or len(x) != len(y):
        raise ValueError(f"oversample_minority: x must have one row per label in the 1-D y; "
                         f"got x {x.shape}, y {y.shape}")
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"oversample_minority: ratio must be in (0, 1], got {ratio}")
    if len(y) == 0:
        return x.copy(), y.copy()
    rng = as_generator(seed)
    classes, class_of, class_sizes = np.unique(y, return_inverse=True, return_counts=True)
    target = int(np.ceil(ratio * class_sizes.max()))
    extra = []
    for c, size in enumerate(class_sizes):
        if size < target:
            extra.append(rng.choice(np.flatnonzero(class_of == c), size=target - size, replace=True))
    index = np.concatenate([np.arange(len(y))] + extra)
    index = rng.permutation(index)
    return x[index], y[index]


def random_split(dataset, lengths, generator=None) -> list:
    """``dataset`` cut at random into :class:`Subset` s of the given ``lengths`` (``torch.utils.data.random_split``).

    ``lengths`` are counts summing to ``len(dataset)``, or fractions summing to 1. Fractions are
    rounded as PyTorch rounds them: each split gets ``floor(len(dataset) * fraction)`` items,
    and the items left over go one each to the splits in order, from the first (so
    ``[0.5, 0.5]`` of 5 items gives ``[3, 2]``). The indices are one random permutation of
    ``0..N-1`` cut in order; ``generator`` is a ``numpy.random.Generator``
    (``np.random.default_rng(42)``), or None for minidl's generator (``minidl.manual_seed``).
    The same generator gives the same split; the permutation differs from PyTorch's, whose
    random numbers are its own.
    """
    lengths = list(lengths)
    n = len(dataset)
    if not lengths:
        raise ValueError("random_split: lengths is empty; give counts (e.g. [80, 20]) or fractions ([0.8, 0.2])")
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        for i, fraction in enumerate(lengths):
            if not 0 <= fraction <= 1:
                raise ValueError(f"random_split: the fraction at index {i} is {fraction}, not between 0 and 1")
        counts = [int(math.floor(n * fraction)) for fraction in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"random_split: the split at index {i} has length 0 ({lengths[i]} of {n} items)",
                              stacklevel=2)
        lengths = counts
    if any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0 for k in lengths):
        raise ValueError(f"random_split: lengths must be non-negative counts or fractions summing to 1, got {lengths}")
    if sum(lengths) != n:
        raise ValueError(f"random_split: the lengths sum to {sum(lengths)}, but the dataset has {n} items; "
                         "give counts that sum to len(dataset), or fractions that sum to 1")
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"random_split: generator must be a numpy.random.Generator, e.g. np.random.default_rng(42), "
                        f"or None (minidl's generator); got {type(generator).__name__}")
    order = as_generator(generator).permutation(n).tolist()
    ends = list(itertools.accumulate(lengths))
    return [Subset(dataset, order[end - length:end]) for end, length in zip(ends, lengths)]
