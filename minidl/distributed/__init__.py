"""``minidl.distributed``: PyTorch's ``torch.distributed`` names over minidl's communicators.

    import minidl.distributed as dist                # import torch.distributed as dist
    dist.init_process_group(backend="gloo")          # MPI on CPUs ("nccl": NCCL on GPUs)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(t, op=dist.ReduceOp.SUM)         # t (a Tensor) summed over the ranks, in place
    dist.destroy_process_group()

The processes are started by ``mpiexec`` (``mpiexec -n 4 python train.py``). A script written for
torchrun, which reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from its environment (nanoGPT's
``train.py``), runs as ``mpiexec -n 4 python -m minidl.distributed.run train.py``: that runner sets the
three variables from MPI's ranks, then runs the script. torchrun's variables without MPI work for a
world of one process only (minidl's collectives need MPI to start the job; NCCL gets its id through
MPI): ``WORLD_SIZE`` above 1 outside mpiexec is refused with the command to use instead.

Backends: ``"gloo"`` and ``"mpi"`` are minidl's MPI communicator, ``"nccl"`` its NCCL one, ``None``
the choice :func:`minidl.parallel.init` makes (NCCL when a GPU with NCCL is present). ``timeout=`` (a
``datetime.timedelta``) bounds every collective of the job (see :mod:`minidl.parallel.comm`).
"""
from __future__ import annotations

import os

import numpy as np

from minidl.parallel import world as _world_module
from minidl.parallel.comm import _under_mpi_launcher
from minidl.tensor import Tensor, mark_changed

__all__ = ["ReduceOp", "all_reduce", "barrier", "broadcast", "destroy_process_group", "get_rank", "get_world_size",
           "init_process_group", "is_available", "is_initialized"]

_BACKENDS = {None: "auto", "gloo": "mpi", "mpi": "mpi", "nccl": "nccl"}


class ReduceOp:
    """The reductions :func:`all_reduce` offers (PyTorch's names)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


_REDUCTIONS = {ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min, ReduceOp.MAX: np.max}


def is_available() -> bool:
    """Always True: minidl's process groups are MPI or NCCL (a world of one needs neither)."""
    return True


def init_process_group(backend: str | None = None, init_method: str | None = None, timeout=None,
                       world_size: int = -1, rank: int = -1, **unused) -> None:
    """Join the job: this process's rank and the world's size come from mpiexec (or, for one process,
    from torchrun's ``RANK``/``WORLD_SIZE``, or nothing at all).

    ``timeout`` (a ``datetime.timedelta`` or seconds) is how long any collective may wait for the
    other ranks before the whole job ends (default: ``MINIDL_COLLECTIVE_TIMEOUT`` or 30 minutes).
    ``init_method`` (a rendezvous address) is not needed under mpiexec and is ignored.
    """
    if backend is not None and str(backend).lower() not in _BACKENDS:
        raise ValueError(f"init_process_group: unknown backend {backend!r}; minidl offers 'gloo' or 'mpi' (its MPI "
                         "communicator, on CPU arrays) and 'nccl' (NCCL through CuPy, on GPU arrays)")
    if _world_module.is_initialized():
        raise RuntimeError("init_process_group: trying to initialize the default process group twice; "
                           "call destroy_process_group() first")
    env_size = _env_int("WORLD_SIZE")
    env_rank = _env_int("RANK")
    expected_size = world_size if world_size != -1 else env_size
    expected_rank = rank if rank != -1 else env_rank
    choice = _BACKENDS[None if backend is None else str(backend).lower()]
    if choice == "auto" and not _under_mpi_launcher():
        choice = "local"
    comm = _world_module.init(choice)
    if expected_size is not None and expected_size > 1 and comm.size == 1:
        _world_module.leave()
        raise RuntimeError(
            f"init_process_group: WORLD_SIZE={expected_size} (torchrun's variables), but this process was not "
            "started by mpiexec; minidl's collectives need MPI to start a job of several processes. Run "
            f"mpiexec -n {expected_size} python -m minidl.distributed.run SCRIPT [ARGS] (it sets RANK, WORLD_SIZE "
            "and LOCAL_RANK from MPI's ranks); without MPI only a world of one process works")
    for name, wanted, got in (("world size", expected_size, comm.size), ("rank", expected_rank, comm.rank)):
        if wanted is not None and wanted != got:
            _world_module.leave()
            raise RuntimeError(f"init_process_group: the {name} given ({wanted}, from the arguments or the RANK/"
                               f"WORLD_SIZE variables) differs from the job's ({got}, from mpiexec); start the "
                               "script with mpiexec -n N python -m minidl.distributed.run, which sets them")
    if timeout is not None:
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
        comm.set_timeout(seconds)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"init_process_group: the environment variable {name}={value!r} is not an integer") from None


def is_initialized() -> bool:
    """True between :func:`init_process_group` and :func:`destroy_process_group`."""
    return _world_module.is_initialized()


def _group(owner: str, group=None):
    if group is not None:
        return group
    if not _world_module.is_initialized():
        raise RuntimeError(f"{owner}: the default process group has not been initialized; "
                           "call minidl.distributed.init_process_group() first")
    return _world_module.get_world()


def get_rank(group=None) -> int:
    """This process's rank in [0, world size)."""
    return _group("get_rank", group).rank


def get_world_size(group=None) -> int:
    """The number of processes in the job."""
    return _group("get_world_size", group).size


def barrier(group=None) -> None:
    """Wait until every rank arrives."""
    _group("barrier", group).barrier()


class _Done:
    """What ``async_op=True`` returns: the operation has finished by the time it is returned."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _array_of(owner: str, tensor):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{owner}: expected a minidl Tensor, got {type(tensor).__name__}")
    return tensor.array


def all_reduce(tensor, op: str = ReduceOp.SUM, group=None, async_op: bool = False):
    """Replace ``tensor`` (on every rank) by the reduction of every rank's ``tensor``, in place.

    SUM and AVG are one all-reduce; PRODUCT, MIN and MAX gather every rank's copy and reduce it here
    (``size`` times the bytes: meant for small tensors such as flags and counts).
    """
    comm = _group("all_reduce", group)
    array = _array_of("all_reduce", tensor)
    if op not in (ReduceOp.SUM, ReduceOp.AVG) and op not in _REDUCTIONS:
        raise ValueError(f"all_reduce: unknown op {op!r}; use ReduceOp.SUM, AVG, PRODUCT, MIN or MAX")
    work = array if array.flags.c_contiguous else array.copy()
    if op in (ReduceOp.SUM, ReduceOp.AVG):
        comm.allreduce_(work)
        if op == ReduceOp.AVG:
            if work.dtype.kind not in "fc":
                raise TypeError(f"all_reduce: ReduceOp.AVG needs a floating tensor, got {work.dtype}; "
                                "use SUM and divide, or cast first")
            work /= comm.size
    else:
        gathered = comm.allgather(work)
        work = _REDUCTIONS[op](gathered, axis=0) if isinstance(gathered, np.ndarray) else \
            getattr(gathered, {ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}[op])(axis=0)
    if work is not array:
        array[...] = work
    mark_changed(tensor)
    return _Done() if async_op else None


def broadcast(tensor, src: int = 0, group=None, async_op: bool = False):
    """Overwrite ``tensor`` on every rank with rank ``src``'s values, in place."""
    comm = _group("broadcast", group)
    array = _array_of("broadcast", tensor)
    work = array if array.flags.c_contiguous else array.copy()
    comm.broadcast_(work, src)
    if work is not array:
        array[...] = work
    mark_changed(tensor)
    return _Done() if async_op else None


def destroy_process_group(group=None) -> None:
    """Leave the job: :func:`is_initialized` is False afterwards (MPI itself ends with the process)."""
    _group("destroy_process_group", group).synchronize()
    _world_module.leave()
