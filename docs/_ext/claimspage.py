"""The tables of docs/claims.md, built from what the notebooks recorded when this build ran them.

A claim notebook ends with ``ClaimLog.save()`` (``minidl.train.claims``), which
writes ``<notebook>.json`` into ``$MINIDL_CLAIMS_DIR``; conf.py points that at
``docs/_build/claims`` before any notebook runs. On the page, a directive

    ```{claims} 17_generalization
    ```

stands where the notebook's table goes. The directive only marks the place (the
notebooks have not run yet when the page is read); the table is filled in once
every page has been read — and every notebook executed or taken from the
execution cache — from the record the notebook wrote: each claim, a link to the
notebook section that measures it (found in the notebook's own page, so a
renamed section fails the build), its seeds, what was measured, the verdict, and
the minidl code it uses; above it the date, the machine and the seconds of that
run. A notebook without a record, or a section the notebook does not have, is a
warning, so ``sphinx-build -W`` fails instead of showing stale numbers.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from minidl.train.claims import ENVIRONMENT, load_records, seeds_text

logger = logging.getLogger(__name__)
DEFAULT_FOLDER = Path(__file__).resolve().parent.parent / "_build" / "claims"
VERDICT_TEXT = {"reproduced": "reproduced", "partly": "partly reproduced", "not at this scale": "not at this scale"}


class claims_table(nodes.General, nodes.Element):
    """Where one notebook's claims go; replaced by the table when the page is resolved."""


class ClaimsDirective(SphinxDirective):
    required_arguments = 1
    has_content = False

    def run(self):
        notebook = self.arguments[0].strip()
        pages = getattr(self.env, "claims_pages", set())
        pages.add(self.env.docname)
        self.env.claims_pages = pages
        return [claims_table(notebook=notebook)]


def inline(text: str) -> list:
    """``code`` and **bold** of a claim's text as docutils nodes; everything else as plain text."""
    out = []
    for piece in re.split(r"(`[^`]+`|\*\*[^*]+\*\*)", text):
        if piece.startswith("`") and piece.endswith("`") and len(piece) > 1:
            out.append(nodes.literal(piece[1:-1], piece[1:-1]))
        elif piece.startswith("**") and piece.endswith("**") and len(piece) > 4:
            out.append(nodes.strong(piece[2:-2], piece[2:-2]))
        elif piece:
            out.append(nodes.Text(piece))
    return out


SMART_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"'})


def plain_title(text: str) -> str:
    """A title as the notebook's source writes it: the typographic quotes MyST puts in turned back."""
    return text.translate(SMART_QUOTES).strip()


def section_ids(doctree) -> dict:
    """Each section title of a page (its quotes plain) → the section's first id (its anchor)."""
    return {plain_title(section.next_node(nodes.title).astext()): section["ids"][0]
            for section in doctree.findall(nodes.section) if section["ids"] and section.next_node(nodes.title)}


def build_table(record: dict, link) -> list:
    """The nodes of one notebook's table: a line on the run, then one row per claim.

    ``link(section)`` gives the URI of a section of the notebook, or None when it has none.
    """
    run = nodes.paragraph()
    run += nodes.emphasis(text=f"Last run {record['date']} on {record['machine']}: "
                               f"{record['seconds']:.0f} s ({record['cpu_seconds']:.0f} s of CPU) for the notebook.")
    table = nodes.table(classes=["claims"])
    columns = ("claim", "section, seeds", "measured", "verdict", "code")
    group = nodes.tgroup(cols=len(columns))
    table += group
    for width in (28, 16, 40, 10, 16):
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for name in columns:
        row += nodes.entry("", nodes.paragraph(text=name))
    head += row
    body = nodes.tbody()
    group += body
    for claim in record["claims"]:
        row = nodes.row()
        uri = link(claim["section"])
        where = nodes.paragraph()
        if uri:
            where += nodes.reference("", "", nodes.emphasis(text=claim["section"]), refuri=uri, internal=True)
        else:
            where += nodes.emphasis(text=claim["section"])
        where += nodes.Text(f", {seeds_text(claim['seeds'])}")
        verdict = nodes.paragraph()
        text = VERDICT_TEXT.get(claim["verdict"], claim["verdict"])
        verdict += nodes.strong(text=text) if claim["verdict"] != "reproduced" else nodes.Text(text)
        for cell in (nodes.paragraph("", "", *inline(claim["claim"])), where,
                     nodes.paragraph("", "", *inline(claim["measured"])), verdict,
                     nodes.paragraph("", "", *inline(claim["code"]))):
            row += nodes.entry("", cell)
        body += row
    return [run, table]


def fill_tables(app, doctree, docname):
    placeholders = list(doctree.findall(claims_table))
    if not placeholders:
        return
    folder = os.environ.get(ENVIRONMENT) or str(DEFAULT_FOLDER)
    try:
        records = load_records(folder)
    except ValueError as error:
        logger.warning(f"claims: {error}", location=docname)
        records = {}
    for node in placeholders:
        notebook = node["notebook"]
        record = records.get(notebook)
        if record is None:
            logger.warning(f"claims: no record of notebook {notebook} in {folder}: the notebook did not run in this "
                           "build and its execution cache has no record (build with MINIDL_DOCS_EXECUTE=force)",
                           location=docname)
            node.replace_self(nodes.paragraph(text=f"(no record of {notebook})"))
            continue
        page = f"notebooks/{notebook}"
        anchors = section_ids(app.env.get_doctree(page)) if page in app.env.all_docs else {}
        if page not in app.env.all_docs:
            logger.warning(f"claims: notebook {notebook} has no page in this build", location=docname)

        def link(section, page=page, anchors=anchors, notebook=notebook):
            section = plain_title(section)
            if section not in anchors:
                logger.warning(f"claims: notebook {notebook} has no section {section!r} (its sections: "
                               f"{sorted(anchors)})", location=docname)
                return None
            return app.builder.get_relative_uri(docname, page) + "#" + anchors[section]

        node.replace_self(build_table(record, link))


def outdated(app, env, added, changed, removed):
    """The claims page is rebuilt whenever a notebook was: its tables come from their runs."""
    if any(name.startswith("notebooks/") for name in (*added, *changed)):
        return sorted(getattr(env, "claims_pages", set()) - set(added) - set(changed))
    return []


def purge(app, env, docname):
    getattr(env, "claims_pages", set()).discard(docname)


def merge(app, env, docnames, other):
    env.claims_pages = getattr(env, "claims_pages", set()) | (getattr(other, "claims_pages", set()) & set(docnames))


def skip(self, node):
    raise nodes.SkipNode


def setup(app):
    app.add_node(claims_table, html=(skip, None), latex=(skip, None), text=(skip, None))
    app.add_directive("claims", ClaimsDirective)
    app.connect("doctree-resolved", fill_tables)
    app.connect("env-get-outdated", outdated)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
