"""Augmentation transforms: per-sample randomness, exact values, seeds, no mutation."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl
from minidl.data import Compose, FrequencyMasking, GaussianNoise, RandomCrop, RandomHorizontalFlip, TimeMasking


def images(n=32, c=None, h=5, w=6, seed=0):
    shape = (n, h, w) if c is None else (n, c, h, w)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def test_flip_probability_one_and_zero():
    x = images(c=2)
    np.testing.assert_array_equal(RandomHorizontalFlip(p=1.0, rng=0)(x), x[..., ::-1])
    np.testing.assert_array_equal(RandomHorizontalFlip(p=0.0, rng=0)(x), x)


def test_flip_decides_per_sample_and_leaves_the_input_alone():
    x = images(n=400)
    before = x.copy()
    out = RandomHorizontalFlip(p=0.5, rng=1)(x)
    np.testing.assert_array_equal(x, before)
    flipped = np.array([np.array_equal(o, s[:, ::-1]) for o, s in zip(out, x)])
    kept = np.array([np.array_equal(o, s) for o, s in zip(out, x)])
    assert np.all(flipped ^ kept)
    assert 150 < flipped.sum() < 250
    np.testing.assert_array_equal(out, RandomHorizontalFlip(p=0.5, rng=1)(x))  # seeded


@given(padding=st.integers(0, 3), channels=st.sampled_from([None, 1, 3]), seed=st.integers(0, 1000))
@settings(max_examples=30, deadline=None)
def test_crop_is_a_window_of_the_padded_image(padding, channels, seed):
    x = images(n=6, c=channels, seed=seed)
    out = RandomCrop(padding=padding, rng=seed)(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    padded = np.zeros(x.shape[:-2] + (x.shape[-2] + 2 * padding, x.shape[-1] + 2 * padding), np.float32)
    padded[..., padding:padding + x.shape[-2], padding:padding + x.shape[-1]] = x
    h, w = x.shape[-2:]
    for o, p in zip(out, padded):
        windows = [(i, j) for i in range(2 * padding + 1) for j in range(2 * padding + 1)
                   if np.array_equal(o, p[..., i:i + h, j:j + w])]
        assert windows, "the crop is not a window of the zero-padded image"


def test_crop_reaches_every_offset_and_can_change_size():
    x = np.arange(500 * 4 * 4, dtype=np.float32).reshape(500, 4, 4) + 1.0  # nonzero, all distinct
    out = RandomCrop(padding=1, rng=0)(x)
    # The top-left pixel tells the offset: padding (0) when shifted down/right, else a pixel of x.
    top_left = out[:, 0, 0]
    assert (top_left == 0).any() and (top_left == x[:, 0, 0]).any() and (top_left == x[:, 1, 1]).any()
    small = RandomCrop(size=2, rng=0)(x)
    assert small.shape == (500, 2, 2)
    with pytest.raises(ValueError, match="does not fit"):
        RandomCrop(size=(7, 7), padding=1)(x)


def test_gaussian_noise_statistics_and_dtype():
    x = np.full((200, 50, 50), 3.0, np.float32)
    out = GaussianNoise(std=0.5, rng=0)(x)
    assert out.dtype == np.float32
    noise = out.astype(np.float64) - 3.0
    assert abs(noise.mean()) < 0.005 and abs(noise.std() - 0.5) < 0.005
    assert GaussianNoise(0.1, rng=0)(np.zeros((2, 3), np.uint8)).dtype == np.float32
    assert GaussianNoise(0.1, rng=0)(np.zeros((2, 3), np.float64)).dtype == np.float64
    np.testing.assert_array_equal(GaussianNoise(0.0, rng=0)(x), x)
    np.testing.assert_array_equal(x, 3.0)


def runs(mask):
    """(start, length) of each run of True in a 1-D boolean array."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return list(zip(starts, ends - starts))


@pytest.mark.parametrize("cls, axis", [(TimeMasking, 1), (FrequencyMasking, 2)])
def test_spec_augment_masks_whole_bands_of_limited_width(cls, axis):
    x = np.random.default_rng(0).uniform(1.0, 2.0, size=(300, 20, 12)).astype(np.float32)  # (N, T, F)
    out = cls(max_width=4, num_masks=2, value=0.0, rng=3)(x)
    assert out.shape == x.shape and out.dtype == np.float32
    zero = out == 0.0
    np.testing.assert_array_equal(out[~zero], x[~zero])      # everything else untouched
    other = 2 if axis == 1 else 1
    band = zero.all(axis=other)                               # masked steps are masked entirely
    np.testing.assert_array_equal(zero.any(axis=other), band)
    widths = []
    for sample in band:
        found = runs(sample)
        assert len(found) <= 2                                # two masks, possibly overlapping
        assert sum(length for _, length in found) <= 8
        widths += [length for _, length in found]
    assert max(widths) >= 4 and band.any(axis=1).mean() > 0.5
    starts = [s for sample in band for s, _ in runs(sample)]
    assert min(starts) == 0 and max(s + n for sample in band for s, n in runs(sample)) == x.shape[axis]


def test_masking_value_and_no_masks():
    x = np.ones((4, 10, 6), np.float32)
    out = TimeMasking(max_width=10, value=-1.0, rng=0)(x)
    assert set(np.unique(out)) <= {-1.0, 1.0}
    np.testing.assert_array_equal(FrequencyMasking(max_width=3, num_masks=0, rng=0)(x), x)


def test_compose_applies_in_order_and_passes_the_generator():
    x = images(n=20, c=1)
    pipeline = Compose([RandomCrop(padding=1), RandomHorizontalFlip(), GaussianNoise(0.1)])
    a = pipeline(x, rng=np.random.default_rng(5))
    b = pipeline(x, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    g = np.random.default_rng(5)
    by_hand = GaussianNoise(0.1)(RandomHorizontalFlip()(RandomCrop(padding=1)(x, rng=g), rng=g), rng=g)
    np.testing.assert_array_equal(a, by_hand)
    minidl.manual_seed(1)
    c = pipeline(x)
    minidl.manual_seed(1)
    np.testing.assert_array_equal(c, pipeline(x))  # no rng anywhere: minidl's seeded generator


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"at least 3 dimensions.*x\[None\]"):
        RandomHorizontalFlip()(np.zeros((4, 4)))
    with pytest.raises(ValueError, match="probability"):
        RandomHorizontalFlip(p=1.5)
    with pytest.raises(TypeError, match="rng"):
        GaussianNoise(0.1, rng="seed")
    with pytest.raises(ValueError, match="batch axis"):
        TimeMasking(3)(np.zeros((4, 10)))
