"""Turn the plain-text math of minidl.optim's docstrings into LaTeX for MathJax.

The update functions write their equations as the book does, one per line,
with a remark after a gap of spaces::

    m ← β₁m + (1 − β₁)g             first moment: momentum
    w ← w − lr·(m̂ / ((√v̂)^k + ε) + λw)            k = hessian_power

This module builds on ``opsmath.py`` (its Greek letters, superscripts and
function names) and adds what optimizers need: the arrow ←, norms ‖·‖,
subscript digits (β₁), ᵗ, Π_{i≤t}, ⌊·⌋, numbers such as 1e-3, and the names
of the documented function's parameters (``lr``, ``step_size``) as upright
symbols. As in ``opsmath.py`` nothing is guessed: a piece of text with a word
the translation does not know is prose and is shown as written.
"""
from __future__ import annotations

import re
import unicodedata

from opsmath import GREEK, LATEX_FUNCTIONS, NAMED_FUNCTIONS, SUPERSCRIPTS, NotMath

__all__ = ["NotMath", "aligned_row", "has_relation", "lhs_names", "prose_pieces", "segments", "text_latex",
           "to_latex"]

SUPER = {**SUPERSCRIPTS, "ᵗ": "t"}
SUBSCRIPTS = {"₀": "0", "₁": "1", "₂": "2", "₃": "3", "₄": "4", "₅": "5", "₆": "6", "₇": "7", "₈": "8", "₉": "9"}
SYMBOLS = {"←": r"\leftarrow ", "→": r"\to ", "·": r"\cdot ", "*": r"\cdot ", "⊙": r"\odot ", "±": r"\pm ",
           "½": r"\tfrac{1}{2}", "∞": r"\infty ", "−": "-", "≤": r"\le ", "≥": r"\ge ", "≈": r"\approx ",
           "∝": r"\propto ", "∇": r"\nabla ", "‖": r"\|", "⌊": r"\lfloor ", "⌋": r"\rfloor ", "~": r"\sim ",
           "×": r"\times ", "%": r"\%", ";": r";\;", ",": r",\,", "{": r"\{", "}": r"\}"}
PLAIN = set("+-=/()[]|!:.<>")
BIG_OPERATORS = {"Π": r"\prod", "∏": r"\prod", "Σ": r"\sum"}
RELATIONS = "←=≤≥≈∝<>"
GLOBAL_NAMES = {"lr"}                 # the learning rate, in every docstring
PRODUCTS = {"Hz", "Hv"}               # a matrix times a vector, written side by side
OPEN, CLOSE = {"(": ")", "[": "]", "⌊": "⌋"}, {")", "]", "⌋"}
_NOT_LETTER = "⁰¹²³⁴⁵⁶⁷⁸⁹⁻ˣᵀⁱʲⁿᵗ₀₁₂₃₄₅₆₇₈₉½"
_L = rf"[^\W\d_{_NOT_LETTER}]"
_TOKEN = re.compile(rf"""
      (?P<space>\s+)
    | (?P<power>\*\*)
    | (?P<sup>[{''.join(SUPER)}]+)
    | (?P<sub>[{''.join(SUBSCRIPTS)}]+)
    | (?P<word>{_L}(?:{_L}|[0-9])*[\u0302\u0304]?(?:_(?:\{{[^{{}}]*\}}|(?:{_L}|[0-9])+))*)
    | (?P<number>\d+(?:\.\d+)?(?:e-?\d+)?)
    | (?P<other>.)
""", re.VERBOSE)


def tokens(text: str):
    """(kind, value, start, end) for each token of ``text`` (already in NFD form)."""
    return [(m.lastgroup, m.group(0), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _symbols(text: str) -> str:
    return " ".join(GREEK.get(c, c) for c in text)


def _name(name: str) -> str:
    """A parameter's name as a symbol: a0 → a₀, T_mult → T with subscript mult, lr → upright lr."""
    if len(name) == 1:
        return _symbols(name)
    if re.fullmatch(r"[A-Za-z][0-9]+", name):
        return f"{name[0]}_{{{name[1:]}}}"
    head, _, rest = name.partition("_")
    if rest and (len(head) == 1 or head in GREEK):
        sub = _symbols(rest) if len(rest) == 1 else r"\text{" + rest + "}"
        return f"{_symbols(head)}_{{{sub}}}"
    return r"\mathrm{" + name.replace("_", r"\_") + "}"


def _word(text: str, names) -> str:
    """LaTeX of one word token; NotMath when it is a word of prose."""
    if "_" in text and text in names:  # step_size, T_mult: a parameter, not a subscript
        return _name(text)
    head, _, sub = text.partition("_")
    if sub and len(head.rstrip("\u0302\u0304")) > 1 and head not in BIG_OPERATORS:
        raise NotMath(text)  # lr_decay: a name from the code, not a symbol with a subscript
    accent = ""
    if head[-1] in "\u0302\u0304":
        accent, head = (r"\hat" if head[-1] == "\u0302" else r"\bar"), head[:-1]
    if head in BIG_OPERATORS:
        latex = BIG_OPERATORS[head]
    elif head in LATEX_FUNCTIONS:
        latex = "\\" + head
    elif head in NAMED_FUNCTIONS and len(head) > 1:
        latex = rf"\operatorname{{{head}}}"
    elif head.isalpha() and (len(head) == 1 or (len(head) <= 3 and any(c in GREEK for c in head))):
        latex = _symbols(head)  # x, μb, tβ, Δw: one-letter symbols side by side
    elif re.fullmatch(r"[A-Za-z][0-9]+", head) or head in names or head in GLOBAL_NAMES:
        latex = _name(head)
    elif head in PRODUCTS:
        latex = head
    else:
        raise NotMath(text)
    if accent and len(head) > 1 and latex == _symbols(head):  # ρḡ: the bar is on the g
        latex = f"{_symbols(head[:-1])} {accent}{{{_symbols(head[-1])}}}"
    elif accent:
        latex = f"{accent}{{{latex}}}"
    if sub:
        if sub.startswith("{"):
            sub = _convert(tokens(sub[1:-1]), names)
        elif sub.isalpha() and len(sub) >= 2:
            sub = rf"\text{{{sub}}}"
        else:
            sub = _symbols(sub)
        latex = f"{latex}_{{{sub}}}"
    return latex


def _number(text: str) -> str:
    mantissa, _, exponent = text.partition("e")
    if not exponent:
        return text
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa}\cdot {power}"


def _closing(toks, start):
    """Index of the bracket closing the one at ``start``."""
    depth = 0
    for index in range(start, len(toks)):
        value = toks[index][1]
        depth += (value in OPEN) - (value in CLOSE)
        if depth == 0:
            return index
    raise NotMath("unbalanced brackets")


def _operand(toks, start, names):
    """LaTeX of the operand after ^, ** or √, and the index after it; outer brackets dropped."""
    while start < len(toks) and toks[start][0] == "space":
        start += 1
    if start >= len(toks):
        raise NotMath("missing operand")
    kind, value = toks[start][:2]
    if value in "-−":
        inner, end = _operand(toks, start + 1, names)
        return "-" + inner, end
    if value in OPEN:
        end = _closing(toks, start)
        inner = _convert(toks[start + 1:end], names)
        return (rf"\lfloor {inner}\rfloor " if value == "⌊" else inner), end + 1
    if value in "|‖":
        end = next((i for i in range(start + 1, len(toks)) if toks[i][1] == value), None)
        if end is None:
            raise NotMath(f"unbalanced {value}")
        bar = "|" if value == "|" else r"\|"
        return f"{bar}{_convert(toks[start + 1:end], names)}{bar}", end + 1
    if kind == "word":
        return _word(value, names), start + 1
    if kind == "number":
        return _number(value), start + 1
    raise NotMath(f"unexpected {value!r}")


def _convert(toks, names) -> str:
    out, i = [], 0
    while i < len(toks):
        kind, value = toks[i][:2]
        if kind == "space":
            out.append(r"\quad " if len(value) >= 2 else " ")
            i += 1
        elif kind == "power" or value == "^":
            operand, i = _operand(toks, i + 1, names)
            out.append(f"^{{{operand}}}")
        elif value == "√":
            operand, i = _operand(toks, i + 1, names)
            out.append(rf"\sqrt{{{operand}}}")
        elif kind == "sup":
            out.append("^{" + "".join(SUPER[c] for c in value) + "}")
            i += 1
        elif kind == "sub":
            out.append("_{" + "".join(SUBSCRIPTS[c] for c in value) + "}")
            i += 1
        elif kind == "word":
            out.append(_word(value, names) + " ")
            i += 1
        elif kind == "number":
            out.append(_number(value))
            i += 1
        elif value in SYMBOLS:
            out.append(SYMBOLS[value])
            i += 1
        elif value in PLAIN:
            out.append(value)
            i += 1
        else:
            raise NotMath(f"unknown character {value!r}")
    return "".join(out)


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += (char in OPEN) - (char in CLOSE)
        if depth < 0:
            return False
    return depth == 0 and text.count("|") % 2 == 0 and text.count("‖") % 2 == 0


def to_latex(text: str, names=frozenset()) -> str:
    """LaTeX for a piece of docstring math; raises NotMath when it holds prose.

    ``names`` are the multi-letter names that are symbols here (the parameters of
    the function whose docstring this is).
    """
    text = unicodedata.normalize("NFD", text.strip().rstrip(".").strip())
    if not text or any(c in text for c in "`'\\\"$") or not _balanced(text):
        raise NotMath(text)
    return re.sub(r"\s+", " ", _convert(tokens(text), names)).strip()


def has_relation(text: str) -> bool:
    return any(r in text for r in RELATIONS)


def text_latex(text: str) -> str:
    """``text`` as a MathJax \\text{...} (roles and literals as their bare names, braces made safe)."""
    text = re.sub(r":[\w:.+-]+:`~?([^`]+)`|``(.+?)``", lambda m: m.group(1) or m.group(2), text.strip())
    text = text.replace("\\", "").replace("$", "").replace("{", "(").replace("}", ")")
    return rf"\text{{{text}}}"


# ---------------------------------------------------------------- equation lines
def segments(line: str) -> list[str]:
    """A line cut at its gaps of two or more spaces (an arrow's own alignment gap is not a cut)."""
    line = re.sub(r"\s{2,}(?=[←=])|(?<=[←=])\s{2,}", " ", line.strip())
    return [part for part in re.split(r"\s{2,}", line) if part]


def lhs_names(lines) -> set[str]:
    """Names assigned in an equation block (``trust ← ...``, ``cycle = ...``): symbols in it too."""
    found = set()
    for line in lines:
        for match in re.finditer(r"(?:^|[\s;,(])([^\W\d][\w]*)\s*[←=]", line):
            found.add(match.group(1))
    return found


def _align(latex: str) -> str:
    """Put the alignment point ``&`` before the first ← (else the first top-level =)."""
    index = latex.find(r"\leftarrow")
    if index < 0:
        depth = 0
        for position, char in enumerate(latex):
            depth += {"{": 1, "}": -1}.get(char, 0)
            if char == "=" and depth == 0:
                index = position
                break
    return "&" + latex if index < 0 else latex[:index] + "&" + latex[index:]


def aligned_row(line: str, names) -> str | None:
    """One row of an ``aligned`` block for an equation line, or None when the line is prose.

    Leading prose is a label, math segments are the equation, trailing prose is the
    remark (in its own column). ``r ← the Adam direction`` keeps its words as text.
    """
    parts = segments(line)
    kinds = []
    for part in parts:
        try:
            kinds.append(("math", to_latex(part, names)))
        except NotMath:
            kinds.append(("text", part))
    if not any(kind == "math" for kind, _ in kinds):
        lhs, arrow, rhs = parts[0].partition("←")
        try:
            if not arrow:
                return None
            kinds[0] = ("math", f"{to_latex(lhs, names)} \\leftarrow {text_latex(rhs)}")
        except NotMath:
            return None
    first = next(i for i, (kind, _) in enumerate(kinds) if kind == "math")
    last = max(i for i, (kind, _) in enumerate(kinds) if kind == "math")
    kinds[last] = ("math", kinds[last][1].removesuffix(SYMBOLS[","]).rstrip())  # `E[z ⊙ Hz] = diag(H),`
    label = r"\quad ".join(text_latex(text) for _, text in kinds[:first])
    body = [_align(kinds[first][1])] + [latex if kind == "math" else text_latex(latex)
                                        for kind, latex in kinds[first + 1:last + 1]]
    row = (label + r"\quad " if label else "") + r"\quad ".join(body)
    remark = " ".join(text for _, text in kinds[last + 1:])
    if remark:
        row += r" && {\small " + text_latex(remark) + "}"
    return row


# ---------------------------------------------------------------- math inside prose
_INLINE = re.compile(r"``(.+?)``|:[\w:.+-]+:`~?([^`]+)`")
_OPERATOR_END = tuple("+-−·/=←,;:(⊙√^")


def _symbol_word(word: str) -> bool:
    """True for a word that is a symbol whatever the names around it (x, β, lr, max, a0)."""
    try:
        _word(word, frozenset())
        return True
    except NotMath:
        return False


def _top_level_split(text: str) -> list[str]:
    """``text`` cut at its ", " outside brackets."""
    pieces, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += (char in OPEN) - (char in CLOSE)
        if depth == 0 and text.startswith(", ", index):
            pieces.append(text[start:index])
            start = index + 2
    return pieces + [text[start:]]


def _math_runs(text: str, names):
    """(start, end, latex) of the equations inside a piece of prose: the longest spans that
    convert, hold a relation (← = ≤ ...) and do not end on an operator."""
    toks = tokens(text)
    barrier = []
    for kind, value, _, _ in toks:
        try:
            stop = (kind == "word" and _word(value, names) is None) or value in "'\"`"
        except NotMath:
            stop = True
        barrier.append(stop or (kind == "other" and value not in SYMBOLS and value not in PLAIN
                                and value not in "√^"))
    runs, i = [], 0
    while i < len(toks):
        starts_here = (not barrier[i] and toks[i][0] in ("word", "number") or toks[i][1] in "(√‖|⌊")
        if starts_here and toks[i][0] == "word" and not _symbol_word(toks[i][1]):
            following = next((t[1] for t in toks[i + 1:] if t[0] != "space"), "")
            starts_here = following in RELATIONS or following == "("  # `decoupled w ← ...`: start at w
        if not starts_here or (i and toks[i - 1][0] not in ("space",) and toks[i - 1][1] not in "(~"):
            i += 1
            continue
        limit = i
        while limit < len(toks) and not barrier[limit] and not (
                toks[limit][1] == "." and (limit + 1 == len(toks) or toks[limit + 1][0] == "space")):
            limit += 1
        found = None
        for j in range(limit, i, -1):
            if toks[j - 1][0] == "space":
                continue
            piece = text[toks[i][2]:toks[j - 1][3]]
            if not has_relation(piece) or piece.endswith(_OPERATOR_END):
                continue
            pieces = _top_level_split(piece)
            while len(pieces) > 1 and not has_relation(pieces[-1]):
                pieces.pop()
            piece = ", ".join(pieces)
            try:
                found = (toks[i][2], toks[i][2] + len(piece), to_latex(piece, names))
                break
            except NotMath:
                continue
        if found:
            runs.append(found)
            while i < len(toks) and toks[i][2] < found[1]:
                i += 1
        else:
            i += 1
    return runs


def prose_pieces(text: str, names=frozenset()):
    """A paragraph as ("text" | "literal" | "math", content) pieces: ``code`` and :role:`x` spans
    as literals, equations inside the sentences as math, the rest as text."""
    text = unicodedata.normalize("NFD", text)
    out, last = [], 0

    def plain(segment):
        position = 0
        for start, end, latex in _math_runs(segment, names):
            if start > position:
                out.append(("text", segment[position:start]))
            out.append(("math", latex))
            position = end
        if position < len(segment):
            out.append(("text", segment[position:]))

    for match in _INLINE.finditer(text):
        plain(text[last:match.start()])
        out.append(("literal", match.group(1) or match.group(2)))
        last = match.end()
    plain(text[last:])
    return [(kind, unicodedata.normalize("NFC", content) if kind != "math" else content)
            for kind, content in out if content]
