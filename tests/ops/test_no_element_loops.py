"""No op computes element by element in Python: the source of the ops and the array kernels is
scanned for the ways a per-element Python fallback creeps in (an erf through ``np.vectorize(math.erf)``
ran at 142 ns an element, 318 times PyTorch's GELU).

Refused, read from the syntax tree:
- ``np.vectorize``, ``np.frompyfunc`` and ``np.apply_along_axis`` (a Python call per element or row);
- a ``math`` function passed as a value (``map(math.erf, ...)``): only ``math.f(scalar)`` calls are fine;
- a loop or comprehension over an array's elements (``.flat``, ``.tolist()``, ``.ravel()``,
  ``.flatten()``, ``np.nditer``, ``np.ndindex``).
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "minidl"
SCANNED = sorted(ROOT.glob("ops/*.py")) + [ROOT / "backend.py", ROOT / "array_kernels.py", ROOT / "functional.py"]
PER_ELEMENT_CALLS = {"vectorize", "frompyfunc", "apply_along_axis"}
ELEMENT_ITERATORS = {"flat", "tolist", "ravel", "flatten", "nditer", "ndindex"}


def _name(node):
    """The last name of ``a.b.c`` or ``c``; None for anything else."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _iterates_elements(iterable) -> bool:
    """Does ``for _ in iterable`` walk an array element by element?"""
    target = iterable.func if isinstance(iterable, ast.Call) else iterable
    return _name(target) in ELEMENT_ITERATORS


def element_loops(source: str) -> list[tuple[int, str]]:
    """(line, what) for each per-element Python fallback in ``source``."""
    tree = ast.parse(source)
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)) and _name(node) in PER_ELEMENT_CALLS:
            found.append((node.lineno, f"{_name(node)}: a Python call per element"))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
              and id(node) not in called and node.attr not in ("pi", "e", "inf", "nan", "tau")):
            found.append((node.lineno, f"math.{node.attr} passed as a function: applied element by element"))
        elif isinstance(node, (ast.For, ast.comprehension)) and _iterates_elements(node.iter):
            found.append((getattr(node, "lineno", node.iter.lineno), "a Python loop over an array's elements"))
    return found


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_per_element_python_fallback(path):
    found = element_loops(path.read_text())
    assert not found, f"{path.relative_to(ROOT.parent)}: " + "; ".join(f"line {n}: {what}" for n, what in found)


@pytest.mark.parametrize("snippet", [
    "y = np.vectorize(math.erf, otypes=[x.dtype])(x)",  # the erf fallback this scan was written for
    "y = np.frompyfunc(f, 1, 1)(x)",
    "y = np.array(list(map(math.erf, x)))",
    "y = np.array([math.erf(v) for v in x.flat])",
    "for v in x.ravel():\n    total += math.exp(v)",
    "y = [math.sqrt(v) for v in x.tolist()]",
])
def test_the_scan_finds_the_fallbacks_it_refuses(snippet):
    assert element_loops(snippet)


def test_the_scan_lets_scalar_math_and_axis_loops_pass():
    ok = ("c = math.sqrt(2 / math.pi)\nfor axis in range(x.ndim):\n    y = y.sum(axis)\n"
          "z = [math.prod(s) for s in shapes]")
    assert element_loops(ok) == []
