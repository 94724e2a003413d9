"""``minidl course make``: an assignment as a complete copy of minidl with the task's functions cut out.

The copy is the running engine itself: every file of the ``minidl`` package is
copied, and in the files that hold a task's functions each body after the
docstring becomes ``raise NotImplementedError("Task 2.2: ...")``. Everything
else works, so a task the student finishes powers real training at once.
``solutions=True`` leaves the bodies whole (the teacher's copy). Beside the
package go ``assignment.json`` (the tasks, their points and where their
functions are), the assignment's notebook and a README for the student.
"""
from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path

import minidl
from minidl.course.assignments import Assignment, find
from minidl.course.holes import body_of, engine_root, locate, replace_bodies, stub

__all__ = ["NOTEBOOKS", "fill", "holes", "make", "manifest"]

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"
MANIFEST = "assignment.json"


def holes(assignment: Assignment) -> dict:
    """file (relative to the engine root) -> {qualname in the file: the stub line} for every task's functions."""
    by_file = defaultdict(dict)
    for task in assignment.tasks:
        for name in task.functions:
            site = locate(name)
            by_file[site.file][site.qualname] = stub(task.message(site.qualname))
    return dict(by_file)


def manifest(assignment: Assignment, solutions: bool = False) -> dict:
    """What ``assignment.json`` holds: the assignment, and per task its id, points, functions and dependencies."""
    tasks = []
    for task in assignment.tasks:
        sites = [locate(name) for name in task.functions]
        tasks.append({"id": task.id, "title": task.title, "points": task.points,
                      "functions": [{"file": s.file, "qualname": s.qualname} for s in sites],
                      "depends_on": list(task.depends_on)})
    return {"assignment": assignment.name, "number": assignment.number, "title": assignment.title,
            "section": assignment.section, "notebook": assignment.notebook, "solutions": solutions,
            "minidl_version": minidl.__version__, "max_points": assignment.max_points, "tasks": tasks}


def _readme(assignment: Assignment, solutions: bool) -> str:
    lines = [f"# Assignment {assignment.number}: {assignment.title}", "",
             f"Goes with the chapter's section: {assignment.section}.", ""]
    if solutions:
        lines += ["This is the teacher's copy: every function is whole.", ""]
    lines += ["This folder is a complete copy of minidl in which the functions of the tasks below raise",
              "`NotImplementedError`. Write each one where it stands (its docstring gives the equations),",
              "then check it from this folder:", "",
              "    python -m minidl course check          # every task",
              f"    python -m minidl course check {assignment.tasks[0].id}      # one task", "",
              f"Start with the notebook `{assignment.notebook}` (run Jupyter from this folder, so that",
              "`import minidl` imports this copy); it ends in a run powered by your code.", "",
              "| task | points | what you write | needs |", "|---|---|---|---|"]
    for task in assignment.tasks:
        names = ", ".join(f"`{n.removeprefix('minidl.')}`" for n in task.functions)
        lines.append(f"| {task.id} {task.title} | {task.points} | {names} | {', '.join(task.depends_on) or '-'} |")
    lines += ["", "Grading runs the same checks on more cases (other shapes, dtypes and values) and says,",
              "for each task, which value is wrong, where, and which classic mistake it looks like."]
    return "\n".join(lines) + "\n"


def make(name: str, out, solutions: bool = False) -> Path:
    """Write assignment ``name`` into the new folder ``out``; return its path."""
    assignment = find(name)
    root = engine_root()
    if (root / MANIFEST).exists():
        raise ValueError(f"course make: the running minidl ({root}) is itself an assignment copy; make assignments "
                         "from the complete engine (the teacher's installation)")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"course make: {out} exists and is not empty; give a new folder")
    cut = {} if solutions else holes(assignment)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(root / "minidl", out / "minidl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for file, bodies in cut.items():
        path = out / file
        path.write_text(replace_bodies(path.read_text(encoding="utf-8"), bodies, file), encoding="utf-8")
    (out / MANIFEST).write_text(json.dumps(manifest(assignment, solutions), indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(NOTEBOOKS / assignment.notebook, out / assignment.notebook)
    (out / "README.md").write_text(_readme(assignment, solutions), encoding="utf-8")
    return out


def fill(folder, bodies: dict) -> None:
    """Write code into functions of an assignment copy: ``bodies`` maps qualified names to body text, or to
    None for the engine's own body (a solved task). How a teacher tries the grader on a planted mistake."""
    by_file = defaultdict(dict)
    for name, code in bodies.items():
        site = locate(name)
        by_file[site.file][site.qualname] = body_of(name) if code is None else code
    for file, replaced in by_file.items():
        path = Path(folder) / file
        path.write_text(replace_bodies(path.read_text(encoding="utf-8"), replaced, file), encoding="utf-8")
