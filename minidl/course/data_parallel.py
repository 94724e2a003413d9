"""Data parallelism's one collective, written on the engine's ring: assignment 7's module.

Data parallelism keeps one copy of the model per rank; each rank computes the
gradients of its share of the batch, and the ranks' gradients are averaged so
that every copy takes the same step. The sum over the ranks is the ring
all-reduce of :mod:`minidl.parallel.ring` (written out on ``sendrecv_``);
minidl's own wrapper, :class:`minidl.parallel.DataParallel`, does the same
with the communicator's all-reduce, in buckets, overlapped with the backward.
"""
from __future__ import annotations

import numpy as np

from minidl.parallel.ring import ring_allreduce_

__all__ = ["average_gradients_"]


def average_gradients_(comm, parameters) -> None:
    """Each parameter's ``.grad`` ← the mean over the ranks of its gradient.

        g ← (1/N) Σ_ranks g         (the ring all-reduce, then a division)

    With every rank's loss a mean over an equal share of the batch, the result is
    the gradient one process gets from the whole batch, on every rank. The sum is taken
    on a copy: a gradient's array may be shared with another tensor (the walk hands the
    same gradient to both operands of an addition), and must not be changed in place.
    """
    for p in parameters:
        if p.grad is None:
            continue
        g = np.array(p.grad.array)
        ring_allreduce_(comm, g)
        g /= comm.size
        p.grad = g
