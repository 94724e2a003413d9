"""The kernel that executes the notebooks during the docs build, without its TCP warning.

ipykernel 7 logs "[IPKernelApp] WARNING | Kernel is running over TCP without
encryption ..." at every start: once per notebook, nine lines in a cold build,
about a kernel that only ever talks to the build on this machine. The warning
comes from the kernel process (its stderr is the build's), so no logging filter
in Sphinx can see it. Instead the build gives the kernel a spec of its own: the
standard ``python3`` spec (this Python, ``-m ipykernel_launcher``) with the
kernel's log level at ERROR, written under ``docs/_build/jupyter`` and found
first through ``JUPYTER_PATH``. Errors in a notebook still fail the build: they
come back as cell outputs, not as kernel log lines.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def use_quiet_kernel(folder: Path) -> Path:
    """Write ``folder/kernels/python3/kernel.json`` and put ``folder`` first on ``JUPYTER_PATH``; return the spec."""
    spec = Path(folder) / "kernels" / "python3" / "kernel.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    content = json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.log_level=ERROR"],
        "display_name": "Python 3 (minidl docs)", "language": "python", "metadata": {"debugger": False},
    }, indent=1)
    if not spec.exists() or spec.read_text() != content:
        spec.write_text(content)
    paths = [str(folder)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != str(folder)]
    os.environ["JUPYTER_PATH"] = os.pathsep.join(paths)
    return spec
