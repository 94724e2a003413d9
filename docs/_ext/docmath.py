"""Docstring math, typeset: minidl's plain-text equations turned into LaTeX for the site.

minidl writes the math of an op or an optimizer in its docstring the way one
writes it on paper, in Unicode, so that it reads well in the source::

    y = a / b;  da = dy / b,  db = −dy · a / b²
    m ← β₁m + (1 − β₁)g             first moment: momentum

This module translates such text into LaTeX (``db = -dy \\cdot a / b^{2}``,
``m \\leftarrow \\beta_{1} m + ...``) for the ops page and the optimizers page.
The translation is strict: a word it does not know as math (and is not a
parameter of the documented op or function) is prose, and prose is never set
as a formula. Nothing is guessed.

How to write a docstring so that its math is typeset
----------------------------------------------------

An *equation line* is a piece of docstring text that states an equation, that
is, holds a relation sign (``= ← ≈ ≤ ≥ < > ~ ∝ →``) outside ````code````:

1. In an op's docstring (a :class:`~minidl.autograd.Function` subclass) the
   first paragraph is the op's math, the forward, a ``;``, then the backward
   (``y = x Wᵀ + b;  dx = dy W,  dW = dyᵀ x``). Each of the two halves that
   holds a relation sign is an equation line.
2. In any docstring on the two pages (ops, optimizers, their update functions,
   schedules), every line of a *formula block* that holds a relation sign is an
   equation line. A formula block is a paragraph indented deeper than the text
   around it, or a paragraph of two or more lines laid out in columns (a gap of
   two or more spaces inside a line, not after a full stop). A block introduced
   by ``::``, starting with ``>>>`` or carrying ``#`` comments is code, shown
   as written, and holds no equation lines.

An equation line is *typeset* when every relation sign in it ends up inside
typeset math. Words may stand around the math: a label before it
(``exact:  Φ(x) = ...``), a remark after a gap of two spaces or in
parentheses, a sentence joining two equations (``dx = dy at the maximum``,
``..., with b = ⟨dy · x̂⟩ and c = ⟨dz · x̂⟩``); they are set as text. What must
convert is each equation itself: its symbols are single letters (Greek too,
with accents x̂, ḡ, subscripts ``x_i``, ``A_nc``, ``w_{y_n}``, ``β₁`` and
superscripts ``x²``, ``Wᵀ``, ``eʸ``), gradients ``dx``, ``dW``, ``dℓ``, the
functions listed below (``exp``, ``softmax``, ``erf``...), numbers (``1e-3``)
and the parameter names of the documented op or function (``lr``, ``eps``,
``axis``). An equation ends where words, punctuation or the line's end follow
it; a right-hand side in words is fine (``dx = the interior of dy``,
``r ← the Adam direction``), but an unknown name that is called, indexed or
raised (``y = frobnicate(x)``) or an operator right after the math is an
equation that did not convert. An equation opens on its relation sign only
right after a parenthesis (``(= softmax − onehot for class targets)``). A line
that breaks the rule fails the docs build (``sphinx-build -W``) and
``tests/docs/test_docmath.py``, naming the op and the line: add the missing
function to ``NAMED_FUNCTIONS`` below or write the line in symbols.
"""
from __future__ import annotations

import re
import unicodedata

__all__ = ["NotMath", "aligned_row", "blocks", "doc_lines", "equation_lines", "has_relation", "lhs_names",
           "line_pieces", "op_parts", "prose_pieces", "row_leftovers", "segments", "split_forward_backward",
           "split_note", "text_latex", "to_latex", "untypeset"]

SUPERSCRIPTS = {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8",
                "⁹": "9", "⁻": "-", "ˣ": "x", "ᵀ": r"\top", "ⁱ": "i", "ʲ": "j", "ⁿ": "n", "ᵗ": "t", "ʸ": "y",
                "ᵏ": "k"}
SUBSCRIPTS = {"₀": "0", "₁": "1", "₂": "2", "₃": "3", "₄": "4", "₅": "5", "₆": "6", "₇": "7", "₈": "8", "₉": "9"}
SYMBOLS = {"←": r"\leftarrow ", "→": r"\to ", "·": r"\cdot ", "*": r"\cdot ", "⊙": r"\odot ", "±": r"\pm ",
           "½": r"\tfrac{1}{2}", "∞": r"\infty ", "−": "-", "≤": r"\le ", "≥": r"\ge ", "≈": r"\approx ",
           "∝": r"\propto ", "∇": r"\nabla ", "∂": r"\partial ", "‖": r"\|", "⌊": r"\lfloor ", "⌋": r"\rfloor ",
           "⟨": r"\langle ", "⟩": r"\rangle ", "~": r"\sim ", "×": r"\times ", "@": r"\, ", "%": r"\%",
           "&": r"\&", "#": r"\#", ";": r";\;", ",": r",\,", "{": r"\{", "}": r"\}", "′": "'", "″": "''",
           "…": r"\dots "}
PLAIN = set("+-=/()[]|!:.<>")
BIG_OPERATORS = {"Σ": r"\sum", "Π": r"\prod", "∏": r"\prod"}
GREEK = {"α": r"\alpha", "β": r"\beta", "γ": r"\gamma", "δ": r"\delta", "ε": r"\varepsilon",
         "η": r"\eta", "θ": r"\theta", "κ": r"\kappa", "λ": r"\lambda", "μ": r"\mu", "ν": r"\nu",
         "π": r"\pi", "ρ": r"\rho", "σ": r"\sigma", "τ": r"\tau", "φ": r"\phi", "ψ": r"\psi",
         "ω": r"\omega", "Φ": r"\Phi", "Ψ": r"\Psi", "Ω": r"\Omega", "Δ": r"\Delta", "Λ": r"\Lambda",
         "Σ": r"\Sigma", "ℓ": r"\ell"}
LATEX_FUNCTIONS = {"max", "min", "exp", "log", "ln", "tanh", "sin", "cos", "det", "arg"}
NAMED_FUNCTIONS = {"sign", "softmax", "erf", "sigmoid", "relu", "col2im", "im2col", "argmax", "argmin", "mean",
                   "var", "diag", "tr", "clip", "gelu", "softplus", "logsumexp", "zeros", "ones", "onehot",
                   "Bernoulli", "Rademacher", "round", "sqrt", "rms", "Var", "DFT", "IDFT", "conj", "crop", "flip",
                   "conv"}
CONNECTIVES = {"for", "otherwise", "where", "else", "if", "or", "and", "with", "elsewhere", "over"}
QUANTITIES = {"ddof", "eps", "key", "axis", "axes", "cond", "lo", "hi", "sh", "sw", "pad", "lr",  # any docstring's
              "shape", "ndim"}
PRODUCTS = {"Hz", "Hv"}               # a matrix times a vector, written side by side
RELATIONS = "←=≤≥≈∝<>~→"
OPEN, CLOSE = {"(": ")", "[": "]", "⌊": "⌋", "⟨": "⟩"}, {")", "]", "⌋", "⟩"}
ACCENTS = {"\u0302": r"\hat", "\u0304": r"\bar", "\u0303": r"\tilde"}
_NOT_LETTER = "".join(SUPERSCRIPTS) + "".join(SUBSCRIPTS) + "½"
_L = rf"[^\W\d_{_NOT_LETTER}]"
_TOKEN = re.compile(rf"""
      (?P<space>\s+)
    | (?P<power>\*\*)
    | (?P<dots>\.\.\.)
    | (?P<sup>[{''.join(SUPERSCRIPTS)}]+)
    | (?P<sub>[{''.join(SUBSCRIPTS)}]+)
    | (?P<word>{_L}(?:{_L}|[0-9])*[{''.join(ACCENTS)}]?(?:_(?:\{{[^{{}}]*\}}|(?:{_L}|[0-9])+))*)
    | (?P<number>\d+(?:\.\d+)?(?:e-?\d+)?)
    | (?P<other>.)
""", re.VERBOSE)


class NotMath(ValueError):
    """The text holds something that is not math (a word of prose): show it as written."""


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


def _head(head: str, names, connectives: bool) -> tuple[str, str]:
    """(LaTeX, kind) of a word without its subscript; kind is 'symbol', 'function', 'name' or 'text'."""
    if head in BIG_OPERATORS:
        return BIG_OPERATORS[head], "function"
    if head in LATEX_FUNCTIONS:
        return "\\" + head, "function"
    if head in NAMED_FUNCTIONS and len(head) > 1:
        return rf"\operatorname{{{head}}}", "function"
    if connectives and head in CONNECTIVES:
        return rf"\text{{ {head} }}", "text"
    if head.isalpha() and (len(head) == 1 or (len(head) == 2 and head[0] == "d")
                           or (len(head) <= 3 and any(c in GREEK for c in head))):
        return _symbols(head), "symbol"  # x, dW, dℓ, μb, Δw: one-letter symbols side by side
    if re.fullmatch(r"[A-Za-z][0-9]+", head):
        return _name(head), "symbol"  # x1, a0
    if head in names or head in QUANTITIES:
        return _name(head), "name"
    if head in PRODUCTS:
        return head, "symbol"
    raise NotMath(head)


def _word(text: str, names=frozenset(), connectives: bool = True) -> str:
    """LaTeX of one word token; NotMath when it is a word of prose."""
    if "_" in text and text in names:  # step_size, T_mult: a parameter, not a subscript
        return _name(text)
    head, _, sub = text.partition("_")
    accent = ACCENTS.get(head[-1], "")
    if accent:
        head = head[:-1]
    latex, kind = _head(head, names, connectives)
    if kind == "text" and sub:
        raise NotMath(text)
    if sub and kind == "name":
        raise NotMath(text)  # lr_decay: a name from the code, not a symbol with a subscript
    if accent and kind == "symbol" and len(head) > 1:  # ρḡ: the bar is on the g
        latex = f"{_symbols(head[:-1])} {accent}{{{_symbols(head[-1])}}}"
    elif accent:
        latex = f"{accent}{{{latex}}}"
    if sub:
        if sub.startswith("{"):
            sub = _convert(tokens(sub[1:-1]), names, connectives)
        elif sub.isalpha() and len(sub) >= 3:
            sub = rf"\text{{{sub}}}"
        else:
            sub = _symbols(sub.replace("_", ""))
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


def _operand(toks, start, names, connectives):
    """LaTeX of the operand after ^, _, ** or √, and the index after it; outer parentheses dropped."""
    while start < len(toks) and toks[start][0] == "space":
        start += 1
    if start >= len(toks):
        raise NotMath("missing operand")
    kind, value = toks[start][:2]
    if value in "-−":
        inner, end = _operand(toks, start + 1, names, connectives)
        return "-" + inner, end
    if value in OPEN:
        end = _closing(toks, start)
        inner = _convert(toks[start + 1:end], names, connectives)
        if value == "(":
            return inner, end + 1
        return f"{SYMBOLS.get(value, value)}{inner}{SYMBOLS.get(toks[end][1], toks[end][1])}", end + 1
    if value in "|‖":
        end = next((i for i in range(start + 1, len(toks)) if toks[i][1] == value), None)
        if end is None:
            raise NotMath(f"unbalanced {value}")
        bar = "|" if value == "|" else r"\|"
        return f"{bar}{_convert(toks[start + 1:end], names, connectives)}{bar}", end + 1
    if kind == "word":
        return _word(value, names, connectives), start + 1
    if kind == "number":
        return _number(value), start + 1
    raise NotMath(f"unexpected {value!r}")


def _convert(toks, names, connectives=True) -> str:
    out, i = [], 0
    while i < len(toks):
        kind, value = toks[i][:2]
        if kind == "space":
            out.append(r"\quad " if len(value) >= 2 else " ")
            i += 1
        elif kind == "power" or value in "^_":
            operand, i = _operand(toks, i + 1, names, connectives)
            out.append(f"{'_' if value == '_' else '^'}{{{operand}}}")
        elif value == "√":
            operand, i = _operand(toks, i + 1, names, connectives)
            out.append(rf"\sqrt{{{operand}}}")
        elif kind == "sup":
            out.append("^{" + " ".join(SUPERSCRIPTS[c] for c in value).replace("- ", "-") + "}")
            i += 1
        elif kind == "sub":
            out.append("_{" + "".join(SUBSCRIPTS[c] for c in value) + "}")
            i += 1
        elif kind == "dots":
            out.append(r"\dots ")
            i += 1
        elif kind == "word":
            out.append(_word(value, names, connectives) + " ")
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


def to_latex(text: str, names=frozenset(), connectives: bool = True) -> str:
    """LaTeX for a piece of docstring math; raises NotMath when it holds prose.

    ``names`` are the multi-letter names that are symbols here (the parameters of
    the op or function whose docstring this is). With ``connectives`` the words
    ``if``, ``for``, ``where``... may join math (``dx = dy if x > 0``).
    """
    text = unicodedata.normalize("NFD", text.strip().rstrip(".").strip())
    if not text or any(c in text for c in "`'\\\"$") or not _balanced(text):
        raise NotMath(text)
    return re.sub(r"\s+", " ", _convert(tokens(text), names, connectives)).strip()


def has_relation(text: str) -> bool:
    """True when ``text`` holds a relation sign outside ``code`` spans."""
    return any(r in re.sub(r"``.+?``|:[\w:.+-]+:`[^`]+`", "", text) for r in RELATIONS)


def text_latex(text: str, strip: bool = True) -> str:
    """``text`` as a MathJax \\text{...} (roles and literals as their bare names, braces made safe)."""
    text = re.sub(r":[\w:.+-]+:`~?([^`]+)`|``(.+?)``", lambda m: m.group(1) or m.group(2),
                  text.strip() if strip else text)
    text = text.replace("\\", "").replace("$", "").replace("{", "(").replace("}", ")")
    return rf"\text{{{text}}}"


# ---------------------------------------------------------------- an op's first paragraph
def split_forward_backward(summary: str) -> tuple[str, str]:
    """The docstring's first paragraph cut at its first top-level ';': (forward, backward)."""
    depth = 0
    for index, char in enumerate(summary):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char == ";" and depth == 0:
            return summary[:index].strip(), summary[index + 1:].strip()
    return summary.strip(), ""


def is_prose(text: str) -> bool:
    """True when some word of ``text`` is not one the translation knows as math."""
    if any(c in text for c in "`'"):  # ``code`` or an apostrophe: a remark in words
        return True
    for kind, value, _, _ in tokens(unicodedata.normalize("NFD", text)):
        if kind == "word":
            try:
                _word(value)
            except NotMath:
                return True
    return False


def split_note(text: str) -> tuple[str, str]:
    """(math, note): a trailing parenthesised remark in prose is split off the math.

    ``"dx = dy · [x > 0] (the mask is saved in forward)."`` gives
    ``("dx = dy · [x > 0]", "the mask is saved in forward")``.
    """
    text = text.strip().rstrip(".").strip()
    if not text.endswith(")"):
        return text, ""
    depth = 0
    for index in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[index], 0)
        if depth == 0:
            head, note = text[:index].rstrip(), text[index + 1:-1].strip()
            if index > 0 and text[index - 1] == " " and head and is_prose(note):
                return head, note
            return text, ""
    return text, ""


def line_pieces(text: str, names=frozenset()):
    """One half of an op's first paragraph as ("math" | "text" | "literal", content) pieces.

    The whole half is one formula when it converts (a trailing remark in prose
    parentheses is kept apart, its own equations set as math); otherwise the
    equations inside its words are.
    """
    formula, note = split_note(text)
    try:
        pieces = [("math", to_latex(formula, names))]
    except NotMath:
        return prose_pieces(text.strip().rstrip("."), names)
    return pieces + ([("text", "  ")] + prose_pieces(f"({note})", names) if note else [])


# ---------------------------------------------------------------- formula blocks
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


def _row_kinds(line: str, names):
    """Each segment of a formula line as ("math", latex) or ("text", words)."""
    kinds = []
    for part in segments(line):
        if re.fullmatch(r"[^\W\d]\w*:", part):  # "exact:", "tanh:": a label, even when it is a function's name
            kinds.append(("text", part))
            continue
        try:
            kinds.append(("math", to_latex(part, names)))
        except NotMath:
            kinds.append(("text", part))
    if not any(kind == "math" for kind, _ in kinds) and kinds:
        lhs, arrow, rhs = kinds[0][1].partition("←")
        words = re.fullmatch(r"\s*([^\W\d_]+)[\w\s'’(),-]*", _INLINE.sub("code", rhs))
        if arrow and words and not _symbol_word(words.group(1)):  # r ← the Adam direction: words, not math
            try:
                kinds[0] = ("math", f"{to_latex(lhs, names)} \\leftarrow {text_latex(rhs)}")
            except NotMath:
                pass
    return kinds


def _words_latex(text: str, names) -> str:
    """Words of a formula line (a label, a remark) in math mode: \\text{...}, their equations as math."""
    out = []
    for kind, content in prose_pieces(text.strip(), names):
        out.append(content if kind == "math" else text_latex(content, strip=False))
    return "".join(out)


def row_leftovers(line: str, names=frozenset()) -> list[str]:
    """The pieces of a formula line that hold a relation sign but are not set as math."""
    return [piece for kind, text in _row_kinds(line, names) if kind == "text"
            for piece in untypeset(prose_pieces(text, names))]


def aligned_row(line: str, names=frozenset()) -> str | None:
    """One row of an ``aligned`` block for a formula line, or None when the line is prose.

    Leading prose is a label, math segments are the equation, trailing prose is the
    remark (in its own column). ``r ← the Adam direction`` keeps its words as text.
    """
    kinds = _row_kinds(line, names)
    if not any(kind == "math" for kind, _ in kinds):
        return None
    first = next(i for i, (kind, _) in enumerate(kinds) if kind == "math")
    last = max(i for i, (kind, _) in enumerate(kinds) if kind == "math")
    kinds[last] = ("math", kinds[last][1].removesuffix(SYMBOLS[","]).rstrip())  # `E[z ⊙ Hz] = diag(H),`
    label = r"\quad ".join(_words_latex(text, names) for _, text in kinds[:first])
    body = [_align(kinds[first][1])] + [latex if kind == "math" else _words_latex(latex, names)
                                        for kind, latex in kinds[first + 1:last + 1]]
    row = (label + r"\quad " if label else "") + r"\quad ".join(body)
    remark = " ".join(text for _, text in kinds[last + 1:])
    if remark:
        row += r" && {\small " + _words_latex(remark, names) + "}"
    return row


# ---------------------------------------------------------------- math inside prose
_INLINE = re.compile(r"``(.+?)``|:[\w:.+-]+:`~?([^`]+)`")
_OPERATOR_END = tuple("+-−·/,;:(⊙√^_")


def _symbol_word(word: str) -> bool:
    """True for a word that is a symbol whatever the names around it (x, β, lr, max, a0)."""
    try:
        _word(word, frozenset(), connectives=False)
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


def _words_follow(toks, position: int) -> bool:
    """True when what follows an equation at ``position`` is prose, punctuation or nothing:
    ``dx = the interior of dy``, ``dx = dy W (a Linear ...)``. An operator, a symbol or a word
    that is called, indexed or raised (``lr·frobnicate(g)``) is math that did not convert."""
    after = [t for t in toks if t[2] >= position]
    spaced = bool(after) and after[0][0] == "space"
    if spaced:
        after = after[1:]
    if not after:
        return True
    kind, value = after[0][:2]
    if value in ",.;:)]" or (value == "(" and spaced):
        return True
    if kind != "word" or not spaced or _symbol_word(value):
        return False
    return len(after) == 1 or after[1][0] == "space" or after[1][1] in ",.;:)'’"


def _math_runs(text: str, names):
    """(start, end, latex) of the equations inside a piece of prose: the longest spans that
    convert, hold a relation (← = ≤ ...) and an operand, and do not end on an operator."""
    toks = tokens(text)
    barrier = []
    for kind, value, _, _ in toks:
        try:
            stop = kind == "word" and not _word(value, names, connectives=False)
        except NotMath:
            stop = True
        barrier.append(stop or (kind == "other" and value not in SYMBOLS and value not in PLAIN
                                and value not in "√^_"))
    runs, i = [], 0
    while i < len(toks):
        kind, value = toks[i][:2]
        starts_here = (not barrier[i] and kind in ("word", "number")) or value in "(√‖|⌊⟨" or (
            kind == "other" and value in RELATIONS)
        if starts_here and kind == "word" and not _symbol_word(value):
            following = next((t[1] for t in toks[i + 1:] if t[0] != "space"), "")
            starts_here = following in RELATIONS or following == "("  # `decoupled w ← ...`: start at w
        if kind == "other" and value in RELATIONS and not (i and toks[i - 1][1] == "("):
            starts_here = False  # "(= softmax − onehot)" opens on its relation; prose before "=" does not
        if not starts_here or (i and toks[i - 1][0] != "space" and toks[i - 1][1] not in "(~"):
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
            if not any(t[0] in ("word", "number") for t in toks[i:j]):
                continue  # a lone "=" between words of prose is not an equation
            pieces = _top_level_split(piece)
            while len(pieces) > 1 and not has_relation(pieces[-1]):
                pieces.pop()
            piece = ", ".join(pieces)
            if not _words_follow(toks, toks[i][2] + len(piece)):
                continue
            try:
                found = (toks[i][2], toks[i][2] + len(piece), to_latex(piece, names, connectives=False))
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


def untypeset(pieces) -> list[str]:
    """The text pieces (of ``line_pieces`` or ``prose_pieces``) that still hold a relation sign."""
    return [content for kind, content in pieces if kind == "text" and has_relation(content)]


# ---------------------------------------------------------------- a docstring's blocks
def doc_lines(doc: str) -> list[str]:
    """A docstring's lines with the indentation of its body removed (an equation block keeps its own)."""
    lines = doc.expandtabs().splitlines()
    rest = lines[1:]
    if rest and not rest[-1].strip():
        base = len(rest[-1])  # the closing quotes' line
    else:
        base = min((len(line) - len(line.lstrip()) for line in rest if line.strip()), default=0)
    lines = [lines[0].strip()] + [line[base:] if not line[:base].strip() else line.lstrip() for line in rest]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _columns(paragraph: list[str]) -> bool:
    """Two or more lines laid out in columns: a gap of two spaces inside a line, not after a full stop."""
    return len(paragraph) > 1 and any(re.search(r"[^\s.]\s{2,}\S", line.strip()) for line in paragraph)


def _is_code(lines: list[str], previous: str) -> bool:
    return (previous.rstrip().endswith("::") or lines[0].lstrip().startswith(">>>")
            or any(re.search(r"(^|\s)#", line) for line in lines))


def blocks(doc: str):
    """("para", text), ("bullets", [text]), ("equations", [line]) and ("code", [line]) blocks."""
    return _blocks(doc_lines(doc))


def op_parts(doc: str):
    """An op's docstring as (forward, backward, blocks of the rest): its first paragraph cut at ';'."""
    lines = doc_lines(doc)
    end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    forward, backward = split_forward_backward(" ".join(line.strip() for line in lines[:end]))
    return forward, backward, _blocks(lines[end + 1:])


def _blocks(lines: list[str]):
    out, para, bullets, equations = [], [], [], []

    def flush():
        if para:
            out.append(("para", " ".join(para)))
        if bullets:
            out.append(("bullets", [" ".join(item) for item in bullets]))
        if equations:
            previous = out[-1][1] if out and out[-1][0] == "para" else ""
            out.append(("code" if _is_code(equations, previous) else "equations", list(equations)))
        para.clear(), bullets.clear(), equations.clear()

    paragraph_start = 0
    for index, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            flush()
            paragraph_start = index + 1
            continue
        if index == paragraph_start and not line.startswith("- "):
            end = next((j for j in range(index, len(lines)) if not lines[j].strip()), len(lines))
            if indent < 4 and _columns(lines[index:end]):  # a table of formulas at the text's indentation
                flush()
                equations.extend(text.strip() for text in lines[index:end])
                flush()
                paragraph_start = end
                continue
        if index < paragraph_start:
            continue
        if line.startswith("- "):
            if para or equations:
                flush()
            bullets.append([line[2:].strip()])
        elif bullets and indent >= 2:
            bullets[-1].append(line.strip())
        elif indent >= 4:
            if para or bullets:
                flush()
            equations.append(line.strip())
        else:
            if equations or bullets:
                flush()
            para.append(line.strip())
    flush()
    return out


def equation_lines(doc: str, names=frozenset(), op: bool = False) -> list[tuple[str, list[str]]]:
    """Every equation line of a docstring (see the module docstring), each with the pieces of it
    that are left as text while holding a relation sign: none when the line is typeset.

    ``op``: the docstring is an op's, whose first paragraph is its forward and backward.
    ``names``: the parameter names that are symbols in it.
    """
    found = []
    if op:
        forward, backward, parts = op_parts(doc)
        found += [(half, untypeset(line_pieces(half, names))) for half in (forward, backward)
                  if half and has_relation(half)]
    else:
        parts = blocks(doc)
    for kind, content in parts:
        if kind == "equations":
            block_names = set(names) | lhs_names(content)
            found += [(line, row_leftovers(line, block_names)) for line in content if has_relation(line)]
    return found
