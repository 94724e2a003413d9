"""A run folder belongs to one run: claimed, locked, checked for writing, released.

    with run_folder.claim("train", args.out, default="train-digits-mlp", resume=args.resume,
                          overwrite=args.overwrite, run_files=RUN_FILES) as folder:
        ...                                    # write into folder.path for the run's whole lifetime
    # a RunFolderError (one line) when the folder is in use, holds a run, or cannot be written

Every command that writes a folder of results (``minidl train``, ``gpt train``,
``tune``, ``predict``, ``optimizers``, ``lr-find``, ``bench``) takes it
through :func:`claim`, which applies four rules:

1. **One run at a time.** The folder's lock file ``.lock`` is locked with
   ``fcntl.flock`` for the run's lifetime and holds the run's process id. A
   second run into the same folder finds it locked and is refused, naming the
   folder and that process. The kernel drops the lock when the process ends,
   however it ends (a crash or ``kill -9`` leaves no stale lock); the file
   itself stays, since removing a lock file while another process may be
   opening it would let two runs lock two different files.
2. **A finished run is not overwritten by accident.** A folder that holds any
   of the command's run files is refused unless the run is resumed
   (``--resume``: it continues there) or ``--overwrite`` is given, which
   removes those files (only those: anything else in the folder stays) before
   the new run starts.
3. **Default names never collide.** Without ``--out`` the folder is
   ``runs/<name>-<time>``, taken with an atomic ``os.mkdir`` (no
   ``exist_ok``): of two runs started in the same second, one gets the name
   and the other retries with ``-2``, ``-3``...
4. **Writing is checked before the work starts.** A probe file is created
   and removed, so a read-only folder, or a parent that cannot be created
   (a file in the way, no permission), is refused at once instead of after
   the first epoch.

A write that fails during the run (a full disk) is an ``OSError`` whose
``filename`` names the file (``minidl.save`` adds it when the operating
system did not); :func:`write_failure` turns it into the one line a command
prints before it exits with status 2. The files written before stay whole:
every checkpoint is written to a temporary file and renamed.
"""
from __future__ import annotations

import datetime
import errno as errno_codes
import os
import shutil

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; the other rules still hold
    fcntl = None

__all__ = ["RunFolder", "RunFolderError", "claim", "default_name", "resume_checkpoint", "write_failure"]

LOCK_NAME = ".lock"


class RunFolderError(ValueError):
    """A run folder that this run may not use; the message is one line that says why and what to do."""


def resume_checkpoint(given: str, checkpoint: str = "last.safetensors") -> str:
    """The checkpoint file ``--resume`` names: ``given`` itself, or its ``checkpoint`` when it is a run folder.

    A folder without that file is a FileNotFoundError that says what the folder holds and what to pass.
    """
    path = os.fspath(given)
    if not os.path.isdir(path):
        return path
    inside = os.path.join(path, checkpoint)
    if os.path.lexists(inside):
        return inside
    held = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    raise FileNotFoundError(
        f"the run folder {path} has no {checkpoint} (the checkpoint written at each validation or epoch end"
        + (f"; it holds {', '.join(held)}" if held else ", and it holds no .safetensors file")
        + "): pass the checkpoint file itself, or start the run again")


class RunFolder:
    """A claimed run folder: ``path``, and the lock held until :meth:`release` (or the ``with`` block ends)."""

    def __init__(self, path: str, lock_file):
        self.path, self._lock = path, lock_file

    def release(self) -> None:
        """Unlock the folder (closing the lock file drops the ``flock``); safe to call twice."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()

    def __repr__(self):
        return f"RunFolder({self.path!r}, {'locked' if self._lock is not None else 'released'})"


def default_name(base: str, parent: str = "runs", now=None, stamped: bool = True) -> str:
    """Create and return ``parent/<base>-<YYYYmmdd-HHMMSS>``, or ``...-2``, ``-3``... if that is taken.

    ``stamped=False`` leaves the time out (``runs/gpt``, then ``runs/gpt-2``...). Each name is
    taken with ``os.mkdir``, which fails when the folder exists, so two runs started together
    never share one.
    """
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    first = os.path.join(parent, f"{base}-{stamp}" if stamped else base)
    _make_parents(first)
    n = 1
    while True:
        folder = first if n == 1 else f"{first}-{n}"
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            n += 1
        except OSError as exc:
            raise RunFolderError(f"cannot create the run folder {folder}: {_reason(exc)}") from None


def claim(command: str, given: str | None, default: str | None = None, *, resume: bool = False,
          overwrite: bool = False, run_files=(), stamped: bool = True) -> RunFolder:
    """Take the folder ``given`` (or a new ``runs/<default>-<time>``) for one run of ``command``.

    ``run_files``: the names the command writes; a folder holding any of them
    holds a run, refused unless ``resume`` or ``overwrite`` (which removes
    them first). ``stamped=False``: the default folder is ``runs/<default>`` (then ``-2``...).
    Raises :class:`RunFolderError` with a one-line message.
    """
    if resume and overwrite:
        raise RunFolderError("--overwrite starts the run again and --resume continues it: give one of them")
    path = given if given is not None else default_name(default or command, stamped=stamped)
    if given is not None:
        _make_parents(os.path.join(path, LOCK_NAME))
    lock = _lock(path)
    try:
        present = [name for name in run_files if os.path.lexists(os.path.join(path, name))]
        if present and not (resume or overwrite):
            raise RunFolderError(
                f"{path} already holds a run ({', '.join(present)}); continue it with --resume, start it "
                "again with --overwrite (its files are removed), or choose another --out")
        _check_writable(path)
        if overwrite:
            for name in present:
                _remove(os.path.join(path, name))
    except BaseException:
        lock.close()
        raise
    return RunFolder(path, lock)


def write_failure(command: str, exc: OSError) -> str:
    """The one line a command prints when a write of its run fails (a full disk, a folder made read-only)."""
    where = exc.filename if exc.filename is not None else "a file of the run"
    return (f"minidl {command}: error: cannot write {where}: {_reason(exc)}; the files written before it "
            "are kept, whole (a checkpoint is written to a temporary file, then renamed)")


# ---------------------------------------------------------------- helpers
def _reason(exc: OSError) -> str:
    """``No space left on device (errno 28, ENOSPC)``: the text and the code of an OSError."""
    code = exc.errno
    text = exc.strerror or (os.strerror(code) if code else str(exc))
    name = errno_codes.errorcode.get(code) if code else None
    return f"{text} (errno {code}, {name})" if name else text


def _make_parents(path: str) -> None:
    folder = os.path.dirname(path)
    if folder:
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise RunFolderError(f"cannot create the run folder {folder}: {_reason(exc)}") from None


def _lock(path: str):
    """The folder's lock file, opened and locked (and holding this process's id), or a RunFolderError."""
    lock_path = os.path.join(path, LOCK_NAME)
    try:
        lock = open(lock_path, "a+", encoding="utf-8")
    except OSError as exc:
        raise RunFolderError(f"cannot write to the run folder {path}: {_reason(exc)}") from None
    if fcntl is not None:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            if exc.errno in (errno_codes.EAGAIN, errno_codes.EWOULDBLOCK, errno_codes.EACCES):
                raise RunFolderError(f"{path} is in use by another run (process {holder}); wait for it to end, "
                                     "or choose another --out") from None
            raise RunFolderError(f"cannot lock the run folder {path}: {_reason(exc)}") from None
    try:
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
    except OSError as exc:
        lock.close()
        raise RunFolderError(f"cannot write to the run folder {path}: {_reason(exc)}") from None
    return lock


def _check_writable(path: str) -> None:
    """Create and remove a probe file in ``path``: a read-only folder is found before the run starts."""
    probe = os.path.join(path, f".write-check-{os.getpid()}")
    try:
        with open(probe, "w", encoding="utf-8") as f:
            f.write("minidl\n")
        os.remove(probe)
    except OSError as exc:
        raise RunFolderError(f"cannot write to the run folder {path}: {_reason(exc)}") from None


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except OSError as exc:
        raise RunFolderError(f"--overwrite: cannot remove {path}: {_reason(exc)}") from None
