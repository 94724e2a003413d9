"""Each assignment's notebook runs to its end in the teacher's copy: its cells call the copy's functions, and
its milestone (XOR, a digits CNN and a GPT, digits MLPs, deep initialized networks, a checkpointed network,
replicas on a ring and on MPI ranks, a Jacobian both ways) asserts what it reached."""
from __future__ import annotations

import pytest

from minidl.course.assignments import ASSIGNMENTS

nbformat = pytest.importorskip("nbformat", reason="the notebooks extra is not installed")
nbclient = pytest.importorskip("nbclient", reason="the notebooks extra is not installed")


@pytest.mark.parametrize("name", [a.name for a in ASSIGNMENTS])
def test_the_assignment_notebook_runs_in_the_teacher_copy(course_copy, monkeypatch, name):
    from minidl.course.assignments import find
    folder = course_copy(name, solutions=True)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the kernel imports the copy from its own folder
    notebook = nbformat.read(folder / find(name).notebook, as_version=4)
    nbclient.NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert f"minidl from {folder}" in printed
