"""Read minidl's plain-text docstrings as reStructuredText without surprises.

minidl's docstrings are written to be read in the source: equations in plain
text (``y = a * b``, ``|x|``, ``zeros_``), examples and tables as indented
blocks. reStructuredText would read ``*`` as emphasis, ``|x|`` as a
substitution, ``name_`` as a link and an indented block after a paragraph as
an error. This extension rewrites each docstring before autodoc parses it:

- an indented block that is not the body of a directive, a field or a list item
  becomes a literal block (shown as written, monospaced);
- in prose, ``*``, ``|`` and a ``_`` that ends a word are escaped, outside
  ````literal````, ``:role:`text``` and ```text``` spans, which keep their meaning.
"""
from __future__ import annotations

import re

# Inline markup kept as it is: ``literal``, :role:`target`, `interpreted`.
_KEPT = re.compile(r"``.+?``|:[\w:.+-]+:`[^`]+`|`[^`]+`_{0,2}")
_SPECIAL = re.compile(r"\*|\||(?<=\w)_(?!\w)")
_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)]|#\.|\(?[a-z]\))\s+")
_FIELD = re.compile(r"^\s*:[^:]+:(\s|$)")
_DIRECTIVE = re.compile(r"^\s*\.\. ")


def escape_prose(line: str) -> str:
    """Escape reST's special characters in one line of prose, outside kept markup."""
    out, last = [], 0
    for match in _KEPT.finditer(line):
        out.append(_SPECIAL.sub(lambda m: "\\" + m.group(0), line[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_SPECIAL.sub(lambda m: "\\" + m.group(0), line[last:]))
    return "".join(out)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block_end(lines, start, base):
    """Index after the block that starts at ``start`` (lines indented deeper than ``base``)."""
    end = start
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    while end > start and not lines[end - 1].strip():  # trailing blank lines belong outside
        end -= 1
    return end


def rewrite(lines: list[str]) -> list[str]:
    """The docstring's lines, with implicit literal blocks made explicit and prose escaped."""
    out: list[str] = []
    base = 0  # indentation of the current paragraph's text (deeper inside a list item)
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            out.append(line)
            i += 1
            continue
        indent = _indent(line)
        item = _LIST_ITEM.match(line)
        if indent <= base or (item and indent <= base + 4 and out and not out[-1].strip()):
            # A line of ordinary text (possibly a new list item); a dedent ends a list item.
            base = indent
            if _DIRECTIVE.match(line) or _FIELD.match(line) or line.rstrip().endswith("::"):
                end = _block_end(lines, i + 1, indent)  # the body is reST already: leave it alone
                out.append(line if _DIRECTIVE.match(line) else escape_prose(line))
                out.extend(lines[i + 1:end])
                i = end
                continue
            if line.lstrip().startswith(">>>"):  # a doctest block runs to the next blank line
                end = i
                while end < len(lines) and lines[end].strip():
                    end += 1
                out.extend(lines[i:end])
                i = end
                continue
            if item:
                base = len(item.group(0))  # a list item's continuation lines align with its text
            out.append(escape_prose(line))
            i += 1
            continue
        # Deeper than the text around it: an implicit literal block (an example, an equation table).
        end = _block_end(lines, i, base)
        previous = out[-1] if out else ""
        if previous.strip() and previous.rstrip().endswith(":") and not previous.rstrip().endswith("::"):
            out[-1] = previous.rstrip() + ":"  # "Bias rules:" becomes "Bias rules::", shown as "Bias rules:"
        else:
            if previous.strip():
                out.append("")
            out.append(" " * base + "::")
        out.append("")
        out.extend(lines[i:end])
        out.append("")
        i = end
    return out


def _process(app, what, name, obj, options, lines):
    lines[:] = rewrite(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
