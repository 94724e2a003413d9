"""The ``minidl`` command.

    minidl gradcheck            check every op's gradient against finite differences
    minidl train ...            train a model on bundled or local data
    minidl diagnose ...         the textbook's debugging recipe on a model
    minidl optimizers           every optimizer's trajectory on 2-D test functions
    minidl lr-find ...          the learning-rate range test
    minidl bench ...            the roofline: measured ceilings and where every op sits
    minidl predict RUN ...      apply a trained run (model and standardizer) to new inputs
    minidl selftest ...         check minidl on this GPU and measure it against PyTorch
    minidl --version

Each command's work lives in the module that owns the concept; this file
only parses arguments and imports that module when the command runs.
Every command that writes files writes them into one folder, ``--out``
(by default ``runs/<command>-<time>``), and prints where.
"""
from __future__ import annotations

import argparse
import difflib
import math
import sys


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


def gradcheck_command(args) -> int:
    """Check every op in minidl.op_cases; print a table; exit 1 if any fails."""
    from minidl.gradcheck import ADJOINT_ULPS, forward_mode_errors, max_relative_error
    from minidl.op_cases import cases

    rows, failed = [], 0
    every = cases(args.seed)
    asked = list(args.only or ()) + ([args.sweep] if args.sweep else [])
    unknown = [name for name in asked if name not in {c[0] for c in every}]
    if unknown:
        names = sorted({c[0] for c in every})
        for name in unknown:
            close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
            print(f"minidl gradcheck: error: no op case named {name!r}; "
                  + (f"the closest: {', '.join(close)}" if close else f"the op cases: {', '.join(names)}"),
                  file=sys.stderr)
        return 2
    if args.sweep:  # the error against the step for one op, drawn
        from minidl.gradcheck import sweep_op_case
        sweep, path = sweep_op_case(args.sweep, args.out, args.seed)
        print(f"{sweep}\nwrote {path}")
        return 0
    for name, fn, inputs in every:
        if args.only and name not in args.only:
            continue
        shapes = " ".join("x".join(map(str, x.shape)) or "()" for x in inputs)
        try:
            if args.adjoint:  # err: the tangent rules against central differences; the adjoint test in ulps
                ulps, err = forward_mode_errors(fn, inputs, eps=args.eps, seed=args.seed)
                ok = err <= args.tolerance and ulps <= ADJOINT_ULPS
                shapes = f"adjoint {ulps:5.2f} ulps  " + shapes
            else:
                err = max_relative_error(fn, inputs, eps=args.eps)
                ok = err <= args.tolerance
        except Exception as exc:  # an op that raises is a failure to report, not a crash
            err, ok = float("nan"), False
            shapes += f"  ({type(exc).__name__}: {exc})"
        failed += not ok
        rows.append((name, shapes, err, ok))
    width = max(len(r[0]) for r in rows)
    print(f"{'op':<{width}}  {'max rel. error':>14}  {'pass':<4}  inputs")
    for name, shapes, err, ok in rows:
        print(f"{name:<{width}}  {err:>14.2e}  {'yes' if ok else 'NO':<4}  {shapes}")
    print(f"\n{len(rows) - failed} passed, {failed} failed (float64 central differences, eps={args.eps:g}"
          + (f"; forward mode: J v from the tangent rules, and ⟨u, J v⟩ = ⟨Jᵀu, v⟩ to {ADJOINT_ULPS} ulps)"
             if args.adjoint else ")"))
    return 1 if failed else 0


def _add_gradcheck(sub):
    p = add_command(sub, "gradcheck", help="check every op's backward against finite differences",
                    description="Check every op's backward against float64 central finite differences and print "
                                "a table:\none row per op case (minidl.op_cases), its largest relative error, and "
                                "whether it passes.\nExits 1 if any op fails.")
    p.add_argument("--eps", type=float, default=1e-6, help="finite-difference step")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative error that passes")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--adjoint", action="store_true", help="check the tangent rules (forward mode) instead: J v "
                   "against central differences, and the adjoint test ⟨u, J v⟩ = ⟨Jᵀu, v⟩ against the backward")
    p.add_argument("--only", nargs="*", metavar="OP", help="check only these ops; an unknown name exits 2 with "
                   "the closest names (default: every op)")
    p.add_argument("--sweep", metavar="OP", help="instead of the table: draw OP's derivative error against the "
                   "step h (1e-1 to 1e-13) for central differences, Richardson and the complex step, with the "
                   "theory's lines, to OUT/sweep_OP.png")
    p.add_argument("--out", default=".", metavar="DIR", help="folder for the --sweep figure (default: here)")
    p.set_defaults(run=gradcheck_command)


def _add_optional_commands(sub):
    """Commands whose modules register themselves (train, diagnose, optimizers, lr-find, bench, predict, gpt, tune,
    selftest)."""
    for module_name in ("minidl.train.cli", "minidl.optim.cli", "minidl.roofline.cli", "minidl.train.predict",
                        "minidl.models.gpt_cli", "minidl.tune.cli", "minidl.selftest.cli"):
        try:
            module = __import__(module_name, fromlist=["add_commands"])
        except ImportError:
            continue
        module.add_commands(sub)


def build_parser() -> argparse.ArgumentParser:
    from minidl import __version__
    parser = argparse.ArgumentParser(prog="minidl", description="minidl: a deep-learning engine written to be read.\n"
                                     "Run 'minidl COMMAND --help' for a command's options.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"minidl {__version__}", help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands",
                                help="one of these; 'minidl COMMAND --help' for its options")
    _add_gradcheck(sub)
    _add_optional_commands(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    from minidl.train.run_folder import RunFolderError
    try:
        return args.run(args)
    except RunFolderError as exc:  # a folder in use, holding a run, or not writable: one line, before any work
        name = " ".join(filter(None, ("minidl", args.command, getattr(args, "gpt_command", None))))
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
