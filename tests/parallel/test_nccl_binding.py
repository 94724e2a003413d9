"""NCCLComm's calls checked against the real binding, without a GPU.

``cupy.cuda.nccl`` is CuPy's Cython binding of libnccl. CuPy 14 loads libnccl
through cuda-pathfinder, which finds it in the ``nvidia-nccl-cu12`` wheel's
``nvidia/nccl/lib`` in site-packages: no GPU and no CUDA driver are needed to load it.

Each collective of ``NCCLComm`` is driven through that binding with a
communicator whose handle is NULL (``NcclCommunicator.__new__`` without
``__init__``) and device arrays described by their pointer, size and dtype.
The binding converts every argument (pointers, count, NCCL dtype and
operation, root, stream) and calls libnccl, whose first check rejects the NULL
communicator: ``NcclError`` with ncclInvalidArgument. A wrong argument — one
too few, a float count, a dtype constant CuPy does not define — fails earlier,
in Cython, as ``TypeError`` or ``AttributeError``, so reaching libnccl proves the
call is well formed. The start-up (unique id, ``NcclCommunicator(size, id,
rank)``) is checked the same way: libnccl refuses it for lack of CUDA.

The wheels come with ``pip install -e '.[gpu-check]'`` (part of ``[test]``).
What runs only on a GPU (real sums across ranks) is in test_nccl.py.
"""
import types

import numpy as np
import pytest

from minidl import backend
from minidl.parallel import comm

# ncclDataType_t in nccl.h (part of NCCL's stable ABI), independent of minidl's table and of CuPy's names
NCCL_H_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
                "float16": 6, "float32": 7, "float64": 8}
NCCL_INVALID_ARGUMENT = 4  # ncclResult_t
NCCL_UNHANDLED_CUDA_ERROR = 1
DTYPES = sorted(comm._NCCL_TYPES)  # every dtype minidl sends through NCCL


@pytest.fixture(scope="module")
def nccl():
    pytest.importorskip("cupy", reason="needs CuPy: pip install -e '.[gpu-check]' (no GPU needed)")
    from cupy.cuda import nccl as module
    if not getattr(module, "available", False):
        pytest.skip("CuPy could not load libnccl: pip install nvidia-nccl-cu12 (part of '.[gpu-check]')")
    if not hasattr(module, "NcclCommunicator") or not hasattr(module, "NcclError"):  # pragma: no cover
        pytest.skip("cupy.cuda.nccl no longer offers NcclCommunicator/NcclError; update this test")
    return module


class _DeviceArray:
    """What NCCLComm reads of a CuPy array: shape, size, dtype, contiguity and the device pointer."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self._memory = np.zeros(max(self.size, 1) * self.dtype.itemsize, np.uint8)  # never touched by NCCL here
        self.data = types.SimpleNamespace(ptr=self._memory.ctypes.data)


def _fake_cupy():
    """The few CuPy calls NCCLComm makes besides NCCL: the current stream, one device, empty()."""
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)  # 0: CUDA's default stream
    device = types.SimpleNamespace(use=lambda: None)
    cuda = types.SimpleNamespace(get_current_stream=lambda: stream, Device=lambda index: device,
                                 runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    return types.SimpleNamespace(cuda=cuda, empty=lambda shape, dtype: _DeviceArray(shape, dtype))


@pytest.fixture
def null_world(nccl):
    """An NCCLComm of 2 ranks whose NCCL communicator handle is NULL."""
    world = object.__new__(comm.NCCLComm)
    world.nccl_module, world.cp, world.mpi = nccl, _fake_cupy(), None
    world.rank, world.size, world.device = 0, 2, "cuda:0"
    world.comm = nccl.NcclCommunicator.__new__(nccl.NcclCommunicator)
    assert world.comm.comm == 0  # the handle, as an integer
    return world


def _fails_inside_libnccl(nccl, call):
    with pytest.raises(nccl.NcclError) as info:  # a TypeError here would be a wrong argument
        call()
    assert info.value.status == NCCL_INVALID_ARGUMENT, str(info.value)


def test_minidl_dtypes_map_to_ncclh_types_of_the_same_width(nccl):
    for name, constant in comm._NCCL_TYPES.items():
        assert getattr(nccl, constant) == NCCL_H_TYPES[name], (name, constant)
    assert set(comm._NCCL_TYPES) == set(NCCL_H_TYPES)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_reaches_libnccl(null_world, nccl, dtype):
    _fails_inside_libnccl(nccl, lambda: null_world.allreduce_(_DeviceArray((3, 5), dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_reaches_libnccl(null_world, nccl, dtype, root):
    _fails_inside_libnccl(nccl, lambda: null_world.broadcast_(_DeviceArray((7,), dtype), root=root))


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_reaches_libnccl(null_world, nccl, dtype):
    _fails_inside_libnccl(nccl, lambda: null_world.allgather(_DeviceArray((2, 3), dtype)))


def test_the_check_catches_a_wrong_argument(null_world, nccl):
    """Calls like minidl's, but wrong, fail before libnccl: the tests above would see them."""
    x = _DeviceArray((4,), "float32")
    with pytest.raises(TypeError):  # the stream left out
        null_world.comm.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM)
    with pytest.raises(TypeError):  # the array passed where its pointer belongs
        null_world.comm.bcast(x, x.size, nccl.NCCL_FLOAT32, 0, 0)
    with pytest.raises(TypeError):  # allGather takes no reduction operation
        null_world.comm.allGather(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)


def test_a_dtype_nccl_lacks_is_minidls_error_before_the_binding(null_world):
    with pytest.raises(TypeError, match="NCCL has no type for bool"):
        null_world.allreduce_(_DeviceArray((3,), np.bool_))


def test_empty_arrays_make_no_nccl_call(null_world):
    empty = _DeviceArray((0,), "float32")
    assert null_world.allreduce_(empty) is empty
    assert null_world.broadcast_(empty) is empty
    assert null_world.allgather(empty).shape == (2, 0)


def test_start_up_reaches_libnccl(nccl, monkeypatch):
    """__init__'s get_unique_id() and NcclCommunicator(size, id, rank) are well formed: libnccl refuses only CUDA."""
    monkeypatch.setattr(backend, "cupy_module", _fake_cupy)
    monkeypatch.setattr(backend, "nccl", lambda: nccl)
    monkeypatch.setattr(comm, "_under_mpi_launcher", lambda: False)
    with pytest.raises(nccl.NcclError) as info:
        comm.NCCLComm()
    assert info.value.status == NCCL_UNHANDLED_CUDA_ERROR, str(info.value)


# ---------------------------------------------------------------- point to point and groups
@pytest.mark.parametrize("dtype", DTYPES)
def test_send_and_recv_reach_libnccl(null_world, nccl, dtype):
    _fails_inside_libnccl(nccl, lambda: null_world.send(_DeviceArray((2, 3), dtype), 1))
    _fails_inside_libnccl(nccl, lambda: null_world.recv_(_DeviceArray((2, 3), dtype), 1))


def test_a_wrong_send_fails_before_libnccl(null_world, nccl):
    x = _DeviceArray((4,), "float32")
    with pytest.raises(TypeError):  # the peer left out
        null_world.comm.send(x.data.ptr, x.size, nccl.NCCL_FLOAT32, 0)
    with pytest.raises(ValueError, match="cannot exchange with peer 0"):  # to itself: minidl's own error
        null_world.send(x, 0)


class _SubGroupMPI:
    """What NCCLComm reads of an MPI communicator of a 3-rank group, seen from the group's rank ``rank``:
    rank, size, and the broadcast that carries the unique id (recorded)."""

    def __init__(self, mpi_comm, rank=1):
        self.comm, self.rank, self.size, self.local_rank, self.local_size = self, rank, 3, 0, 1
        self.bcasts, self.origin = [], mpi_comm

    def bcast(self, obj, root):
        self.bcasts.append((obj, root))
        return obj if obj is not None else bytes(range(128))  # rank 0's id, as rank 1 receives it


@pytest.mark.parametrize("group_rank", [0, 1])
def test_split_makes_a_group_communicator_whose_id_goes_over_the_groups_mpi(nccl, null_world, monkeypatch,
                                                                              group_rank):
    """split: MPI_Comm_split, then NcclCommunicator(3, id, rank in the group) with the id broadcast by the
    group's rank 0 over the group's MPI communicator; libnccl refuses only for lack of CUDA."""
    splits, made, guarded = [], [], []
    null_world.mpi = types.SimpleNamespace(comm=types.SimpleNamespace(
        Split=lambda color, key: splits.append((color, key)) or "group's MPI communicator"),
        _guarded=guarded.append)  # the deadline-bounded barrier before MPI_Comm_split (see comm.MPIComm)
    null_world.rank, null_world.device_index = 2, 0

    def group_mpi(mpi_comm):
        made.append(_SubGroupMPI(mpi_comm, rank=group_rank))
        return made[-1]

    monkeypatch.setattr(backend, "cupy_module", _fake_cupy)
    monkeypatch.setattr(backend, "nccl", lambda: nccl)
    monkeypatch.setattr(comm, "MPIComm", group_mpi)
    with pytest.raises(nccl.NcclError) as info:
        null_world.split(5, key=group_rank)
    assert info.value.status == NCCL_UNHANDLED_CUDA_ERROR, str(info.value)
    assert splits == [(5, group_rank)]
    assert guarded == ["split"]
    (group,) = made
    assert group.origin == "group's MPI communicator"
    ((sent, root),) = group.bcasts
    assert root == 0 and (isinstance(sent, bytes) and len(sent) == 128) == (group_rank == 0)
    assert (sent is None) == (group_rank == 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_reaches_libnccl(null_world, nccl, dtype):
    _fails_inside_libnccl(nccl, lambda: null_world.reduce_scatter(_DeviceArray((6,), dtype)))


def test_reduce_scatter_needs_a_length_that_divides(null_world):
    with pytest.raises(ValueError, match=r"length divides by the 2 ranks; got shape \(5,\)"):
        null_world.reduce_scatter(_DeviceArray((5,), "float32"))


def test_sendrecv_reaches_libnccl_inside_a_group(null_world, nccl):
    """ncclGroupStart, then the send, which libnccl refuses for the NULL communicator (ncclGroupEnd follows)."""
    _fails_inside_libnccl(nccl, lambda: null_world.sendrecv_(_DeviceArray((3,), "float32"), 1,
                                                             _DeviceArray((3,), "float32"), 1))


def test_iallreduce_runs_on_a_side_stream_after_the_current_one(null_world, nccl):
    """The all-reduce is queued on a stream of its own that first waits for the current stream's work
    (an event), and its wait() makes the current stream wait for it; the call itself reaches libnccl."""
    calls = []

    class Event:
        def record(self, stream=None):
            calls.append(("record", stream.ptr))

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr = 17  # a side stream's handle, as libnccl receives it

        def wait_event(self, event):
            calls.append(("side waits", type(event).__name__))

    null_world.cp.cuda.Event, null_world.cp.cuda.Stream = Event, Stream
    _fails_inside_libnccl(nccl, lambda: null_world.iallreduce_(_DeviceArray((4,), "float32")))
    assert calls == [("record", 0), ("side waits", "Event")]  # recorded on the current stream (ptr 0)
    assert null_world._side_stream.ptr == 17


# ---------------------------------------------------------------- all-to-all (grouped ncclSend / ncclRecv)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_reaches_libnccl_inside_a_group(null_world, nccl, dtype):
    """ncclGroupStart, then the first ncclSend (bytes: NCCL_UINT8), refused for the NULL communicator."""
    _fails_inside_libnccl(nccl, lambda: null_world.all_to_all(_DeviceArray((2, 3), dtype)))


def test_all_to_all_v_reaches_libnccl_with_its_counts_given(null_world, nccl):
    _fails_inside_libnccl(nccl, lambda: null_world.all_to_all_v(_DeviceArray((5, 2), "float32"), [2, 3],
                                                                recv_counts=[1, 4]))


def test_all_to_all_needs_a_row_per_rank(null_world):
    with pytest.raises(ValueError, match=r"NCCLComm.all_to_all: all_to_all takes an array of shape \(2, \.\.\.\)"):
        null_world.all_to_all(_DeviceArray((3, 2), np.float32))
