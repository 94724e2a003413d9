"""Datasets: anything with a length and an item per index.

A dataset item is a tuple of NumPy arrays (or Tensors, or numbers), one per
field (for example ``(image, label)``). ``DataLoader`` stacks items into
batches of Tensors (see ``minidl.data.collate``). A dataset that
can gather many items at once (``TensorDataset``) offers ``get_batch(indices)``
so that a batch is one fancy-indexing call per field instead of a Python loop.

    ds = TensorDataset(x, y)          # x: (N, ...), y: (N,)
    len(ds)                           # N
    ds[3]                             # (x[3], y[3])
    ds.get_batch(np.array([0, 5]))    # (x[[0, 5]], y[[0, 5]])
    Subset(ds, [4, 0, 2])[1]          # ds[0]: a view of some items, in the given order
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.tensor import Tensor


class Dataset:
    """Base class: subclasses define ``__len__`` and ``__getitem__(index)``.

    ``__getitem__`` returns a tuple of arrays (or numbers), one per field.
    Override ``get_batch(indices)`` too when many items can be gathered at
    once faster than one by one.
    """

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def get_batch(self, indices: np.ndarray) -> tuple:
        """The items at ``indices`` stacked field by field (the generic, item-by-item way)."""
        items = [self[int(i)] for i in indices]
        if not items:
            raise ValueError(f"{type(self).__name__}.get_batch: no indices given")
        if not isinstance(items[0], tuple):
            items = [(item,) for item in items]
        return tuple(np.stack([_array(item[f]) for item in items]) for f in range(len(items[0])))


def _array(value) -> np.ndarray:
    """A field of an item as a NumPy array (a Tensor's array is taken as it is)."""
    return backend.to_numpy(value.array) if isinstance(value, Tensor) else np.asarray(value)


def _as_numpy(array, position: int) -> np.ndarray:
    if hasattr(array, "numpy") and callable(array.numpy):  # a minidl Tensor (or similar)
        array = array.numpy()
    array = backend.to_numpy(array)  # NumPy as is; a CuPy array is copied to the host
    if array.ndim == 0:
        raise ValueError(
            f"TensorDataset: array {position} is a scalar; every array needs a first axis "
            "that indexes the samples")
    return array


class TensorDataset(Dataset):
    """Samples are the rows of one or more arrays of equal length.

    ``TensorDataset(x, y)``: item ``i`` is ``(x[i], y[i])``. Arrays keep their
    dtypes (use float32 features and int64 labels, as ``minidl.data``'s
    loaders return them); minidl Tensors are converted to NumPy.
    """

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("TensorDataset needs at least one array, e.g. TensorDataset(x, y)")
        self.arrays = tuple(_as_numpy(a, i) for i, a in enumerate(arrays))
        lengths = [len(a) for a in self.arrays]
        if len(set(lengths)) != 1:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ValueError(
                f"TensorDataset: arrays must have the same length along axis 0, got shapes {shapes}")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def get_batch(self, indices: np.ndarray) -> tuple:
        return tuple(a[indices] for a in self.arrays)

    def __repr__(self) -> str:
        fields = ", ".join(f"{a.dtype}{list(a.shape)}" for a in self.arrays)
        return f"TensorDataset({fields})"


class Subset(Dataset):
    """The items of ``dataset`` at ``indices``, in that order (PyTorch's ``torch.utils.data.Subset``).

    ``Subset(ds, idx)[i]`` is ``ds[idx[i]]``; no item is copied. ``dataset`` and ``indices``
    are kept as attributes under those names, as PyTorch's. A batch is gathered in one call
    when ``dataset`` can gather (``get_batch``), so a split of a :class:`TensorDataset` loads
    as fast as the whole.
    """

    def __init__(self, dataset, indices):
        self.dataset, self.indices = dataset, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def get_batch(self, indices: np.ndarray) -> tuple:
        chosen = np.asarray(self.indices, dtype=np.int64)[np.asarray(indices, dtype=np.int64)]
        if gathers_batches(self.dataset):
            return self.dataset.get_batch(chosen)
        return Dataset.get_batch(self, indices)

    def __repr__(self) -> str:
        return f"Subset({self.dataset!r}, {len(self.indices)} indices)"


def gathers_batches(dataset) -> bool:
    """Can ``dataset.get_batch(indices)`` gather a batch at once (one fancy-indexing call per field)?

    True for a dataset whose class defines its own ``get_batch`` (:class:`TensorDataset`), and for
    a :class:`Subset` of one; False where only the item-by-item base method is there. The loader
    asks this to choose its route.
    """
    if isinstance(dataset, Subset):
        return gathers_batches(dataset.dataset)
    return callable(getattr(dataset, "get_batch", None)) and \
        getattr(type(dataset), "get_batch", None) is not Dataset.get_batch
