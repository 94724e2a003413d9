"""DataLoader: batches of Tensors, shuffled reproducibly, resumable mid-epoch (PyTorch's ``DataLoader``).

    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, seed=0)
    for xb, yb in loader:          # Tensors, one per field: xb.shape == (64, ...), yb.size(0) == 64
        ...
    state = loader.state_dict()    # save with the checkpoint
    loader.load_state_dict(state)  # a resumed run sees exactly the same batches

It takes PyTorch's arguments (``sampler=``, ``batch_sampler=``, ``collate_fn=``,
``drop_last=``, ``generator=``, ``worker_init_fn=``, ``num_workers=``...) and
raises PyTorch's errors for the combinations PyTorch refuses. Items are
collated by ``default_collate`` (``minidl.data.collate``), so a dataset that
returns Tensors, arrays, numbers, tuples or dicts gives what PyTorch's loader
gives. A dataset that can gather a whole batch at once (``TensorDataset``,
anything with ``get_batch(indices)``) is read with one indexing call per field
and its arrays are wrapped as Tensors without a copy: that is the fast path
the Trainer uses.

Why it is reproducible: the order of epoch ``e`` is a pure function of
``(seed, e)`` -- a fresh generator seeded with both -- and not the leftover
state of a generator that ran before. So the whole position of the loader is
three integers (seed, epoch, batch), and a run stopped after any batch and
resumed from ``state_dict()`` continues with the batch the uninterrupted run
would have seen next. Random augmentation (``transform``) gets its own
generator per batch, seeded with ``(seed, epoch, batch)``, for the same reason.

``num_workers > 0`` differs from PyTorch: the workers are threads of this
process, not processes. They build the next ``num_workers * prefetch_factor``
batches while the model trains on the current one (NumPy releases the GIL
inside many array operations, and file reads release it), and batches still
come out in order. Nothing is pickled and nothing is forked, so a dataset
needs no care to be shared, and ``worker_init_fn(worker_id)`` runs once in each
thread. But Python code in a dataset's ``__getitem__`` runs one thread at a
time, so a slow pure-Python dataset gains less than from worker processes; a
``TensorDataset``, whose batch is one gather, gains nothing; and a dataset that
draws random numbers from a shared generator in ``__getitem__`` draws them in
the threads' order, not the batches' (``transform=`` is seeded per batch and
stays reproducible).
"""
from __future__ import annotations

import collections
import itertools
import math

import numpy as np

from minidl.data.collate import batch_to, default_collate, default_convert
from minidl.data.dataset import TensorDataset, gathers_batches
from minidl.data.samplers import BatchSampler, RandomSampler, SequentialSampler, _draw_seed
from minidl.tensor import Tensor

_STATE_KEYS = ("seed", "epoch", "batch", "num_samples", "batch_size")


class DataLoader:
    """Iterate over a dataset in batches of Tensors.

    Args:
        dataset: a ``Dataset`` (or anything with ``__len__`` and ``__getitem__``, a
            list of items too, as in PyTorch); a tuple of arrays ``(x, y)`` is
            minidl's shorthand for ``TensorDataset(x, y)``.
        batch_size: samples per batch (a positive integer), or ``None`` to serve
            single items (converted to Tensors, not batched), as in PyTorch.
        shuffle: ``True``, a new random order every epoch; ``"once"``, one random
            order kept for every epoch (to test the textbook's remark that
            reshuffling each epoch usually does not help); ``False``, in order.
        sampler: the indices of an epoch (``RandomSampler``, ``SubsetRandomSampler``,
            any iterable of indices); mutually exclusive with ``shuffle``.
        batch_sampler: the index lists of an epoch's batches (``BatchSampler``);
            mutually exclusive with ``batch_size``, ``shuffle``, ``sampler`` and ``drop_last``.
        num_workers: threads that prepare the next batches ahead (see the module
            docstring: threads, not PyTorch's processes); 0 prepares each batch when asked.
        collate_fn: makes one batch from a list of items (default: ``default_collate``).
        pin_memory: accepted for PyTorch's sake; no effect (batches move to ``device`` directly).
        drop_last: skip the last, smaller batch when ``len(dataset)`` is not a
            multiple of ``batch_size``.
        timeout: seconds to wait for a worker's batch (0: no limit).
        worker_init_fn: called as ``worker_init_fn(worker_id)`` once in each worker thread.
        multiprocessing_context: accepted for PyTorch's sake; no effect (the workers are threads).
        generator: a ``numpy.random.Generator``; the shuffle's seed is drawn from it.
        prefetch_factor: batches each worker prepares ahead (default 2 with workers).
        persistent_workers: accepted for PyTorch's sake (threads are cheap to start each epoch).
        seed: (minidl) seed of the shuffle and of ``transform``. ``None`` draws one from
            ``generator``, or from minidl's generator, so ``minidl.manual_seed(s)`` fixes it too.
        transform: (minidl) an optional callable ``transform(x, rng)`` applied to the
            first field of every batch (see ``minidl.data.transforms``).
        device: (minidl) the device the batches' Tensors are put on (default: where
            the dataset's arrays are, the CPU for NumPy).

    Each iteration (``for batch in loader``) is one epoch. ``len(loader)`` is
    the number of batches per epoch.
    """

    def __init__(self, dataset, batch_size: int | None = 1, shuffle: bool | str | None = None, sampler=None,
                 batch_sampler=None, num_workers: int = 0, collate_fn=None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn=None, multiprocessing_context=None,
                 generator=None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 seed: int | None = None, transform=None, device=None):
        if isinstance(dataset, tuple):  # minidl's shorthand: (x, y) is TensorDataset(x, y)
            dataset = TensorDataset(*dataset)
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise TypeError(
                f"DataLoader: dataset must have __len__ and __getitem__, got {type(dataset).__name__}; "
                "wrap arrays as TensorDataset(x, y)")
        # PyTorch's checks, with PyTorch's messages.
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) or num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if multiprocessing_context is not None and num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
                             f"but got num_workers={num_workers}")
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None:
            if drop_last:
                raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with "
                                 "drop_last")
        elif isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"DataLoader: batch_size must be an int or None, got {batch_size!r}")
        elif batch_size <= 0:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got {batch_size}")
        if shuffle not in (True, False, None, "once"):
            raise ValueError(f"DataLoader: shuffle must be True, False or 'once', got {shuffle!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"DataLoader: seed must be a non-negative int or None, got {seed!r}")
        if seed is not None and generator is not None:
            raise ValueError("DataLoader: give seed= or generator=, not both")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be callable, got {type(collate_fn).__name__}")
        self.dataset = dataset
        self.batch_size = None if batch_size is None else int(batch_size)
        self.shuffle = bool(shuffle)
        self.shuffle_once = shuffle == "once"
        self.drop_last = bool(drop_last)
        self.transform = transform
        self.collate_fn = default_collate if collate_fn is None else collate_fn
        self.num_workers, self.timeout, self.worker_init_fn = int(num_workers), timeout, worker_init_fn
        self.prefetch_factor = (2 if prefetch_factor is None else int(prefetch_factor)) if num_workers else None
        self.pin_memory, self.persistent_workers = bool(pin_memory), bool(persistent_workers)
        self.device = device
        self.generator = generator
        if seed is None:
            # Draw only when randomness is used, so an unshuffled loader does not
            # shift minidl's global random stream (and with it the model's init).
            needs_seed = self.shuffle or transform is not None
            seed = _draw_seed(generator, "DataLoader") if needs_seed else 0
        self.seed = int(seed)
        self._own_sampler = sampler is None
        if sampler is None:
            sampler = RandomSampler(dataset, seed=self.seed) if self.shuffle else SequentialSampler(dataset)
        self.sampler = sampler
        if batch_sampler is None and self.batch_size is not None:
            batch_sampler = BatchSampler(sampler, self.batch_size, self.drop_last)
        self.batch_sampler = batch_sampler
        self._epoch = 0
        self._batch = 0          # batches of the current epoch already handed out
        self._fresh = True       # the next __iter__ continues (epoch, batch) instead of starting anew

    # ------------------------------------------------------------------ sizes
    def __len__(self) -> int:
        if self.batch_sampler is None:
            return len(self.sampler)
        if self._own_batches():
            n = len(self.sampler)
            return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
        return len(self.batch_sampler)

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
    def _own_batches(self) -> bool:
        """Are the batches cut by the loader's own BatchSampler from a sampler with ``epoch_order``?"""
        return (type(self.batch_sampler) is BatchSampler and self.batch_sampler.sampler is self.sampler
                and callable(getattr(self.sampler, "epoch_order", None)))

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample indices of epoch ``epoch`` in the order they are served (samplers with ``epoch_order``)."""
        order = getattr(self.sampler, "epoch_order", None)
        if order is None:
            raise TypeError(f"DataLoader.epoch_order: the sampler {type(self.sampler).__name__} cannot tell an "
                            "epoch's order in advance; iterate the loader instead")
        return order(0 if self.shuffle_once else int(epoch))

    def _index_batches(self, epoch: int, first: int):
        """The index batches of epoch ``epoch`` from batch ``first`` on (arrays, or the sampler's lists)."""
        if self._own_batches():
            size = self.batch_size
            # A sampler that draws its epoch in chunks (RandomSampler) is read chunk by chunk, so an
            # epoch of 10**10 draws never exists as one array; any other gives its order at once.
            chunks = getattr(self.sampler, "epoch_chunks", None)
            order_of = 0 if self.shuffle_once else int(epoch)
            parts = chunks(order_of) if callable(chunks) else (self.epoch_order(epoch),)
            return _batches_of(parts, size, first * size, len(self) * size)
        source = self.batch_sampler if self.batch_sampler is not None else self.sampler
        if callable(getattr(source, "set_epoch", None)):
            source.set_epoch(0 if self.shuffle_once else epoch)
        return itertools.islice(iter(source), first, None)

    def _batch_maker(self, epoch: int):
        """``make(indices, b)``: batch ``b`` of epoch ``epoch`` gathered, collated, transformed, put on the device.

        The route is chosen once per epoch, so that each batch costs a few Python operations.
        """
        dataset, collate_fn, transform, device, seed = (self.dataset, self.collate_fn, self.transform,
                                                        self.device, self.seed)
        if self.batch_sampler is None:  # batch_size=None: one item, converted, not batched
            def gather(index):
                return default_convert(dataset[index])
        elif collate_fn is default_collate and gathers_batches(dataset):
            # The fast path: one gather per field; its arrays become Tensors without a copy.
            get_batch = dataset.get_batch

            def gather(indices):
                return _as_tensors(get_batch(np.asarray(indices)))
        else:
            def gather(indices):
                return collate_fn([dataset[int(i)] for i in indices])

        if transform is None and device is None:
            return lambda indices, b: gather(indices)

        def make(indices, b):
            batch = gather(indices)
            if transform is not None:
                batch = _transformed(batch, transform, np.random.default_rng([seed, epoch, b, 1]))
            return batch if device is None else batch_to(batch, device)
        return make

    def __iter__(self):
        try:
            num_batches = len(self)
        except TypeError:  # a sampler without a length: served until it ends
            num_batches = math.inf
        if not self._fresh or self._batch >= num_batches:
            if not (self._fresh and self._batch == 0):
                self._epoch += 1
            self._batch = 0
        self._fresh = False
        epoch, first = self._epoch, self._batch
        batches, make = self._index_batches(epoch, first), self._batch_maker(epoch)
        if self.num_workers:
            yield from self._prefetched(make, batches, first)
            return
        for b, indices in enumerate(batches, first):
            batch = make(indices, b)
            # Count the batch as served before handing it out: a state_dict taken
            # while the caller holds it must resume with the batch after it.
            self._batch = b + 1
            yield batch

    def _prefetched(self, make, batches, first: int):
        """The batches of ``batches``, built by worker threads up to ``num_workers * prefetch_factor`` ahead."""
        # Imported here: only loaders with workers pay for it. (Before Python 3.11 its
        # TimeoutError is not the builtin one.)
        from concurrent.futures import ThreadPoolExecutor
        from concurrent.futures import TimeoutError as WorkerTimeout
        ids = itertools.count()
        init = self.worker_init_fn

        def start_worker():
            worker_id = next(ids)  # itertools.count's next is atomic under the GIL
            if init is not None:
                init(worker_id)

        ahead = max(1, self.num_workers * self.prefetch_factor)
        pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="minidl-loader", initializer=start_worker)
        stuck = False
        try:
            numbered = enumerate(batches, first)
            pending = collections.deque(pool.submit(make, indices, b) for b, indices in
                                        itertools.islice(numbered, ahead))
            b = first
            while pending:
                try:
                    batch = pending.popleft().result(timeout=self.timeout or None)
                except WorkerTimeout:
                    stuck = True  # a thread cannot be stopped: leave it to finish on its own
                    raise RuntimeError(f"DataLoader timed out after {self.timeout} seconds") from None
                for later, indices in itertools.islice(numbered, 1):
                    pending.append(pool.submit(make, indices, later))
                self._batch = b = b + 1
                yield batch
        finally:
            pool.shutdown(wait=not stuck, cancel_futures=True)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """The loader's position as plain ints (JSON- and checkpoint-friendly).

        ``epoch`` and ``batch``: ``batch`` batches of epoch ``epoch`` have been
        handed out. ``num_samples`` and ``batch_size`` are there to catch a
        resume with a different dataset or batch size.
        """
        return {"seed": self.seed, "epoch": self._epoch, "batch": self._batch,
                "num_samples": len(self.dataset), "batch_size": self.batch_size or 0}

    def check_state_dict(self, state) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state)`` would fail; change nothing."""
        self._checked(state)

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next iteration serves the batch after the last one served."""
        values = self._checked(state)
        self.seed, self._epoch, self._batch = values["seed"], values["epoch"], values["batch"]
        if self._own_sampler and isinstance(self.sampler, RandomSampler):
            self.sampler.seed = self.seed  # the loader's own sampler shuffles with the loader's seed
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
        if values["num_samples"] != len(self.dataset) or values["batch_size"] != (self.batch_size or 0):
            raise ValueError(
                f"{owner}: the state was saved for {values['num_samples']} samples in "
                f"batches of {values['batch_size']}, but this loader has {len(self.dataset)} samples in "
                f"batches of {self.batch_size}; resume with the same dataset and batch_size")
        if not values["batch"] <= len(self):
            raise ValueError(f"{owner}: epoch {values['epoch']} / batch "
                             f"{values['batch']} out of range (0..{len(self)} batches per epoch)")
        return values

    def __repr__(self) -> str:
        sampler = "" if self._own_sampler else f", sampler={type(self.sampler).__name__}"
        return (f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, seed={self.seed}{sampler})")


def _batches_of(chunks, size: int, start: int, stop: int):
    """Batches of ``size`` indices from positions ``start..stop`` of the concatenated ``chunks``, read
    lazily (the last batch shorter when the chunks end first)."""
    pending, filled, position = [], 0, 0
    for chunk in chunks:
        begin, position = position, position + len(chunk)
        if position <= start:
            continue
        piece = chunk[max(start - begin, 0):stop - begin]
        while len(piece):
            take = piece[:size - filled]
            pending.append(take)
            filled, piece = filled + len(take), piece[len(take):]
            if filled == size:
                yield pending[0] if len(pending) == 1 else np.concatenate(pending)
                pending, filled = [], 0
        if position >= stop:
            break
    if pending:
        yield np.concatenate(pending)


def _as_tensors(batch):
    """A gathered batch as Tensors: a tuple of plain arrays (the common case) is wrapped field by field."""
    if type(batch) is tuple:
        return [Tensor(field) if type(field) is np.ndarray and field.dtype.kind in "biuf" else default_convert(field)
                for field in batch]
    return default_convert(batch)


def _transformed(batch, transform, rng):
    """``batch`` with ``transform(x, rng)`` applied to the array of its first field."""
    if isinstance(batch, (list, tuple)) and batch:
        fields = [_transformed(batch[0], transform, rng), *batch[1:]]
        return type(batch)(*fields) if hasattr(batch, "_fields") else type(batch)(fields)
    if not isinstance(batch, Tensor) and not hasattr(batch, "shape"):
        raise TypeError(f"DataLoader: transform= applies to the first field of a tuple batch or to a batch array, "
                        f"got a {type(batch).__name__} batch; apply it in the dataset or in a collate_fn")
    array = batch.array if isinstance(batch, Tensor) else batch
    out = transform(array, rng=rng)
    return Tensor(out) if isinstance(batch, Tensor) else out
