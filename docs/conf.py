"""Sphinx configuration of the minidl documentation site.

Build it with one command (from the repository root):

    pip install -e '.[docs]' && sphinx-build -W --keep-going -b html docs docs/_build/html

The notebooks in ``notebooks/`` are copied into ``docs/notebooks/`` when the
build starts and executed by MyST-NB, so every figure on the site comes from
the current code. Execution results are cached under ``docs/_build`` keyed
by each notebook's content; set ``MINIDL_DOCS_EXECUTE=force`` to run them all
again (after changing minidl itself, for example). A cell may run 600 s
(``MINIDL_DOCS_CELL_TIMEOUT`` raises it on a slow machine,
``docs/_ext/celltimeout.py``). The kernel that runs them
is the standard one with its start-up TCP warning silenced
(``docs/_ext/quietkernel.py``).

The claim notebooks write what they measured into ``docs/_build/claims``
(``MINIDL_CLAIMS_DIR``), and the tables of ``claims.md`` are built from it
(``docs/_ext/claimspage.py``).

Equations are typeset by a copy of MathJax that the build puts in ``_static/``
(``docs/_ext/offlinemath.py``), so the built folder works opened from disk,
with no network.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT))

import minidl  # noqa: E402 - after the path is set, so a source checkout documents itself


def copy_notebooks(source: Path = ROOT / "notebooks", target: Path = DOCS / "notebooks") -> list[str]:
    """Mirror notebooks/*.ipynb into docs/notebooks/ (a build-time copy, ignored by git).

    A copy is rewritten only when its content changed, so the execution cache and
    Sphinx's incremental build see an unchanged notebook as unchanged.
    """
    target.mkdir(exist_ok=True)
    names = sorted(path.name for path in source.glob("*.ipynb"))
    for name in names:
        new = (source / name).read_bytes()
        copy = target / name
        if not copy.exists() or copy.read_bytes() != new:
            copy.write_bytes(new)
    for stale in target.glob("*.ipynb"):
        if stale.name not in names:
            stale.unlink()
    for leftover in target.iterdir():  # outputs a notebook wrote next to itself on an earlier run
        if leftover.suffix != ".ipynb":
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return names


copy_notebooks()

# The claim notebooks record what they measured into this folder as they run (minidl.train.claims);
# docs/_ext/claimspage.py builds the tables of claims.md from it once every notebook has run. It lives
# beside the execution cache, so a notebook taken from the cache keeps the record of the run cached.
os.environ.setdefault("MINIDL_CLAIMS_DIR", str(DOCS / "_build" / "claims"))

# The notebooks' kernel logs no TCP warning at start (docs/_ext/quietkernel.py); a cell's time
# limit is docs/_ext/celltimeout.py's.
from celltimeout import cell_timeout  # noqa: E402
from quietkernel import use_quiet_kernel  # noqa: E402

use_quiet_kernel(DOCS / "_build" / "jupyter")

# ---------------------------------------------------------------- project
project = "minidl"
author = "the minidl authors"
copyright = "minidl authors, MIT license"  # noqa: A001 - Sphinx's name for it
release = minidl.__version__
version = ".".join(release.split(".")[:2])

# ---------------------------------------------------------------- extensions
extensions = [
    "myst_nb",                  # MyST Markdown pages and executed notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "offlinemath",              # docs/_ext/offlinemath.py: MathJax shipped with the site, typeset offline
    "sphinx.ext.viewcode",
    "opsdoc",                   # docs/_ext/opsdoc.py: the "Ops and their gradients" page
    "graphfigure",              # docs/_ext/graphfigure.py: the recorded graph of a two-layer net
    "apipages",                 # docs/_ext/apipages.py: one API page per public module, from __all__
    "docstrings",               # docs/_ext/docstrings.py: plain-text docstrings as clean reST
    "optimdoc",                 # docs/_ext/optimdoc.py: the optimizer and schedule sections of optimizers.md
    "claimspage",               # docs/_ext/claimspage.py: the tables of claims.md, from the notebooks' runs
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
suppress_warnings = [
    "myst.header",  # notebooks start at "# 01 · Title" and then go to "###" for small asides
]

# MyST: $...$ and $$...$$ math as in the notebooks, ::: fences, definition lists, anchors for headings.
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "attrs_inline"]
myst_heading_anchors = 3

# ---------------------------------------------------------------- notebooks (MyST-NB)
nb_execution_mode = os.environ.get("MINIDL_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_timeout = cell_timeout()  # seconds per cell, 600 or MINIDL_DOCS_CELL_TIMEOUT; a stuck cell fails
nb_execution_raise_on_error = True   # a failing notebook fails the build
nb_execution_show_tb = True          # and the log shows the traceback
nb_merge_streams = True
nb_kernel_rgx_aliases = {".*": "python3"}  # whatever kernel name a notebook was saved with

# ---------------------------------------------------------------- API reference
autosummary_generate = True
autosummary_ignore_module_all = False    # a module's public names are its __all__
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autoclass_content = "both"               # the class docstring and __init__'s
add_module_names = False

# ---------------------------------------------------------------- HTML
html_theme = "furo"
html_title = f"minidl {release}"
html_static_path = ["_static"]
html_css_files = ["minidl.css"]
html_theme_options = {"navigation_with_keys": True}
mathjax3_config = {"tex": {"macros": {"R": r"\mathbb{R}"}}}
