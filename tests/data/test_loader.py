"""DataLoader: batching, seeded shuffling, resume from state_dict, errors."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl
from minidl.data import DataLoader, Dataset, GaussianNoise, TensorDataset


def make_data(n=23):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = np.arange(n, dtype=np.int64)
    return x, y


def collect(loader, epochs):
    return [[tuple(a.numpy().copy() for a in batch) for batch in loader] for _ in range(epochs)]


@given(n=st.integers(0, 40), batch_size=st.integers(1, 12), drop_last=st.booleans(), shuffle=st.booleans())
@settings(max_examples=40, deadline=None)
def test_batches_cover_the_epoch(n, batch_size, drop_last, shuffle):
    x, y = make_data(n)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=3)
    tensors = list(loader)
    assert all(isinstance(field, minidl.Tensor) for batch in tensors for field in batch)
    batches = [tuple(field.numpy() for field in batch) for batch in tensors]
    expected_batches = n // batch_size if drop_last else -(-n // batch_size)
    assert len(loader) == expected_batches == len(batches)
    seen = np.concatenate([yb for _, yb in batches]) if batches else np.zeros(0, np.int64)
    assert len(seen) == (expected_batches * batch_size if drop_last else n)
    assert len(np.unique(seen)) == len(seen)  # no sample twice in one epoch
    for xb, yb in batches:
        assert xb.dtype == np.float32 and yb.dtype == np.int64
        np.testing.assert_array_equal(xb, x[yb])  # the fields stay aligned
        assert len(xb) == batch_size or (not drop_last and xb is batches[-1][0])
    if not shuffle:
        np.testing.assert_array_equal(seen, np.arange(len(seen)))


def test_last_batch_is_smaller_unless_dropped():
    x, y = make_data(10)
    sizes = [len(b[1]) for b in DataLoader((x, y), batch_size=4)]
    assert sizes == [4, 4, 2]
    sizes = [len(b[1]) for b in DataLoader((x, y), batch_size=4, drop_last=True)]
    assert sizes == [4, 4]


def test_seeded_shuffle_is_reproducible_and_changes_every_epoch():
    x, y = make_data(50)
    a = collect(DataLoader((x, y), batch_size=8, shuffle=True, seed=7), epochs=3)
    b = collect(DataLoader((x, y), batch_size=8, shuffle=True, seed=7), epochs=3)
    c = collect(DataLoader((x, y), batch_size=8, shuffle=True, seed=8), epochs=1)
    order = [np.concatenate([yb for _, yb in epoch]) for epoch in a]
    for ea, eb in zip(a, b):
        for (xa, ya), (xb, yb) in zip(ea, eb):
            np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(order[0], order[1]) and not np.array_equal(order[1], order[2])
    assert not np.array_equal(order[0], np.concatenate([yb for _, yb in c[0]]))
    for o in order:
        np.testing.assert_array_equal(np.sort(o), np.arange(50))


def test_seed_none_follows_manual_seed():
    x, y = make_data(30)
    minidl.manual_seed(11)
    first = [yb.numpy() for _, yb in DataLoader((x, y), batch_size=30, shuffle=True)][0]
    minidl.manual_seed(11)
    again = [yb.numpy() for _, yb in DataLoader((x, y), batch_size=30, shuffle=True)][0]
    np.testing.assert_array_equal(first, again)


def test_unshuffled_loader_does_not_consume_the_global_generator():
    minidl.manual_seed(5)
    expected = minidl.backend.rng("cpu").random()
    minidl.manual_seed(5)
    DataLoader(make_data(), batch_size=4)
    assert minidl.backend.rng("cpu").random() == expected


@pytest.mark.parametrize("stop_epoch, stop_batch", [(0, 1), (1, 0), (1, 2), (1, 5), (2, 4)])
def test_resume_from_state_dict_sees_the_same_batches(stop_epoch, stop_batch):
    """A run stopped after any batch and resumed from state_dict (through JSON, as in a
    checkpoint) continues exactly like the uninterrupted run."""
    x, y = make_data(37)
    make = lambda seed: DataLoader((x, y), batch_size=6, shuffle=True, seed=seed,  # noqa: E731
                                   transform=GaussianNoise(0.5))
    reference = [b for epoch in collect(make(123), epochs=4) for b in epoch]  # 7 batches per epoch

    served, state = [], None
    loader = make(123)
    for epoch in range(4):
        for b, batch in enumerate(loader):
            served.append(tuple(a.numpy().copy() for a in batch))
            if (epoch, b) == (stop_epoch, stop_batch):
                state = json.loads(json.dumps(loader.state_dict()))
                break
        if state is not None:
            break
    resumed = make(999)  # another seed: the state must bring back the original one
    resumed.load_state_dict(state)
    while len(served) < len(reference):
        served.extend(tuple(a.numpy().copy() for a in batch) for batch in resumed)
    assert len(served) == len(reference)
    for (xs, ys), (xr, yr) in zip(served, reference):
        np.testing.assert_array_equal(ys, yr)
        np.testing.assert_array_equal(xs, xr)  # augmentation reproduced too


def test_resume_after_a_complete_epoch_starts_the_next_one():
    x, y = make_data(12)
    loader = DataLoader((x, y), batch_size=5, shuffle=True, seed=1)
    list(loader)
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batch"] == 3
    second = [yb.numpy() for _, yb in loader]
    other = DataLoader((x, y), batch_size=5, shuffle=True, seed=4)
    other.load_state_dict(state)
    assert [yb.tolist() for _, yb in other] == [yb.tolist() for yb in second]
    assert other.epoch == 1


def test_abandoned_epoch_is_not_continued_without_load():
    x, y = make_data(20)
    loader = DataLoader((x, y), batch_size=5, shuffle=True, seed=2)
    next(iter(loader))
    epoch1 = np.concatenate([yb.numpy() for _, yb in loader])
    assert loader.epoch == 1 and len(epoch1) == 20
    np.testing.assert_array_equal(epoch1, loader.epoch_order(1))


def test_state_dict_roundtrip_through_minidl_save(tmp_path):
    serialization = pytest.importorskip("minidl.serialization")
    loader = DataLoader(make_data(), batch_size=4, shuffle=True, seed=2**62 + 5)
    it = iter(loader)
    next(it)
    serialization.save({"loader": loader.state_dict()}, tmp_path / "ckpt.safetensors")
    state = serialization.load(tmp_path / "ckpt.safetensors")["loader"]
    assert state == loader.state_dict()


@pytest.mark.parametrize("bad", [0, -1, -64])
def test_nonpositive_batch_size_names_the_value(bad):
    with pytest.raises(ValueError, match=f"batch_size.*{bad}"):
        DataLoader(make_data(), batch_size=bad)


@pytest.mark.parametrize("bad", [2.5, "8", True])
def test_non_integer_batch_size_is_a_type_error(bad):
    with pytest.raises(TypeError, match="batch_size"):
        DataLoader(make_data(), batch_size=bad)


def test_load_state_dict_rejects_another_dataset_or_batch_size():
    loader = DataLoader(make_data(23), batch_size=4, shuffle=True, seed=0)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="23 samples in batches of 4"):
        DataLoader(make_data(24), batch_size=4, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(make_data(23), batch_size=5, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="missing keys"):
        loader.load_state_dict({"epoch": 0})


def test_generic_dataset_items_are_stacked():
    class Squares(Dataset):
        def __len__(self):
            return 7

        def __getitem__(self, i):
            return np.full((2, 2), i, dtype=np.float32), i * i

    batches = list(DataLoader(Squares(), batch_size=3))
    assert [b[0].shape for b in batches] == [(3, 2, 2), (3, 2, 2), (1, 2, 2)]
    np.testing.assert_array_equal(batches[1][1], [9, 16, 25])
    np.testing.assert_array_equal(batches[1][0][:, 0, 0], [3, 4, 5])


def test_tensor_dataset_checks_lengths_and_converts_tensors():
    with pytest.raises(ValueError, match=r"\(3, 2\), \(4,\)"):
        TensorDataset(np.zeros((3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="at least one array"):
        TensorDataset()
    ds = TensorDataset(minidl.tensor(np.ones((4, 2), np.float32)), np.arange(4))
    assert isinstance(ds.arrays[0], np.ndarray) and len(ds) == 4
    x, y = ds[2]
    np.testing.assert_array_equal(x, [1, 1])
    assert y == 2
