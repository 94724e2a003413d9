"""A world of N ranks as N threads of one process, talking through queues: the ring's test bench.

:class:`ThreadComm` is a :class:`minidl.parallel.comm.Communicator` with the
point-to-point calls only (``send``, ``recv_``, ``sendrecv_``), so code written
for MPI ranks runs here unchanged, and a ring that waits for a message nobody
sends is reported, with the ranks that wait, instead of hanging. Each rank counts
the bytes it sends.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from minidl.parallel.comm import Communicator

from .core import Mismatch


class Deadlock(RuntimeError):
    """A rank waited for a message that never came."""


class ThreadComm(Communicator):
    """Rank ``rank`` of a world of ``size`` threads; messages are copied into per-pair queues."""

    name = "threads"

    def __init__(self, rank: int, size: int, boxes: dict, timeout: float, failed: threading.Event | None = None):
        self.rank, self.size, self._boxes, self._timeout = rank, size, boxes, timeout
        self._failed = failed or threading.Event()  # set when any rank raised: the others stop waiting
        self.sent_bytes = 0

    def send(self, array, dest: int) -> None:
        self._check_peer("send", dest)
        message = np.array(array, copy=True)
        self.sent_bytes += message.nbytes
        self._boxes[self.rank, dest].put(message)

    def recv_(self, array, source: int):
        self._check_peer("recv_", source)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                message = self._boxes[source, self.rank].get(timeout=0.05)
                break
            except queue.Empty:
                if self._failed.is_set():
                    raise Deadlock(f"rank {self.rank} stopped waiting for rank {source}: another rank failed") \
                        from None
                if time.monotonic() > deadline:
                    raise Deadlock(f"rank {self.rank} waited {self._timeout:g} s for a message from rank {source} "
                                   "that never came") from None
        if message.shape != np.shape(array):
            raise ValueError(f"rank {self.rank} received {message.shape} values from rank {source} into a buffer of "
                             f"shape {np.shape(array)}: the two ranks disagree about which chunk this step moves")
        array[...] = message
        return array

    def sendrecv_(self, send_array, dest: int, recv_array, source: int):
        self.send(send_array, dest)
        return self.recv_(recv_array, source)

    def allreduce_(self, array):
        raise NotImplementedError("ThreadComm has no all-reduce of its own: build it from sendrecv_ "
                                  "(that is the assignment)")


def run_ranks(size: int, work, timeout: float = 3.0) -> tuple:
    """Run ``work(comm)`` on ``size`` thread ranks; return (the results by rank, the comms).

    An exception on any rank is raised again here, naming the rank; a rank still running
    after ``timeout`` seconds (plus a margin) is reported as a Mismatch.
    """
    boxes = {(a, b): queue.Queue() for a in range(size) for b in range(size) if a != b}
    failed = threading.Event()
    comms = [ThreadComm(r, size, boxes, timeout, failed) for r in range(size)]
    results, errors = [None] * size, [None] * size

    def body(r):
        try:
            results[r] = work(comms[r])
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors[r] = exc
            failed.set()
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 2.0)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise Mismatch(f"rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} did not finish: "
                       "a rank waits for a message another never sends")
    first = [r for r, exc in enumerate(errors) if exc is not None and not isinstance(exc, Deadlock)]
    for r in first + [r for r, exc in enumerate(errors) if isinstance(exc, Deadlock)]:  # the cause first
        exc = errors[r]
        if exc is not None:
            if isinstance(exc, Mismatch):
                raise exc
            try:
                again = type(exc)(f"on rank {r} of {size}: {exc}")
            except Exception:  # noqa: BLE001 - an exception type that takes other arguments: as it was
                raise exc from None
            raise again from exc
    return results, comms
