"""``python -m tests.cupy_standin ARGS``: the ``minidl ARGS`` command with the stand-in as its GPU.

For the tests of commands that need a GPU (``minidl selftest --device cuda``,
``benchmarks/gpu_run.sh``), run in a subprocess on a machine without one.
"""
import sys

from minidl import backend
from minidl.cli import main
from tests import cupy_standin

backend._use_cupy_module(cupy_standin, cupy_standin.cupyx)
sys.exit(main(sys.argv[1:]))
