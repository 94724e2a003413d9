"""``minidl course grade``: the hidden checks run against a submission, each task isolated, with feedback.

The grader starts one fresh Python (``python -I``: no PYTHONPATH, no user
site) whose ``sys.path`` begins with the submission, so ``import minidl``
imports the student's copy and only it; the checks themselves are loaded from
this package's files (the teacher's), never from the submission. Inside it
each task runs in a child process of its own with a time limit
(:mod:`minidl.course.checks.runner`). The public cases and the hidden ones
(drawn from ``seed``, which the student never sees) all count: a task's
points are its share of cases passed, and a task whose checks ran fewer cases
than they declare, or none, gets no points, with the reason.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from minidl.course.assignments import Assignment, find
from minidl.course.checks.core import MISTAKES

__all__ = ["Grade", "GradeError", "TaskGrade", "feedback_lines", "grade", "read_manifest"]

CHECKS = Path(__file__).resolve().parent / "checks"
SHOWN_FAILURES = 4  # per task; the count of the rest is given

_BOOTSTRAP = """\
import importlib.util, sys
submission, checks, request = sys.argv[1:4]
sys.path.insert(0, submission)
spec = importlib.util.spec_from_file_location("minidl_course_grader", checks + "/__init__.py",
                                              submodule_search_locations=[checks])
package = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = package
spec.loader.exec_module(package)
from minidl_course_grader.runner import main
sys.exit(main(submission, request))
"""


class GradeError(ValueError):
    """A folder that is not a submission (no assignment.json, no minidl), or a grader that could not run."""


@dataclass
class TaskGrade:
    id: str
    title: str
    points: float
    max_points: int
    feedback: list
    mistakes: list = field(default_factory=list)
    checks_run: int = 0
    checks_passed: int = 0
    failures: list = field(default_factory=list)  # the runner's failure records (check, case, hidden, message...)


@dataclass
class Grade:
    assignment: str
    seed: int
    tasks: list

    @property
    def total(self) -> float:
        return round(sum(t.points for t in self.tasks), 2)

    @property
    def max_total(self) -> int:
        return sum(t.max_points for t in self.tasks)

    def to_dict(self) -> dict:
        return {"assignment": self.assignment, "seed": self.seed,
                "tasks": [{"id": t.id, "title": t.title, "points": t.points, "max_points": t.max_points,
                           "feedback": t.feedback, "mistakes": t.mistakes, "checks_run": t.checks_run,
                           "checks_passed": t.checks_passed} for t in self.tasks],
                "total": self.total, "max_total": self.max_total}


def read_manifest(submission) -> dict:
    path = Path(submission) / "assignment.json"
    if not path.is_file():
        raise GradeError(f"course grade: {submission} holds no assignment.json: not an assignment folder")
    if not (Path(submission) / "minidl" / "__init__.py").is_file():
        raise GradeError(f"course grade: {submission} holds no minidl package (minidl/__init__.py)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise GradeError(f"course grade: {path} is not valid JSON: {exc}") from None


def _run_checks(submission: Path, assignment: Assignment, task_ids, seed: int, timeout: float) -> list:
    """The runner's per-task results (dicts): one fresh interpreter rooted at the submission, which forks a
    child per task; where the system cannot fork, one interpreter per task."""
    tasks = [t for t in assignment.tasks if t.id in task_ids]
    if hasattr(os, "fork"):
        return _run_in_one(submission, tasks, seed, timeout)
    return [r for t in tasks for r in _run_in_one(submission, [t], seed, timeout)]


def _run_in_one(submission: Path, tasks, seed: int, timeout: float) -> list:
    with tempfile.TemporaryDirectory(prefix="minidl-grade-") as scratch:
        request = Path(scratch) / "request.json"
        result = Path(scratch) / "result.json"
        request.write_text(json.dumps({"tasks": [{"id": t.id, "checks": list(t.checks), "functions": list(t.functions)}
                                                 for t in tasks],
                                       "hidden_seed": seed, "timeout": timeout, "result": str(result)}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
        command = [sys.executable, "-I", "-c", _BOOTSTRAP, str(submission.resolve()), str(CHECKS), str(request)]
        limit = 60 + timeout * len(tasks)
        try:
            run = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return [{"id": t.id, "error": f"the checks did not finish within {limit:g} s (an endless loop, or an "
                                          "import that never ends)",
                     "planned": 0, "ran": 0, "passed": 0, "failures": []} for t in tasks]
        if not result.is_file():
            tail = (run.stderr or run.stdout or "").strip().splitlines()[-3:]
            return [{"id": t.id, "error": "the grader's process stopped before reporting (exit code "
                     f"{run.returncode}): " + " | ".join(tail), "planned": 0, "ran": 0, "passed": 0, "failures": []}
                    for t in tasks]
        return json.loads(result.read_text())


def feedback_lines(result: dict) -> list:
    """The feedback of one task's result: what failed, where, and the mistakes it looks like.

    Failures that say the same thing (the same message at the same place) are given once, with the
    first case that showed it and the number of cases.
    """
    groups = {}
    for failure in result["failures"]:
        key = (failure["check"], failure["message"], failure.get("where", ""), tuple(failure["mistakes"]))
        groups.setdefault(key, []).append(failure)
    lines = []
    for (check, message, where, mistakes), failures in list(groups.items())[:SHOWN_FAILURES]:
        first = failures[0]
        more = f"; the same in {len(failures) - 1} more case{'s' if len(failures) > 2 else ''}" \
            if len(failures) > 1 else ""
        text = f"{check} ({first['case']}{', a hidden case' if first['hidden'] else ''}{more}): {message}"
        if where:
            text += f" [at {where}]"
        for name in mistakes:
            text += f" -- looks like: {name} ({MISTAKES.get(name, '')})"
        lines.append(text)
    left = sum(len(f) for f in list(groups.values())[SHOWN_FAILURES:])
    if left:
        lines.append(f"... and {left} more failing case{'s' if left > 1 else ''}")
    return lines


def _task_grade(task, result: dict) -> TaskGrade:
    planned, ran, passed = result["planned"], result["ran"], result["passed"]
    mistakes = sorted({m for f in result["failures"] for m in f["mistakes"]})
    if result.get("error"):
        return TaskGrade(task.id, task.title, 0.0, task.points, [f"no points: {result['error']}"], mistakes, ran, 0)
    if planned == 0 or ran == 0:
        return TaskGrade(task.id, task.title, 0.0, task.points,
                         ["no points: no checks ran, and a task whose checks did not run is never passed"],
                         mistakes, ran, 0)
    if ran < planned:
        return TaskGrade(task.id, task.title, 0.0, task.points,
                         [f"no points: only {ran} of the {planned} checks the task declares ran"], mistakes, ran, 0)
    points = round(task.points * passed / planned, 2)
    lines = [f"{passed} of {planned} checks passed"] + feedback_lines(result)
    return TaskGrade(task.id, task.title, points, task.points, lines, mistakes, ran, passed, result["failures"])


def grade(submission, seed: int | None = None, timeout: float = 60.0, tasks=None) -> Grade:
    """Grade the assignment folder ``submission``: every task (or the ids in ``tasks``), hidden cases included."""
    submission = Path(submission)
    manifest = read_manifest(submission)
    try:
        assignment = find(str(manifest.get("assignment")))
    except KeyError as exc:
        raise GradeError(f"course grade: {submission}: {exc.args[0]}") from None
    ids = [t.id for t in assignment.tasks if tasks is None or t.id in tasks]
    seed = secrets.randbelow(2 ** 31) if seed is None else int(seed)
    results = {r["id"]: r for r in _run_checks(submission, assignment, ids, seed, timeout)}
    graded = [_task_grade(t, results[t.id]) for t in assignment.tasks if t.id in ids]
    full = {g.id for g in graded if g.points == g.max_points}
    for g, task in zip(graded, [t for t in assignment.tasks if t.id in ids]):
        missing = [d for d in task.depends_on if d in results and d not in full]
        if missing and g.points < g.max_points:
            g.feedback.append(f"note: this task runs through task{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(missing)}, which lost points: fix {'them' if len(missing) > 1 else 'it'} "
                              "first, the failures here may come from there")
    return Grade(assignment.name, seed, graded)
