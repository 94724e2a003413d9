"""``minidl course check``: the student's side, the public checks of one task or all, in this process.

It runs in the assignment folder's own minidl (``python -m minidl course check``
from that folder) and reads that folder's ``assignment.json``. The cases are the
public ones only; the grader adds hidden ones drawn from a seed of its own,
with the same checks and the same feedback.
"""
from __future__ import annotations

import json

from minidl.course.assignments import find
from minidl.course.checks.runner import run_task
from minidl.course.grade import feedback_lines
from minidl.course.holes import engine_root

__all__ = ["NotAnAssignment", "run_public_checks"]


class NotAnAssignment(ValueError):
    """The running minidl is not an assignment copy (no assignment.json beside the package)."""


def run_public_checks(task_ids=None) -> list:
    """[(task, result dict, feedback lines)] for each task (or the ids given), in the table's order."""
    path = engine_root() / "assignment.json"
    if not path.is_file():
        raise NotAnAssignment(f"the minidl that is running ({engine_root() / 'minidl'}) is not an assignment "
                              "copy: run 'python -m minidl course check' inside the folder that "
                              "'minidl course make' wrote")
    assignment = find(str(json.loads(path.read_text(encoding="utf-8"))["assignment"]))
    if task_ids:
        for task_id in task_ids:
            assignment.task(task_id)  # an unknown id: a KeyError that lists the tasks
    out = []
    for task in assignment.tasks:
        if task_ids and task.id not in task_ids:
            continue
        result = run_task(task.id, task.checks, functions=task.functions)
        out.append((task, result, feedback_lines(result)))
    return out
