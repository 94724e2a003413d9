"""``python -m minidl.distributed.run SCRIPT [ARGS]``: run a torchrun-style script under mpiexec.

    mpiexec -n 4 python -m minidl.distributed.run train.py --batch_size=8
    mpiexec -n 4 python -m minidl.distributed.run -m my_package.train

PyTorch's ``torchrun`` starts the processes and tells each who it is through ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; scripts such as nanoGPT's ``train.py`` read
them before ``init_process_group``. Here mpiexec starts the processes, and this runner sets those
four variables from the MPI job (Open MPI's ``OMPI_COMM_WORLD_*``, MPICH's ``PMI_*``, or MPI itself)
before running the script as ``__main__``, with ``sys.argv`` as the script would see it.
"""
from __future__ import annotations

import os
import runpy
import sys

# (rank, size, local rank, local size) as each launcher names them
_LAUNCHERS = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE"),
              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"))

USAGE = "usage: mpiexec -n N python -m minidl.distributed.run SCRIPT [ARGS]   (or -m MODULE [ARGS])"


def job_variables() -> dict:
    """torchrun's four variables for this process, from the launcher's environment (or MPI, or a world of one)."""
    for names in _LAUNCHERS:
        if all(name in os.environ for name in names):
            rank, size, local_rank, local_size = (os.environ[name] for name in names)
            break
    else:
        from minidl.parallel.comm import MPIComm, _under_mpi_launcher
        if _under_mpi_launcher():
            comm = MPIComm()
            rank, size, local_rank, local_size = comm.rank, comm.size, comm.local_rank, comm.local_size
        else:
            rank, size, local_rank, local_size = 0, 1, 0, 1
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size)}


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0 if argv else 2)
    os.environ.update(job_variables())
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit(f"minidl.distributed.run: -m needs a module name\n{USAGE}")
        sys.argv[:] = [argv[1]] + argv[2:]  # the module's arguments, as `python -m MODULE ARGS` gives them
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.isfile(script):
        raise SystemExit(f"minidl.distributed.run: no such script {script!r}\n{USAGE}")
    sys.argv[:] = argv  # the script's arguments, as `python SCRIPT ARGS` gives them (runpy sets only argv[0])
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
