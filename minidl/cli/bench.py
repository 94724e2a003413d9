"""``minidl bench``: measure this machine's roofline and place every op on it.

    minidl bench                     full sizes on the CPU (a few minutes on 2 cores)
    minidl bench --quick             small sizes, seconds: a smoke run
    minidl bench --device cuda       on the GPU, with CuPy (and PyTorch on the GPU, where installed)
    minidl bench --out DIR           where <machine>.json and the PNGs go (default runs/bench-<time>)
    minidl bench --only linear relu  time only these ops

The machine's name in the file names is $MINIDL_MACHINE, or the host name.
"""
from __future__ import annotations

import sys

from minidl.cli.args import add_command, add_overwrite, out_folder
from minidl.train.run_folder import write_failure


def bench_command(args) -> int:
    from minidl import backend
    from minidl.roofline import suite
    if args.device == "cuda" and not backend.gpu_available():
        print("minidl bench: --device cuda needs CuPy and a CUDA GPU, and none is usable here; "
              "run with --device cpu")
        return 2
    frameworks = tuple(f for f in suite.FRAMEWORKS if f not in (args.skip or ()))
    results = suite.results_name(args.device, args.quick, args.machine) + ".json"
    with out_folder("bench", args.out, overwrite=args.overwrite, run_files=(results,)) as out:
        try:
            suite.run(args.device, quick=args.quick, out_dir=out.path, machine=args.machine, frameworks=frameworks,
                      only=set(args.only) if args.only else None)
        except OSError as exc:  # a full disk: one line
            print(write_failure("bench", exc), file=sys.stderr)
            return 2
    return 0


def add_commands(subparsers) -> None:
    p = add_command(subparsers, "bench", help="the roofline: measured ceilings and where every op sits",
                    description="Measure this machine's roofline (peak FLOP/s of a large matrix product, memory "
                                "bandwidth, in-cache bandwidth)\nand time every op forward and backward, beside "
                                "NumPy and PyTorch where installed;\nprint a table, write <machine>.json and "
                                "three PNGs into --out.\nThe machine's name is $MINIDL_MACHINE, or the host name.")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu, or cuda (needs CuPy and a GPU)")
    p.add_argument("--quick", action="store_true", help="small sizes: seconds instead of minutes")
    p.add_argument("--out", help="folder for the JSON and PNGs (default: runs/bench-<time>)")
    add_overwrite(p)
    p.add_argument("--machine", default=None, help="name for the results files (default: $MINIDL_MACHINE or host)")
    p.add_argument("--skip", nargs="*", choices=("numpy", "torch"),
                   help="frameworks to leave out (default: none; torch is left out when not installed)")
    p.add_argument("--only", nargs="*", metavar="OP",
                   help="time only these ops: matmul, linear, relu, ... (default: every op)")
    p.set_defaults(run=bench_command)
