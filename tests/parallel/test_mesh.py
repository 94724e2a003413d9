"""Meshes and groups in one process: the layout, the checks that run before any communicator is made."""
import numpy as np
import pytest

from minidl import parallel
from minidl.parallel.mesh import mesh_layout


class SplitRecorder(parallel.LocalComm):
    """Claims a rank and a size; records the splits asked of it and answers with its group's rank and size
    as the grid says (so a Mesh can be built for any rank without MPI)."""

    def __init__(self, rank, size, refuse=False):
        self.rank, self.size, self.refuse, self.splits = rank, size, refuse, []

    def split(self, color, key=None):
        if self.refuse:
            raise AssertionError("split called although the mesh was invalid")
        self.splits.append((color, key))
        return (color, key)


def test_layout_is_row_major_with_the_last_axis_fastest():
    # 2 × 3 grid, drawn by hand:   0 1 2
    #                              3 4 5
    coords, members = mesh_layout({"data": 2, "tensor": 3}, 4)
    assert coords == {"data": 1, "tensor": 1}
    assert members == {"data": [1, 4], "tensor": [3, 4, 5]}
    coords, members = mesh_layout({"pipe": 2, "data": 2, "tensor": 2}, 6)  # 6 = 1·4 + 1·2 + 0
    assert coords == {"pipe": 1, "data": 1, "tensor": 0}
    assert members == {"pipe": [2, 6], "data": [4, 6], "tensor": [6, 7]}


def test_every_rank_of_a_group_asks_for_the_same_color_and_its_coordinate_as_key():
    sizes = {"data": 2, "tensor": 3}
    meshes = [parallel.Mesh(SplitRecorder(r, 6), **sizes) for r in range(6)]
    for axis in sizes:
        for r, mesh in enumerate(meshes):
            color, key = mesh.group(axis)
            assert key == mesh.coordinate(axis)
            same_color = [s for s, other in enumerate(meshes) if other.group(axis)[0] == color]
            assert same_color == mesh.members[axis]
    assert [len(m.world.splits) for m in meshes] == [2] * 6  # one split per axis, in the same order


def test_a_world_of_one_is_a_mesh_of_ones():
    mesh = parallel.Mesh(parallel.LocalComm(), data=1, tensor=1)
    assert mesh.shape == (1, 1) and mesh.coordinate("tensor") == 0
    assert isinstance(mesh["data"], parallel.LocalComm) and mesh.size("data") == 1
    x = np.arange(3.0)
    assert mesh.group("tensor").allreduce_(x) is x


def test_a_mesh_that_does_not_fill_the_world_is_refused_before_any_split():
    with pytest.raises(ValueError) as info:
        parallel.Mesh(SplitRecorder(0, 4, refuse=True), data=2, tensor=3)
    message = str(info.value)
    assert "Mesh(data=2, tensor=3) has 6 places but the world has 4 rank(s)" in message
    assert "data=1, tensor=4; data=2, tensor=2; data=4, tensor=1" in message
    with pytest.raises(ValueError, match="axis 'tensor' must be a positive int, got 0"):
        parallel.Mesh(SplitRecorder(0, 4, refuse=True), data=4, tensor=0)
    with pytest.raises(ValueError, match="name at least one axis"):
        parallel.Mesh(SplitRecorder(0, 4, refuse=True))


def test_an_unknown_axis_names_the_mesh_axes():
    mesh = parallel.Mesh(parallel.LocalComm(), data=1, tensor=1)
    with pytest.raises(KeyError, match="no axis 'pipeline'; this mesh has 'data', 'tensor'"):
        mesh.group("pipeline")


def test_point_to_point_names_the_valid_peers():
    world = SplitRecorder(1, 3)
    with pytest.raises(ValueError, match=r"rank 1 of 3 cannot exchange with peer 1; .*\[0, 2\]"):
        world.send(np.zeros(2), 1)
    with pytest.raises(ValueError, match="peer 3"):
        world.recv_(np.zeros(2), 3)
    with pytest.raises(ValueError, match=r"none \(a world of one\)"):
        parallel.LocalComm().send(np.zeros(2), 0)
