"""MathJax shipped with the site: equations are typeset with no network, even opened from disk.

``sphinx.ext.mathjax`` loads MathJax from a CDN, so a site read offline (or on a
machine without internet) shows raw TeX. This extension takes MathJax 3 from
the ``django-static-mathjax`` package, a plain copy of MathJax's release files
with no dependencies (part of the ``docs`` extra, whatever its name says about
Django), copies into ``_static/mathjax/`` the renderer the site uses
(``tex-chtml.js``) and everything it loads on demand (TeX extensions, its web
fonts, the menu and the accessibility components), and points ``mathjax_path``
at that copy. MathJax finds its fonts and extensions relative to its own
script, so the built folder works from ``file://`` as well as from a server.

A ``mathjax_path`` that conf.py sets to a URL is left alone (a site that wants
the CDN can say so); a missing package fails the build with the command that
installs it.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from sphinx.errors import ExtensionError

SCRIPT = "tex-chtml.js"
# What tex-chtml.js may load at run time, relative to MathJax's es5/ folder.
ON_DEMAND = ["input/tex/extensions", "output/chtml", "ui", "a11y", "sre"]
TARGET = "mathjax"  # under _static/


def mathjax_folder() -> Path:
    """MathJax's es5/ folder inside the installed django-static-mathjax package."""
    spec = importlib.util.find_spec("mathjax")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        es5 = Path(folder) / "static" / "mathjax" / "es5"
        if (es5 / SCRIPT).is_file():
            return es5
    raise ExtensionError("offlinemath: MathJax's files were not found; install the docs extra "
                         "(pip install -e '.[docs]'), which brings django-static-mathjax")


def _copy_if_changed(source: Path, target: Path) -> None:
    if target.exists() and target.stat().st_size == source.stat().st_size \
            and target.stat().st_mtime >= source.stat().st_mtime:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def copy_mathjax(outdir: Path) -> list[Path]:
    """Copy the renderer and what it loads into ``outdir/_static/mathjax``; the files written there."""
    es5 = mathjax_folder()
    sources = [es5 / SCRIPT] + [path for part in ON_DEMAND for path in sorted((es5 / part).rglob("*"))
                                if path.is_file()]
    targets = []
    for source in sources:
        target = Path(outdir) / "_static" / TARGET / source.relative_to(es5)
        _copy_if_changed(source, target)
        targets.append(target)
    return targets


def _use_local_copy(app, config) -> None:
    if "://" not in config.mathjax_path or config.mathjax_path.startswith("file:"):
        return
    if config.overrides.get("mathjax_path") or "mathjax_path" in getattr(config, "_raw_config", {}):
        return  # conf.py (or -D) chose a URL on purpose
    mathjax_folder()  # fail now, with the install command, rather than ship pages that load nothing
    config.mathjax_path = f"{TARGET}/{SCRIPT}"


def _copy_after_build(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        copy_mathjax(app.outdir)


def setup(app):
    app.setup_extension("sphinx.ext.mathjax")
    app.connect("config-inited", _use_local_copy)
    app.connect("build-finished", _copy_after_build)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
