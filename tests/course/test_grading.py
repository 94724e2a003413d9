"""Every assignment: the student's copy scores 0 and its public checks fail with the task's message; the
teacher's copy scores full marks; the grade's JSON has the fields the issue lists."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minidl.course.assignments import ASSIGNMENTS, find
from minidl.course.grade import grade
from tests.course.conftest import SEED

NAMES = [a.name for a in ASSIGNMENTS]


def public_checks(folder, *tasks):
    """``python -m minidl course check`` run inside an assignment folder, as a student runs it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "minidl", "course", "check", *tasks], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", NAMES)
def test_the_student_copy_scores_zero_and_its_checks_name_the_task(course_copy, name):
    folder = course_copy(name)
    result = grade(folder, seed=SEED)
    assert result.total == 0 and result.max_total == find(name).max_points
    for t, task in zip(result.tasks, find(name).tasks):
        assert t.points == 0 and t.checks_run > 0, t
        # the task's own hole, or (a walk broken in assignment 3) the hole of a task it runs through
        assert any(f"Task {i}: write" in line for line in t.feedback for i in (t.id,) + task.depends_on), t.feedback
    checked = public_checks(folder)
    assert checked.returncode == 1, checked.stderr
    for t in find(name).tasks:
        assert f"Task {t.id} {t.title}: 0 of" in checked.stdout
        assert any(f"Task {i}: write" in checked.stdout for i in (t.id,) + t.depends_on)
    assert f"0 of {len(find(name).tasks)} tasks pass their public checks" in checked.stdout


@pytest.mark.parametrize("name", NAMES)
def test_the_teacher_copy_scores_full_marks(course_copy, name):
    result = grade(course_copy(name, solutions=True), seed=SEED)
    assert result.total == result.max_total, [t.feedback for t in result.tasks if t.points < t.max_points]
    assert all(t.checks_run == t.checks_passed > 0 for t in result.tasks)


def test_public_checks_pass_in_the_teacher_copy_and_take_a_task_id(course_copy):
    checked = public_checks(course_copy("checkpointing", solutions=True), "6.1", "6.2")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Task 6.1" in checked.stdout and "Task 6.3" not in checked.stdout
    assert "2 of 2 tasks pass their public checks; grading adds hidden cases" in checked.stdout
    wrong = public_checks(course_copy("checkpointing", solutions=True), "9.9")
    assert wrong.returncode == 2 and "has no task '9.9'" in wrong.stderr


def test_grade_command_writes_the_json_the_issue_lists(course_copy, tmp_path, capsys):
    from minidl.cli import main
    out = tmp_path / "grade.json"
    assert main(["course", "grade", str(course_copy("scalar-autograd")), "--json", str(out), "--seed", "3"]) == 0
    data = json.loads(out.read_text())
    assert set(data) >= {"assignment", "tasks", "total", "max_total"} and data["assignment"] == "scalar-autograd"
    assert data["total"] == 0 and data["max_total"] == 30 and data["seed"] == 3
    for t in data["tasks"]:
        assert set(t) >= {"id", "points", "max_points", "feedback"} and t["points"] == 0
    printed = capsys.readouterr().out
    assert "total: 0 of 30 (hidden seed 3)" in printed
    assert main(["course", "grade", str(tmp_path)]) == 2  # not a submission
    assert "holds no assignment.json" in capsys.readouterr().err
