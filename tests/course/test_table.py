"""The table of assignments holds together: every function it names exists, every check it names is
registered, dependencies point backwards, hidden cases differ from public ones, and the engine carries
no solution markers."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import minidl
from minidl.course import assignments
from minidl.course.assignments import ASSIGNMENTS, find
from minidl.course.checks import core, runner
from minidl.course.holes import engine_root, locate
from minidl.course.make import manifest

TASKS = [t for a in ASSIGNMENTS for t in a.tasks]


def test_eight_assignments_with_unique_names_and_tasks_numbered_by_assignment():
    assert [a.number for a in ASSIGNMENTS] == list(range(1, 9))
    assert len({a.name for a in ASSIGNMENTS}) == 8
    for a in ASSIGNMENTS:
        assert a.tasks and all(t.id == f"{a.number}.{i + 1}" for i, t in enumerate(a.tasks)), a.name
        assert find(a.name) is a and find(str(a.number)) is a
    with pytest.raises(KeyError, match="no assignment 'nine'"):
        find("nine")


@pytest.mark.parametrize("task", TASKS, ids=[t.id for t in TASKS])
def test_every_function_is_found_in_a_file_of_minidl(task):
    for name in task.functions:
        site = locate(name)
        source = (engine_root() / site.file).read_text()
        assert f"def {site.qualname.split('.')[-1]}(" in source, (name, site)


def test_no_function_is_cut_twice():
    names = [n for t in TASKS for n in t.functions]
    assert len(names) == len(set(names))


def test_dependencies_point_to_earlier_tasks_of_the_same_assignment():
    for a in ASSIGNMENTS:
        ids = [t.id for t in a.tasks]
        for i, t in enumerate(a.tasks):
            assert set(t.depends_on) <= set(ids[:i]), (t.id, t.depends_on)


def test_every_check_is_registered_with_public_and_hidden_cases_that_differ():
    names = [c for t in TASKS for c in t.checks]
    checks = runner.load(names)
    assert set(checks) == set(names)
    for name, chk in checks.items():
        assert chk.public and chk.hidden_count >= 1, name
        public = [json.dumps(p, sort_keys=True, default=str) for p in chk.public]
        for seed in range(20):
            drawn = chk.draw_hidden(np.random.default_rng(seed))
            assert len(drawn) == chk.hidden_count, name  # the count the grader holds the run to
            assert not set(json.dumps(p, sort_keys=True, default=str) for p in drawn) & set(public), name
        assert len(chk.cases(7)) == len(chk.public) + chk.hidden_count
        assert all(not c.hidden for c in chk.cases())


def test_each_mistake_the_checks_name_is_explained():
    source = "\n".join(p.read_text() for p in Path(core.__file__).parent.glob("*.py"))
    named = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in core.MISTAKES:
            named.add(node.value)
    assert len(core.MISTAKES) >= 40 and named == set(core.MISTAKES)


def test_the_engine_holds_no_solution_markers():
    package = engine_root() / "minidl"
    for path in package.rglob("*.py"):
        if "course" in path.relative_to(package).parts:
            continue
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "NotImplementedError(\"Task", "NotImplementedError('Task"):
            assert marker not in text, (path, marker)


def test_the_checks_import_the_engine_and_their_own_modules_only():
    """The grader loads the checks from the teacher's files beside a student's minidl: they may import minidl's
    engine and the modules that hold holes (the student's code), never the rest of minidl.course."""
    allowed = {"minidl.course", "minidl.course.scalar", "minidl.course.data_parallel"}
    for path in Path(core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minidl.course"):
                names = {a.name for a in node.names}
                assert node.module in allowed, (path, node.module)
                assert node.module != "minidl.course" or names <= {"scalar", "data_parallel"}, (path, names)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("minidl.course") for a in node.names), path


def test_manifest_lists_each_task_with_its_files_and_dependencies():
    data = manifest(find("op-backwards"))
    assert data["assignment"] == "op-backwards" and data["max_points"] == sum(t["points"] for t in data["tasks"])
    task = next(t for t in data["tasks"] if t["id"] == "2.2")
    assert task == {"id": "2.2", "title": assignments.task("2.2").title, "points": 15,
                    "functions": [{"file": "minidl/ops/linalg.py", "qualname": "MatMul.backward"}],
                    "depends_on": ["2.1"]}


def test_course_list_json_names_titles_and_tasks(capsys):
    from minidl.cli import main
    assert main(["course", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["name"] for a in listed] == [a.name for a in ASSIGNMENTS]
    first = listed[1]
    assert first["title"] == "Op backwards" and first["tasks"][1]["id"] == "2.2"
    assert first["tasks"][1]["functions"] == ["minidl.ops.linalg.MatMul.backward"]
    assert main(["course", "list"]) == 0
    text = capsys.readouterr().out
    assert "2 op-backwards" in text and "2.2  15 pts" in text


def test_make_refuses_a_folder_in_use_and_an_unknown_assignment(tmp_path, capsys):
    from minidl.cli import main
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    assert main(["course", "make", "2", "--out", str(tmp_path / "x")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["course", "make", "nine", "--out", str(tmp_path / "y")]) == 2
    assert "no assignment 'nine'" in capsys.readouterr().err


def test_course_check_outside_an_assignment_says_where_to_run_it():
    out = subprocess.run([sys.executable, "-m", "minidl", "course", "check"], capture_output=True, text=True,
                         cwd=engine_root(), timeout=120)
    assert out.returncode == 2 and "not an assignment copy" in out.stderr, out.stderr
    assert minidl  # the engine itself is untouched by all of this
