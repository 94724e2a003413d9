"""The ``minidl`` command.

    minidl gradcheck            check every op's gradient against finite differences
    minidl train ...            train a model on bundled or local data
    minidl diagnose ...         the textbook's debugging recipe on a model
    minidl optimizers           every optimizer's trajectory on 2-D test functions
    minidl lr-find ...          the learning-rate range test
    minidl bench ...            the roofline: measured ceilings and where every op sits
    minidl predict RUN ...      apply a trained run (model and standardizer) to new inputs
    minidl selftest ...         check minidl on this GPU and measure it against PyTorch
    minidl course ...           assignments cut from minidl's source: make, check, grade
    minidl plan ...             every parallel layout's predicted step time and memory; the one to use
    minidl --version

One module of this package per command (``minidl.cli.train``, ``.gpt``...),
each importing the library below it and nothing importing it; the shared
argument helpers are in :mod:`minidl.cli.args`. This file is the entry point
(``minidl`` and ``python -m minidl``): it imports every command module, so a
command that cannot be imported is an error, not a missing command.
Every command that writes files writes them into one folder, ``--out``
(by default ``runs/<command>-<time>``), and prints where.
"""
from __future__ import annotations

import argparse
import sys

from minidl.cli import bench, course, diagnose, gpt, gradcheck, optimizers, plan, predict, selftest, train, tune
from minidl.cli.args import HelpFormatter, default_out

__all__ = ["build_parser", "default_out", "main"]

# the order of ``minidl --help``
COMMANDS = (gradcheck, train, diagnose, optimizers, bench, predict, gpt, tune, selftest, course, plan)


def build_parser() -> argparse.ArgumentParser:
    from minidl import __version__
    parser = argparse.ArgumentParser(prog="minidl", description="minidl: a deep-learning engine written to be read.\n"
                                     "Run 'minidl COMMAND --help' for a command's options.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"minidl {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                help="one of these; 'minidl COMMAND --help' for its options")
    for command in COMMANDS:
        command.add_commands(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # to print the command that continues a run
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from minidl.train.run_folder import RunFolderError
    try:
        return args.run(args)
    except RunFolderError as exc:  # a folder in use, holding a run, or not writable: one line, before any work
        print(f"{_name(args)}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside training (which says more): one line, the shell's code for SIGINT
        print(f"{_name(args)}: stopped (Ctrl-C)", file=sys.stderr)
        return 130


def _name(args) -> str:
    return " ".join(filter(None, ("minidl", args.command, getattr(args, "gpt_command", None))))


if __name__ == "__main__":
    sys.exit(main())
