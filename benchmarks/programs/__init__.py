"""Real training programs, each written once for PyTorch (``import torch``) and run on minidl with
its import lines changed (see ``benchmarks/bench_programs.py``). Each module defines
``make_step(seed) -> step``, a callable that runs one training step of the program."""
