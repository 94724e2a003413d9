"""DataLoader: batches of NumPy arrays, shuffled reproducibly, resumable mid-epoch.

    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, seed=0)
    for xb, yb in loader:          # one tuple of arrays per batch, one array per field
        ...
    state = loader.state_dict()    # save with the checkpoint
    loader.load_state_dict(state)  # a resumed run sees exactly the same batches

Why it is reproducible: the order of epoch ``e`` is a pure function of
``(seed, e)`` -- a fresh generator seeded with both -- and not the leftover
state of a generator that ran before. So the whole position of the loader is
three integers (seed, epoch, batch), and a run stopped after any batch and
resumed from ``state_dict()`` continues with the batch the uninterrupted run
would have seen next. Random augmentation (``transform``) gets its own
generator per batch, seeded with ``(seed, epoch, batch)``, for the same reason.

The loader returns NumPy arrays and never creates Tensors: the training loop
moves each batch to its device.
"""
from __future__ import annotations

import math

import numpy as np

from minidl import backend
from minidl.data.dataset import Dataset, TensorDataset

_STATE_KEYS = ("seed", "epoch", "batch", "num_samples", "batch_size")


class DataLoader:
    """Iterate over a dataset in batches.

    Args:
        dataset: a ``Dataset`` (or anything with ``__len__`` and ``__getitem__``);
            a tuple/list of arrays is wrapped in ``TensorDataset``.
        batch_size: samples per batch (a positive integer).
        shuffle: ``True``, a new random order every epoch; ``"once"``, one random
            order kept for every epoch (to test the textbook's remark that
            reshuffling each epoch usually does not help); ``False``, in order.
        drop_last: skip the last, smaller batch when ``len(dataset)`` is not a
            multiple of ``batch_size``.
        seed: seed of the shuffle and of ``transform``. ``None`` draws one from
            minidl's generator, so ``minidl.manual_seed(s)`` fixes it too.
        transform: an optional callable ``transform(x, rng)`` applied to the
            first field of every batch (see ``minidl.data.transforms``).

    Each iteration (``for batch in loader``) is one epoch. ``len(loader)`` is
    the number of batches per epoch.
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None, transform=None):
        if isinstance(dataset, (tuple, list)):
            dataset = TensorDataset(*dataset)
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(
                f"DataLoader: dataset must have __len__ and __getitem__, got {type(dataset).__name__}; "
                "wrap arrays as TensorDataset(x, y)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"DataLoader: batch_size must be an int, got {batch_size!r}")
        if batch_size <= 0:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size}")
        if seed is not None and (not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"DataLoader: seed must be a non-negative int or None, got {seed!r}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        if shuffle not in (True, False, "once"):
            raise ValueError(f"DataLoader: shuffle must be True, False or 'once', got {shuffle!r}")
        self.shuffle = bool(shuffle)
        self.shuffle_once = shuffle == "once"
        self.drop_last = bool(drop_last)
        self.transform = transform
        if seed is None:
            # Draw only when randomness is used, so an unshuffled loader does not
            # shift minidl's global random stream (and with it the model's init).
            needs_seed = self.shuffle or transform is not None
            seed = int(backend.rng("cpu").integers(0, 2**63 - 1)) if needs_seed else 0
        self.seed = int(seed)
        self._epoch = 0
        self._batch = 0          # batches of the current epoch already handed out
        self._fresh = True       # the next __iter__ continues (epoch, batch) instead of starting anew

    # ------------------------------------------------------------------ sizes
    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch being iterated, or the last one iterated (0-based)."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run epoch ``epoch`` from its first batch."""
        if epoch < 0:
            raise ValueError(f"DataLoader.set_epoch: epoch must be >= 0, got {epoch}")
        self._epoch, self._batch, self._fresh = int(epoch), 0, True

    # ------------------------------------------------------------------ order
    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample indices of epoch ``epoch`` in the order they are served."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, 0 if self.shuffle_once else int(epoch)]).permutation(n)

    def __iter__(self):
        num_batches = len(self)
        if not self._fresh or self._batch >= num_batches:
            if not (self._fresh and self._batch == 0):
                self._epoch += 1
            self._batch = 0
        self._fresh = False
        order = self.epoch_order(self._epoch)
        get_batch = getattr(self.dataset, "get_batch", None)
        if get_batch is None:
            get_batch = lambda idx: Dataset.get_batch(self.dataset, idx)  # noqa: E731
        for b in range(self._batch, num_batches):
            indices = order[b * self.batch_size:(b + 1) * self.batch_size]
            batch = get_batch(indices)
            if not isinstance(batch, tuple):
                batch = tuple(batch) if isinstance(batch, list) else (batch,)
            if self.transform is not None:
                rng = np.random.default_rng([self.seed, self._epoch, b, 1])
                batch = (self.transform(batch[0], rng=rng),) + batch[1:]
            # Count the batch as served before handing it out: a state_dict taken
            # while the caller holds it must resume with the batch after it.
            self._batch = b + 1
            yield batch

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """The loader's position as plain ints (JSON- and checkpoint-friendly).

        ``epoch`` and ``batch``: ``batch`` batches of epoch ``epoch`` have been
        handed out. ``num_samples`` and ``batch_size`` are there to catch a
        resume with a different dataset or batch size.
        """
        return {"seed": self.seed, "epoch": self._epoch, "batch": self._batch,
                "num_samples": len(self.dataset), "batch_size": self.batch_size}

    def check_state_dict(self, state) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state)`` would fail; change nothing."""
        self._checked(state)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next iteration serves the batch after the last one served."""
        values = self._checked(state)
        self.seed, self._epoch, self._batch = values["seed"], values["epoch"], values["batch"]
        self._fresh = True

    def _checked(self, state) -> dict:
        owner = "DataLoader.load_state_dict"
        if not isinstance(state, dict):
            raise ValueError(f"{owner}: expected a dict from DataLoader.state_dict(), got {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"{owner}: missing keys {missing}; "
                             f"expected {list(_STATE_KEYS)} from DataLoader.state_dict()")
        values = {}
        for k in _STATE_KEYS:
            value = state[k]
            if isinstance(value, np.ndarray) and value.shape == ():
                value = value[()]  # a 0-d array from an npz file
            top = 2**128 if k == "seed" else 2**63  # seeds may be large; counts fit in int64
            if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)) \
                    or not 0 <= value < top:
                raise ValueError(f"{owner}: {k} must be a whole number from 0 to 2**{top.bit_length() - 1} - 1, "
                                 f"got {repr(value)[:80]}")
            values[k] = int(value)
        if values["num_samples"] != len(self.dataset) or values["batch_size"] != self.batch_size:
            raise ValueError(
                f"{owner}: the state was saved for {values['num_samples']} samples in "
                f"batches of {values['batch_size']}, but this loader has {len(self.dataset)} samples in "
                f"batches of {self.batch_size}; resume with the same dataset and batch_size")
        if not values["batch"] <= len(self):
            raise ValueError(f"{owner}: epoch {values['epoch']} / batch "
                             f"{values['batch']} out of range (0..{len(self)} batches per epoch)")
        return values

    def __repr__(self) -> str:
        return (f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, seed={self.seed})")
