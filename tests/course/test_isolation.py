"""The grader imports the student's copy and only it, survives whatever the student's code does, and never
takes checks that did not run for a pass."""
from __future__ import annotations

import numpy as np

from minidl.course.assignments import Task
from minidl.course.checks import core, runner
from minidl.course.grade import _task_grade, grade
from minidl.nn import init
from tests.course.conftest import SEED, derive

FANS = "minidl.nn.init._calculate_fan_in_and_fan_out"


def test_a_planted_mistake_loses_points_while_the_installed_minidl_stays_right(course_copy, tmp_path, monkeypatch):
    """TinyTorch's grader once tested its own package instead of the student's. Here the test process's
    PYTHONPATH even points at the complete engine: the grader must still import the submission."""
    from minidl.course.holes import engine_root
    monkeypatch.setenv("PYTHONPATH", str(engine_root()))
    folder = derive(course_copy("initializers", solutions=True), tmp_path / "s", {FANS: """
shape = tuple(tensor.shape)
receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
return shape[0] * receptive, shape[1] * receptive
"""})
    result = grade(folder, seed=SEED, tasks=["5.1"])
    assert result.tasks[0].points < result.tasks[0].max_points
    assert "fan_in and fan_out swapped" in result.tasks[0].mistakes
    import minidl
    assert init._calculate_fan_in_and_fan_out(minidl.tensor(np.zeros((3, 5, 2)))) == (10, 6)


def test_a_hang_an_exit_and_a_crash_each_cost_one_task_with_the_reason(course_copy, tmp_path):
    folder = derive(course_copy("checkpointing", solutions=True), tmp_path / "s", {
        "minidl.checkpoint.segments.uniform_boundaries": "while True:\n    pass\n",
        "minidl.checkpoint.plan.SegmentPlan.peak_bytes": "import os\nos._exit(3)\n",
        "minidl.checkpoint.segments.checkpoint_sequential": "import ctypes\nreturn ctypes.string_at(0)\n"})
    result = grade(folder, seed=SEED, timeout=3)
    hang, exited, crashed = result.tasks
    assert hang.points == 0 and "did not finish within the time limit of 3 s" in hang.feedback[0]
    assert exited.points == 0 and "exit code 3" in exited.feedback[0]
    assert crashed.points == 0 and "killed by signal" in crashed.feedback[0]


def test_without_fork_each_task_gets_an_interpreter_of_its_own(course_copy, monkeypatch):
    import os
    monkeypatch.delattr(os, "fork")  # as on Windows: the grader starts one interpreter per task
    result = grade(course_copy("scalar-autograd", solutions=True), seed=SEED, tasks=["1.1", "1.3"])
    assert [t.id for t in result.tasks] == ["1.1", "1.3"] and result.total == 20


def test_a_submission_that_does_not_import_fails_every_task_with_the_place(course_copy, tmp_path):
    folder = derive(course_copy("forward-mode", solutions=True), tmp_path / "s", {})
    path = folder / "minidl" / "ops" / "elementwise.py"
    path.write_text(path.read_text().replace("def _spread(t, shape):", "def _spread(t, shape)"))  # a syntax error
    result = grade(folder, seed=SEED)
    assert result.total == 0
    for t in result.tasks:
        assert "does not import: SyntaxError" in t.feedback[0] and "elementwise.py" in t.feedback[0]


def _fake(name, public, hidden, count):
    core.registry().pop(name, None)
    core.check(name, public=public, hidden=lambda rng: hidden, hidden_count=count)(lambda case: None)


def test_checks_that_do_not_run_are_a_failure_never_a_pass():
    task = Task("0.1", "a task whose checks vanished", (), 10, ("fake.none",))
    _fake("fake.none", [], [], 0)
    result = runner.run_task("0.1", ["fake.none"], hidden_seed=1)
    assert result["ran"] == 0 and result["failures"] == []
    graded = _task_grade(task, result)
    assert graded.points == 0 and "no checks ran" in graded.feedback[0]
    _fake("fake.short", [dict(a=1)], [dict(a=2)], 3)  # declares three hidden cases, draws one
    result = runner.run_task("0.1", ["fake.short"], hidden_seed=1)
    assert (result["planned"], result["ran"], result["passed"]) == (4, 2, 2)
    graded = _task_grade(Task("0.1", "t", (), 10, ("fake.short",)), result)
    assert graded.points == 0 and "only 2 of the 4 checks" in graded.feedback[0]
    result = runner.run_task("0.1", ["fake.missing"], hidden_seed=1)
    assert "could not be loaded" in result["error"]
    assert _task_grade(task, result).points == 0
