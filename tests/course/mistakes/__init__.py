"""The mistake bank: wrong solutions written as students write them, at least three per task.

Each :class:`Mistake` replaces the bodies of one task's functions (the others keep
the engine's) and says which named mistakes the grader's feedback must find in it
(``names``; empty where the error is only located, not one of the classic ones).
The bank is test data: tests/course/test_mistake_bank.py plants each entry in a copy
of its assignment and grades it; test_class.py builds a class out of it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mistake:
    task: str
    description: str
    bodies: dict
    names: tuple = ()
    public_passes: bool = False  # passes every public check: only the hidden cases catch it


def bank() -> list:
    from tests.course.mistakes import a1, a2, a3, a4, a5, a6, a7, a8
    return [m for module in (a1, a2, a3, a4, a5, a6, a7, a8) for m in module.MISTAKES]
