"""How long one notebook cell may run in the docs build: 600 s, or ``MINIDL_DOCS_CELL_TIMEOUT``.

Every notebook runs in under a minute on two idle cores, but the build may share
a busy machine (the test suite builds the docs beside its other workers), where
a cell that takes 7 s alone has taken 162 s. The limit only catches a cell that
hangs, so it is generous; a slower machine raises it, for example
``MINIDL_DOCS_CELL_TIMEOUT=1800 sphinx-build ...``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

DEFAULT_SECONDS = 600


def cell_timeout(environ: Mapping[str, str] = os.environ) -> int:
    """The per-cell limit in seconds: ``MINIDL_DOCS_CELL_TIMEOUT`` (a positive whole number) or 600."""
    value = environ.get("MINIDL_DOCS_CELL_TIMEOUT", "").strip()
    if not value:
        return DEFAULT_SECONDS
    try:
        seconds = int(value)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ValueError(f"MINIDL_DOCS_CELL_TIMEOUT={value!r}: the docs build's limit per notebook cell must be "
                         f"a positive whole number of seconds, for example MINIDL_DOCS_CELL_TIMEOUT=1800 "
                         f"(unset, it is {DEFAULT_SECONDS})")
    return seconds
