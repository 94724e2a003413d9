"""Assignment copies made once per test session, and copies derived from them with planted code.

A copy starts with no bytecode; the engine's own ``__pycache__`` folders are copied in
beside the sources so that only the files with holes or planted code are compiled
again (a bytecode file records its source's size and time, which a copy keeps).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minidl.course.holes import engine_root
from minidl.course.make import fill, make

SEED = 12345  # the hidden cases' seed in these tests (a grade prints the one it used)


def _bytecode(copy: Path) -> None:
    package = engine_root() / "minidl"
    for cache in package.rglob("__pycache__"):
        target = copy / "minidl" / cache.relative_to(package)
        if target.parent.is_dir():
            shutil.copytree(cache, target, dirs_exist_ok=True)


def derive(base: Path, dest: Path, bodies: dict) -> Path:
    """A copy of the assignment folder ``base`` at ``dest`` with ``bodies`` written into its functions."""
    shutil.copytree(base, dest)
    fill(dest, bodies)
    return dest


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory):
    """``course_copy(name, solutions=False)``: that assignment's folder, made once per session."""
    made = {}
    root = tmp_path_factory.mktemp("course")

    def get(name: str, solutions: bool = False) -> Path:
        key = (name, solutions)
        if key not in made:
            out = root / f"{name}-{'solutions' if solutions else 'student'}"
            make(name, out, solutions=solutions)
            _bytecode(out)
            made[key] = out
        return made[key]
    return get
