"""``minidl course grade --class``: every submission of a folder graded into a gradebook.

Each sub-folder of the class folder that holds an ``assignment.json`` is one
student's submission (the folder's name is the student's). Written beside the
CSV: ``feedback/<student>.md``, the page to hand back, and
``class_summary.md``, the mistakes the class made most and each task's mean.
All submissions are graded on the same hidden seed, so they meet the same cases.
"""
from __future__ import annotations

import csv
import secrets
from collections import Counter, defaultdict
from pathlib import Path

from minidl.course.checks.core import MISTAKES
from minidl.course.grade import Grade, GradeError, grade

__all__ = ["feedback_page", "grade_class", "summary_page"]


def feedback_page(student: str, result: Grade) -> str:
    """One student's feedback as Markdown: the total, then each task's points and what was wrong."""
    lines = [f"# Feedback for {student}: {result.assignment}", "",
             f"Total: **{result.total:g} of {result.max_total}** points.", ""]
    for t in result.tasks:
        lines += [f"## Task {t.id}: {t.title} ({t.points:g} of {t.max_points})", ""]
        lines += [f"- {line}" for line in t.feedback]
        if t.mistakes:
            lines += ["", "Mistakes recognized: " + "; ".join(f"**{m}** ({MISTAKES.get(m, '')})" for m in t.mistakes)]
        lines.append("")
    return "\n".join(lines)


def summary_page(graded: dict) -> str:
    """The class's most common mistakes (how many students made each, in which tasks) and each task's mean."""
    students = len(graded)
    counts, where = Counter(), defaultdict(set)
    points, tasks = defaultdict(list), {}
    for result in graded.values():
        seen = set()
        for t in result.tasks:
            tasks[t.id] = (t.title, t.max_points)
            points[t.id].append(t.points)
            for m in t.mistakes:
                where[m].add(t.id)
                seen.add(m)
        counts.update(seen)
    lines = [f"# Class summary: {students} submission{'s' if students != 1 else ''}", "",
             "## The mistakes the class made most", ""]
    if counts:
        lines += ["| mistake | students | tasks |", "|---|---|---|"]
        lines += [f"| {m} | {n} | {', '.join(sorted(where[m]))} |" for m, n in counts.most_common()]
    else:
        lines.append("No recognized mistake.")
    lines += ["", "## Points per task", "", "| task | mean | full marks |", "|---|---|---|"]
    for task_id, (title, full) in tasks.items():
        got = points[task_id]
        lines.append(f"| {task_id} {title} | {sum(got) / len(got):.2f} of {full} | "
                     f"{sum(p == full for p in got)} of {len(got)} |")
    return "\n".join(lines) + "\n"


def grade_class(folder, out_csv, seed: int | None = None, timeout: float = 60.0, log=None) -> dict:
    """Grade every submission under ``folder``; write the CSV, the feedback pages and the summary."""
    folder, out_csv = Path(folder), Path(out_csv)
    submissions = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "assignment.json").is_file())
    if not submissions:
        raise GradeError(f"course grade --class: {folder} holds no submission (a folder with an assignment.json)")
    seed = secrets.randbelow(2 ** 31) if seed is None else int(seed)
    graded = {}
    for path in submissions:
        graded[path.name] = grade(path, seed=seed, timeout=timeout)
        if log:
            log(f"{path.name}: {graded[path.name].total:g} of {graded[path.name].max_total}")
    names = {r.assignment for r in graded.values()}
    if len(names) > 1:
        raise GradeError(f"course grade --class: {folder} mixes assignments ({', '.join(sorted(names))}); "
                         "grade each assignment's folder on its own")
    task_ids = [t.id for t in next(iter(graded.values())).tasks]
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student"] + [f"task {i}" for i in task_ids] + ["total", "max_total", "mistakes"])
        for student, result in graded.items():
            by_id = {t.id: t.points for t in result.tasks}
            mistakes = sorted({m for t in result.tasks for m in t.mistakes})
            writer.writerow([student] + [f"{by_id[i]:g}" for i in task_ids]
                            + [f"{result.total:g}", result.max_total, "; ".join(mistakes)])
    pages = out_csv.parent / "feedback"
    pages.mkdir(exist_ok=True)
    for student, result in graded.items():
        (pages / f"{student}.md").write_text(feedback_page(student, result), encoding="utf-8")
    (out_csv.parent / "class_summary.md").write_text(summary_page(graded), encoding="utf-8")
    return graded
