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
    x_aug, y_aug = augment_dataset(x, y, RandomRotation(10), k=10, seed=0)   # offline: 10 versions each
    TimeWarp(sigma=0.2)(sequences);  WindowSlice(0.9)(sequences)              # (N, T, F)

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


class RandomRotation(Transform):
    """Rotate each image by an angle drawn from U(−degrees, degrees) about its centre, bilinearly.

    The textbook's "slightly rotated" images (chapter 4, §4.5.1): a few degrees.
    Output pixel p takes the input at R(−θ)(p − c) + c, c the centre
    ((H − 1)/2, (W − 1)/2), interpolated between the four pixels around it;
    places that fall outside the image get ``fill``. A positive angle turns
    the picture counter-clockwise as displayed (row 0 at the top), as
    ``scipy.ndimage.rotate(x, angle, order=1, reshape=False, mode="grid-constant")`` does. Acts on the
    last two axes; the output keeps the input's float dtype (integers → float32).
    """

    min_ndim = 3

    def __init__(self, degrees: float = 10.0, fill: float = 0.0, rng=None):
        super().__init__(rng)
        if not 0.0 <= degrees <= 180.0:
            raise ValueError(f"RandomRotation: degrees must be in [0, 180], got {degrees}")
        self.degrees, self.fill = float(degrees), fill

    def apply(self, x, rng):
        angles = rng.uniform(-self.degrees, self.degrees, size=len(x))
        return rotate(x, angles, self.fill)

    def __repr__(self) -> str:
        return f"RandomRotation(degrees={self.degrees}, fill={self.fill})"


def rotate(x: np.ndarray, angles, fill: float = 0.0) -> np.ndarray:
    """Images ``(N, ..., H, W)`` each rotated by its angle in degrees (bilinear, about the centre)."""
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
    n, (h, w) = len(x), x.shape[-2:]
    theta = np.deg2rad(np.broadcast_to(np.asarray(angles, dtype=np.float64), (n,)))[:, None, None]
    rows, cols = np.meshgrid(np.arange(h) - (h - 1) / 2, np.arange(w) - (w - 1) / 2, indexing="ij")
    # the source of each output pixel: the output position turned back by θ (rows grow downwards,
    # so a counter-clockwise turn on screen is clockwise in (row, column) coordinates)
    src_r = np.cos(theta) * rows + np.sin(theta) * cols + (h - 1) / 2
    src_c = -np.sin(theta) * rows + np.cos(theta) * cols + (w - 1) / 2
    r0, c0 = np.floor(src_r).astype(np.int64), np.floor(src_c).astype(np.int64)
    fr, fc = src_r - r0, src_c - c0
    flat = x.reshape(n, -1, h, w).astype(np.float64)
    out = np.zeros(flat.shape, dtype=np.float64)
    batch = np.arange(n)[:, None, None]
    for dr, dc, weight in ((0, 0, (1 - fr) * (1 - fc)), (0, 1, (1 - fr) * fc), (1, 0, fr * (1 - fc)),
                           (1, 1, fr * fc)):
        r, c = r0 + dr, c0 + dc
        inside = (r >= 0) & (r < h) & (c >= 0) & (c < w)
        values = flat[batch, :, np.clip(r, 0, h - 1), np.clip(c, 0, w - 1)]       # (N, H, W, C)
        values = np.where(inside[..., None], values, fill)
        out += np.moveaxis(values * weight[..., None], -1, 1)
    return out.reshape(x.shape).astype(dtype)


def warp_times(length: int, sigma: float, knots: int, rng: np.random.Generator) -> np.ndarray:
    """A random monotone time map τ: [0, T−1] → [0, T−1] with τ(0) = 0 and τ(T−1) = T−1.

    The speed of time is drawn at ``knots + 2`` evenly spaced points from
    N(1, σ²) (kept above 0.1), interpolated linearly between them, and summed:
    τ(t) is the time reached after t steps at those speeds, scaled to end at T − 1.
    """
    speeds = np.maximum(rng.normal(1.0, sigma, size=knots + 2), 0.1)
    speed = np.interp(np.arange(length - 1), np.linspace(0, length - 2, knots + 2), speeds)
    tau = np.concatenate([[0.0], np.cumsum(speed)])
    return tau * (length - 1) / tau[-1]


def _resample(x: np.ndarray, times: np.ndarray) -> np.ndarray:
    """x (T, F) read at fractional times (linear interpolation along the first axis)."""
    lower = np.clip(np.floor(times).astype(np.int64), 0, len(x) - 1)
    upper = np.minimum(lower + 1, len(x) - 1)
    frac = (times - lower)[:, None]
    return x[lower] * (1 - frac) + x[upper] * frac


class TimeWarp(Transform):
    """Stretch and squeeze time smoothly in each sequence ``(N, T, F)``: x'(t) = x(τ(t)), τ from :func:`warp_times`.

    The textbook's time warping for speech (chapter 4, §4.5.1, after Park et
    al.'s SpecAugment); this is the smooth random warp of Um et al. (2017):
    ``sigma`` is how much the speed of time varies, ``knots`` how often it
    changes. The first and last steps stay in place.
    """

    min_ndim = 3

    def __init__(self, sigma: float = 0.2, knots: int = 4, rng=None):
        super().__init__(rng)
        if sigma < 0 or knots < 0:
            raise ValueError(f"TimeWarp: sigma and knots must be >= 0, got {sigma} and {knots}")
        self.sigma, self.knots = float(sigma), int(knots)

    def apply(self, x, rng):
        if x.shape[1] < 2:
            return x.copy()
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
        out = np.empty(x.shape, dtype=dtype)
        for n in range(len(x)):
            times = warp_times(x.shape[1], self.sigma, self.knots, rng)
            out[n] = _resample(x[n].reshape(x.shape[1], -1), times).reshape(x.shape[1:])
        return out

    def __repr__(self) -> str:
        return f"TimeWarp(sigma={self.sigma}, knots={self.knots})"


class WindowSlice(Transform):
    """Cut a random window of ``fraction`` of each sequence ``(N, T, F)`` and stretch it back to T steps.

    Le Guennec, Malinowski and Tavenard (2016): a window of w = ⌈fraction·T⌉
    steps starting at s ~ U{0, …, T − w} is read at times s + t (w − 1)/(T − 1),
    t = 0 … T − 1 (linear interpolation), so every sample keeps its length.
    """

    min_ndim = 3

    def __init__(self, fraction: float = 0.9, rng=None):
        super().__init__(rng)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"WindowSlice: fraction must be in (0, 1], got {fraction}")
        self.fraction = float(fraction)

    def apply(self, x, rng):
        length = x.shape[1]
        window = max(1, int(np.ceil(self.fraction * length)))
        starts = rng.integers(0, length - window + 1, size=len(x))
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
        out = np.empty(x.shape, dtype=dtype)
        step = (window - 1) / (length - 1) if length > 1 else 0.0
        for n, start in enumerate(starts):
            out[n] = _resample(x[n].reshape(length, -1), start + np.arange(length) * step).reshape(x.shape[1:])
        return out

    def __repr__(self) -> str:
        return f"WindowSlice(fraction={self.fraction})"


def augment_dataset(x, y, transform, k: int, seed=None, keep_original: bool = True):
    """Offline augmentation: every sample k times, as the textbook's "augment each sample 10 times".

    Returns ``(x_aug, y_aug)`` with ``k · N`` samples: with ``keep_original``
    the originals and ``k − 1`` transformed copies of each, else ``k``
    transformed copies. Copy j of every sample follows copy j − 1 of all
    samples (the originals first). ``transform(x, rng)`` is any transform of
    this module; ``seed``: an int, a Generator, or None for minidl's generator.
    Unlike a loader's on-the-fly ``transform``, the set is fixed: every epoch
    sees the same k versions.
    """
    x, y = np.asarray(x), np.asarray(y)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"augment_dataset: k is how many versions of each sample, a positive integer; got {k!r}")
    if len(x) != len(y):
        raise ValueError(f"augment_dataset: x has {len(x)} samples but y has {len(y)}")
    rng = _as_generator(seed) if seed is not None else backend.rng("cpu")
    copies = [x] if keep_original else []
    while len(copies) < k:
        copies.append(np.asarray(transform(x, rng=rng)).astype(x.dtype, copy=False))
    return np.concatenate(copies), np.tile(y, k)
