"""The DataLoader as PyTorch's: collation, samplers, batch samplers, workers, and PyTorch's errors."""
import collections
import threading

import numpy as np
import pytest

import minidl
from minidl.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    default_convert,
)

Pair = collections.namedtuple("Pair", "left right")


def items(n=5):
    """Dataset items of every kind default_collate knows, built with plain NumPy values."""
    return [(np.arange(3, dtype=np.float32) + i, i, 0.5 * i, i % 2 == 0, np.float32(i) / 4, f"s{i}",
             {"a": np.full((2,), i, dtype=np.int32), "b": [i, -i]}, Pair(i, 1.5))
            for i in range(n)]


def as_plain(batch):
    """A collated batch with every Tensor (minidl's or PyTorch's) as (dtype name, values)."""
    if isinstance(batch, minidl.Tensor):
        return ("tensor", str(batch.numpy().dtype), batch.numpy().tolist())
    if type(batch).__module__.startswith("torch"):
        return ("tensor", str(batch.numpy().dtype), batch.numpy().tolist())
    if isinstance(batch, dict):
        return {key: as_plain(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return (type(batch).__name__,) + tuple(as_plain(v) for v in batch)
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [as_plain(v) for v in batch])
    return batch


def test_default_collate_gives_pytorchs_batch_for_every_kind_of_item():
    torch_data = pytest.importorskip("torch.utils.data")
    ours, theirs = default_collate(items()), torch_data.default_collate(items())
    assert as_plain(ours) == as_plain(theirs)
    # and the values themselves, by hand, for the main fields
    np.testing.assert_array_equal(ours[0].numpy(), np.arange(3) + np.arange(5)[:, None])
    assert ours[1].dtype == np.int64 and ours[2].dtype == np.float64 and ours[3].dtype == np.bool_
    assert ours[5] == ("s0", "s1", "s2", "s3", "s4")  # strings stay as they are: the field's tuple


def test_default_convert_matches_pytorchs():
    torch_data = pytest.importorskip("torch.utils.data")
    item = items(1)[0]
    assert as_plain(default_convert(item)) == as_plain(torch_data.default_convert(item))


def test_collate_refuses_what_pytorch_refuses():
    with pytest.raises(TypeError, match="found <class 'object'>"):
        default_collate([object(), object()])
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([(1, 2), (3,)])
    with pytest.raises(RuntimeError, match=r"\(2,\), \(3,\)"):
        default_collate([np.zeros(2), np.zeros(3)])


class TensorItems(Dataset):
    """A dataset returning minidl Tensors, as a PyTorch dataset returns torch tensors."""

    def __init__(self, x, y, tensor):
        self.x, self.y, self.tensor = x, y, tensor

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.tensor(self.x[i]), self.tensor(self.y[i])


def test_a_dataset_of_tensors_gives_pytorchs_batches():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((11, 2, 3)).astype(np.float32)
    y = np.arange(11, dtype=np.int64)
    ours = DataLoader(TensorItems(x, y, minidl.tensor), batch_size=4, drop_last=False)
    theirs = torch.utils.data.DataLoader(TensorItems(x, y, torch.tensor), batch_size=4, drop_last=False)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want) == len(ours) == len(theirs) == 3
    for (xb, yb), (xt, yt) in zip(got, want):
        assert isinstance(xb, minidl.Tensor) and xb.size(0) == xt.size(0)
        np.testing.assert_array_equal(xb.numpy(), xt.numpy())
        np.testing.assert_array_equal(yb.numpy(), yt.numpy())
        assert xb.dtype == np.float32 and yb.dtype == np.int64


def test_a_tensor_dataset_batch_is_the_gathered_array_wrapped_without_a_copy():
    gathered = []

    class Recording(TensorDataset):
        def get_batch(self, indices):
            batch = super().get_batch(indices)
            gathered.append(batch)
            return batch

    x, y = np.ones((6, 2), np.float32), np.arange(6)
    xb, yb = next(iter(DataLoader(Recording(x, y), batch_size=4)))
    assert xb.array is gathered[0][0] and yb.array is gathered[0][1]


def test_sequential_and_batch_samplers_equal_pytorchs():
    torch_data = pytest.importorskip("torch.utils.data")
    data = list(range(10))
    for drop_last in (False, True):
        ours = BatchSampler(SequentialSampler(data), 3, drop_last)
        theirs = torch_data.BatchSampler(torch_data.SequentialSampler(data), 3, drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_random_sampler_draws_permutations_and_with_replacement():
    data = range(7)
    sampler = RandomSampler(data, generator=np.random.default_rng(0))
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(7)) and first != second  # a new order each pass
    longer = list(RandomSampler(data, num_samples=17, seed=1))
    assert len(longer) == 17  # two whole permutations, then 3 more without repeats
    assert sorted(longer[:7]) == sorted(longer[7:14]) == list(range(7)) and len(set(longer[14:])) == 3
    drawn = np.array(list(RandomSampler(data, replacement=True, num_samples=7000, seed=2)))
    counts = np.bincount(drawn, minlength=7)
    # 7000 uniform draws over 7 values: each count ~ Binomial(7000, 1/7), sd ~ 29; 6 sd is a failure
    assert len(drawn) == 7000 and drawn.min() >= 0 and drawn.max() <= 6 and np.all(np.abs(counts - 1000) < 175)
    subset = [2, 9, 4, 11]
    picked = list(SubsetRandomSampler(subset, seed=3))
    assert sorted(picked) == sorted(subset) and len(SubsetRandomSampler(subset)) == 4


def test_weighted_sampler_draws_in_proportion_to_the_weights():
    weights = np.array([1.0, 3.0, 0.0, 6.0])
    drawn = np.array(list(WeightedRandomSampler(weights, 20000, seed=0)))
    counts = np.bincount(drawn, minlength=4)
    # expected 2000, 6000, 0, 12000; each count's sd is at most sqrt(20000 / 4) ~ 71, so 6 sd is 430
    assert counts[2] == 0 and np.all(np.abs(counts - 20000 * weights / weights.sum()) < 430)
    unique = list(WeightedRandomSampler(weights, 3, replacement=False, seed=1))
    assert sorted(unique) == [0, 1, 3]  # without replacement: the three indices of non-zero weight, once each
    with pytest.raises(ValueError, match="cannot draw 4 samples without replacement from 3 non-zero weights"):
        WeightedRandomSampler(weights, 4, replacement=False)


def test_weighted_sampler_balances_classes_with_class_weights():
    y = np.array([0] * 90 + [1] * 10)
    sampler = WeightedRandomSampler(minidl.data.class_weights(y)[y], 10000, seed=2)
    share = np.mean(y[np.array(list(sampler))] == 1)
    assert abs(share - 0.5) < 0.03  # a 10% class drawn half the time: sd of the share is 0.005


def test_same_seed_same_order():
    data = range(50)
    a = [list(RandomSampler(data, generator=np.random.default_rng(5))) for _ in range(2)]
    assert a[0] == a[1]
    minidl.manual_seed(3)
    b = list(DataLoader(TensorDataset(np.arange(50)), batch_size=8, shuffle=True))
    minidl.manual_seed(3)
    c = list(DataLoader(TensorDataset(np.arange(50)), batch_size=8, shuffle=True))
    assert [t[0].tolist() for t in b] == [t[0].tolist() for t in c]
    g = [list(DataLoader(np.arange(50)[:, None], batch_size=8, shuffle=True, generator=np.random.default_rng(9)))
         for _ in range(2)]
    assert [t[0].tolist() for t in g[0]] == [t[0].tolist() for t in g[1]]


def test_samplers_refuse_what_pytorch_refuses():
    torch_data = pytest.importorskip("torch.utils.data")
    cases = [(lambda m: m.RandomSampler(range(3), replacement=1)),
             (lambda m: m.RandomSampler(range(3), num_samples=0)),
             (lambda m: m.BatchSampler(range(3), 0, False)),
             (lambda m: m.WeightedRandomSampler([1.0, 2.0], 0)),
             (lambda m: m.WeightedRandomSampler([1.0, 2.0], 2, replacement=0)),
             (lambda m: m.WeightedRandomSampler([[1.0, 2.0]], 2)),
             (lambda m: m.BatchSampler(range(3), 2, 1))]
    for case in cases:
        with pytest.raises((TypeError, ValueError)) as theirs:
            case(torch_data)
        with pytest.raises(theirs.type, match=f"^{theirs.value}$".replace("(", r"\(").replace(")", r"\)")):
            case(minidl.utils.data)


@pytest.mark.parametrize("kwargs", [
    {"batch_sampler": [[0, 1]], "batch_size": 2},
    {"batch_sampler": [[0, 1]], "shuffle": True},
    {"batch_sampler": [[0, 1]], "sampler": [0, 1]},
    {"batch_sampler": [[0, 1]], "drop_last": True},
    {"sampler": [0, 1], "shuffle": True},
    {"batch_size": None, "drop_last": True},
    {"num_workers": -1},
    {"prefetch_factor": 2},
    {"persistent_workers": True},
    {"multiprocessing_context": "spawn"},
])
def test_loader_refuses_the_combinations_pytorch_refuses(kwargs):
    torch_data = pytest.importorskip("torch.utils.data")
    data = np.arange(4.0)
    with pytest.raises(ValueError) as theirs:
        torch_data.DataLoader(data, **kwargs)
    with pytest.raises(ValueError) as ours:
        DataLoader(TensorDataset(data), **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_sampler_and_batch_sampler_choose_the_batches():
    x = np.arange(10, dtype=np.int64)
    by_sampler = DataLoader(TensorDataset(x), sampler=[9, 8, 7, 1, 0], batch_size=2)
    assert [b[0].tolist() for b in by_sampler] == [[9, 8], [7, 1], [0]] and len(by_sampler) == 3
    by_batches = DataLoader(TensorDataset(x), batch_sampler=[[3, 4, 5], [0]])
    assert [b[0].tolist() for b in by_batches] == [[3, 4, 5], [0]] and len(by_batches) == 2
    single = list(DataLoader(TensorDataset(x), batch_size=None, sampler=[2, 5]))
    assert [item[0].tolist() for item in single] == [2, 5] and single[0][0].shape == ()


def test_a_custom_sampler_resumes_mid_epoch():
    x = np.arange(30, dtype=np.int64)

    def make():
        return DataLoader(TensorDataset(x), batch_size=4, sampler=SubsetRandomSampler(range(0, 30, 2), seed=4))

    whole = [[b[0].tolist() for b in make()] for _ in range(1)]  # noqa: C416 - one epoch, as lists
    loader = make()
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(2)]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert head + [b[0].tolist() for b in resumed] == whole[0]


def test_worker_threads_give_the_same_batches_in_order():
    x = np.random.default_rng(1).standard_normal((37, 4)).astype(np.float32)
    y = np.arange(37)
    started, lock = [], threading.Lock()

    def init(worker_id):
        with lock:
            started.append(worker_id)

    def noise(batch, rng):
        return batch + rng.standard_normal(batch.shape).astype(batch.dtype)

    plain = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True, seed=6, transform=noise)
    threaded = DataLoader(TensorDataset(x, y), batch_size=5, shuffle=True, seed=6, transform=noise,
                          num_workers=2, worker_init_fn=init)
    for _ in range(2):
        for (xa, ya), (xb, yb) in zip(plain, threaded, strict=True):
            np.testing.assert_array_equal(xa.numpy(), xb.numpy())
            np.testing.assert_array_equal(ya.numpy(), yb.numpy())
    assert sorted(started) == [0, 0, 1, 1]  # each epoch's two threads, numbered 0 and 1
    for batch in threaded:  # leaving an epoch early stops the workers without waiting for the rest
        break
    assert threaded.state_dict()["batch"] == 1


def test_batches_go_to_the_loaders_device(device):
    x, y = np.arange(6, dtype=np.float32).reshape(3, 2), np.array([2, 0, 1])
    loader = DataLoader(TensorDataset(x, y), batch_size=2, device=device)
    items = DataLoader([{"x": x[i], "y": int(y[i])} for i in range(3)], batch_size=2, device=device)
    for (xb, yb), item in zip(loader, items):
        for got in (xb, yb, item["x"], item["y"]):
            assert isinstance(got, minidl.Tensor) and got.device.type == device.split(":")[0]
        np.testing.assert_array_equal(xb.numpy(), item["x"].numpy())
        np.testing.assert_array_equal(yb.numpy(), item["y"].numpy())
    np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in loader]), x)


def test_samplers_are_reachable_under_pytorchs_path():
    for name in ("RandomSampler", "SequentialSampler", "SubsetRandomSampler", "WeightedRandomSampler",
                 "BatchSampler", "Sampler",
                 "default_collate", "DataLoader"):
        assert getattr(minidl.utils.data, name) is getattr(minidl.data, name)


def test_a_worker_that_takes_too_long_times_out_as_in_pytorch():
    class Slow(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            release.wait(5)
            return np.float32(i)

    release = threading.Event()
    loader = DataLoader(Slow(), batch_size=2, num_workers=1, timeout=0.05)
    try:
        with pytest.raises(RuntimeError, match="DataLoader timed out after 0.05 seconds"):
            next(iter(loader))
    finally:
        release.set()


def test_transform_needs_a_batch_with_a_first_field():
    class Dicts(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"x": np.zeros(2, np.float32)}

    loader = DataLoader(Dicts(), batch_size=2, transform=lambda x, rng: x)
    with pytest.raises(TypeError, match="got a dict batch; apply it in the dataset or in a collate_fn"):
        next(iter(loader))


def test_batch_size_none_serves_converted_items_as_pytorch():
    torch_data = pytest.importorskip("torch.utils.data")
    data = [(np.arange(2, dtype=np.float32) + i, i) for i in range(3)]
    ours = list(DataLoader(data, batch_size=None))
    theirs = list(torch_data.DataLoader(data, batch_size=None))
    assert [as_plain(b) for b in ours] == [as_plain(b) for b in theirs]


def test_the_loaders_positional_arguments_are_pytorchs():
    import inspect
    torch_data = pytest.importorskip("torch.utils.data")

    def positional(fn):
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional(DataLoader.__init__) == positional(torch_data.DataLoader.__init__)
    for name in ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler", "BatchSampler"):
        assert positional(getattr(minidl.data, name).__init__) == positional(getattr(torch_data, name).__init__)
