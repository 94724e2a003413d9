"""The roofline suite at full sizes: the machine's ceilings, every op forward and backward in
minidl, NumPy by hand and PyTorch, the batch-size sweep, and a training step's profile.

    python benchmarks/bench_roofline.py [--device cpu|cuda] [--quick]

Writes benchmarks/results/<machine>.json and <machine>_{roofline,batch_sweep,step_profile}.png
(the same run as ``minidl bench``; the work is in minidl.roofline).
"""
from __future__ import annotations

import argparse
import os
import sys

from common import machine_name

from minidl.roofline import suite

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", nargs="*", metavar="OP", help="time only these ops")
    args = parser.parse_args(argv)
    suite.run(args.device, quick=args.quick, out_dir=RESULTS, machine=machine_name(),
              only=set(args.only) if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
