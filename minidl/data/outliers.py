"""Per-sample statistics and the samples at their extremes: the outliers to look at first.

    stats = sample_statistics(x)                  # {"mean": (N,), "std": (N,), "min": ..., "max": ..., "norm": ...}
    scores = outlier_scores(x)                    # the largest robust z-score of each sample: mean, std, norm
    extremes(scores, k=8)                         # (indices of the k lowest, of the k highest)
    plot_extremes(x, scores, k=8, shape=(8, 8))   # the two rows of samples, titled with their scores

The guide's first step is to become one with the data: "write simple scripts
to search, filter, and sort your data to visualize distributions and identify
outliers, which often reveal bugs in preprocessing" (Training Deep Learning
Models, §3.1). Sorting by a per-sample statistic puts the corrupted, blank,
saturated or mis-scaled samples at the ends of the list.

The robust z-score of a value ``v`` of a statistic whose values over the data
set have median ``m`` and median absolute deviation ``MAD`` is
``z = (v − m) / (1.4826 · MAD)`` (1.4826·MAD estimates the standard deviation
of normal data, and neither the median nor the MAD is pulled by the outliers
themselves). When more than half the values are equal (the maximum pixel of
most digits is 1) the MAD is 0, and the mean absolute deviation from the
median takes its place: ``z = (v − m) / (1.2533 · MeanAD)`` (1.2533·MeanAD
estimates σ for normal data; Iglewicz & Hoaglin's modified z-score). A
sample's outlier score is its largest ``|z|`` over the statistics.
"""
from __future__ import annotations

import numpy as np

__all__ = ["STATISTICS", "extremes", "outlier_scores", "plot_extremes", "robust_z", "sample_statistics"]

STATISTICS = ("mean", "std", "min", "max", "norm")
MAD_TO_STD = 1.4826  # 1 / Φ⁻¹(3/4): the MAD of a normal distribution is 0.6745 σ
MEAN_AD_TO_STD = 1.2533  # √(π/2): the mean absolute deviation of a normal distribution is 0.7979 σ


def _flat(x, owner):
    x = np.asarray(x)
    if x.ndim < 2 or len(x) == 0:
        raise ValueError(f"{owner}: expected samples along the first axis, shape (N, ...) with N >= 1, "
                         f"got shape {x.shape}")
    return x.reshape(len(x), -1).astype(np.float64)


def sample_statistics(x) -> dict:
    """Each sample's mean, standard deviation, minimum, maximum and L2 norm over its features (arrays of N)."""
    flat = _flat(x, "sample_statistics")
    return {"mean": flat.mean(1), "std": flat.std(1), "min": flat.min(1), "max": flat.max(1),
            "norm": np.sqrt((flat ** 2).sum(1))}


def robust_z(values) -> np.ndarray:
    """``(v − median) / (1.4826 · MAD)``, or ``/ (1.2533 · MeanAD)`` when the MAD is 0; all zeros when every
    value is the same."""
    values = np.asarray(values, dtype=np.float64)
    median = np.median(values)
    deviation = np.abs(values - median)
    spread = MAD_TO_STD * np.median(deviation)
    if spread == 0:  # more than half the values are equal: the mean deviation still sees the others
        spread = MEAN_AD_TO_STD * deviation.mean()
    if spread == 0:
        return np.zeros_like(values)
    return (values - median) / spread


def outlier_scores(x, statistics=("mean", "std", "norm")) -> np.ndarray:
    """The largest ``|robust z|`` of each sample over ``statistics`` (names of :func:`sample_statistics`).

    The default leaves out the minimum and the maximum: on data clipped to a range (pixels in [0, 1])
    most samples share them, and the few that do not (a faint digit) would top the list.
    """
    unknown = [s for s in statistics if s not in STATISTICS]
    if unknown or not statistics:
        raise ValueError(f"outlier_scores: statistics must be some of {STATISTICS}, got {list(statistics)}")
    stats = sample_statistics(x)
    return np.max(np.abs(np.stack([robust_z(stats[s]) for s in statistics])), axis=0)


def extremes(scores, k: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the ``k`` lowest and the ``k`` highest scores (each ordered from the extreme inwards)."""
    scores = np.asarray(scores)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(scores):
        raise ValueError(f"extremes: k must be a whole number from 1 to the {len(scores)} samples, got {k!r}")
    order = np.argsort(scores, kind="stable")
    return order[:k], order[::-1][:k]


def plot_extremes(x, scores, k: int = 8, shape=None, labels=None, ax_title: str = "outlier score"):
    """Two rows of images: the ``k`` samples with the lowest and the highest ``scores``; returns the figure.

    ``shape`` reshapes a flat sample into an image (e.g. ``(8, 8)``); ``labels``, when given, go in the titles.
    """
    import matplotlib.pyplot as plt

    x = np.asarray(x)
    low, high = extremes(scores, k)
    fig, axes = plt.subplots(2, k, figsize=(1.3 * k, 3.2), squeeze=False)
    for row, (name, picked) in enumerate((("lowest", low), ("highest", high))):
        for ax, i in zip(axes[row], picked):
            image = x[i].reshape(shape) if shape is not None else x[i]
            ax.imshow(np.squeeze(image), cmap="gray")
            ax.set_xticks([]), ax.set_yticks([])
            ax.set_title(f"#{i}" + (f" ({labels[i]})" if labels is not None else "") + f"\n{scores[i]:.2g}",
                         fontsize=7)
        axes[row, 0].set_ylabel(name, fontsize=8)
    fig.suptitle(f"the {k} lowest and highest {ax_title}s", fontsize=9)
    fig.tight_layout()
    return fig
