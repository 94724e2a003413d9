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


def test_regression_traced_by_minidl_compile_equals_its_eager_step():
    """pytorch/examples' regression in the form a tracer takes: eager and traced (minidl.compile) give
    the same losses bit for bit over several steps (each run from the seed: the same batches)."""
    import minidl
    eager = bench_programs.load("regression", "minidl").make_traced_step(0)
    expected = [eager().numpy() for _ in range(6)]
    traced = bench_programs.load("regression", "minidl").make_traced_step(0, minidl.compile)
    got = [traced().numpy() for _ in range(6)]
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]
    assert expected[0] != expected[-1]  # the model learns: the steps are not one repeated value
