"""Samplers: which sample indices an epoch visits, and in what order (PyTorch's ``torch.utils.data`` samplers).

    SequentialSampler(ds)                                   # 0, 1, ..., N-1
    RandomSampler(ds)                                       # a permutation, a new one every epoch
    RandomSampler(ds, replacement=True, num_samples=1000)   # 1000 draws with replacement
    SubsetRandomSampler([3, 7, 9])                          # these indices, shuffled
    WeightedRandomSampler(class_weights(y)[y], len(y))      # every class equally often
    BatchSampler(RandomSampler(ds), batch_size=32, drop_last=False)   # lists of indices
    DataLoader(ds, sampler=RandomSampler(ds), batch_size=32)

Why every random order is a pure function of ``(seed, epoch)``: a random
sampler draws one seed when it is made (from ``generator`` when one is given,
else from minidl's generator, so ``minidl.manual_seed(s)`` fixes it) and
shuffles epoch ``e`` with a fresh NumPy generator seeded with ``(seed, e)``.
The same seed gives the same order, and the loader can resume in the middle
of any epoch from three integers (see ``DataLoader.state_dict``). The loader
calls ``set_epoch(e)`` before each epoch; a sampler iterated on its own moves
to the next epoch after each pass, so two passes differ, as PyTorch's do.

``generator`` is a ``numpy.random.Generator`` (``np.random.default_rng(s)``):
minidl's random streams are NumPy's, and it has no generator class of its own.
The orders themselves differ from PyTorch's (another random number generator);
their distribution is the same.
"""
from __future__ import annotations

import itertools

import numpy as np

from minidl import backend


class Sampler:
    """Base class: ``__iter__`` yields sample indices; ``__len__`` says how many (when known)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _draw_seed(generator, owner: str) -> int:
    """One seed from ``generator`` (a NumPy Generator) or, when None, from minidl's CPU generator."""
    if generator is None:
        generator = backend.rng("cpu")
    elif not isinstance(generator, np.random.Generator):
        raise TypeError(f"{owner}: generator must be a numpy.random.Generator, e.g. np.random.default_rng(0), "
                        f"or None (minidl's generator, seeded by minidl.manual_seed); got {type(generator).__name__}")
    return int(generator.integers(0, 2**63 - 1))


class _EpochSeeded(Sampler):
    """A random sampler whose epoch ``e`` is shuffled by a generator seeded with ``(seed, e)``."""

    def _start(self, generator, seed, owner: str) -> None:
        if seed is not None and generator is not None:
            raise ValueError(f"{owner}: give seed= or generator=, not both")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ValueError(f"{owner}: seed must be a non-negative int or None, got {seed!r}")
        self.generator = generator
        self.seed = int(seed) if seed is not None else _draw_seed(generator, owner)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass serve epoch ``epoch``'s order."""
        self.epoch = int(epoch)

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, int(epoch)])

    def __iter__(self):
        order = self.epoch_order(self.epoch)
        self.epoch += 1
        return iter(order.tolist())


class SequentialSampler(Sampler):
    """The indices ``0, 1, ..., len(data_source) - 1`` in order, every epoch."""

    def __init__(self, data_source):
        self.data_source = data_source

    def epoch_order(self, epoch: int = 0) -> np.ndarray:
        return np.arange(len(self.data_source))

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_EpochSeeded):
    """Random indices of ``data_source``: a permutation per epoch, or ``num_samples`` draws with replacement.

    PyTorch's arguments, and ``seed`` besides. An epoch is drawn lazily, in chunks of at most
    ``CHUNK`` draws (or one permutation of the dataset at a time), so makemore's
    ``RandomSampler(ds, replacement=True, num_samples=int(1e10))`` holds 64 K indices, not
    75 GiB; ``len()`` still answers ``num_samples``.

    Args:
        data_source: the dataset (only its length is used).
        replacement: draw with replacement (``num_samples`` independent uniform draws).
        num_samples: indices per epoch (default ``len(data_source)``). Without
            replacement and more than ``len(data_source)``: whole permutations
            one after another, the last one cut short, as PyTorch does.
        generator: a ``numpy.random.Generator`` the sampler's seed is drawn from.
        seed: (minidl) the seed itself, instead of a generator.
    """

    def __init__(self, data_source, replacement: bool = False, num_samples: int | None = None, generator=None,
                 *, seed: int | None = None):
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer))
                                        or num_samples <= 0):
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        self.data_source, self.replacement, self._num_samples = data_source, replacement, num_samples
        self._start(generator, seed, "RandomSampler")

    #: draws with replacement made at once: large enough for NumPy's speed, small enough to hold (512 KiB)
    CHUNK = 1 << 16

    @property
    def num_samples(self) -> int:
        # Read the length each time: the dataset may change size between epochs, as in PyTorch.
        return len(self.data_source) if self._num_samples is None else int(self._num_samples)

    def epoch_chunks(self, epoch: int):
        """The indices epoch ``epoch`` serves, as consecutive int64 arrays drawn one at a time.

        With replacement: ``num_samples`` uniform draws from ``0..n-1``, ``CHUNK`` at a time.
        Without: whole permutations of ``0..n-1``, the last one cut short, as PyTorch does.
        """
        n, count, rng = len(self.data_source), self.num_samples, self._rng(epoch)
        if n == 0:
            return
        if self.replacement:
            for start in range(0, count, self.CHUNK):
                yield rng.integers(0, n, size=min(self.CHUNK, count - start), dtype=np.int64)
            return
        whole, rest = divmod(count, n)
        for _ in range(whole):
            yield rng.permutation(n).astype(np.int64, copy=False)
        if rest:
            yield rng.permutation(n)[:rest].astype(np.int64, copy=False)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The indices epoch ``epoch`` serves, in order, as one int64 array (``num_samples`` long)."""
        return np.concatenate([np.zeros(0, dtype=np.int64), *self.epoch_chunks(epoch)])

    def __iter__(self):
        chunks = self.epoch_chunks(self.epoch)  # a generator: nothing is drawn until asked
        self.epoch += 1
        return itertools.chain.from_iterable(chunk.tolist() for chunk in chunks)

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_EpochSeeded):
    """The given ``indices``, in a new random order every epoch (no replacement)."""

    def __init__(self, indices, generator=None, *, seed: int | None = None):
        self.indices = indices
        self._start(generator, seed, "SubsetRandomSampler")

    def epoch_order(self, epoch: int) -> np.ndarray:
        indices = np.asarray(self.indices, dtype=np.int64).reshape(-1)
        return indices[self._rng(epoch).permutation(len(indices))]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(_EpochSeeded):
    """``num_samples`` indices drawn with probability ``p_i = w_i / Σ_j w_j`` (PyTorch's ``WeightedRandomSampler``).

    With per-sample weights ``class_weights(y)[y]`` every class is drawn equally
    often on average: oversampling the small classes without copying them.
    Without replacement, no index comes twice in an epoch (so ``num_samples``
    can be at most the number of non-zero weights).
    """

    def __init__(self, weights, num_samples: int, replacement: bool = True, generator=None, *,
                 seed: int | None = None):
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights = np.asarray(weights.numpy() if hasattr(weights, "numpy") else weights, dtype=np.float64)
        if weights.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {weights.shape}")
        if weights.size == 0 or not np.all(np.isfinite(weights)) or weights.min() < 0 or weights.sum() <= 0:
            raise ValueError("WeightedRandomSampler: weights must be finite, non-negative and not all zero, got "
                             f"{weights.size} weights summing to {weights.sum() if weights.size else 0}")
        if not replacement and num_samples > np.count_nonzero(weights):
            raise ValueError(f"WeightedRandomSampler: cannot draw {num_samples} samples without replacement from "
                             f"{np.count_nonzero(weights)} non-zero weights; lower num_samples or set "
                             "replacement=True")
        self.weights, self.num_samples, self.replacement = weights, int(num_samples), replacement
        self._start(generator, seed, "WeightedRandomSampler")

    def epoch_order(self, epoch: int) -> np.ndarray:
        p = self.weights / self.weights.sum()
        return self._rng(epoch).choice(len(p), size=self.num_samples, replace=self.replacement, p=p)

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Groups the indices of ``sampler`` into lists of ``batch_size`` (the last one shorter unless ``drop_last``)."""

    def __init__(self, sampler, batch_size: int, drop_last: bool):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler, self.batch_size, self.drop_last = sampler, int(batch_size), drop_last

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to the sampler, when it has epochs."""
        if callable(getattr(self.sampler, "set_epoch", None)):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
