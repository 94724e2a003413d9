"""The code passes ruff (pyflakes, pycodestyle and import order; configured in pyproject.toml)."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
               "minidl", "tests", "benchmarks", "docs"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"ruff found problems (fix them, or run `ruff check --fix` on your files):\n" \
                                   f"{result.stdout[-6000:]}{result.stderr[-2000:]}"
