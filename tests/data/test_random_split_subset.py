"""random_split and Subset as PyTorch's, and RandomSampler(replacement=True) drawing its epoch lazily."""
import tracemalloc
import warnings

import numpy as np
import pytest

import minidl as mdl
from minidl.data import DataLoader, RandomSampler, Subset, TensorDataset, random_split


@pytest.mark.parametrize("n,fractions", [
    (10, [0.7, 0.3]), (5, [0.5, 0.5]), (7, [1 / 3, 1 / 3, 1 / 3]), (101, [0.8, 0.1, 0.1]),
    (3, [0.25, 0.25, 0.25, 0.25]), (1000, [0.05, 0.95]), (9, [1.0]),
])
def test_fractions_round_as_pytorchs(torch, n, fractions):
    with warnings.catch_warnings(record=True) as their_warnings:
        warnings.simplefilter("always")
        theirs = [len(s) for s in torch.utils.data.random_split(range(n), fractions)]
    with warnings.catch_warnings(record=True) as our_warnings:
        warnings.simplefilter("always")
        ours = [len(s) for s in random_split(range(n), fractions, generator=np.random.default_rng(0))]
    assert ours == theirs and sum(ours) == n
    assert len(our_warnings) == len(their_warnings) == theirs.count(0)  # an empty split is warned about


def test_fraction_rounding_by_hand():
    # floor(5 * 0.5) = 2 each, one left over goes to the first split
    assert [len(s) for s in random_split(range(5), [0.5, 0.5])] == [3, 2]
    # floor(10 * 0.33) = 3 each, one left over: to the first
    assert [len(s) for s in random_split(range(10), [0.33, 0.33, 0.34])] == [4, 3, 3]


def test_the_splits_partition_the_dataset_and_the_generator_fixes_them():
    splits = random_split(range(50), [20, 25, 5], generator=np.random.default_rng(42))
    assert [len(s) for s in splits] == [20, 25, 5]
    assert sorted(i for s in splits for i in s.indices) == list(range(50))
    again = random_split(range(50), [20, 25, 5], generator=np.random.default_rng(42))
    assert [s.indices for s in again] == [s.indices for s in splits]
    other = random_split(range(50), [20, 25, 5], generator=np.random.default_rng(43))
    assert [s.indices for s in other] != [s.indices for s in splits]
    mdl.manual_seed(3)
    first = random_split(range(50), [25, 25])[0].indices
    mdl.manual_seed(3)
    assert random_split(range(50), [25, 25])[0].indices == first  # minidl's generator when none is given


def test_random_split_refuses_what_pytorch_refuses(torch):
    for lengths in ([3, 3], [0.5, 0.6], [1.2, -0.2]):
        with pytest.raises(ValueError):
            torch.utils.data.random_split(range(10), lengths)
        with pytest.raises(ValueError, match="random_split: "):
            random_split(range(10), lengths)
    with pytest.raises(TypeError, match="random_split: generator must be a numpy.random.Generator"):
        random_split(range(10), [5, 5], generator=42)


def test_subset_indexes_as_pytorchs(torch):
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    ours = Subset(TensorDataset(x, y), [4, 0, 2])
    theirs = torch.utils.data.Subset(torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y)), [4, 0, 2])
    assert len(ours) == len(theirs) == 3
    for i in range(3):
        np.testing.assert_array_equal(ours[i][0], theirs[i][0].numpy())
        assert int(ours[i][1]) == int(theirs[i][1])
    assert ours.dataset is not None and ours.indices == [4, 0, 2]


def test_a_loader_over_a_subset_gathers_the_same_batches_as_item_by_item():
    x = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    train, _ = random_split(TensorDataset(x, np.arange(40)), [30, 10], generator=np.random.default_rng(1))
    fast = [b for b in DataLoader(train, batch_size=8)]
    items = [b for b in DataLoader(train, batch_size=8, collate_fn=lambda items: mdl.data.default_collate(items))]
    assert len(fast) == len(items) == 4
    for (xf, yf), (xi, yi) in zip(fast, items):
        np.testing.assert_array_equal(xf.numpy(), xi.numpy())
        np.testing.assert_array_equal(yf.numpy(), yi.numpy())
    np.testing.assert_array_equal(np.concatenate([yb.numpy() for _, yb in fast]), train.indices)


def test_random_sampler_with_replacement_is_lazy():
    ds = TensorDataset(np.arange(100.0)[:, None], np.arange(100))
    sampler = RandomSampler(ds, replacement=True, num_samples=int(1e10), generator=np.random.default_rng(0))
    assert len(sampler) == int(1e10)  # makemore's sampler: PyTorch answers its length without drawing
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    assert len(loader) == int(1e10) // 32
    tracemalloc.start()
    try:
        batches = loader.__iter__()
        first = [next(batches) for _ in range(3)]
        draws = sampler.__iter__()
        alone = [next(draws) for _ in range(1000)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # a few chunks of 64 K indices, not 80 GB
    assert all(len(yb) == 32 and 0 <= int(yb.min().item()) and int(yb.max().item()) < 100 for _, yb in first)
    assert all(0 <= i < 100 for i in alone)


def test_a_lazy_epoch_is_the_same_order_however_it_is_read():
    ds = range(7)
    n = 3 * RandomSampler.CHUNK + 5
    sampler = RandomSampler(ds, replacement=True, num_samples=n, seed=4)
    order = sampler.epoch_order(0)
    assert order.shape == (n,) and order.dtype == np.int64
    assert list(sampler) == order.tolist()  # iterating epoch 0 draws the same indices
    loader = DataLoader(TensorDataset(np.arange(7)), batch_size=1000, sampler=sampler)
    loader.set_epoch(2)
    served = np.concatenate([b[0].numpy() for b in loader])
    np.testing.assert_array_equal(served, sampler.epoch_order(2))
    counts = np.bincount(order, minlength=7)  # uniform: each index about n / 7 times
    assert np.abs(counts / n - 1 / 7).max() < 0.01


def test_a_lazy_epoch_resumes_mid_epoch():
    ds = TensorDataset(np.arange(10))
    n = 2 * RandomSampler.CHUNK + 17  # the resumed batches start in the second chunk

    def make():
        return DataLoader(ds, batch_size=1000, sampler=RandomSampler(ds, replacement=True, num_samples=n, seed=1))
    loader = make()
    it = iter(loader)
    for _ in range(70):
        next(it)
    state = loader.state_dict()
    rest = [b[0].numpy() for b in it]
    resumed = make()
    resumed.load_state_dict(state)
    assert len(rest) == len(loader) - 70 and len(rest[-1]) == n % 1000
    for a, b in zip(rest, resumed):
        np.testing.assert_array_equal(a, b[0].numpy())
