"""Data augmentation on batches of NumPy arrays.

Every transform takes a batch whose first axis indexes samples and draws its
randomness per sample (one image flipped, its neighbour not). Images are
``(N, H, W)`` or ``(N, C, H, W)``; sequences and spectrograms are
``(N, T, F)`` (time, then frequency, as with ``batch_first=True``). For a
single sample pass ``x[None]``. Inputs are never modified; a new array is
returned.

Randomness: each transform takes ``rng`` -- an int seed, a
``numpy.random.Generator``, or ``None`` for minidl's global generator (set by
``minidl.manual_seed``). A generator given at call time, ``t(x, rng=g)``,
wins; ``DataLoader(..., transform=t)`` does this with a generator seeded by
(seed, epoch, batch), so augmentation is the same after a resume.

    augment = Compose([RandomCrop(padding=1), RandomHorizontalFlip(), GaussianNoise(0.05)], rng=0)
    xb = augment(xb)

Augment the training split only; validation and test data are left as they are.
"""
from __future__ import annotations

import numpy as np

from minidl import backend


def _as_generator(rng):
    if rng is None or isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng must be an int seed, a numpy.random.Generator or None, got {type(rng).__name__}")


class Transform:
    """Base class: subclasses implement ``apply(x, rng)`` on a batch."""

    min_ndim = 1  # the batch axis plus whatever the transform works on

    def __init__(self, rng=None):
        self.rng = _as_generator(rng)

    def __call__(self, x, rng=None):
        x = np.asarray(x)
        if x.ndim < self.min_ndim:
            raise ValueError(f"{type(self).__name__}: expected a batch with at least {self.min_ndim} "
                             f"dimensions (samples first), got shape {x.shape}; "
                             "for one sample pass x[None]")
        generator = _as_generator(rng) or self.rng or backend.rng("cpu")
        return self.apply(x, generator)

    def apply(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError


class Compose(Transform):
    """Apply transforms in order. A generator given to the call is passed to each."""

    def __init__(self, transforms, rng=None):
        super().__init__(rng)
        self.transforms = list(transforms)

    def __call__(self, x, rng=None):
        generator = _as_generator(rng) or self.rng
        for transform in self.transforms:
            x = transform(x, rng=generator)
        return x

    def __repr__(self) -> str:
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"


class RandomHorizontalFlip(Transform):
    """Mirror each image left-right (reverse the last axis) with probability ``p``."""

    min_ndim = 3

    def __init__(self, p: float = 0.5, rng=None):
        super().__init__(rng)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be a probability in [0, 1], got {p}")
        self.p = p

    def apply(self, x, rng):
        flip = rng.random(len(x)) < self.p
        out = x.copy()
        out[flip] = x[flip][..., ::-1]
        return out

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p})"


class RandomCrop(Transform):
    """Pad each image by ``padding`` pixels of ``fill`` on all sides, then crop ``size`` at a random place.

    ``size``: ``(h, w)`` or an int; default the original size, so with
    padding ``p`` the image is shifted by up to ``p`` pixels each way -- the
    usual CIFAR augmentation. Acts on the last two axes.
    """

    min_ndim = 3

    def __init__(self, size=None, padding: int = 0, fill: float = 0.0, rng=None):
        super().__init__(rng)
        if padding < 0:
            raise ValueError(f"RandomCrop: padding must be >= 0, got {padding}")
        self.size = (size, size) if isinstance(size, (int, np.integer)) else size
        self.padding = int(padding)
        self.fill = fill

    def apply(self, x, rng):
        p = self.padding
        pad = [(0, 0)] * (x.ndim - 2) + [(p, p), (p, p)]
        padded = np.pad(x, pad, constant_values=self.fill) if p else x
        height, width = padded.shape[-2:]
        h, w = self.size if self.size is not None else x.shape[-2:]
        if not (0 < h <= height and 0 < w <= width):
            raise ValueError(f"RandomCrop: crop size {(h, w)} does not fit images of shape "
                             f"{x.shape[-2:]} padded by {p} to {(height, width)}")
        tops = rng.integers(0, height - h + 1, size=len(x))
        lefts = rng.integers(0, width - w + 1, size=len(x))
        out = np.empty(x.shape[:-2] + (h, w), dtype=x.dtype)
        for n, (top, left) in enumerate(zip(tops, lefts)):
            out[n] = padded[n, ..., top:top + h, left:left + w]
        return out

    def __repr__(self) -> str:
        return f"RandomCrop(size={self.size}, padding={self.padding}, fill={self.fill})"


class GaussianNoise(Transform):
    """Add independent normal noise ``N(0, std^2)`` to every value. Integer input becomes float32."""

    def __init__(self, std: float = 0.1, rng=None):
        super().__init__(rng)
        if std < 0:
            raise ValueError(f"GaussianNoise: std must be >= 0, got {std}")
        self.std = std

    def apply(self, x, rng):
        out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
        noise_dtype = np.float64 if out_dtype == np.float64 else np.float32  # standard_normal's two dtypes
        noise = rng.standard_normal(x.shape, dtype=noise_dtype)
        return (x + self.std * noise).astype(out_dtype, copy=False)

    def __repr__(self) -> str:
        return f"GaussianNoise(std={self.std})"


class _BandMasking(Transform):
    """SpecAugment masking: ``num_masks`` bands of ``0..max_width`` consecutive steps along ``axis``
    set to ``value`` in each sample, at uniformly random places (Park et al., 2019)."""

    min_ndim = 2

    def __init__(self, max_width: int, num_masks: int = 1, value: float = 0.0, axis: int = -1, rng=None):
        super().__init__(rng)
        if max_width < 0 or num_masks < 0:
            raise ValueError(f"{type(self).__name__}: max_width and num_masks must be >= 0, "
                             f"got {max_width} and {num_masks}")
        self.max_width, self.num_masks, self.value, self.axis = int(max_width), int(num_masks), value, axis

    def apply(self, x, rng):
        axis = self.axis % x.ndim
        if axis == 0:
            raise ValueError(f"{type(self).__name__}: axis {self.axis} is the batch axis of shape {x.shape}")
        length = x.shape[axis]
        n = len(x)
        widths = rng.integers(0, min(self.max_width, length) + 1, size=(n, self.num_masks))
        starts = np.floor(rng.random((n, self.num_masks)) * (length - widths + 1)).astype(np.int64)
        position = np.arange(length)
        masked = ((position >= starts[..., None]) & (position < (starts + widths)[..., None])).any(axis=1)
        # masked: (N, length) -> broadcast against x with length on `axis`.
        shape = [1] * x.ndim
        shape[0], shape[axis] = n, length
        return np.where(masked.reshape(shape), np.asarray(self.value, dtype=x.dtype), x)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(max_width={self.max_width}, num_masks={self.num_masks}, "
                f"value={self.value})")


class TimeMasking(_BandMasking):
    """Mask ``num_masks`` runs of up to ``max_width`` time steps (axis -2 of ``(N, T, F)``) per sample."""

    def __init__(self, max_width: int, num_masks: int = 1, value: float = 0.0, axis: int = -2, rng=None):
        super().__init__(max_width, num_masks, value, axis, rng)


class FrequencyMasking(_BandMasking):
    """Mask ``num_masks`` bands of up to ``max_width`` frequency channels (the last axis) per sample."""

    def __init__(self, max_width: int, num_masks: int = 1, value: float = 0.0, axis: int = -1, rng=None):
        super().__init__(max_width, num_masks, value, axis, rng)
