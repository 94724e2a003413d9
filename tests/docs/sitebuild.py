"""One build of the documentation site per test run, shared by every docs test.

``built_site(tmp_path_factory)`` runs ``sphinx-build -W --keep-going -b html``
(the notebooks executed in it, their results cached by content under
docs/_build) once per run: under pytest-xdist the workers share one build
folder in the run's temporary directory, the first to get the lock builds and
the others wait and reuse it (a failed build is reported to each of them,
not built again).
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class BuildFailed(AssertionError):
    pass


def build(out: Path) -> None:
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-j", "2", "-b", "html", "-q",
               str(DOCS), str(out)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if result.returncode != 0:
        warnings = "\n".join(line for line in result.stderr.splitlines() if "WARNING:" in line or "ERROR:" in line)
        raise BuildFailed(f"sphinx-build failed:\n{warnings or result.stderr[-8000:]}")


def built_site(tmp_path_factory) -> Path:
    """The HTML folder of this run's build (building it if no test of this run has yet)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder under xdist
    out, done, failed = shared / "docs-site", shared / "docs-site.done", shared / "docs-site.failed"
    with open(shared / "docs-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if failed.exists():
            raise BuildFailed(failed.read_text(encoding="utf-8"))
        if not done.exists():
            try:
                build(out)
            except BuildFailed as error:
                failed.write_text(str(error), encoding="utf-8")
                raise
            done.touch()
    return out
