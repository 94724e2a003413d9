"""Collation: a list of dataset items becomes one batch of Tensors, as PyTorch's ``default_collate`` makes it.

    default_collate([(x0, 3), (x1, 5)])   # [Tensor of x0 and x1 stacked, Tensor([3, 5]) int64]

By the type of the first item, recursively:

    ==========================  =============================================
    item                        batch
    ==========================  =============================================
    Tensor, NumPy array         a Tensor, the items stacked on a new axis 0
    Python float                a float64 Tensor (as PyTorch)
    Python int / bool           an int64 / bool Tensor
    NumPy scalar                a Tensor of its dtype
    str, bytes                  the strings as they are, not a Tensor
    dict                        a dict of batches, key by key
    namedtuple                  the same namedtuple of batches, field by field
    tuple, list                 a list of batches, field by field (PyTorch
                                turns a tuple into a list too)
    ==========================  =============================================

``default_convert`` is what a loader with ``batch_size=None`` applies to each
item: arrays become Tensors, containers are walked, the rest stays as it is.

The stacked array is new memory (the items are separate arrays); wrapping an
array as a Tensor never copies it.
"""
from __future__ import annotations

import collections.abc

import numpy as np

from minidl import backend
from minidl.tensor import Tensor

_ERROR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _convertible(dtype) -> bool:
    """Numbers, not strings or objects (bfloat16 is a 'V' dtype, and a number)."""
    return dtype.kind not in "OSUV" or backend.is_bfloat16(dtype)


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or backend.is_device_array(value)


def _is_namedtuple(value) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def _stack(arrays) -> Tensor:
    arrays = [a.array if isinstance(a, Tensor) else a for a in arrays]
    first = arrays[0]
    if not _convertible(first.dtype):
        raise TypeError(_ERROR.format(first.dtype))
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise RuntimeError(f"default_collate: stack expects each item to be of equal size, got shapes "
                           f"{sorted(shapes)}; pad the items to one shape or pass a collate_fn")
    return Tensor(backend.xp_of(first).stack(arrays))


def default_collate(batch):
    """Combine a list of items into one batch (see the module's table); PyTorch's ``default_collate``."""
    if not isinstance(batch, collections.abc.Sequence) or isinstance(batch, (str, bytes)):
        raise TypeError(f"default_collate: expected a list of dataset items, got {type(batch).__name__}")
    if len(batch) == 0:
        raise ValueError("default_collate: got an empty list of items; a batch needs at least one")
    elem = batch[0]
    if isinstance(elem, Tensor) or _is_array(elem):
        return _stack(batch)
    if isinstance(elem, np.generic):
        if not _convertible(elem.dtype):
            raise TypeError(_ERROR.format(elem.dtype))
        return Tensor(np.asarray(batch))
    if isinstance(elem, float):
        return Tensor(np.asarray(batch, dtype=np.float64))
    if isinstance(elem, bool):
        return Tensor(np.asarray(batch))  # bools stay bool; a list mixing bools and ints becomes int64
    if isinstance(elem, int):
        return Tensor(np.asarray(batch, dtype=np.int64))
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([item[key] for item in batch]) for key in elem}
        try:
            return type(elem)(collated)
        except TypeError:  # a mapping type that cannot be built from a dict
            return collated
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(field) for field in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(item) != size for item in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(field) for field in zip(*batch)]
    raise TypeError(_ERROR.format(type(elem)))


def default_convert(data):
    """Arrays (and NumPy scalars) to Tensors, inside dicts, tuples and lists; anything else as it is."""
    if isinstance(data, Tensor):
        return data
    if _is_array(data):
        return Tensor(data) if _convertible(data.dtype) else data
    if isinstance(data, np.generic):
        return Tensor(np.asarray(data)) if _convertible(data.dtype) else data
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(value) for key, value in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]  # a tuple becomes a list, as PyTorch's default_convert does
    if isinstance(data, collections.abc.Sequence):
        return [default_convert(d) for d in data]
    return data


def batch_to(batch, device):
    """``batch`` with every Tensor in it on ``device`` (no copy for a Tensor already there)."""
    if isinstance(batch, Tensor):
        moved = backend.to_device(batch.array, device)
        return batch if moved is batch.array else Tensor(moved)
    if isinstance(batch, dict):
        return {key: batch_to(value, device) for key, value in batch.items()}
    if _is_namedtuple(batch):
        return type(batch)(*(batch_to(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(batch_to(value, device) for value in batch)
    return batch
