"""Every notebook's Markdown, parsed as the docs build parses it: MyST's markdown-it with docs/conf.py's extensions.

What is checked, cell by cell, in every notebook of notebooks/:

- **no table cell is lost**: for each row of each Markdown table, the row's source line (outer pipes
  stripped, ``\\|`` read as ``|``) equals the row's parsed cells joined by ``|`` (whitespace ignored).
  A ``|`` inside math or code splits a cell in two, and markdown-it drops the cells beyond the header's
  count, so the text of the row comes back shorter (write ``\\lvert x\\rvert`` for ``|x|`` in a table);
- **one title, first**: the first cell is Markdown and opens with a ``# `` heading, and no other cell
  has one, so the docs take it as the page's title and its ``##`` sections stay sections of the page
  (without a title, each section becomes an entry of the gallery's table of contents).
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytest.importorskip("myst_parser", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _conf_value(name: str):
    """A literal assigned in docs/conf.py, read without running it (importing it copies the notebooks)."""
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"docs/conf.py assigns no {name}")


def _parser():
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    config = MdParserConfig(enable_extensions=set(_conf_value("myst_enable_extensions")))
    return create_md_parser(config, RendererHTML)


PARSER = _parser()


def lost_table_cells(markdown: str) -> list[str]:
    """The source lines of table rows that lose text when parsed (see the module docstring)."""
    tokens, lines, lost = PARSER.parse(markdown), markdown.splitlines(), []
    for i, token in enumerate(tokens):
        if token.type != "tr_open":
            continue
        cells, k = [], i + 1
        while tokens[k].type != "tr_close":
            if tokens[k].type == "inline":
                cells.append(tokens[k].content)
            k += 1
        line = lines[token.map[0]]
        source = line.strip().removeprefix("|").removesuffix("|").replace("\\|", "|")
        if "".join(source.split()) != "".join("|".join(cells).split()):
            lost.append(line)
    return lost


def _h1_count(markdown: str) -> int:
    return sum(t.type == "heading_open" and t.tag == "h1" for t in PARSER.parse(markdown))


def _markdown_cells(path):
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"], cells


def test_the_checks_see_what_they_exist_to_catch():
    table = "| method | error |\n|---|---|\n| a | $\\dfrac{|f'''|}{6}h^2$ |\n| b | $\\lvert f\\rvert$ |\n"
    assert lost_table_cells(table) == ["| a | $\\dfrac{|f'''|}{6}h^2$ |"]   # the row with | inside math
    assert lost_table_cells("| a | b |\n|---|---|\n| `x \\| y` | 2 |\n") == []  # an escaped | stays in its cell
    assert _h1_count("# Title\n\n## Section\n") == 1 and _h1_count("## Section\n\n### Aside\n") == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_table_row_keeps_its_cells(path):
    cells, _ = _markdown_cells(path)
    lost = [(i, row) for i, text in cells for row in lost_table_cells(text)]
    assert not lost, (f"{path.name}: table rows lose cells when the docs render them (a | inside math or "
                      f"code? write \\lvert x\\rvert): {lost}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_has_one_title_in_its_first_cell(path):
    cells, raw = _markdown_cells(path)
    assert raw[0]["cell_type"] == "markdown", f"{path.name}: the first cell is not Markdown"
    first = PARSER.parse("".join(raw[0]["source"]))
    assert first and first[0].type == "heading_open" and first[0].tag == "h1", \
        f"{path.name}: the first cell does not open with a '# ' title"
    others = [i for i, text in cells if i != 0 and _h1_count(text)]
    assert not others, f"{path.name}: cells {others} hold a second '# ' title"
