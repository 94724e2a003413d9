"""A ring all-reduce built from point-to-point messages: assignment 7's module.

Data parallelism keeps one copy of the model per rank; each rank computes the
gradients of its share of the batch, and an *all-reduce* sums them over the
ranks so every copy takes the same step. MPI and NCCL do it with a ring: the
N ranks stand in a circle, each array is cut into N chunks, and

1. **reduce-scatter** (N − 1 steps): at step s, rank r sends chunk (r − s) to
   its right neighbour and adds the chunk (r − s − 1) it receives from its left
   neighbour into its own. Afterwards rank r holds chunk (r + 1) summed over
   every rank.
2. **all-gather** (N − 1 steps): at step s, rank r sends chunk (r + 1 − s) to
   the right and stores the chunk (r − s) it receives: the summed chunks go
   round until every rank has all of them.

Each rank sends 2(N − 1) chunks of n/N values: 2(N − 1)/N of the array, almost
independent of N, which is why the ring is what large jobs use (the cost model
is :func:`minidl.parallel.cost_model.ring_bytes`). Every step is one
``comm.sendrecv_`` (send right, receive from the left at once), so no rank
waits for another's receive. minidl itself calls MPI's or NCCL's all-reduce
(:mod:`minidl.parallel.comm`); this module writes the algorithm out.
"""
from __future__ import annotations

import numpy as np

__all__ = ["average_gradients_", "chunk_bounds", "ring_allgather_", "ring_allreduce_", "ring_reduce_scatter_"]


def chunk_bounds(n: int, parts: int) -> list:
    """[(start, stop)] of ``parts`` consecutive chunks of n values; the first n % parts chunks one longer
    (NumPy's array_split)."""
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + size + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_reduce_scatter_(comm, array) -> int:
    """Step 1, in place on the 1-D ``array``: afterwards chunk (rank + 1) mod N of it holds that chunk summed over
    every rank. Returns that chunk's index.

        for s = 0 .. N − 2:   send chunk (r − s) mod N to rank (r + 1) mod N,
                              receive chunk (r − s − 1) mod N from rank (r − 1) mod N and add it into yours
    """
    n, r = comm.size, comm.rank
    bounds = chunk_bounds(array.size, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        a, b = bounds[(r - s) % n]
        c, d = bounds[(r - s - 1) % n]
        incoming = np.empty(d - c, array.dtype)
        comm.sendrecv_(array[a:b].copy(), right, incoming, left)
        array[c:d] += incoming
    return (r + 1) % n


def ring_allgather_(comm, array, owned: int) -> None:
    """Step 2, in place on the 1-D ``array`` whose chunk ``owned`` (= (rank + 1) mod N) is final: afterwards every
    chunk holds its owner's values.

        for s = 0 .. N − 2:   send chunk (r + 1 − s) mod N to rank (r + 1) mod N,
                              receive chunk (r − s) mod N from rank (r − 1) mod N and store it
    """
    n, r = comm.size, comm.rank
    bounds = chunk_bounds(array.size, n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):
        a, b = bounds[(owned - s) % n]
        c, d = bounds[(owned - s - 1) % n]
        incoming = np.empty(d - c, array.dtype)
        comm.sendrecv_(array[a:b].copy(), right, incoming, left)
        array[c:d] = incoming


def ring_allreduce_(comm, array):
    """Sum ``array`` (any shape, contiguous) over every rank, in place: a reduce-scatter, then an all-gather.
    Returns ``array``. A world of one rank has nothing to do."""
    if comm.size == 1:
        return array
    flat = array.reshape(-1)  # a view: the ring works on the values in place
    owned = ring_reduce_scatter_(comm, flat)
    ring_allgather_(comm, flat, owned)
    return array


def average_gradients_(comm, parameters) -> None:
    """Data parallelism's one collective: each parameter's ``.grad`` ← the mean of the ranks' gradients.

        g ← (1/N) Σ_ranks g         (the ring all-reduce, then a division)

    With every rank's loss a mean over an equal share of the batch, the result is
    the gradient one process gets from the whole batch, on every rank. The sum is taken
    on a copy: a gradient's array may be shared with another tensor (the walk hands the
    same gradient to both operands of an addition), and must not be changed in place.
    """
    for p in parameters:
        if p.grad is None:
            continue
        g = np.array(p.grad.data)  # a copy: a gradient's array may be shared with another tensor's
        ring_allreduce_(comm, g)
        g /= comm.size
        p.grad = g
