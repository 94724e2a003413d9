"""The built site, opened from disk in headless Chromium with no network, shows typeset math and its figures.

Each page (the index, the ops and optimizers pages, the engine page, the gallery
and every notebook page) is opened as ``file://`` in Debian's Chromium, cut off
from the network (``tests/docs/browser.py``). Once MathJax has finished, the
rendered DOM must hold no raw TeX delimiter in its text, every equation must
have become MathJax output without a TeX error, every image must have loaded,
and the page must have asked nothing of the network. On the ops page, no
relation sign of an op's forward or backward may be left outside the math.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("myst_nb", reason="the docs extra is not installed: pip install -e '.[docs]'")

from tests.docs.browser import Browser, chromium  # noqa: E402 - after the skips above
from tests.docs.sitebuild import ROOT, built_site  # noqa: E402

NOTEBOOKS = sorted(f"notebooks/{path.stem}" for path in (ROOT / "notebooks").glob("*.ipynb"))
PAGES = ["index", "ops", "optimizers", "engine", "gallery", *NOTEBOOKS]
MATH_PAGES = {"ops": 2 * 40, "optimizers": 60, "engine": 5}  # at least this many equations

# Runs in the page once it has loaded: waits for MathJax and the images, then reports.
REPORT = r"""
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  for (const img of document.images) img.loading = "eager";
  await Promise.all([...document.images].map(
    i => i.complete ? null : new Promise(done => { i.onload = i.onerror = done; })));
  const outside = (root, skip) => {
    const found = [], walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let n = walker.nextNode(); n; n = walker.nextNode())
      if (!n.parentElement.closest(skip)) found.push(n.nodeValue);
    return found;
  };
  const math = [...document.querySelectorAll(".math")];
  return JSON.stringify({
    mathjax: (window.MathJax && MathJax.version) || null,
    math: math.length,
    untypeset: math.filter(e => !e.querySelector("mjx-container")).map(e => e.textContent.trim().slice(0, 300)),
    raw_tex: outside(document.body, "script, style, pre, code, textarea")
      .filter(t => /\\\(|\\\)|\\\[|\\\]|\$\$|\\begin\{|\\frac\{/.test(t)).map(t => t.trim().slice(0, 300)),
    tex_errors: [...document.querySelectorAll("mjx-merror")]
      .map(e => (e.getAttribute("data-mjx-error") || e.textContent).slice(0, 300)),
    images: [...document.images].map(i => ({src: i.getAttribute("src"), width: i.naturalWidth})),
    op_relations_as_text: [...document.querySelectorAll(".op-math dd")].flatMap(
      dd => outside(dd, "mjx-container, code").filter(t => /[=←≈≤≥]/.test(t)).map(t => t.trim())),
  });
})()
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    return built_site(tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    executable = chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (`.ci/run` installs Debian's package: apt-get install chromium)")
    browser = Browser(executable)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def rendered(site, browser):
    """page name -> (the page's report, the URLs it requested), each page opened once."""
    cache = {}

    def render(name):
        if name not in cache:
            path = site / f"{name}.html"
            assert path.is_file(), f"{name}.html was not built"
            value, requested = browser.visit(path.as_uri(), REPORT)
            cache[name] = json.loads(value), requested
        return cache[name]

    return render


@pytest.mark.parametrize("name", PAGES)
def test_page_renders_offline(rendered, name):
    report, requested = rendered(name)
    assert not report["raw_tex"], f"{name} shows raw TeX: {report['raw_tex'][:5]}"
    assert not report["untypeset"], f"{name}: equations MathJax did not typeset: {report['untypeset'][:5]}"
    assert not report["tex_errors"], f"{name}: TeX errors: {report['tex_errors'][:5]}"
    if report["math"]:
        assert report["mathjax"], f"{name} has equations but MathJax did not run"
    broken = [image["src"] for image in report["images"] if image["width"] <= 0]
    assert not broken, f"{name}: images that did not load: {broken}"
    assert report["math"] >= MATH_PAGES.get(name, 0), f"{name} has only {report['math']} equations"
    remote = [url for url in requested if not url.startswith(("file:", "data:", "blob:", "about:"))]
    assert not remote, f"{name} asks the network for {remote}"


def test_ops_page_leaves_no_relation_outside_the_math(rendered):
    report, _ = rendered("ops")
    assert report["math"] > 0
    assert not report["op_relations_as_text"], \
        f"ops whose forward or backward shows a relation as plain text: {report['op_relations_as_text'][:10]}"


def test_notebook_pages_show_their_figures(rendered):
    images = [image for name in NOTEBOOKS for image in rendered(name)[0]["images"]]
    assert images, "no notebook page shows a figure"
    assert all(image["width"] > 0 for image in images)
