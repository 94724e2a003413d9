"""The documentation site builds with warnings as errors, and what it builds is whole.

One build (``sphinx-build -W --keep-going -b html docs <tmp>``, the notebooks
executed in it; ``tests/docs/sitebuild.py``) is shared by these checks and the
browser's (``tests/docs/test_browser.py``): every page and every notebook page
is there, equations are set for the MathJax shipped with the site, every image
a page shows exists, and every link inside the site leads to a file that exists
and to an anchor on it. Notebook results are cached by content under
docs/_build, so a second run only executes what changed.
"""
from __future__ import annotations

import importlib.util
import inspect
import pkgutil
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("myst_nb", reason="the docs extra is not installed: pip install -e '.[docs]'")

from tests.docs.sitebuild import DOCS, ROOT, built_site  # noqa: E402 - after the skips above

GENERATED_DIRS = {"_build", "notebooks", "api", "_generated", "_templates", "_static", "_ext"}


class PageParser(HTMLParser):
    """The ids, links, images and scripts of one HTML page."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.images, self.scripts = set(), [], [], []
        self.math = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and "name" in attrs:
            self.ids.add(attrs["name"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "link" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        if tag == "script":
            self.scripts.append(attrs.get("src") or "")
        if tag in ("span", "div") and "math" in (attrs.get("class") or "").split():
            self.math += 1


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return built_site(tmp_path_factory)


@pytest.fixture(scope="module")
def pages(site) -> dict[Path, PageParser]:
    parsed = {}
    for path in site.rglob("*.html"):
        if "_modules" in path.parts or "_sources" in path.parts:
            continue
        parser = PageParser()
        parser.feed(path.read_text(encoding="utf-8"))
        parsed[path] = parser
    return parsed


def source_pages() -> list[str]:
    """Every hand-written page: docs/**/*.md outside the generated folders."""
    return sorted(str(p.relative_to(DOCS).with_suffix("")) for p in DOCS.rglob("*.md")
                  if not GENERATED_DIRS & set(p.relative_to(DOCS).parts[:-1]))


def test_every_page_is_built(site):
    missing = [name for name in source_pages() if not (site / f"{name}.html").is_file()]
    assert not missing, f"pages not built: {missing}"
    assert {"index", "getting_started", "engine", "ops", "api", "gallery"} <= set(source_pages())


def test_every_notebook_has_a_page(site):
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    missing = [name for name in notebooks if not (site / "notebooks" / f"{name}.html").is_file()]
    assert not missing, f"notebooks without a page in the gallery: {missing}"
    gallery = (site / "gallery.html").read_text(encoding="utf-8")
    assert all(f"notebooks/{name}.html" in gallery for name in notebooks)


def test_every_public_module_has_an_api_page(site):
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        from apipages import PUBLIC_MODULES
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    present = [name for name in PUBLIC_MODULES if importlib.util.find_spec(name) is not None]
    assert "minidl.functional" in present and "minidl.nn" in present
    missing = [name for name in present if not (site / "api" / f"{name}.html").is_file()]
    assert not missing, f"public modules without an API page: {missing}"
    functional = (site / "api" / "minidl.functional.html").read_text(encoding="utf-8")
    import minidl.functional
    undocumented = [name for name in minidl.functional.__all__ if f'id="minidl.functional.{name}"' not in functional]
    assert not undocumented, f"functional names missing from the API page: {undocumented}"


def test_equations_are_set_for_the_mathjax_shipped_with_the_site(pages, site):
    mathjax_pages = ["ops.html", "engine.html"] + (["optimizers.html"] if (DOCS / "optimizers.md").exists() else [])
    for name in mathjax_pages:
        page = pages[site / name]
        sources = [src for src in page.scripts if "mathjax" in src.lower()]
        assert sources, f"{name} does not load MathJax"
        assert not any(urlsplit(src).scheme for src in sources), f"{name} loads MathJax from the network: {sources}"
        assert all((site / unquote(src)).is_file() for src in sources), f"{name}: {sources} not in the site"
        assert page.math >= 5, f"{name} has {page.math} equations"
    fonts = site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    assert len(list(fonts.glob("*.woff"))) >= 20, "MathJax's fonts were not copied with it"
    assert (site / "_static" / "mathjax" / "input" / "tex" / "extensions" / "boldsymbol.js").is_file()
    assert pages[site / "ops.html"].math >= 2 * 40  # every op's forward and backward hold math


def test_ops_page_lists_every_op(site):
    import minidl.ops
    from minidl.autograd import Function
    html = (site / "ops.html").read_text(encoding="utf-8")
    expected = []
    for info in pkgutil.iter_modules(minidl.ops.__path__):
        module = importlib.import_module(f"minidl.ops.{info.name}")
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, Function) and obj.__module__ == module.__name__
                    and obj.backward is not Function.backward):
                expected.append(name)
    assert len(expected) > 40
    missing = [name for name in expected if f'id="op-{name.lower()}"' not in html]
    assert not missing, f"ops missing from the ops page: {missing}"
    # the math comes from the docstring: the matmul entry carries its transposes
    assert r"d b = a ^{\top} \, d y" in html


def test_every_image_exists(pages, site):
    broken = []
    for path, page in pages.items():
        for src in page.images:
            if src.startswith(("http:", "https:", "data:")):
                continue
            if not (path.parent / unquote(urlsplit(src).path)).is_file():
                broken.append(f"{path.relative_to(site)}: {src}")
    assert not broken, "images that do not exist:\n" + "\n".join(broken)
    engine = pages[site / "engine.html"]
    assert any(src.endswith("two_layer_graph.svg") for src in engine.images)
    figures = sum(len(page.images) for path, page in pages.items() if "notebooks" in path.parts)
    assert figures >= 1, "the executed notebooks produced no figure"


def test_no_broken_internal_links(pages, site):
    broken = []
    for path, page in pages.items():
        for href in page.links:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{path.relative_to(site)}: {href}")
            elif parts.fragment and target.suffix == ".html" and target in pages:
                if unquote(parts.fragment) not in pages[target].ids:
                    broken.append(f"{path.relative_to(site)}: {href} (no such anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken[:50])


def test_notebook_pages_show_outputs(site):
    """The notebooks are kept without outputs; their pages have outputs because the build ran them."""
    for path in (site / "notebooks").glob("*.html"):
        html = path.read_text(encoding="utf-8")
        assert re.search(r'class="cell_output', html), f"{path.name} shows no output"
