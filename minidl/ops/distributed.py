"""Communication as ops: the two conjugate functions of tensor parallelism.

A tensor-parallel layer holds one slice of a weight on each of the N ranks
of a group (Megatron-LM; Shoeybi et al. 2019, section 3). Two collectives
join the slices, and each one is the other's derivative:

    copy:  y_r = x          every rank r starts from the same x
    sum:   y = Σ_r x_r      every rank holds one partial sum, all get the total

The loss L depends on every rank's outputs. In a copy, x feeds N outputs, so
its gradient sums theirs: dx = Σ_r dy_r, an all-reduce. In a sum, each x_r
enters y with slope 1 and what follows y is the same on every rank (the same
dy everywhere), so dx_r = dy: the identity. Megatron-LM calls them f and g:

    f = CopyToGroup:    forward identity,     backward all-reduce
    g = SumOverGroup:   forward all-reduce,   backward identity

Each backward is the other op, called on the gradient, so second derivatives
go through the same collectives. ``comm`` is any communicator of
:mod:`minidl.parallel` (its ``allreduce_`` is the only call made); with a
group of one rank both ops are the identity.
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.tensor import as_tensor


def _check_comm(op: str, comm) -> None:
    if not callable(getattr(comm, "allreduce_", None)):
        raise TypeError(f"{op}: comm must be a communicator of minidl.parallel (with allreduce_), "
                        f"got {type(comm).__name__}; make one with parallel.init() or Mesh(...).group(name)")


class CopyToGroup(Function):
    """y = x on every rank of the group;  dx = Σ_r dy_r (an all-reduce of the gradients).

    Megatron-LM's f: placed where a replicated activation enters a
    column-parallel layer, whose ranks each use it with their own slice.
    """

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x):
        return x.view()

    def backward(self, gy):
        return (sum_over_group(gy, self.comm),)

    def jvp(self, dx):
        """ẏ = ẋ, copied alike (so that the tangent's own gradient is all-reduced too)."""
        return CopyToGroup(self.comm)(dx)


def copy_to_group(x, comm):
    """Identity forward, all-reduce of the gradient backward (Megatron-LM's f)."""
    _check_comm("copy_to_group", comm)
    return CopyToGroup(comm)(as_tensor(x))


class SumOverGroup(Function):
    """y = Σ_r x_r, the same on every rank of the group;  dx = dy (the identity).

    Megatron-LM's g: placed after a row-parallel layer, whose ranks each hold
    a partial product of the same output.
    """

    def __init__(self, comm):
        self.comm = comm

    def forward(self, x):
        y = xp_of(x).array(x, copy=True, order="C")  # a buffer of its own: the all-reduce works in place
        return self.comm.allreduce_(y)

    def backward(self, gy):
        return (copy_to_group(gy, self.comm),)

    def jvp(self, dx):
        """ẏ = Σ_r ẋ_r (an all-reduce of the tangents: y is linear in x)."""
        return SumOverGroup(self.comm)(dx)


def sum_over_group(x, comm):
    """All-reduce forward, identity backward (Megatron-LM's g)."""
    _check_comm("sum_over_group", comm)
    return SumOverGroup(comm)(as_tensor(x))
