"""Assignment 7's checks: the ring's two phases and the all-reduce on N thread ranks, against sums.

The ranks run as threads (:mod:`.threads`); each rank's result is compared with
the sum over ranks computed here. The known mistakes are recognized by running
the ring's rules in lockstep in NumPy with one rule changed (a chunk index, a
step count, an assignment for an addition) and comparing with what came back.
"""
from __future__ import annotations

import numpy as np

import minidl
from minidl import nn
from minidl.course import ring

from .core import Mismatch, check, compare, equal
from .threads import run_ranks


def _bounds(n, parts):
    size, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        out.append((start, start + size + (i < extra)))
        start = out[-1][1]
    return out


def simulate_reduce_scatter(xs, steps=None, receive_shift=1, add=True):
    """The reduce-scatter in lockstep: rank r sends chunk (r − s), stores (or adds) into chunk (r − s − shift)."""
    n = len(xs)
    arrays = [x.astype(np.float64).copy() for x in xs]
    bounds = _bounds(arrays[0].size, n)
    for s in range(n - 1 if steps is None else steps):
        sent = [arrays[r][slice(*bounds[(r - s) % n])].copy() for r in range(n)]
        for r in range(n):
            target = slice(*bounds[(r - s - receive_shift) % n])
            incoming = sent[(r - 1) % n]
            if incoming.shape != arrays[r][target].shape:
                return None
            arrays[r][target] = arrays[r][target] + incoming if add else incoming
    return arrays


def simulate_allgather(xs, steps=None, forward=True, add=False):
    """The all-gather in lockstep from each rank owning chunk (r + 1); ``forward=False`` resends the own chunk."""
    n = len(xs)
    arrays = [x.astype(np.float64).copy() for x in xs]
    bounds = _bounds(arrays[0].size, n)
    for s in range(n - 1 if steps is None else steps):
        sent = [arrays[r][slice(*bounds[(r + 1 - (s if forward else 0)) % n])].copy() for r in range(n)]
        for r in range(n):
            target = slice(*bounds[(r - s) % n])
            incoming = sent[(r - 1) % n]
            if incoming.shape != arrays[r][target].shape:
                return None
            arrays[r][target] = arrays[r][target] + incoming if add else incoming
    return arrays


def _inputs(case):
    n, size = case["n"], case["ranks"]
    dtype = np.dtype(case.get("dtype", "float64"))
    return [case.rng.standard_normal(n).astype(dtype) for _ in range(size)]


def _label(p):
    return f"{p['ranks']} ranks, {p['n']} values, {p.get('dtype', 'float64')}"


def _hidden(rng):
    return [dict(ranks=int(rng.integers(4, 7)), n=int(rng.integers(20, 40)), dtype="float32"),
            dict(ranks=2, n=int(rng.integers(5, 9))), dict(ranks=int(rng.integers(3, 6)), n=int(rng.integers(40, 80)))]


@check("a7.reduce_scatter", public=[dict(ranks=3, n=9), dict(ranks=4, n=10)], hidden=_hidden, hidden_count=3,
       label=_label)
def reduce_scatter(case):
    xs = _inputs(case)
    size = len(xs)
    arrays = [x.copy() for x in xs]
    owned, comms = run_ranks(size, lambda comm: ring.ring_reduce_scatter_(comm, arrays[comm.rank]))
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    bounds = _bounds(xs[0].size, size)
    wrong = {"steps off by one": [simulate_reduce_scatter(xs, steps=size), simulate_reduce_scatter(xs, steps=size - 2)],
             "chunks misrouted": [simulate_reduce_scatter(xs, receive_shift=0)],
             "gradient overwritten, not accumulated": [simulate_reduce_scatter(xs, add=False)]}
    for r in range(size):
        equal(f"the chunk rank {r} owns after the reduce-scatter", (r + 1) % size,
              int(owned[r]) if isinstance(owned[r], (int, np.integer)) else owned[r])
        chunk = slice(*bounds[(r + 1) % size])
        compare(f"rank {r}'s chunk {(r + 1) % size} (the sum over the ranks)", total[chunk], arrays[r][chunk],
                xs[0].dtype, [(name, (lambda sim=sim, r=r: sim[r][chunk] if sim is not None else None))
                              for name, sims in wrong.items() for sim in sims])
    _traffic(comms, bounds, xs[0].itemsize, lambda r, s: (r - s) % size)


def _traffic(comms, bounds, itemsize, sent_chunk):
    """Each rank sent exactly the N − 1 chunks the ring moves (``sent_chunk(rank, step)``), no more."""
    size = len(comms)
    for r, comm in enumerate(comms):
        expected = sum(bounds[sent_chunk(r, s)][1] - bounds[sent_chunk(r, s)][0] for s in range(size - 1)) * itemsize
        if comm.sent_bytes != expected:
            extra = comm.sent_bytes - expected
            chunk_sizes = {(b - a) * itemsize for a, b in bounds}
            names = ["steps off by one"] if extra in chunk_sizes or -extra in chunk_sizes else \
                ["not a ring"] if extra > 0 else []
            raise Mismatch(f"rank {r} sent {comm.sent_bytes} bytes; the ring's N − 1 steps send {expected}", names)


def _owned_inputs(xs, total):
    """Each rank's array with its own chunk final and the others garbage, as after a reduce-scatter."""
    size = len(xs)
    bounds = _bounds(xs[0].size, size)
    out = []
    for r, x in enumerate(xs):
        a = x.copy()
        a[slice(*bounds[(r + 1) % size])] = total[slice(*bounds[(r + 1) % size])]
        out.append(a)
    return out


@check("a7.allgather", public=[dict(ranks=3, n=9), dict(ranks=4, n=10)], hidden=_hidden, hidden_count=3,
       label=_label)
def allgather(case):
    xs = _inputs(case)
    size = len(xs)
    total = np.sum([x.astype(np.float64) for x in xs], axis=0).astype(xs[0].dtype)
    arrays = _owned_inputs(xs, total)
    start = [a.copy() for a in arrays]
    _, comms = run_ranks(size, lambda comm: ring.ring_allgather_(comm, arrays[comm.rank], (comm.rank + 1) % size))
    wrong = {"steps off by one": [simulate_allgather(start, steps=size - 2), simulate_allgather(start, steps=size)],
             "chunks misrouted": [simulate_allgather(start, forward=False)],
             "added, not copied": [simulate_allgather(start, add=True)]}
    for r in range(size):
        compare(f"rank {r}'s array after the all-gather", total, arrays[r], xs[0].dtype,
                [(name, (lambda sim=sim, r=r: sim[r] if sim is not None else None))
                 for name, sims in wrong.items() for sim in sims])
    _traffic(comms, _bounds(xs[0].size, size), xs[0].itemsize, lambda r, s: (r + 1 - s) % size)


@check("a7.allreduce", public=[dict(ranks=3, n=12, batch=12)],
       hidden=lambda rng: [dict(ranks=4, n=int(rng.integers(10, 30)), batch=16, dtype="float32"),
                           dict(ranks=2, n=int(rng.integers(3, 8)), batch=6)], hidden_count=2,
       label=lambda p: _label(p) + f"; a Linear layer's gradients on a batch of {p['batch']}")
def allreduce(case):
    xs = _inputs(case)
    size = len(xs)
    arrays = [x.copy().reshape(1, -1) if i % 2 else x.copy() for i, x in enumerate(xs)]  # any shape works
    _, comms = run_ranks(size, lambda comm: ring.ring_allreduce_(comm, arrays[comm.rank]))
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    for r in range(size):
        compare(f"rank {r}'s array after the all-reduce", total.reshape(arrays[r].shape), arrays[r], xs[0].dtype)
    chunk = -(-xs[0].size // size) * xs[0].itemsize
    for r, comm in enumerate(comms):
        if comm.sent_bytes > 2 * (size - 1) * chunk:
            raise Mismatch(f"rank {r} sent {comm.sent_bytes} bytes for an all-reduce of {xs[0].nbytes}: a ring sends "
                           f"at most 2(N − 1) chunks, {2 * (size - 1) * chunk} bytes", ["not a ring"])
    # data parallelism: the ranks' gradients on their shares of the batch, averaged, are one process's
    dtype = np.dtype(case.get("dtype", "float64"))
    batch = case["batch"]
    x = case.rng.standard_normal((batch, 5)).astype(dtype)
    y = case.rng.standard_normal((batch, 3)).astype(dtype)

    def model():
        minidl.manual_seed(7)
        return nn.Linear(5, 3).to(dtype)
    whole = model()
    ((whole(minidl.tensor(x)) - minidl.tensor(y)) ** 2).mean().backward()
    replicas, share = [model() for _ in range(size)], batch // size
    for r, m in enumerate(replicas):
        part = slice(r * share, (r + 1) * share)
        ((m(minidl.tensor(x[part])) - minidl.tensor(y[part])) ** 2).mean().backward()
    run_ranks(size, lambda comm: ring.average_gradients_(comm, list(replicas[comm.rank].parameters())))
    for r, m in enumerate(replicas):
        for name, (p, q) in zip(("weight", "bias"), zip(m.parameters(), whole.parameters())):
            expected = q.grad.numpy().astype(np.float64)
            compare(f"rank {r}'s {name} gradient after averaging (one process's on the whole batch)", expected,
                    p.grad, dtype, {"not averaged": expected * size})
