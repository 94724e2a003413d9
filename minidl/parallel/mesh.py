"""A mesh of ranks: the world laid out on a grid with named axes, one group per axis.

Hybrid parallelism splits the world several ways at once. With 4 ranks,
``Mesh(data=2, tensor=2)`` lays them out on a 2 × 2 grid, row-major (the
last axis varies fastest), and gives each rank one communicator per axis: the
ranks that share every other coordinate.

    rank:   0  1        tensor groups (rows):     {0, 1}  {2, 3}
            2  3        data groups (columns):    {0, 2}  {1, 3}

    mesh = parallel.Mesh(data=2, tensor=2)        # a collective: every rank builds the same mesh
    mesh.coordinate("tensor")                      # this rank's place along the axis (= its rank in the group)
    tp = mesh.group("tensor")                      # a Communicator: all-reduce the tensor-parallel partial sums
    dp = mesh.group("data")                        # a Communicator: all-reduce the gradients of the replicas

Name the axis that communicates most last: its ranks are then neighbours,
which on a cluster means the same machine (Megatron-LM puts the tensor axis
there, since it all-reduces activations in every layer).

Groups come from :meth:`Communicator.split` (``MPI_Comm_split``; on NCCL a
new communicator per group, its unique id sent over MPI), made axis by
axis in the order given, so every rank makes the same calls in the same order.
"""
from __future__ import annotations

import math

import numpy as np


def mesh_layout(sizes: dict, rank: int) -> tuple[dict, dict]:
    """``(coordinates, members)`` of ``rank`` on a row-major grid of ``sizes`` (an ordered dict).

    ``coordinates[axis]``: the rank's index along ``axis``; ``members[axis]``: the world ranks of its
    group along ``axis``, in the group's order (the ranks whose other coordinates equal its own).
    """
    shape = tuple(sizes.values())
    coords = np.unravel_index(rank, shape)
    coordinates, members = {}, {}
    for axis, name in enumerate(sizes):
        coordinates[name] = int(coords[axis])
        line = list(coords)
        ranks = []
        for index in range(shape[axis]):
            line[axis] = index
            ranks.append(int(np.ravel_multi_index(tuple(line), shape)))
        members[name] = ranks
    return coordinates, members


def _valid_splits(world: int, names) -> str:
    """Every assignment of sizes to ``names`` whose product is ``world`` (for error messages)."""
    choices = [()]
    for _ in names:
        choices = [c + (d,) for c in choices for d in range(1, world + 1) if world % (math.prod(c) * d) == 0]
    full = [c for c in choices if math.prod(c) == world]
    return "; ".join(", ".join(f"{n}={d}" for n, d in zip(names, c)) for c in full[:8])


class Mesh:
    """``Mesh(comm=None, **sizes)``: the ranks of ``comm`` on a grid with one named axis per keyword.

    ``Mesh(data=2, tensor=2)`` on 4 ranks; every size is a positive int and
    their product must equal the world size (checked before any communicator
    is made, naming the valid choices). ``comm`` defaults to ``parallel.init()``.
    """

    def __init__(self, comm=None, **sizes):
        if not sizes:
            raise ValueError("Mesh: name at least one axis with its size, e.g. Mesh(data=2, tensor=2)")
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise ValueError(f"Mesh: the size of axis {name!r} must be a positive int, got {size!r}")
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        self.world = comm
        self.sizes = {name: int(size) for name, size in sizes.items()}
        asked = ", ".join(f"{n}={s}" for n, s in self.sizes.items())
        if math.prod(self.sizes.values()) != comm.size:
            raise ValueError(f"Mesh({asked}) has {math.prod(self.sizes.values())} places but the world has "
                             f"{comm.size} rank(s); the sizes must multiply to {comm.size}: "
                             f"{_valid_splits(comm.size, list(self.sizes))}")
        self.coordinates, self.members = mesh_layout(self.sizes, comm.rank)
        self.groups = {}
        for name in self.sizes:  # the same splits, in the same order, on every rank
            others = {n: c for n, c in self.coordinates.items() if n != name}
            color = int(np.ravel_multi_index(tuple(others.values()),
                                             tuple(self.sizes[n] for n in others))) if others else 0
            self.groups[name] = comm.split(color, key=self.coordinates[name])

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def shape(self) -> tuple:
        return tuple(self.sizes.values())

    def _axis(self, name: str) -> str:
        if name not in self.sizes:
            raise KeyError(f"Mesh: no axis {name!r}; this mesh has {', '.join(map(repr, self.sizes))}")
        return name

    def group(self, name: str):
        """The communicator of this rank's group along axis ``name``."""
        return self.groups[self._axis(name)]

    def __getitem__(self, name: str):
        return self.group(name)

    def coordinate(self, name: str) -> int:
        """This rank's index along axis ``name`` (its rank within ``group(name)``)."""
        return self.coordinates[self._axis(name)]

    def size(self, name: str) -> int:
        return self.sizes[self._axis(name)]

    def __repr__(self):
        axes = ", ".join(f"{n}={s}" for n, s in self.sizes.items())
        where = ", ".join(f"{n}={c}" for n, c in self.coordinates.items())
        return f"Mesh({axes}; rank {self.world.rank} at {where})"
