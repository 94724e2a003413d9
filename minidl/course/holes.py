"""Holes cut out of minidl's own source: functions found by qualified name, their bodies replaced.

A task names the functions a student writes by qualified name, as Python
resolves them (``minidl.ops.linalg.MatMul.backward``). :func:`locate` imports
the module and follows the attributes to the function, so a function that a
package re-exports from a submodule is found in the file that defines it;
:func:`replace_bodies` then finds the same function in that file's syntax
tree and rewrites only the lines of its body after the docstring. The
signature, the decorators and the docstring (the derivation: the lecture)
stay as they are; nothing in the engine marks where a solution begins.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

import minidl

__all__ = ["FunctionSite", "HoleError", "body_of", "engine_root", "locate", "replace_bodies", "stub"]


class HoleError(ValueError):
    """A qualified name that names no function of minidl, or a file whose function cannot be cut."""


@dataclass(frozen=True)
class FunctionSite:
    """Where a function lives: ``file`` relative to the folder holding the ``minidl`` package, and its
    ``qualname`` inside that file's module (``MatMul.backward``)."""

    name: str  # the qualified name the table gives (minidl.ops.linalg.MatMul.backward)
    file: str  # posix path relative to the engine root (minidl/ops/linalg.py)
    qualname: str  # the path inside the module (MatMul.backward)


def engine_root() -> Path:
    """The folder that holds the running ``minidl`` package (the copy a generator reads)."""
    return Path(minidl.__file__).resolve().parent.parent


def locate(name: str) -> FunctionSite:
    """The file and in-file qualified name of the function ``name`` (``package.module.Class.method``)."""
    if not name.startswith("minidl."):
        raise HoleError(f"course: {name!r} is not a name inside minidl (expected 'minidl.module.function')")
    parts = name.split(".")
    module, rest = None, []
    for cut in range(len(parts), 0, -1):  # the longest prefix that imports is the module
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        break
    if module is None or not rest:
        raise HoleError(f"course: {name!r} does not name a function inside a module of minidl")
    obj = module
    for attribute in rest:
        try:
            obj = inspect.getattr_static(obj, attribute)
        except AttributeError:
            raise HoleError(f"course: {name!r}: {'.'.join(parts[:len(parts) - len(rest)])} has no "
                            f"attribute path {'.'.join(rest)!r}") from None
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = inspect.unwrap(obj)
    if not inspect.isfunction(obj):
        raise HoleError(f"course: {name!r} is a {type(obj).__name__}, not a function: a hole is a function body")
    if "<locals>" in obj.__qualname__:
        raise HoleError(f"course: {name!r} is defined inside another function; name that function instead")
    source = Path(inspect.getsourcefile(obj)).resolve()
    try:
        relative = source.relative_to(engine_root())
    except ValueError:
        raise HoleError(f"course: {name!r} is defined in {source}, outside minidl") from None
    return FunctionSite(name, relative.as_posix(), obj.__qualname__)


def _find(tree: ast.Module, qualname: str):
    """The FunctionDef of ``qualname`` (``Class.method`` or ``function``) among the module's statements."""
    body, node = tree.body, None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _has_docstring(node) -> bool:
    first = node.body[0]
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def body_of(name: str) -> str:
    """The body of the engine's function ``name`` after its docstring, dedented: what a hole takes away."""
    site = locate(name)
    source = (engine_root() / site.file).read_text(encoding="utf-8")
    node = _find(ast.parse(source), site.qualname)
    statements = node.body[1:] if _has_docstring(node) else node.body
    first = statements[0]
    start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", ())])
    return textwrap.dedent("".join(source.splitlines(keepends=True)[start - 1:node.end_lineno]))


def stub(message: str) -> str:
    """The body of a hole: one line that says which task it belongs to."""
    return f"raise NotImplementedError({message!r})"


def replace_bodies(source: str, bodies: dict, filename: str = "<source>") -> str:
    """``source`` with the body of each function ``qualname -> code`` replaced by ``code`` (dedented text).

    The lines kept: everything up to the end of the docstring (or of the signature, for a
    function without one); the lines replaced: the rest of the body. ``code`` is indented to the
    body's own indentation.
    """
    tree = ast.parse(source, filename)
    lines = source.splitlines(keepends=True)
    edits = []
    for qualname, code in bodies.items():
        node = _find(tree, qualname)
        if node is None:
            raise HoleError(f"course: {filename} has no function {qualname!r}")
        statements = node.body[1:] if _has_docstring(node) else node.body
        if statements:
            first = statements[0]
            start = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", ())])
            indent = first.col_offset
        else:  # a docstring and nothing else
            start = node.body[0].end_lineno + 1
            indent = node.body[0].col_offset
        start_line = lines[start - 1]
        if start_line[:len(start_line) - len(start_line.lstrip())].strip() or start == node.lineno:
            raise HoleError(f"course: {filename}: {qualname}'s body shares a line with its signature; "
                            "write it on lines of its own")
        end = node.end_lineno
        text = "".join(" " * indent + line if line.strip() else "\n"
                       for line in _dedent(code).splitlines(keepends=True))
        if not text.endswith("\n"):
            text += "\n"
        edits.append((start, end, text))
    edits.sort(reverse=True)
    for (start, end, text), later in zip(edits, [None] + edits[:-1]):
        if later is not None and end >= later[0]:
            raise HoleError(f"course: {filename}: two holes overlap (lines {start}-{end})")
        lines[start - 1:end] = [text]
    return "".join(lines)


def _dedent(code: str) -> str:
    return textwrap.dedent(code).strip("\n") + "\n"
