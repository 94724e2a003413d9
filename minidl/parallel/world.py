"""Joining the job: ``parallel.init`` picks the communicator once per process; ``get_world``, ``is_root``.

``minidl.parallel`` hands these names on; the modules of the package import
them from here.
"""
from __future__ import annotations

import sys
import traceback
import warnings

from minidl.parallel.comm import Communicator, LocalComm, MPIComm, NCCLComm, _under_mpi_launcher, nccl_available

__all__ = ["get_world", "init", "install_abort_on_exception", "is_initialized", "is_root", "leave"]

_BACKENDS = ("auto", "local", "mpi", "nccl")
_world: Communicator | None = None


def init(backend: str = "auto", device: str | None = None, abort_on_exception: bool = True) -> Communicator:
    """Join the job and return its communicator (the same one on every later call).

    ``backend``:
      - ``"auto"``: a world of one when the process was not started by mpiexec (or mpi4py is
        missing); otherwise NCCL when ``device`` is a GPU, or is not given and a GPU with NCCL
        is present, and MPI in every other case;
      - ``"local"``, ``"mpi"``, ``"nccl"``: that backend (``"nccl"`` without mpiexec is a
        world of one GPU that still runs every collective through NCCL).

    With more than one rank and ``abort_on_exception``, an uncaught exception on any rank
    prints its traceback with the rank's number and aborts the whole job at once (MPI_Abort),
    instead of leaving the other ranks waiting forever inside a collective.
    """
    global _world
    if backend not in _BACKENDS:
        raise ValueError(f"parallel.init: unknown backend {backend!r}; choose one of {', '.join(_BACKENDS)}")
    if _world is not None:
        if backend not in ("auto", _world.name):
            raise RuntimeError(f"parallel.init: already initialized with the {_world.name} backend; "
                               f"a process joins one job, once (asked for {backend!r})")
        return _world
    _world = _make_world(backend, device)
    if abort_on_exception and _world.size > 1:
        install_abort_on_exception(_world)
    return _world


def _make_world(backend: str, device) -> Communicator:
    if backend == "local":
        return LocalComm()
    if backend == "mpi":
        return MPIComm()
    if backend == "nccl":
        return NCCLComm()
    if not _under_mpi_launcher():
        return LocalComm()
    try:
        import mpi4py.MPI  # noqa: F401
    except ImportError:
        warnings.warn("parallel.init: this process was started by an MPI launcher but mpi4py is not "
                      "installed, so every rank trains alone on the whole data; pip install 'minidl[mpi]'",
                      RuntimeWarning, stacklevel=3)
        return LocalComm()
    wants_gpu = device is not None and str(device).startswith(("cuda", "gpu"))
    if wants_gpu or (device is None and nccl_available()):
        return NCCLComm()
    return MPIComm()


def get_world() -> Communicator:
    """The communicator from :func:`init`; a world of one if ``init`` has not been called."""
    return _world if _world is not None else LocalComm()


def is_initialized() -> bool:
    """True between :func:`init` and :func:`leave`."""
    return _world is not None


def leave() -> None:
    """Forget the communicator :func:`init` made (``minidl.distributed.destroy_process_group``): a later
    ``init`` makes a new one. MPI itself stays up until the process exits (it starts once per process)."""
    global _world
    _world = None


def is_root() -> bool:
    """True on rank 0 (and in a single process): the rank that logs, draws progress bars, saves."""
    return get_world().rank == 0


def install_abort_on_exception(comm: Communicator) -> None:
    """Make an uncaught exception on this rank end the whole job, naming the rank."""
    previous = sys.excepthook

    def abort_job(exc_type, exc, tb):
        if exc_type is SystemExit:  # an explicit exit is not an error to report
            previous(exc_type, exc, tb)
            return
        lines = traceback.format_exception(exc_type, exc, tb)
        prefix = f"[rank {comm.rank}] "
        sys.stderr.write(f"\nminidl.parallel: rank {comm.rank} of {comm.size} failed with an uncaught "
                         f"{exc_type.__name__}; aborting all {comm.size} ranks\n")
        sys.stderr.write("".join(prefix + line for text in lines for line in text.splitlines(True)))
        sys.stderr.flush()
        comm.abort(1)

    sys.excepthook = abort_job
