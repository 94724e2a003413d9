"""What every ``minidl`` command shares: the help formatter, the output folder, argument types.

Every command module of :mod:`minidl.cli` takes these from here; nothing else
in the package is shared between commands.
"""
from __future__ import annotations

import argparse
import math
import os


# ---------------------------------------------------------------- help and output folders shared by every command
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (line breaks kept); each option's default appended to its help.

    The default is added as ``(default: X)`` unless the help already says what
    the default is (the word "default") or there is nothing to show (a flag
    that is off unless given, an option whose default is None).
    """

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default == argparse.SUPPRESS
                or not action.option_strings or action.nargs == 0):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else f"{default:g}" \
            if isinstance(default, float) else str(default)
        return f"{text} (default: {shown})"


def add_command(subparsers, name: str, help: str, description: str | None = None):  # noqa: A002 - argparse's name
    """A subcommand parser with the shared formatter: ``help`` one line for ``minidl --help``."""
    return subparsers.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".",
                                 formatter_class=HelpFormatter)


def default_out(command: str, now=None) -> str:
    """Create ``runs/<command>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when taken) and return its name.

    The name is taken with an atomic ``mkdir``: see :mod:`minidl.train.run_folder`.
    """
    from minidl.train.run_folder import default_name
    return default_name(command, now=now)


def out_folder(command: str, given: str | None, overwrite: bool = False, run_files=()):
    """The folder a command writes into (``given``, or a new ``runs/<command>-<time>``), claimed; printed once.

    Returns a :class:`~minidl.train.run_folder.RunFolder` (its ``path``; locked until released, use it in a
    ``with`` block). A folder that holds one of ``run_files`` is refused unless ``overwrite``; a folder in
    use by another run, or one that cannot be written, raises RunFolderError (``main`` prints it in one line).
    """
    from minidl.train.run_folder import claim
    folder = claim(command, given, overwrite=overwrite, run_files=run_files)
    print(f"writing to {folder.path}/", flush=True)
    return folder


def add_overwrite(parser) -> None:
    """The ``--overwrite`` flag of every command that writes a run folder."""
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds an earlier run's files, removing them first "
                             "(default: such a folder is refused)")


# ---------------------------------------------------------------- argument types shared by every command
def positive_int(text):
    """argparse type: an integer ≥ 1, with a message that says what was wrong."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer (at least 1), got {value}")
    return value


def positive_float(text):
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def nonnegative_float(text):
    """argparse type: a number ≥ 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def data_spec(text):
    """argparse type: the ``--data`` of ``minidl train`` and ``diagnose``: digits, spirals or mnist:PATH."""
    if text in ("digits", "spirals") or (text.startswith("mnist:") and len(text) > len("mnist:")):
        return text
    raise argparse.ArgumentTypeError(f"expected digits, spirals or mnist:PATH (a folder with the MNIST IDX "
                                     f"files), got {text!r}")


def continue_command(argv, folder: str, ranks: int = 1) -> str:
    """The command line that continues an interrupted run: ``argv`` (the words after ``minidl``) without its
    ``--resume``, ``--out`` and ``--overwrite``, then ``--resume folder``; under mpiexec when ``ranks`` > 1."""
    import shlex
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word in ("--resume", "--out"):
            skip = True
        elif word == "--overwrite" or word.startswith(("--resume=", "--out=")):
            continue
        else:
            words.append(word)
    start = ["minidl"] if ranks <= 1 else ["mpiexec", "-n", str(ranks), "python", "-m", "mpi4py", "-m", "minidl"]
    return shlex.join(start + words + ["--resume", folder])


def interrupted_line(name: str, interrupted, argv, folder: str, ranks: int = 1) -> str:
    """The one line a command prints when Ctrl-C stopped its training (``interrupted``: a TrainingInterrupted):
    where the last checkpoint is and the exact command that continues from it."""
    if interrupted.checkpoint is None:
        again = continue_command(argv, folder, ranks).rsplit(" --resume ", 1)[0] + " --out " + folder + " --overwrite"
        return (f"{name}: stopped (Ctrl-C) at step {interrupted.step}, before the first checkpoint: nothing to "
                f"resume; start again with: {again}")
    # --resume FOLDER reads the folder's last.safetensors; a newer checkpoint of another name (best.safetensors,
    # written just before Ctrl-C landed) is named itself
    target = interrupted.checkpoint
    if os.path.basename(target) == "last.safetensors":
        target = os.path.dirname(target) or "."
    return (f"{name}: stopped (Ctrl-C) at step {interrupted.step}; the last checkpoint is {interrupted.checkpoint} "
            f"(step {interrupted.checkpoint_step}); continue with: {continue_command(argv, target, ranks)}")
