"""No order drift: with only the tasks up to k written, the checks of every task up to k pass.

Each task's checks may run through the tasks it declares (``depends_on``) and earlier ones, never through a
later task's hole: for each k a copy of the student's assignment gets the engine's own bodies for tasks 1..k
(as a student who has done them) and the grader runs the checks of those tasks. The last k is the teacher's
copy, graded in test_grading.py.
"""
from __future__ import annotations

import pytest

from minidl.course.assignments import ASSIGNMENTS
from minidl.course.grade import grade
from tests.course.conftest import SEED, derive

CASES = [(a.name, k) for a in ASSIGNMENTS for k in range(1, len(a.tasks))]


@pytest.mark.parametrize("name, done", CASES, ids=[f"{n}-first{k}" for n, k in CASES])
def test_the_checks_of_the_tasks_done_pass_while_later_tasks_are_holes(course_copy, tmp_path, name, done):
    from minidl.course.assignments import find
    tasks = find(name).tasks[:done]
    folder = derive(course_copy(name), tmp_path / "partial", {f: None for t in tasks for f in t.functions})
    result = grade(folder, seed=SEED, tasks=[t.id for t in tasks])
    assert [t.id for t in result.tasks] == [t.id for t in tasks]
    assert result.total == result.max_total, [(t.id, t.feedback) for t in result.tasks if t.points < t.max_points]
