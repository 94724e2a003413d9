"""A class of 30 generated submissions (correct ones, untouched ones, and one planted mistake each from the
mistake bank) grades into the gradebook it should: each row's points, the mistakes named, a feedback page per
student, and a summary that counts the class's mistakes."""
from __future__ import annotations

import csv
import shutil
from collections import Counter

from minidl.cli import main
from tests.course.conftest import SEED, derive
from tests.course.mistakes import bank

NAME = "scalar-autograd"


def test_a_class_of_thirty_grades_into_a_correct_gradebook(course_copy, tmp_path, capsys):
    mistakes = [m for m in bank() if m.task.startswith("1.")]
    folder = tmp_path / "class"
    folder.mkdir()
    planned = {}
    for i in range(30):
        student = f"student{i:02d}"
        if i < 6:
            shutil.copytree(course_copy(NAME, solutions=True), folder / student)
            planned[student] = None
        elif i < 9:
            shutil.copytree(course_copy(NAME), folder / student)
            planned[student] = "holes"
        else:
            m = mistakes[(i - 9) % len(mistakes)]
            derive(course_copy(NAME, solutions=True), folder / student, m.bodies)
            planned[student] = m
    (folder / "notes.txt").write_text("not a submission")  # a stray file is no submission
    out = tmp_path / "grades" / "grades.csv"
    assert main(["course", "grade", "--class", str(folder), "--out", str(out), "--seed", str(SEED)]) == 0
    assert "graded 30 submissions" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert [r["student"] for r in rows] == sorted(planned)
    named = Counter()
    for row in rows:
        plan = planned[row["student"]]
        points = {t: float(row[f"task {t}"]) for t in ("1.1", "1.2", "1.3")}
        assert abs(sum(points.values()) - float(row["total"])) < 1e-6 and row["max_total"] == "30"
        if plan is None:
            assert points == {"1.1": 10, "1.2": 10, "1.3": 10} and row["mistakes"] == ""
        elif plan == "holes":
            assert float(row["total"]) == 0
        else:
            assert points[plan.task] < 10, (row, plan.description)
            assert all(p == 10 for t, p in points.items() if t != plan.task), (row, plan.description)
            for n in plan.names:
                assert n in row["mistakes"].split("; "), (row, plan.description)
            named.update(set(plan.names))
        page = (out.parent / "feedback" / f"{row['student']}.md").read_text()
        assert f"Total: **{float(row['total']):g} of 30** points." in page
    summary = (out.parent / "class_summary.md").read_text()
    assert "# Class summary: 30 submissions" in summary
    for mistake, count in named.items():
        line = next(line for line in summary.splitlines() if line.startswith(f"| {mistake} |"))
        assert int(line.split("|")[2]) >= count, (mistake, line)
