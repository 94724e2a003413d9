"""docs/_ext/docmath.py: minidl's docstring equations become LaTeX, and every equation line is typeset.

The lines below are taken from minidl's op and optimizer docstrings. The last
tests walk every docstring the ops and optimizers pages show and fail on any
equation line (see docmath's module docstring for the rule) that is not typeset.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install -e '.[docs]'")

EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"
sys.path.insert(0, str(EXT))
try:
    import docmath
    import opsdoc
    import optimdoc
    from docmath import NotMath, aligned_row, equation_lines, line_pieces, prose_pieces, to_latex, untypeset
finally:
    sys.path.remove(str(EXT))


def math_of(pieces) -> list[str]:
    return [content for kind, content in pieces if kind == "math"]


def text_of(pieces) -> str:
    return "".join(content for kind, content in pieces if kind != "math")


# ---------------------------------------------------------------- ops: whole lines
@pytest.mark.parametrize("line, latex", [
    ("y = a @ b", r"y = a \, b"),                                       # MatMul
    ("da = dy @ bᵀ,  db = aᵀ @ dy", r"d a = d y \, b ^{\top},\,\quad d b = a ^{\top} \, d y"),
    ("db = -dy * a / b²", r"d b = -d y \cdot a / b ^{2}"),               # Div
    ("y = Σ (x − x̄)² / (n − ddof)", r"y = \sum (x - \bar{x} )^{2} / (n - \mathrm{ddof} )"),  # Var
    ("y_i = e^(x_i − max x) / Σ_j e^(x_j − max x)",                      # Softmax
     r"y_{i} = e ^{x_{i} - \max x } / \sum_{j} e ^{x_{j} - \max x }"),
    ("s = 1/√(⟨(x − μ)²⟩ + ε)", r"s = 1/\sqrt{\langle (x - \mu )^{2}\rangle + \varepsilon }"),  # Normalize
    ("y = min(max(x, lo), hi)", r"y = \min (\max (x ,\, \mathrm{lo} ),\, \mathrm{hi} )"),  # Clip
    ("y = x for x > 0, αx otherwise", r"y = x \text{ for } x > 0,\, \alpha x \text{ otherwise }"),  # LeakyReLU
    ("y = [x1, x2, ...]", r"y = [x_{1} ,\, x_{2} ,\, \dots ]"),         # Concatenate
])
def test_op_lines_convert(line, latex):
    assert to_latex(line) == latex


def test_parameter_names_are_symbols_only_where_they_are_the_ops():
    line = "y[n, c, i, j] = max_{p,q} x_pad[n, c, i·sh + p, j·sw + q]"  # MaxPool2d
    assert r"\max_{p ,\,q }" in to_latex(line) and r"x_{\text{pad}}" in to_latex(line)
    with pytest.raises(NotMath):
        to_latex("dx = dy · slope for x < 0")  # LeakyReLU's parameter, in another op's docstring
    assert to_latex("dx = dy · slope for x < 0", {"slope"}) == r"d x = d y \cdot \mathrm{slope} \text{ for } x < 0"


@pytest.mark.parametrize("text", [
    "the gradient goes to the larger input, split evenly on ties",     # Maximum's backward: words
    "dx = dy broadcast to x's shape",
    "y = x with axes permuted",
])
def test_prose_is_never_one_formula(text):
    with pytest.raises(NotMath):
        to_latex(text)


# ---------------------------------------------------------------- ops: math among words
def test_linear_forward_sets_the_equation_and_keeps_the_words():
    pieces = line_pieces("y = x Wᵀ + b with W of shape (out, in) (PyTorch's layout)")
    assert math_of(pieces) == [r"y = x W ^{\top} + b"]
    assert text_of(pieces).strip() == "with W of shape (out, in) (PyTorch's layout)"


def test_dropout_forward_sets_both_relations():
    pieces = line_pieces("y = x · m / (1 − p), m_i ~ Bernoulli(1 − p) drawn once per call")
    assert math_of(pieces) == [r"y = x \cdot m / (1 - p ),\, m_{i} \sim \operatorname{Bernoulli} (1 - p )"]
    assert text_of(pieces).strip() == "drawn once per call"


def test_cross_entropy_lines():
    forward = line_pieces("ℓ_n = −Σ_c A_nc log softmax(x_n)_c for logits x (M, C) and a constant target "
                          "distribution A (M, C)")
    assert math_of(forward) == [r"\ell_{n} = -\sum_{c} A_{n c} \log \operatorname{softmax} (x_{n} )_{c}"]
    backward = line_pieces("dx_n = dℓ_n · (softmax(x_n) · Σ_c A_nc − A_n)   (= softmax − onehot for plain "
                           "class targets).")
    assert math_of(backward)[1] == r"= \operatorname{softmax} - \operatorname{onehot}"
    assert untypeset(forward) == untypeset(backward) == []


def test_gradient_op_lines_set_every_equation():
    pieces = line_pieces("d(dy) = s · (dz − ⟨dz⟩ − x̂ ⟨dz · x̂⟩)  (the map dy → z is symmetric: a NormalizeGrad "
                         "of dz), dx = −s² · (x̂ (⟨dz · (dy − ⟨dy⟩)⟩ − 3 b c) + c (dy − ⟨dy⟩) + b (dz − ⟨dz⟩)), "
                         "with b = ⟨dy · x̂⟩ and c = ⟨dz · x̂⟩.")
    assert len(math_of(pieces)) == 5  # d(dy), dy → z, dx, b and c
    assert untypeset(pieces) == []
    assert math_of(line_pieces("Linear's input gradient as an op of (dy, W):  z = dy W"))[-1].endswith(
        r"z = d y W")


def test_an_equation_with_words_on_its_right_keeps_its_relation_in_the_math():
    pieces = line_pieces("dx_i = the slice of dy that x_i filled.")  # Concatenate's backward
    assert math_of(pieces) == [r"d x_{i} ="]
    assert untypeset(pieces) == []


@pytest.mark.parametrize("line", [
    "y = frobnicate(x)",                 # an unknown function: math that does not convert
    "logp_{n, y_n} = −w_{y_n}",          # an unknown symbol on the left
    "the loss = a mean over the batch",  # a relation between words
])
def test_lines_that_are_not_typeset_are_reported(line):
    assert untypeset(line_pieces(line)) != []


# ---------------------------------------------------------------- optimizers
@pytest.mark.parametrize("line, row", [
    ("m ← β₁m + (1 − β₁)g             first moment: momentum",
     r"m &\leftarrow \beta _{1}m + (1 - \beta _{1})g && {\small \text{first moment: momentum}}"),
    ("w ← w − lr·g                no momentum (μ = 0, b unused)",
     r"w &\leftarrow w - \mathrm{lr} \cdot g && {\small \text{no momentum (}\mu = 0\text{, b unused)}}"),
    ("r ← the Adam direction          :func:`adam_direction`, the book's lines",
     r"r &\leftarrow \text{the Adam direction} && {\small \text{adam_direction}\text{, the book's lines}}"),
])
def test_optimizer_rows(line, row):
    assert aligned_row(line, {"lr"}) == row


def test_optimizer_names_and_numbers():
    line = "f(t) = η_min + (a0 − η_min)·(1 + cos(π·T_cur/T_i))/2,   T_0 = T0,  T_{i+1} = T_mult·T_i"
    latex = to_latex(line, {"a0", "T0", "T_mult", "eta_min"})
    assert r"\eta_{\text{min}}" in latex and r"T_{\text{mult}}" in latex and r"T_{i +1}" in latex
    assert to_latex("ε = 1e-3") == r"\varepsilon = 10^{-3}"


def test_inline_equations_in_optimizer_prose():
    pieces = prose_pieces("With weight decay use AdamW (decoupled decay, w ← w − lr·λw beside the Adam step)")
    assert math_of(pieces) == [r"w \leftarrow w - \mathrm{lr} \cdot \lambda w"]


# ---------------------------------------------------------------- what an equation line is
def test_equation_lines_of_an_op_are_its_halves_and_formula_blocks():
    doc = """Gaussian error linear unit, y = x Φ(x).

    exact:  Φ(x) = ½(1 + erf(x/√2)),      dy/dx = Φ(x) + x φ(x)
    tanh:   Φ(x) ≈ ½(1 + tanh(u)), u = √(2/π)(x + 0.044715x³),
            dy/dx = ½(1 + t) + ½x(1 − t²) √(2/π)(1 + 3·0.044715x²)
    """
    lines = equation_lines(doc, op=True)
    assert [line for line, _ in lines] == [
        "Gaussian error linear unit, y = x Φ(x).",
        "exact:  Φ(x) = ½(1 + erf(x/√2)),      dy/dx = Φ(x) + x φ(x)",
        "tanh:   Φ(x) ≈ ½(1 + tanh(u)), u = √(2/π)(x + 0.044715x³),",
        "dy/dx = ½(1 + t) + ½x(1 − t²) √(2/π)(1 + 3·0.044715x²)"]
    assert all(not left for _, left in lines)


def test_prose_and_code_hold_no_equation_lines():
    doc = """Learning-rate schedules: plain functions f(t) → lr, and the scheduler that applies them.

    Each factory below returns such a function; they combine like functions do:

        f = warmup(cosine_restarts(0.1, T0=1000), steps=500)       # ramp up, then SGDR
        scheduler = ScheduleLR(optimizer, f)                      # then scheduler.step() per step
    """
    assert equation_lines(doc) == []
    assert [kind for kind, _ in docmath.blocks(doc)] == ["para", "para", "code"]


def test_a_formula_line_that_does_not_convert_is_reported():
    doc = """One step.

        w ← w − lr·frobnicate(g)
        m ← βm + (1 − β)g
    """
    lines = equation_lines(doc, {"lr"})
    assert [bool(left) for _, left in lines] == [True, False]


# ---------------------------------------------------------------- every docstring of the two pages
def _report(docstrings, op):
    lines, failures = [], []
    for what, doc, names in docstrings:
        for line, left in equation_lines(doc, names, op):
            lines.append(line)
            if left:
                failures.append(f"{what}: {line!r} leaves {left} as text")
    return lines, failures


def test_every_op_equation_line_is_typeset():
    lines, failures = _report(opsdoc.shown_docstrings(), op=True)
    assert len(lines) > 80, "the ops' docstrings hold fewer equation lines than they did"
    assert not failures, "equation lines not typeset (see docs/_ext/docmath.py):\n" + "\n".join(failures)


def test_every_optimizer_equation_line_is_typeset():
    lines, failures = _report(optimdoc.shown_docstrings(), op=False)
    assert len(lines) > 50, "the optimizers' docstrings hold fewer equation lines than they did"
    assert not failures, "equation lines not typeset (see docs/_ext/docmath.py):\n" + "\n".join(failures)
