"""Docstrings as docutils nodes with their math typeset: shared by the ops and optimizers pages.

A docstring's blocks (``docmath.blocks``) become nodes: paragraphs and list
items with ``code`` as literals, *words* emphasized and the equations inside
their sentences as inline math; each formula block as one aligned display, its
remarks in a column of their own; code as written. Every equation line that
``docmath`` cannot typeset is a build warning naming the docstring and the line,
so ``sphinx-build -W`` fails on it.
"""
from __future__ import annotations

import re

from docmath import aligned_row, blocks, equation_lines, lhs_names, prose_pieces
from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)
_EMPHASIS = re.compile(r"(?<![\w*])\*([^*\s](?:[^*]*[^*\s])?)\*(?![\w*])")


def piece_nodes(pieces) -> list[nodes.Node]:
    """("math" | "literal" | "text", content) pieces as nodes."""
    out = []
    for kind, content in pieces:
        if kind == "math":
            out.append(nodes.math(content, content))
        elif kind == "literal":
            out.append(nodes.literal(content, content))
        else:
            last = 0
            for match in _EMPHASIS.finditer(content):
                out += [nodes.Text(content[last:match.start()]), nodes.emphasis(match.group(1), match.group(1))]
                last = match.end()
            out.append(nodes.Text(content[last:]))
    return out


def inline(text: str, names) -> list[nodes.Node]:
    """Prose as nodes: ``code`` as literals, *words* emphasized, equations in the sentences as math."""
    return piece_nodes(prose_pieces(text, names))


def equation_nodes(lines, names, docname) -> list[nodes.Node]:
    """A formula block: its math rows as one aligned display; a row of prose as a paragraph."""
    names = set(names) | lhs_names(lines)
    out, run = [], []

    def flush():
        if run:
            latex = r"\[\begin{aligned}" + r" \\ ".join(run) + r"\end{aligned}\]"
            out.append(nodes.math_block(latex, latex, nowrap=True, number=None, label=None, docname=docname))
            run.clear()

    for line in lines:
        row = aligned_row(line, names)
        if row:
            run.append(row)
        else:
            flush()
            out.append(nodes.paragraph("", "", *inline(line, names)))
    flush()
    return out


def block_nodes(parts, names, docname, edit_paragraph=None) -> list[nodes.Node]:
    """Blocks as nodes; ``edit_paragraph(text)`` may rewrite or (returning "") drop a paragraph."""
    out = []
    for kind, content in parts:
        if kind == "para":
            content = edit_paragraph(content) if edit_paragraph else content
            if content:
                out.append(nodes.paragraph("", "", *inline(content, names)))
        elif kind == "bullets":
            out.append(nodes.bullet_list("", *[nodes.list_item("", nodes.paragraph("", "", *inline(item, names)))
                                               for item in content]))
        elif kind == "code":
            text = "\n".join(content)
            out.append(nodes.literal_block(text, text))
        else:
            out.extend(equation_nodes(content, names, docname))
    return out


def doc_nodes(doc: str, names, docname, edit_paragraph=None) -> list[nodes.Node]:
    """A docstring as nodes (see :func:`block_nodes`)."""
    return block_nodes(blocks(doc), names, docname, edit_paragraph)


def warn_untypeset(doc: str, names, what: str, op: bool = False, location=None) -> None:
    """A build warning for each equation line of ``doc`` that is not typeset."""
    for line, left in equation_lines(doc, names, op):
        if left:
            logger.warning(f"{what}: this equation line is not typeset: {line!r} (left as text: "
                           f"{'; '.join(map(repr, left))}); docs/_ext/docmath.py says how to write it",
                           type="docmath", subtype="untypeset", location=location)
