"""Gathering and splitting along an axis as ops: the pair that joins a split activation and cuts it again.

A layer split over the N ranks of a group leaves each rank one equal part of an activation along
some axis: its output channels (filter-wise parallelism), its rows of the image (spatial
parallelism). Two ops move between the parts and the whole, and each one is the other's derivative
when what follows the whole is the same on every rank (so every rank holds the same gradient dy of
the whole):

    gather:  y = [x_0, x_1, ..., x_{N−1}] along ``axis``    dx_r = dy's part r         (an all-gather)
    split:   y_r = x's part r                                dx = [dy_0, ..., dy_{N−1}] (an all-gather)

Megatron-LM (Shoeybi et al. 2019) gathers a column-parallel layer's output this way when the next
layer needs all of it. ``comm`` is any communicator of :mod:`minidl.parallel` (its ``allgather``
is the only call made); in a group of one both ops are the identity.
"""
from __future__ import annotations

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.tensor import as_tensor


def _check(op: str, x, comm, axis: int) -> int:
    if not callable(getattr(comm, "allgather", None)) or not hasattr(comm, "size"):
        raise TypeError(f"{op}: comm must be a communicator of minidl.parallel (with allgather), got "
                        f"{type(comm).__name__}; make one with parallel.init() or Mesh(...).group(name)")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{op}: axis {axis} is out of range for a tensor of shape {tuple(x.shape)}")
    return axis % x.ndim


def _gathered(x, comm, axis: int):
    """The parts of every rank laid side by side along ``axis`` (rank order)."""
    xp = xp_of(x)
    parts = comm.allgather(xp.ascontiguousarray(x))          # (N, *x.shape)
    parts = xp.moveaxis(parts, 0, axis)                      # x.shape[:axis] + (N,) + x.shape[axis:]
    shape = x.shape[:axis] + (parts.shape[axis] * x.shape[axis],) + x.shape[axis + 1:]
    return xp.ascontiguousarray(parts).reshape(shape)


def _own_part(x, comm, axis: int):
    size = x.shape[axis]
    if size % comm.size:
        raise ValueError(f"split_to_group: axis {axis} of shape {tuple(x.shape)} has {size} entries, which do "
                         f"not split evenly over the {comm.size} ranks of the group; use a size divisible by "
                         f"{comm.size}")
    part = size // comm.size
    index = [slice(None)] * x.ndim
    index[axis] = slice(comm.rank * part, (comm.rank + 1) * part)
    return xp_of(x).ascontiguousarray(x[tuple(index)])


class GatherFromGroup(Function):
    """y = the ranks' parts side by side along ``axis``;  dx = this rank's part of dy."""

    def __init__(self, comm, axis: int):
        self.comm, self.axis = comm, axis

    def forward(self, x):
        return _gathered(x, self.comm, self.axis)

    def backward(self, gy):
        return (SplitToGroup(self.comm, self.axis)(gy),)

    def jvp(self, dx):
        """ẏ = the ranks' tangents gathered alike."""
        return GatherFromGroup(self.comm, self.axis)(dx)


class SplitToGroup(Function):
    """y = this rank's part of x along ``axis`` (x the same on every rank);  dx = the parts of dy gathered."""

    def __init__(self, comm, axis: int):
        self.comm, self.axis = comm, axis

    def forward(self, x):
        return _own_part(x, self.comm, self.axis)

    def backward(self, gy):
        return (GatherFromGroup(self.comm, self.axis)(gy),)

    def jvp(self, dx):
        """ẏ = this rank's part of ẋ."""
        return SplitToGroup(self.comm, self.axis)(dx)


def gather_from_group(x, comm, axis: int):
    """All-gather of the ranks' equal parts along ``axis`` forward; this rank's part of the gradient backward."""
    x = as_tensor(x)
    return GatherFromGroup(comm, _check("gather_from_group", x, comm, axis))(x)


def split_to_group(x, comm, axis: int):
    """This rank's part along ``axis`` (rank r: entries r·n/N .. (r+1)·n/N) forward; the gradient all-gathered
    backward. Raises ValueError when the axis does not split evenly over the group."""
    x = as_tensor(x)
    return SplitToGroup(comm, _check("split_to_group", x, comm, axis))(x)
