"""Every wrong solution of the mistake bank loses points, and the feedback names the mistake it is.

The bank's entries are planted in copies of their assignment's teacher copy, several
at once where their tasks do not run through each other (a round), and the planted
tasks graded: each must score below full marks, with its named mistakes in the
feedback. An entry marked ``public_passes`` must fail hidden cases only: the proof
that the grader's cases are not the public ones.
"""
from __future__ import annotations

import pytest

from minidl.course.assignments import ASSIGNMENTS, find
from minidl.course.grade import grade
from tests.course.conftest import SEED, derive
from tests.course.mistakes import bank

BANK = bank()


def _closure(assignment, task_id) -> set:
    """The task and every task it runs through, directly or not."""
    seen, todo = set(), [task_id]
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo.extend(assignment.task(t).depends_on)
    return seen


def rounds(assignment, mistakes) -> list:
    """The mistakes in groups whose tasks are distinct and none runs through another."""
    groups = []
    for m in mistakes:
        for group in groups:
            if all(m.task not in _closure(assignment, g.task) and g.task not in _closure(assignment, m.task)
                   for g in group):
                group.append(m)
                break
        else:
            groups.append([m])
    return groups


def test_every_task_has_at_least_three_wrong_solutions():
    counts = {t.id: 0 for a in ASSIGNMENTS for t in a.tasks}
    for m in BANK:
        counts[m.task] += 1
    covered = {a.number for a in ASSIGNMENTS if any(m.task.startswith(f"{a.number}.") for m in BANK)}
    thin = {t: n for t, n in counts.items() if int(t.split(".")[0]) in covered and n < 3}
    assert not thin, f"tasks with fewer than three wrong solutions in the bank: {thin}"


def test_the_bank_holds_solutions_that_pass_every_public_check():
    """The grader's cases are not the public ones: these entries pass every public case (their rounds below
    verify that they fail hidden cases only)."""
    passing = {m.task.split(".")[0] for m in BANK if m.public_passes}
    assert len(passing) >= 5, passing


def test_each_mistake_touches_only_its_own_task():
    for m in BANK:
        functions = set(find(m.task.split(".")[0]).task(m.task).functions)
        assert set(m.bodies) <= functions, (m.task, m.description)


ROUNDS = [(a.name, i, group) for a in ASSIGNMENTS
          for i, group in enumerate(rounds(a, [m for m in BANK if m.task.startswith(f"{a.number}.")]))]


@pytest.mark.parametrize("name, index, group", ROUNDS, ids=[f"{n}-round{i}" for n, i, _ in ROUNDS])
def test_planted_mistakes_lose_points_and_are_named(course_copy, tmp_path, name, index, group):
    bodies = {}
    for m in group:
        bodies.update(m.bodies)
    planted = sorted({m.task for m in group})
    result = grade(derive(course_copy(name, solutions=True), tmp_path / "submission", bodies), seed=SEED, tasks=planted)
    by_id = {t.id: t for t in result.tasks}
    assert sorted(by_id) == planted
    for m in group:
        t = by_id[m.task]
        assert t.points < t.max_points, f"{m.task} {m.description!r} scored full marks: {t.feedback}"
        for mistake_name in m.names:
            assert mistake_name in t.mistakes, f"{m.task} {m.description!r}: {mistake_name!r} not named; " \
                                               f"feedback: {t.feedback}"
        if m.public_passes:  # passes every public case: only the hidden ones catch it
            assert t.failures and all(f["hidden"] for f in t.failures), (m.description, t.failures)
