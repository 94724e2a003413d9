"""Assignment 7's checks: the ring all-reduce on N thread ranks against the sum, and gradients averaged over
replicas against one process's.

The ranks run as threads (:mod:`.threads`); each rank's result is compared with
the sum over ranks computed here, and each rank's traffic with the ring's 2(N − 1)
chunks. The known mistakes are recognized by running the ring's rules in lockstep
in NumPy with one rule changed (a chunk index, a step count, an assignment for an
addition) and comparing with what came back.
"""
from __future__ import annotations

import numpy as np

import minidl
from minidl import nn
from minidl.course import data_parallel
from minidl.parallel import ring

from .core import Mismatch, check, compare
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


def simulate_allreduce(xs, scatter=None, gather=None):
    """The whole ring in lockstep, each phase with its own changed rule (None where it fails to run)."""
    scattered = simulate_reduce_scatter(xs, **(scatter or {}))
    return None if scattered is None else simulate_allgather(scattered, **(gather or {}))


def _inputs(case):
    n, size = case["n"], case["ranks"]
    dtype = np.dtype(case.get("dtype", "float64"))
    return [case.rng.standard_normal(n).astype(dtype) for _ in range(size)]


def _label(p):
    return f"{p['ranks']} ranks, {p['n']} values, {p.get('dtype', 'float64')}" + \
        (f", shape {p['shape']}" if p.get("shape") else "")


def _traffic(comms, bounds, itemsize):
    """Each rank sent exactly the 2(N − 1) chunks the ring moves, no more, no fewer."""
    size = len(comms)
    for r, comm in enumerate(comms):
        sent = [(r - s) % size for s in range(size - 1)] + [(r + 1 - s) % size for s in range(size - 1)]
        expected = sum(bounds[c][1] - bounds[c][0] for c in sent) * itemsize
        if comm.sent_bytes != expected:
            extra = comm.sent_bytes - expected
            chunk_sizes = {(b - a) * itemsize for a, b in bounds}
            names = ["steps off by one"] if abs(extra) in chunk_sizes else ["not a ring"] if extra > 0 else []
            raise Mismatch(f"rank {r} sent {comm.sent_bytes} bytes; the ring's 2(N − 1) steps send {expected}", names)


def _allreduce_hidden(rng):
    return [dict(ranks=int(rng.integers(4, 7)), n=int(rng.integers(20, 40)), dtype="float32"),
            dict(ranks=2, n=int(rng.integers(5, 9))), dict(ranks=3, n=12, shape=(3, 4)),
            dict(ranks=int(rng.integers(3, 6)), n=int(rng.integers(40, 80)))]


@check("a7.allreduce", public=[dict(ranks=3, n=9), dict(ranks=4, n=10)], hidden=_allreduce_hidden, hidden_count=4,
       label=_label)
def allreduce(case):
    xs = _inputs(case)
    size, shape = len(xs), tuple(case.get("shape") or (case["n"],))
    arrays = [x.copy().reshape(shape) for x in xs]
    _, comms = run_ranks(size, lambda comm: ring.ring_allreduce_(comm, arrays[comm.rank]))
    total = np.sum([x.astype(np.float64) for x in xs], axis=0)
    wrong = [("steps off by one", simulate_allreduce(xs, scatter=dict(steps=size - 2))),
             ("steps off by one", simulate_allreduce(xs, gather=dict(steps=size - 2))),
             ("chunks misrouted", simulate_allreduce(xs, scatter=dict(receive_shift=0))),
             ("chunks misrouted", simulate_allreduce(xs, gather=dict(forward=False))),
             ("gradient overwritten, not accumulated", simulate_allreduce(xs, scatter=dict(add=False))),
             ("added, not copied", simulate_allreduce(xs, gather=dict(add=True)))]
    for r in range(size):
        compare(f"rank {r}'s array after the all-reduce", total.reshape(shape), arrays[r], xs[0].dtype,
                [(name, (lambda sim=sim, r=r: sim[r].reshape(shape) if sim is not None else None))
                 for name, sim in wrong])
    _traffic(comms, _bounds(xs[0].size, size), xs[0].itemsize)


@check("a7.average", public=[dict(ranks=3, batch=12)],
       hidden=lambda rng: [dict(ranks=4, batch=16, dtype="float32"), dict(ranks=2, batch=int(rng.choice([6, 8])))],
       hidden_count=2, label=lambda p: f"{p['ranks']} replicas, a batch of {p['batch']}, {p.get('dtype', 'float64')}")
def average(case):
    """The ranks' gradients on their shares of the batch, averaged, are one process's on the whole batch."""
    size, batch = case["ranks"], case["batch"]
    dtype = np.dtype(case.get("dtype", "float64"))
    x = case.rng.standard_normal((batch, 5)).astype(dtype)
    y = case.rng.standard_normal((batch, 3)).astype(dtype)

    def model():
        minidl.manual_seed(7)
        return nn.Linear(5, 3).to(dtype)

    def loss(m, rows):
        return ((m(minidl.tensor(x[rows])) - minidl.tensor(y[rows])) ** 2).mean()
    whole = model()
    replicas = [model() for _ in range(size)]
    loss(whole, slice(None)).backward()
    share = batch // size
    for r, m in enumerate(replicas):
        loss(m, slice(r * share, (r + 1) * share)).backward()
    run_ranks(size, lambda comm: data_parallel.average_gradients_(comm, list(replicas[comm.rank].parameters())))
    for r, m in enumerate(replicas):
        for (name, p), q in zip(m.named_parameters(), whole.parameters()):
            expected = q.grad.numpy().astype(np.float64)
            compare(f"rank {r}'s {name} gradient after averaging (one process's on the whole batch)", expected,
                    p.grad, dtype, [("not averaged", expected * size), ("missing scale", expected / size)])
