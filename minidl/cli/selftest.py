"""``minidl selftest``: does minidl work on this GPU, and how fast?

    minidl selftest                    every stage on cuda:0, results in runs/selftest-<time>/
    minidl selftest --quick            small sizes: a smoke run of the command itself
    minidl selftest --out DIR          where selftest.json, summary.txt and the PNGs go
    minidl selftest --only parity nccl run only these stages

Exits 0 when every stage passed, 1 when one failed or ran out of time, 2 when
there is no usable GPU (one line says what is missing).
"""
from __future__ import annotations

import sys

from minidl.cli.args import add_command, add_overwrite, out_folder


def selftest_command(args) -> int:
    from minidl import selftest
    from minidl.selftest import report
    try:
        selftest.check_device(args.device)
    except selftest.Unavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    limits = dict(args.limit or ())
    with out_folder("selftest", args.out, overwrite=args.overwrite, run_files=report.RESULT_FILES) as out:
        results = selftest.run(args.device, out=out.path, quick=args.quick,
                               only=set(args.only) if args.only else None, limits=limits)
    return 0 if results["passed"] else 1


def _limit(text):
    """argparse type: ``STAGE=SECONDS`` with a known stage and a positive number of seconds."""
    import argparse

    from minidl.selftest import STAGES
    names = [name for name, _, _ in STAGES]
    name, _, seconds = text.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = 0.0
    if name not in names or not value > 0:
        raise argparse.ArgumentTypeError(f"expected STAGE=SECONDS with STAGE one of {', '.join(names)} and "
                                         f"SECONDS > 0 (parity=90), got {text!r}")
    return name, value


def add_commands(subparsers) -> None:
    from minidl.selftest import STAGES
    names = [name for name, _, _ in STAGES]
    p = add_command(subparsers, "selftest", help="check minidl on this GPU and measure it against PyTorch",
                    description="Prove minidl on a GPU in one command, stage by stage, each under its own time "
                                "limit:\n" + "\n".join(f"  {name:<12} {full:>4} s ({quick} s with --quick)"
                                                       for name, full, quick in STAGES)
                                + "\nA failed stage never stops the rest. Writes selftest.json, summary.txt and "
                                  "two PNGs into --out.\nExits 0 if every stage passed, 1 if one failed, 2 if "
                                  "there is no usable GPU.")
    p.add_argument("--device", default="cuda", help="the GPU to check: cuda or cuda:N")
    p.add_argument("--out", help="folder for the results (default: runs/selftest-<time>)")
    add_overwrite(p)
    p.add_argument("--quick", action="store_true", help="small sizes: tests the command, not the GPU's speed")
    p.add_argument("--only", nargs="*", choices=names, metavar="STAGE",
                   help=f"run only these stages ({', '.join(names)}; default: all)")
    p.add_argument("--limit", nargs="*", type=_limit, metavar="STAGE=SECONDS",
                   help="change a stage's time limit (default: the table above)")
    p.set_defaults(run=selftest_command)
