"""benchmarks/bench_programs.py: each program is PyTorch text that runs on minidl with only its import
lines changed, and one training step of it runs and lowers nothing to NaN."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_programs  # noqa: E402


@pytest.mark.parametrize("name", bench_programs.PROGRAMS)
def test_program_differs_from_its_pytorch_text_in_import_lines_only(name):
    theirs = bench_programs.source(name, "torch").splitlines()
    ours = bench_programs.source(name, "minidl").splitlines()
    assert len(ours) == len(theirs)
    changed = [(a, b) for a, b in zip(theirs, ours) if a != b]
    assert changed and all(a.startswith(("import torch", "from torch")) and "minidl" in b for a, b in changed)


@pytest.mark.parametrize("name", bench_programs.PROGRAMS)
def test_a_step_of_each_program_runs_on_minidl(name):
    step = bench_programs.load(name, "minidl").make_step(0)
    losses = [step(), step()]
    values = [loss if isinstance(loss, float) else loss.item() for loss in losses]
    assert all(math.isfinite(v) and v > 0 for v in values)
