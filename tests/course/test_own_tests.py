"""In each student's copy, the engine outside the holes passes its own tests: a subset per assignment.

The files chosen cover parts of minidl that each assignment's notebook relies on and that none of its holes
touch: the bundled datasets and splits, freezing layers (layers, a backward, an optimizer), the memory tracker
that assignment 6 measures with; files that compare with PyTorch are left out (importing it per copy costs more
than the tests). They run
with the copy first on the path (``--import-mode=append`` keeps pytest from putting this checkout first), one
forked child per copy (own_tests_runner.py), and a guard test checks that the minidl under test is the copy's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OWN_TESTS = {
    "scalar-autograd": ["tests/nn/test_freeze.py", "tests/data/test_datasets.py"],
    "op-backwards": ["tests/data/test_datasets.py", "tests/data/test_split.py"],
    "backward-walk": ["tests/data/test_datasets.py", "tests/data/test_split.py"],
    "optimizers": ["tests/data/test_split.py", "tests/test_memory.py"],
    "initializers": ["tests/data/test_datasets.py", "tests/data/test_preprocess.py"],
    "checkpointing": ["tests/test_memory.py", "tests/nn/test_freeze.py"],
    "data-parallel": ["tests/test_memory.py", "tests/nn/test_freeze.py"],
    "forward-mode": ["tests/nn/test_freeze.py", "tests/test_memory.py"],
}


def test_the_engine_outside_the_holes_passes_its_own_tests(course_copy, tmp_path):
    plan = [[str(course_copy(name)), files] for name, files in sorted(OWN_TESTS.items())]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("own_tests_runner.py")),
                          str(tmp_path / "plan.json")], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    codes = json.loads(run.stdout.strip().splitlines()[-1])
    failed = {Path(copy).name: code for copy, code in codes.items() if code != 0}
    assert len(codes) == len(OWN_TESTS) and not failed, (failed, run.stdout[-4000:])
