"""Rotation, time warping, window slicing, offline augmentation and the loader's fixed order."""
import numpy as np
import pytest

from minidl.data import DataLoader, TensorDataset
from minidl.data.transforms import (
    RandomRotation,
    TimeWarp,
    WindowSlice,
    augment_dataset,
    rotate,
    warp_times,
)


def test_rotation_by_hand():
    x = np.random.default_rng(0).random((2, 3, 5, 5))
    np.testing.assert_allclose(rotate(x, [0.0, 0.0]), x, atol=1e-12)
    np.testing.assert_allclose(rotate(x, 90.0), np.rot90(x, axes=(-2, -1)), atol=1e-12)   # counter-clockwise
    # a point at the centre, turned 30°: output (0, 1) reads the input at (1 − cos 30°, 1 + sin 30°),
    # 1 − cos 30° of the way down to row 1 and halfway between columns 1 and 2: (1 − cos 30°)/2 of the point
    one = np.zeros((1, 3, 3))
    one[0, 1, 1] = 1.0
    edge = (1 - np.cos(np.pi / 6)) / 2
    np.testing.assert_allclose(rotate(one, 30.0)[0], [[0, edge, 0], [edge, 1, edge], [0, edge, 0]], atol=1e-12)


def test_rotation_matches_scipy():
    ndimage = pytest.importorskip("scipy.ndimage")
    x = np.random.default_rng(1).random((3, 9, 7)).astype(np.float32)
    angles = [7.0, -12.5, 3.0]
    ours = rotate(x, angles)
    for image, angle, out in zip(x, angles, ours):
        ref = ndimage.rotate(image.astype(np.float64), angle, reshape=False, order=1, mode="grid-constant")
        np.testing.assert_allclose(out, ref, atol=1e-6)
    assert ours.dtype == np.float32
    small = RandomRotation(5, rng=0)(x)
    assert small.shape == x.shape and 0 < np.abs(small - x).mean() < np.abs(rotate(x, 45.0) - x).mean()


def test_time_warp_keeps_the_ends_and_reads_the_sequence_at_warped_times():
    times = warp_times(50, 0.3, 4, np.random.default_rng(0))
    assert times[0] == 0 and times[-1] == pytest.approx(49) and np.all(np.diff(times) > 0)
    x = np.random.default_rng(1).standard_normal((2, 50, 3))
    warped = TimeWarp(0.3, 4)(x, rng=np.random.default_rng(0))
    expected = np.stack([np.interp(times, np.arange(50), x[0, :, f]) for f in range(3)], axis=1)
    np.testing.assert_allclose(warped[0], expected, atol=1e-12)
    np.testing.assert_allclose(TimeWarp(0.0)(x, rng=0), x, atol=1e-12)       # no variation: no warp
    assert not np.allclose(warped[1], x[1])


def test_window_slice_stretches_a_window_back_to_full_length():
    ramp = np.arange(20, dtype=np.float64)[None, :, None].repeat(3, axis=0)
    out = WindowSlice(0.5)(ramp, rng=0)
    for row in out[:, :, 0]:                                  # a ramp stays a ramp: start + t·9/19
        start = row[0]
        assert 0 <= start <= 10 and start == int(start)
        np.testing.assert_allclose(row, start + np.arange(20) * 9 / 19, atol=1e-12)
    np.testing.assert_allclose(WindowSlice(1.0)(ramp, rng=0), ramp)


def test_augment_dataset_makes_k_versions():
    x = np.random.default_rng(2).random((4, 6, 6)).astype(np.float32)
    y = np.arange(4)
    x_aug, y_aug = augment_dataset(x, y, RandomRotation(10), k=3, seed=0)
    assert x_aug.shape == (12, 6, 6) and y_aug.tolist() == [0, 1, 2, 3] * 3
    np.testing.assert_array_equal(x_aug[:4], x)
    assert not np.allclose(x_aug[4:8], x) and not np.allclose(x_aug[4:8], x_aug[8:])
    x2, _ = augment_dataset(x, y, RandomRotation(10), k=3, seed=0)
    np.testing.assert_array_equal(x_aug, x2)
    assert len(augment_dataset(x, y, RandomRotation(10), k=2, keep_original=False, seed=0)[0]) == 8
    with pytest.raises(ValueError, match="k is how many versions of each sample, a positive integer; got 0"):
        augment_dataset(x, y, RandomRotation(10), k=0)


def test_loader_can_keep_one_order_for_every_epoch():
    ds = TensorDataset(np.arange(10), np.arange(10))
    once = DataLoader(ds, batch_size=10, shuffle="once", seed=3)
    every = DataLoader(ds, batch_size=10, shuffle=True, seed=3)
    first, second = (next(iter(once))[0].tolist() for _ in range(2))
    assert first == second and sorted(first) == list(range(10)) and first != list(range(10))
    assert first == every.epoch_order(0).tolist() and every.epoch_order(1).tolist() != first
    with pytest.raises(ValueError, match="shuffle must be True, False or 'once', got 'twice'"):
        DataLoader(ds, shuffle="twice")
