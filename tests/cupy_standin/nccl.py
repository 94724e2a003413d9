"""cupy.cuda.nccl on the stand-in: a world of ONE rank, whose collectives copy bytes as libnccl's would.

With one rank every collective has a known result: all-reduce and reduce-scatter (sums over one rank)
and all-gather copy the input into the output, broadcast leaves the buffer as it is, and a send to
oneself is received, inside one group, by the receive posted with it. This module does exactly that,
on the device pointers CuPy hands libnccl (the stand-in's arrays are NumPy memory, so a pointer is a
host address), with the element size of each NCCL dtype from ``nccl.h``; a communicator of several
ranks is refused, as is a send with no matching receive (libnccl would wait forever). So the
selftest's NCCL stage runs on the stand-in through minidl's own ``NCCLComm``, and a wrong count, dtype
or pointer in minidl changes the bytes it checks.

The default stand-in has no NCCL (``cuda.nccl.available`` is False: data parallelism runs on the local
communicator there); the tests that want this one put it in place (``tests/test_selftest.py``).
"""
from __future__ import annotations

import ctypes

available = True

# ncclDataType_t and ncclRedOp_t of nccl.h (the values CuPy's binding exposes under these names)
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64 = 0, 1, 2, 3, 4, 5
NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_SUM = 0
_ITEMSIZE = {NCCL_INT8: 1, NCCL_UINT8: 1, NCCL_INT32: 4, NCCL_UINT32: 4, NCCL_INT64: 8, NCCL_UINT64: 8,
             NCCL_FLOAT16: 2, NCCL_FLOAT32: 4, NCCL_FLOAT64: 8}


class NcclError(RuntimeError):
    """cupy.cuda.nccl.NcclError."""


def get_unique_id():
    return (0,) * 128


_group = []  # the sends and receives posted since groupStart(), run at groupEnd()
_depth = [0]


def groupStart():  # noqa: N802 - CuPy's name
    _depth[0] += 1


def groupEnd():  # noqa: N802 - CuPy's name
    _depth[0] -= 1
    if _depth[0] == 0:
        sends = [call for call in _group if call[0] == "send"]
        receives = [call for call in _group if call[0] == "recv"]
        _group.clear()
        if len(sends) != len(receives):
            raise NcclError("ncclInvalidUsage: a send to oneself needs the matching receive in the same group")
        for (_, source, count, dtype), (_, target, count_in, dtype_in) in zip(sends, receives):
            if (count, dtype) != (count_in, dtype_in):
                raise NcclError("ncclInvalidUsage: the send and the receive differ in count or dtype")
            _copy(target, source, count, dtype)


def _copy(target, source, count, dtype):
    ctypes.memmove(int(target), int(source), int(count) * _ITEMSIZE[dtype])


class NcclCommunicator:
    """A communicator of one rank (``NcclCommunicator(1, id, 0)``)."""

    def __init__(self, ndev, commId, rank):  # noqa: N803 - CuPy's names
        if (ndev, rank) != (1, 0):
            raise NcclError(f"the stand-in's NCCL has one rank; asked for rank {rank} of {ndev}")
        self.comm = 1

    def _check(self, dtype, peer=0):
        if dtype not in _ITEMSIZE:
            raise NcclError(f"ncclInvalidArgument: dtype {dtype!r}")
        if peer != 0:
            raise NcclError(f"ncclInvalidArgument: peer {peer} in a world of one")

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        self._check(datatype)
        _copy(recvbuf, sendbuf, count, datatype)

    def bcast(self, buff, count, datatype, root, stream):
        self._check(datatype, root)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._check(datatype)
        _copy(recvbuf, sendbuf, count, datatype)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        self._check(datatype)
        _copy(recvbuf, sendbuf, recvcount, datatype)

    def send(self, sendbuf, count, datatype, peer, stream):
        self._check(datatype, peer)
        if _depth[0] == 0:
            raise NcclError("a send to oneself outside a group waits forever for its receive")
        _group.append(("send", sendbuf, count, datatype))

    def recv(self, recvbuf, count, datatype, peer, stream):
        self._check(datatype, peer)
        if _depth[0] == 0:
            raise NcclError("a receive from oneself outside a group waits forever for its send")
        _group.append(("recv", recvbuf, count, datatype))

    def abort(self):
        pass
