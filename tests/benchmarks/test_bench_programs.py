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


@pytest.mark.parametrize("name", ["nanogpt", "mnist"])
def test_gpt_and_cnn_traced_by_minidl_compile_equal_their_eager_steps(name):
    """nanoGPT (AdamW, tied weights) and mnist (two convolutions, dropout, Adadelta) in traced form:
    the replays, with their lowered ops and reused buffers, give the eager losses bit for bit (each run
    from the seed: the same batches and dropout masks)."""
    import minidl
    eager = bench_programs.load(name, "minidl").make_traced_step(0)
    expected = [eager().numpy() for _ in range(4)]
    compiled = {}
    traced = bench_programs.load(name, "minidl").make_traced_step(0, bench_programs._keeping(compiled, "t", True))
    got = [traced().numpy() for _ in range(4)]
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]
    assert compiled["t"].recordings == 2 and len(list(compiled["t"].plans.values())[0].memory.out_buffer) > 5
    assert isinstance(compiled["t"], minidl.tracing.CompiledStep)
