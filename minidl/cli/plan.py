"""``minidl plan``: which layout for this model on this machine? Every layout predicted, ranked, one recommended.

    minidl plan --model gpt --layers 4 --width 128 --heads 4 --context 128 --batch 32 \\
                --devices 4 --memory 16GB --bandwidth 25GB/s --latency 10us --flops 100TFLOP/s
    minidl plan --model mlp --sizes 784,512,512,10 --batch 256 --devices 8 --memory 80GB --bandwidth 300GB/s
    minidl plan --model gpt --batch 8 --this-machine --devices 2       # this computer's measured ceilings

Prints, for every layout that fits the devices (data parallelism, ZeRO 1/2/3, tensor, pipeline GPipe and
1F1B, their 2-D meshes), the predicted step time and its parts, the step peak memory per rank and the bytes
each rank sends per step; the layouts whose peak does not fit the memory are listed apart; then the
recommendation and its reason. Writes no files; exits 1 when no layout fits, 2 on bad input.
The library side is :mod:`minidl.parallel.planner`.
"""
from __future__ import annotations

import re
import sys

from minidl.cli.args import add_command

UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "ki": 2**10, "mi": 2**20, "gi": 2**30,
         "ti": 2**40}
EXAMPLES = {"--memory": "16GB or 16GiB", "--bandwidth": "25GB/s", "--flops": "100TFLOP/s or 1e14",
            "--bucket": "25MiB"}
SECONDS = {"s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def quantity(text: str, option: str, suffix: str) -> float:
    """``16GB``, ``16GiB``, ``25GB/s``, ``1e14``, ``100TFLOP/s`` → a number; ValueError naming ``option``."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmgtp]i?)?\s*(" + suffix + r")?\s*", text, re.I)
    try:
        value = float(match.group(1)) * UNITS[(match.group(2) or "").lower()] if match else float("nan")
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{option} {text!r}: expected a positive number with an optional unit, such as "
                         f"{EXAMPLES[option]}")
    return value


def seconds(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us|µs|ns)?\s*", text)
    try:
        value = float(match.group(1)) * SECONDS[match.group(2) or "s"] if match else float("nan")
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise ValueError(f"--latency {text!r}: expected a time of at least 0, such as 10us, 0.5ms or 2e-5")
    return value


def _sizes(text: str) -> list:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"--sizes {text!r}: expected at least two positive widths separated by commas, such as "
                         "784,512,10 (inputs, hidden layers, classes)")
    return sizes


def _positive(value, option: str) -> int:
    if value is None or value < 1:
        raise ValueError(f"{option} must be a positive integer, got {value}")
    return value


def plan_command(args) -> int:
    from minidl.parallel.planner import Machine, ModelSpec, plan
    try:
        itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[args.dtype]
        if args.model == "gpt":
            for option in ("layers", "width", "heads", "context", "vocab"):
                _positive(getattr(args, option), f"--{option}")
            model = ModelSpec.gpt(args.layers, args.width, args.heads, args.context, args.vocab, itemsize)
        else:
            model = ModelSpec.mlp(_sizes(args.sizes), itemsize)
        devices = _positive(args.devices, "--devices")
        batch = _positive(args.batch, "--batch")
        if args.micro_batches is not None:
            _positive(args.micro_batches, "--micro-batches")
        if args.this_machine:
            from minidl.roofline.ceilings import measure
            machine = Machine.from_ceilings(measure("cpu", quick=True), devices)
        else:
            machine = Machine(devices, quantity(args.memory, "--memory", "b"),
                              quantity(args.bandwidth, "--bandwidth", "b/s"), seconds(args.latency),
                              quantity(args.flops, "--flops", "flop/s|flops"))
        table = plan(model, batch, machine, bucket_bytes=int(quantity(args.bucket, "--bucket", "b")),
                     micro_batches=args.micro_batches)
    except ValueError as exc:
        print(f"minidl plan: error: {exc}", file=sys.stderr)
        return 2
    print(table)
    return 0 if table.rows else 1


def add_commands(subparsers) -> None:
    """Register ``plan`` with the ``minidl`` command's subparsers."""
    p = add_command(subparsers, "plan", help="predict every parallel layout's step time and memory; recommend one",
                    description=__doc__.split("\n\n", 1)[1].split("\nPrints")[0].strip("\n") + "\n\n"
                    + "Prints" + __doc__.split("\nPrints", 1)[1].split("The library side")[0].rstrip())
    p.add_argument("--model", choices=("gpt", "mlp"), default="gpt", help="the model to lay out")
    p.add_argument("--layers", type=int, default=4, help="GPT: transformer blocks")
    p.add_argument("--width", type=int, default=128, help="GPT: embedding width")
    p.add_argument("--heads", type=int, default=4, help="GPT: attention heads (tensor parallelism splits them)")
    p.add_argument("--context", type=int, default=128, help="GPT: tokens per sequence")
    p.add_argument("--vocab", type=int, default=65, help="GPT: vocabulary size")
    p.add_argument("--sizes", default="784,512,512,10", help="MLP: the widths, inputs to classes")
    p.add_argument("--batch", type=int, default=32, help="global batch (sequences or samples) per step")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16", "float64"), default="float32",
                   help="weights and gradients (Adam's state: two of these per weight)")
    p.add_argument("--devices", type=int, default=4, help="devices (ranks)")
    p.add_argument("--memory", default="16GB", help="memory per device (16GB, 16GiB, 1.6e10)")
    p.add_argument("--bandwidth", default="25GB/s", help="link bandwidth per device, bytes per second")
    p.add_argument("--latency", default="10us", help="seconds per message (10us, 0.01ms)")
    p.add_argument("--flops", default="100TFLOP/s", help="FLOP/s per device")
    p.add_argument("--this-machine", dest="this_machine", action="store_true",
                   help="this computer as --devices ranks: FLOP/s, bandwidth and memory measured (about a "
                        "second), in place of --memory, --bandwidth, --flops")
    p.add_argument("--micro-batches", dest="micro_batches", type=int, default=None,
                   help="pipeline micro-batches (default: up to 4 per stage, dividing the batch)")
    p.add_argument("--bucket", default="25MiB", help="the data-parallel collectives' piece")
    p.set_defaults(run=plan_command)
