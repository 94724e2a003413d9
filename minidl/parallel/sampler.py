"""Sharding: rank r of N gets its contiguous slice of every global batch.

Data parallelism splits each global batch of B samples across N ranks. With
``shard_bounds`` the slices are as equal as they can be: the first B mod N
ranks get ⌈B/N⌉ samples, the others ⌊B/N⌋, and together they are the batch,
in order. When B does not divide by N the slices differ in size, so
``DataParallel`` weights each rank's mean gradient by its sample count:

    g = Σ_r n_r · g_r / Σ_r n_r = (1/B) Σ_i ∇ℓ_i

which is exactly the gradient one process computes on the whole batch.

``shard_loader(loader, comm)`` turns a ``DataLoader`` over the whole dataset
into one that yields this rank's slice of the very batches the original would
yield (same shuffle, same seed, same resumable position), reading only the
rows this rank needs.
"""
from __future__ import annotations

import numpy as np


def shard_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """``(start, stop)`` of rank ``rank``'s slice of ``n`` items split over ``size`` ranks."""
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"shard_bounds: rank must lie in [0, size) with size >= 1, got rank={rank}, "
                         f"size={size}")
    base, extra = divmod(int(n), size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard(array, rank: int, size: int):
    """Rank ``rank``'s slice (along the first axis) of ``array``: a view, no copy."""
    start, stop = shard_bounds(len(array), rank, size)
    return array[start:stop]


class ShardedDataset:
    """A view of ``dataset`` whose ``get_batch(indices)`` returns only this rank's slice of ``indices``.

    Its length is the whole dataset's, so a ``DataLoader`` over it shuffles and
    batches exactly as over the original; only the rows read differ.
    """

    def __init__(self, dataset, rank: int, size: int):
        shard_bounds(0, rank, size)  # validates rank and size
        self.dataset, self.rank, self.size = dataset, int(rank), int(size)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]

    def get_batch(self, indices) -> tuple:
        mine = shard(np.asarray(indices), self.rank, self.size)
        get_batch = getattr(self.dataset, "get_batch", None)
        if len(mine) == 0:
            # A batch smaller than the world leaves this rank without samples: an empty batch of
            # the right shapes and dtypes (its gradient then has weight 0).
            probe = np.asarray(indices)[:1]
            batch = get_batch(probe) if get_batch is not None else _stack(self.dataset, probe)
            return tuple(field[:0] for field in batch)
        return get_batch(mine) if get_batch is not None else _stack(self.dataset, mine)

    def __repr__(self) -> str:
        return f"ShardedDataset({self.dataset!r}, rank={self.rank}, size={self.size})"


def _stack(dataset, indices) -> tuple:
    from minidl.data.dataset import Dataset
    return Dataset.get_batch(dataset, indices)


def shard_loader(loader, comm):
    """A ``DataLoader`` yielding rank ``comm.rank``'s slice of every batch of ``loader``.

    ``loader.batch_size`` stays the *global* batch size B; each rank gets about
    B/N samples. Shuffle order, seed and position (``state_dict``) are those of
    ``loader``, so every rank walks the same global batches in step. A random
    ``transform`` gets the global batch's generator but sees only this rank's rows,
    so augmentation is an equally valid draw, not the single-process one.
    With ``comm.size == 1`` the loader is returned as it is.
    """
    from minidl.data.loader import DataLoader
    if comm.size == 1:
        return loader
    if not isinstance(loader, DataLoader):
        raise TypeError(f"shard_loader: expected a minidl.data.DataLoader, got {type(loader).__name__}; "
                        "for other iterables shard each batch yourself: parallel.shard(x, comm.rank, comm.size)")
    if loader.batch_size < comm.size:
        raise ValueError(f"shard_loader: the global batch size {loader.batch_size} is smaller than the "
                         f"{comm.size} ranks, so some ranks would get no samples; use a batch of at least "
                         f"{comm.size} (B/N samples per rank)")
    if not loader._own_sampler or loader.batch_size is None:
        raise TypeError("shard_loader: the loader must cut its own batches (shuffle= and batch_size=, no sampler= "
                        "or batch_sampler=): each rank takes its slice of the batches that order gives")
    sharded = DataLoader(ShardedDataset(loader.dataset, comm.rank, comm.size), batch_size=loader.batch_size,
                         shuffle="once" if loader.shuffle_once else loader.shuffle, drop_last=loader.drop_last,
                         seed=loader.seed, transform=loader.transform, device=loader.device)
    sharded.load_state_dict(loader.state_dict())
    return sharded
