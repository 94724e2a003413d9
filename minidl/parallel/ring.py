"""Ring all-reduce, written out: the algorithm inside NCCL and most MPI libraries, on point-to-point calls.

minidl's communicators call the engine's own all-reduce (``comm.allreduce_``). This module is
the same sum done by hand, so a student can read it and see where the cost model's
2(N−1)/N · n bytes come from (Patarasuk & Yuan 2009; :mod:`minidl.parallel.cost_model`).

N ranks sit in a ring; each sends only to its right neighbour and receives only from its left.
The array is cut into N chunks. Rank r starts by passing on chunk r:

    reduce-scatter, steps s = 0 … N−2:
        send chunk (r − s) mod N to the right; receive chunk (r − s − 1) mod N from the left
        and add it to our own copy of that chunk
        → after N−1 steps rank r holds the whole sum of chunk (r + 1) mod N
    all-gather, steps s = 0 … N−2:
        send chunk (r + 1 − s) mod N (complete) to the right; receive chunk (r − s) mod N
        from the left and keep it
        → after N−1 more steps every rank holds every summed chunk

Each step moves one chunk of n/N elements over every link at once, so a rank sends
2(N−1) chunks in all: 2(N−1)/N · n, whatever N is. That is why data parallelism scales.
"""
from __future__ import annotations

from minidl.backend import xp_of


def chunk_bounds(n: int, ranks: int) -> list[tuple[int, int]]:
    """The N chunks of an array of n elements: (start, stop) each, sizes differing by at most one."""
    base, extra = divmod(n, ranks)
    bounds, start = [], 0
    for i in range(ranks):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_allreduce_(comm, array):
    """``array ← Σ_ranks array``, in place, by the ring algorithm of the module docstring; returns ``array``.

    A collective: every rank of ``comm`` calls it with an array of the same shape and dtype.
    ``array`` must be contiguous (its flat view is summed chunk by chunk). On one rank it is
    the identity. The sum of each element is taken in ring order, so its last bits may differ
    from ``comm.allreduce_``'s (the engine picks its own order).
    """
    if not (getattr(array, "flags", None) is not None and array.flags.c_contiguous):
        raise ValueError(f"ring_allreduce_: the array must be C-contiguous (it is summed through its flat view), "
                         f"got shape {tuple(getattr(array, 'shape', ()))}; pass xp.ascontiguousarray(array)")
    n, r = comm.size, comm.rank
    if n == 1:
        return array
    flat = array.reshape(-1)
    chunks = [flat[start:stop] for start, stop in chunk_bounds(flat.size, n)]
    right, left = (r + 1) % n, (r - 1) % n
    incoming = xp_of(array).empty(chunks[0].size, array.dtype)  # the largest chunk: chunk 0
    for s in range(n - 1):  # reduce-scatter
        send, receive = chunks[(r - s) % n], chunks[(r - s - 1) % n]
        got = comm.sendrecv_(send, right, incoming[:receive.size], left)
        receive += got
    for s in range(n - 1):  # all-gather
        send, receive = chunks[(r + 1 - s) % n], chunks[(r - s) % n]
        comm.sendrecv_(send, right, receive, left)
    return array
