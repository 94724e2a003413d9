"""The roofline: measured ceilings of this machine and where every op of minidl sits under them.

    from minidl import roofline
    c = roofline.measure("cpu")                 # peak GEMM FLOP/s, copy/triad bandwidth, balance
    cost = roofline.opcosts.linear(256, 1024, 1024)   # analytic FLOPs and bytes, forward and backward
    results = roofline.run("cpu", quick=True, out_dir="results")   # the whole suite, JSON + PNGs

or from the shell: ``minidl bench [--device cpu|cuda] [--quick] [--out DIR]``.

An op's arithmetic intensity (FLOPs per byte it must move) against the
machine balance (peak FLOP/s ÷ bandwidth) says which ceiling it meets first:
a large matrix product is compute-bound, a ReLU memory-bound, and a Linear
layer moves from one to the other as its batch grows.
"""
from minidl.roofline import ceilings, opcosts
from minidl.roofline.ceilings import Ceilings, measure
from minidl.roofline.opcosts import Cost, OpCost


def run(*args, **kwargs):
    """The whole suite: see :func:`minidl.roofline.suite.run`."""
    from minidl.roofline import suite
    return suite.run(*args, **kwargs)


__all__ = ["Ceilings", "Cost", "OpCost", "ceilings", "measure", "opcosts", "run"]
