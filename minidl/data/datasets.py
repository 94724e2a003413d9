"""Datasets that need no download: the bundled UCI digits and synthetic teaching sets.

All return ``(x, y)`` NumPy arrays: float32 features and int64 class labels
(float32 targets for regression). Synthetic sets are seeded; their shape (the
spiral arms, the blob centers, the true polynomial) does not depend on the
seed, so a training set and a test set drawn with two seeds come from the same
distribution.
"""
from __future__ import annotations

import math
import os

import numpy as np

from minidl.data.split import as_generator

DIGITS_PATH = os.path.join(os.path.dirname(__file__), "digits.npz")


def digits(flatten: bool = False):
    """The UCI optical-recognition handwritten digits: 1,797 images of 8x8 pixels, 10 classes.

    Returns ``(images, labels)``: float32 ``(1797, 8, 8)`` (or ``(1797, 64)``
    with ``flatten=True``) with integer values 0..16 -- each pixel counts the
    "on" pixels of a 4x4 block of a 32x32 bitmap -- and int64 labels 0..9.

    Source and license: "Optical Recognition of Handwritten Digits", E. Alpaydin
    and C. Kaynak (1998), UCI Machine Learning Repository,
    https://doi.org/10.24432/C50P49, licensed under CC BY 4.0
    (https://creativecommons.org/licenses/by/4.0/). These 1,797 samples are the
    repository's test set (optdigits.tes), written by 13 people. The file
    shipped with minidl (minidl/data/digits.npz) stores the same values,
    reformatted; see minidl/data/DIGITS_LICENSE.txt.
    """
    with np.load(DIGITS_PATH, allow_pickle=False) as archive:
        images = archive["images"].astype(np.float32)
        labels = archive["labels"].astype(np.int64)
    if flatten:
        images = images.reshape(len(images), -1)
    return images, labels


def imbalanced_digits(imbalance: float = 10.0, flatten: bool = False, seed=0):
    """The digits with a long tail: class c keeps a share imbalance^(−c/9) of its images.

    Digit 0 keeps all its images, digit 9 a fraction 1/``imbalance`` of them,
    the others a geometric progression in between (the long-tailed variants of
    CIFAR and ImageNet are built the same way). The images kept are drawn at
    random (``seed``: an int, a Generator, or None for minidl's generator).
    ``imbalance=10``: 178 zeros down to 18 nines, 735 images in all.
    """
    if isinstance(imbalance, bool) or not isinstance(imbalance, (int, float)) or imbalance < 1:
        raise ValueError(f"imbalanced_digits: imbalance is the largest class over the smallest, a number >= 1; "
                         f"got {imbalance!r}")
    images, labels = digits(flatten)
    rng = as_generator(seed)
    kept = []
    for c in range(10):
        members = np.flatnonzero(labels == c)
        count = max(1, int(round(len(members) * imbalance ** (-c / 9))))
        kept.append(np.sort(rng.choice(members, size=count, replace=False)))
    index = np.concatenate(kept)
    return images[index], labels[index]


def two_spirals(n: int = 400, noise: float = 0.0, seed=None, turns: float = 1.5):
    """Two interleaved spirals in the plane, one per class: a set no linear model can separate.

    ``n`` points in all (class 0 gets ``n - n // 2``, class 1 ``n // 2``).
    Class 0 lies on ``r = t, angle = 2*pi*turns*t`` for ``t`` in (0, 1]
    (sampled so points are spread evenly along the arm); class 1 is the same
    arm rotated by 180 degrees. ``noise`` is the standard deviation of
    Gaussian noise added to each coordinate. Returns x float32 ``(n, 2)``,
    y int64 ``(n,)``, shuffled.
    """
    if n < 2:
        raise ValueError(f"two_spirals: n must be at least 2 (one point per class), got {n}")
    if noise < 0:
        raise ValueError(f"two_spirals: noise must be >= 0, got {noise}")
    rng = as_generator(seed)
    y = np.repeat(np.array([0, 1], dtype=np.int64), [n - n // 2, n // 2])
    # t = sqrt(u): the arm's length grows like t^2, so this spreads points evenly along it.
    t = np.sqrt(rng.uniform(0.0, 1.0, size=n)) * 0.95 + 0.05
    angle = 2.0 * math.pi * turns * t + math.pi * y
    x = np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1)
    x = x + noise * rng.standard_normal(x.shape)
    order = rng.permutation(n)
    return x[order].astype(np.float32), y[order]


# A cubic in the scaled basis x^k / k! (the polynomial example of Dive into Deep
# Learning); higher degrees continue with alternating coefficients of size 2.
_POLY_COEFFICIENTS = (5.0, 1.2, -3.4, 5.6)


def polynomial_coefficients(degree: int = 3) -> np.ndarray:
    """The coefficients ``c_0..c_degree`` of the true function of ``polynomial_regression``."""
    if degree < 0:
        raise ValueError(f"polynomial_coefficients: degree must be >= 0, got {degree}")
    extra = [2.0 * (-1) ** k for k in range(4, degree + 1)]
    return np.array((_POLY_COEFFICIENTS + tuple(extra))[:degree + 1], dtype=np.float64)


def polynomial_features(x, degree: int) -> np.ndarray:
    """Columns ``x^k / k!`` for ``k = 0..degree`` (float32): the design matrix of a polynomial fit.

    Dividing by ``k!`` keeps high powers from dwarfing low ones, so a
    degree-9 fit stays well conditioned enough for a least-squares solve.
    """
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    powers = np.stack([x ** k / math.factorial(k) for k in range(degree + 1)], axis=1)
    return powers.astype(np.float32)


def polynomial_target(x, degree: int = 3) -> np.ndarray:
    """The noise-free true function ``f(x) = sum_k c_k x^k / k!`` (float32, same shape as x)."""
    x = np.asarray(x, dtype=np.float64)
    c = polynomial_coefficients(degree)
    y = sum(c[k] * x ** k / math.factorial(k) for k in range(degree + 1))
    return np.asarray(y, dtype=np.float32)


def polynomial_regression(n: int = 10, degree: int = 3, noise: float = 0.1, seed=None,
                          x_range=(-1.0, 1.0)):
    """Few noisy samples of a polynomial: the classic demonstration of overfitting.

    ``y = f(x) + eps`` with ``f(x) = 5 + 1.2 x - 3.4 x^2/2! + 5.6 x^3/3!`` (for
    the default ``degree=3``), ``eps ~ N(0, noise^2)`` and ``x`` uniform on
    ``x_range``. Fit it with ``polynomial_features(x, d)`` for d = 1, 3, 9: with
    ``n = 10`` samples the degree-9 fit passes through every training point
    and misses the true curve in between (high variance), degree 1 misses both
    (high bias). Draw the test set with another seed; ``polynomial_target``
    gives the true curve for plots.

    Returns x float32 ``(n, 1)`` and y float32 ``(n, 1)``.
    """
    if n < 1:
        raise ValueError(f"polynomial_regression: n must be at least 1, got {n}")
    if noise < 0:
        raise ValueError(f"polynomial_regression: noise must be >= 0, got {noise}")
    low, high = x_range
    if not low < high:
        raise ValueError(f"polynomial_regression: x_range must be (low, high) with low < high, got {x_range}")
    rng = as_generator(seed)
    x = rng.uniform(low, high, size=(n, 1))
    y = polynomial_target(x, degree).astype(np.float64) + noise * rng.standard_normal((n, 1))
    return x.astype(np.float32), y.astype(np.float32)


def _class_sizes(n: int, weights: np.ndarray) -> np.ndarray:
    """Integer class sizes summing to n, proportional to weights (largest remainder), each >= 1."""
    k = len(weights)
    if n < k:
        raise ValueError(f"gaussian_blobs: n={n} is smaller than the number of classes {k}")
    exact = n * weights / weights.sum()
    sizes = np.floor(exact).astype(np.int64)
    sizes[np.argsort(-(exact - sizes), kind="stable")[:n - int(sizes.sum())]] += 1
    for c in np.flatnonzero(sizes == 0):  # a tiny share still gets one sample, from the largest class
        sizes[np.argmax(sizes)] -= 1
        sizes[c] = 1
    return sizes


def gaussian_blobs(n: int = 600, centers=3, imbalance=None, std: float = 1.0, seed=None, radius: float = 4.0):
    """Isotropic Gaussian clusters, one per class, with a chosen class imbalance.

    Args:
        n: number of samples in all.
        centers: the number of classes (their centers then sit evenly on a
            circle of ``radius`` in the plane), or an array ``(classes, dim)`` of centers.
        imbalance: ``None`` for balanced classes; a number ``r >= 1`` for a
            geometric imbalance where class 0 has ``r`` times as many samples as the
            last class (class k's share is proportional to ``r ** (-k / (classes - 1))``);
            or a sequence of class proportions, e.g. ``(0.9, 0.1)``.
        std: standard deviation of each cluster.
        seed: an int, a Generator, or None (minidl's global generator).

    Returns x float32 ``(n, dim)`` and y int64 ``(n,)``, shuffled. Every class
    has at least one sample; sizes sum to exactly ``n``.
    """
    if isinstance(centers, (int, np.integer)):
        if centers < 1:
            raise ValueError(f"gaussian_blobs: centers must be >= 1, got {centers}")
        angles = 2.0 * math.pi * np.arange(centers) / centers
        centers = radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    centers = np.asarray(centers, dtype=np.float64)
    if centers.ndim != 2 or len(centers) == 0:
        raise ValueError(f"gaussian_blobs: centers must be an int or an array (classes, dim), "
                         f"got shape {centers.shape}")
    k = len(centers)
    if imbalance is None:
        weights = np.ones(k)
    elif np.isscalar(imbalance):
        if imbalance < 1:
            raise ValueError(f"gaussian_blobs: imbalance ratio must be >= 1 (majority : minority), "
                             f"got {imbalance}")
        weights = float(imbalance) ** (-np.arange(k) / max(k - 1, 1))
    else:
        weights = np.asarray(imbalance, dtype=np.float64)
        if weights.shape != (k,) or np.any(weights < 0) or weights.sum() <= 0:
            raise ValueError(f"gaussian_blobs: imbalance as proportions needs {k} non-negative values "
                             f"(one per class), got {imbalance!r}")
    if std < 0:
        raise ValueError(f"gaussian_blobs: std must be >= 0, got {std}")
    rng = as_generator(seed)
    sizes = _class_sizes(int(n), weights)
    y = np.repeat(np.arange(k, dtype=np.int64), sizes)
    x = centers[y] + std * rng.standard_normal((int(n), centers.shape[1]))
    order = rng.permutation(int(n))
    return x[order].astype(np.float32), y[order]
