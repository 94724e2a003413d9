"""The docs build's limit per notebook cell: 600 s unless MINIDL_DOCS_CELL_TIMEOUT says otherwise."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))
from celltimeout import cell_timeout  # noqa: E402 - docs/_ext is not a package


def test_the_limit_is_600_seconds_unless_set():
    assert cell_timeout({}) == 600
    assert cell_timeout({"MINIDL_DOCS_CELL_TIMEOUT": ""}) == 600
    assert cell_timeout({"MINIDL_DOCS_CELL_TIMEOUT": " 1800 "}) == 1800


@pytest.mark.parametrize("value", ["0", "-5", "ten", "2.5"])
def test_a_bad_limit_says_what_it_needs(value):
    with pytest.raises(ValueError, match=rf"MINIDL_DOCS_CELL_TIMEOUT='{value}'.*positive whole number"):
        cell_timeout({"MINIDL_DOCS_CELL_TIMEOUT": value})


def test_the_build_uses_it():
    conf = (Path(__file__).resolve().parents[2] / "docs" / "conf.py").read_text(encoding="utf-8")
    assert "nb_execution_timeout = cell_timeout()" in conf
