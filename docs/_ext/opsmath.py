"""Turn the plain-text math of an op's docstring into LaTeX for MathJax.

minidl writes an op's math in its docstring the way one writes it on paper,
in Unicode: ``y = a / b;  da = dy / b,  db = -dy * a / b²``. This module
translates such a line into LaTeX (``db = -dy \\cdot a / b^{2}``) so that the
site typesets it. The translation is deliberately strict: a line that holds
prose (any word it does not know as math) is not translated, and the page
shows it as written instead. Nothing here guesses.
"""
from __future__ import annotations

import re

SUPERSCRIPTS = {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7",
                "⁸": "8", "⁹": "9", "⁻": "-", "ˣ": "x", "ᵀ": r"\top", "ⁱ": "i", "ʲ": "j", "ⁿ": "n"}
SYMBOLS = {"·": r"\cdot", "*": r"\cdot", "⊙": r"\odot", "≤": r"\le", "≥": r"\ge", "≈": r"\approx",
           "±": r"\pm", "⟨": r"\langle", "⟩": r"\rangle", "∂": r"\partial", "~": r"\sim", "−": "-",
           "½": r"\tfrac{1}{2}", "∞": r"\infty", "@": r"\,", "→": r"\to", "×": r"\times",
           "{": r"\{", "}": r"\}", "%": r"\%", "&": r"\&", "#": r"\#"}
BIG_OPERATORS = {"Σ": r"\sum", "∏": r"\prod"}
GREEK = {"α": r"\alpha", "β": r"\beta", "γ": r"\gamma", "δ": r"\delta", "ε": r"\varepsilon",
         "η": r"\eta", "θ": r"\theta", "κ": r"\kappa", "λ": r"\lambda", "μ": r"\mu", "ν": r"\nu",
         "π": r"\pi", "ρ": r"\rho", "σ": r"\sigma", "τ": r"\tau", "φ": r"\phi", "ψ": r"\psi",
         "ω": r"\omega", "Φ": r"\Phi", "Ψ": r"\Psi", "Ω": r"\Omega", "Δ": r"\Delta", "Λ": r"\Lambda",
         "ℓ": r"\ell"}
LATEX_FUNCTIONS = {"max", "min", "exp", "log", "ln", "tanh", "sin", "cos", "det", "arg"}
NAMED_FUNCTIONS = {"sign", "softmax", "erf", "sigmoid", "relu", "col2im", "im2col", "argmax", "argmin",
                   "mean", "var", "diag", "tr", "clip", "gelu", "softplus", "logsumexp", "zeros",
                   "Bernoulli", "round", "sqrt", "rms", "Var", "E", "U", "N"}
CONNECTIVES = {"for", "otherwise", "where", "else", "if", "or", "and", "with", "elsewhere", "over", "axes"}
QUANTITIES = {"ddof", "eps", "key", "axis", "cond", "lo", "hi", "sh", "sw", "pad"}  # an op's parameters, by name
_TOKEN = re.compile(r"""
      (?P<space>\s+)
    | (?P<power>\*\*)
    | (?P<sup>[⁰¹²³⁴⁵⁶⁷⁸⁹⁻ˣᵀⁱʲⁿ]+)
    | (?P<word>[^\W\d_⁰¹²³⁴⁵⁶⁷⁸⁹ˣᵀⁱʲⁿ][^\W_⁰¹²³⁴⁵⁶⁷⁸⁹ˣᵀⁱʲⁿ]*[\u0302\u0304]?(?:_(?:\{[^}]*\}|[^\W_⁰¹²³⁴⁵⁶⁷⁸⁹ˣᵀⁱʲⁿ]+))?)
    | (?P<number>\d+(?:\.\d+)?(?:e-?\d+)?)
    | (?P<other>.)
""", re.VERBOSE)


class NotMath(ValueError):
    """The text holds something that is not math (a word of prose): show it as written."""


def _word(text: str) -> str:
    base, _, sub = text.partition("_")
    accent = ""
    if base[-1] in "\u0302\u0304":
        accent, base = (r"\hat" if base[-1] == "\u0302" else r"\bar"), base[:-1]
    if base in BIG_OPERATORS:
        latex = BIG_OPERATORS[base]
    elif base in LATEX_FUNCTIONS:
        latex = "\\" + base
    elif base in NAMED_FUNCTIONS:
        latex = rf"\operatorname{{{base}}}"
    elif base in CONNECTIVES and not sub:
        return rf"\text{{ {base} }}"
    elif base in QUANTITIES:
        latex = rf"\mathit{{{base}}}"
    elif len(base) == 1 or (len(base) == 2 and (base[0] == "d" or base[0] in GREEK)):
        latex = _symbols(base)  # x, W, dx, dW, dℓ, αx: one or two symbols side by side
    else:
        raise NotMath(text)
    if accent:
        latex = f"{accent}{{{latex}}}"
    if sub:
        sub = sub.strip("{}")
        if all(c.isalnum() or c in ",-" for c in sub):
            sub = rf"\text{{{sub}}}" if len(sub) >= 3 and sub.isalpha() else _symbols(sub)
        latex = f"{latex}_{{{sub}}}"
    return latex


def _symbols(text: str) -> str:
    return "".join(GREEK[c] + " " if c in GREEK else c for c in text).strip()


def is_prose(text: str) -> bool:
    """True when some word of ``text`` is not one the translation knows as math."""
    if "`" in text or "'" in text:  # ``code`` or an apostrophe: a remark in words
        return True
    for kind, value in _tokens(text):
        if kind == "word":
            try:
                _word(value)
            except NotMath:
                return True
    return False


def _tokens(text: str):
    return [(m.lastgroup, m.group(0)) for m in _TOKEN.finditer(text)]


def _group(tokens, start):
    """The tokens of the parenthesised group opening at ``start``, and the index after it."""
    depth = 0
    for index in range(start, len(tokens)):
        kind, value = tokens[index]
        if kind == "other" and value in "([":
            depth += 1
        elif kind == "other" and value in ")]":
            depth -= 1
            if depth == 0:
                return tokens[start + 1:index], index + 1
    raise NotMath("unbalanced parentheses")


def _operand(tokens, start):
    """LaTeX of the one operand that starts at ``start`` (after ^, √ or **), and the index after it."""
    while start < len(tokens) and tokens[start][0] == "space":
        start += 1
    if start >= len(tokens):
        raise NotMath("missing operand")
    kind, value = tokens[start]
    sign = ""
    if kind == "other" and value in "-−":
        sign, start = "-", start + 1
        kind, value = tokens[start] if start < len(tokens) else ("", "")
    if kind == "other" and value == "(":
        inner, end = _group(tokens, start)
        return sign + _convert(inner), end
    if kind == "other" and value == "|":
        end = next((i for i in range(start + 1, len(tokens)) if tokens[i] == ("other", "|")), None)
        if end is None:
            raise NotMath("unbalanced |")
        return f"{sign}|{_convert(tokens[start + 1:end])}|", end + 1
    if kind in ("word", "number"):
        return sign + (_word(value) if kind == "word" else value), start + 1
    raise NotMath(f"unexpected {value!r}")


def _convert(tokens) -> str:
    out, i = [], 0
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "space":
            out.append(r"\quad " if len(value) >= 2 else " ")
            i += 1
        elif kind == "power" or (kind == "other" and value in "^_"):
            operand, i = _operand(tokens, i + 1)
            out.append(f"{'_' if value == '_' else '^'}{{{operand}}}")
        elif kind == "sup":
            out.append("^{" + " ".join(SUPERSCRIPTS[c] for c in value).replace("- ", "-") + "}")
            i += 1
        elif kind == "other" and value == "√":
            operand, i = _operand(tokens, i + 1)
            out.append(rf"\sqrt{{{operand}}}")
        elif kind == "word":
            out.append(_word(value) + " ")
            i += 1
        elif kind == "number":
            out.append(value)
            i += 1
        elif kind == "other" and value in GREEK:
            out.append(GREEK[value] + " ")
            i += 1
        elif kind == "other" and value in BIG_OPERATORS:
            out.append(BIG_OPERATORS[value] + " ")
            i += 1
        elif kind == "other" and value in SYMBOLS:
            out.append(" " + SYMBOLS[value] + " ")
            i += 1
        elif kind == "other" and value in "+-=/<>()[],|!:.":
            out.append(value)
            i += 1
        else:
            raise NotMath(f"unknown character {value!r}")
    return "".join(out)


def to_latex(text: str) -> str:
    """LaTeX for one line of docstring math; raises NotMath when the line holds prose."""
    text = text.strip().rstrip(".").strip()
    if not text or "'" in text or "`" in text or "\\" in text:
        raise NotMath(text)
    latex = _convert(_tokens(text))
    return re.sub(r"\s+", " ", latex).strip()


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


def split_forward_backward(summary: str) -> tuple[str, str]:
    """The docstring's first paragraph cut at its first top-level ';': (forward, backward)."""
    depth = 0
    for index, char in enumerate(summary):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(char, 0)
        if char == ";" and depth == 0:
            return summary[:index].strip(), summary[index + 1:].strip()
    return summary.strip(), ""
