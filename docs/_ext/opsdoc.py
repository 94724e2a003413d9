"""The ``opsdoc`` directive: the "Ops and their gradients" page, generated from the ops.

Every module of :mod:`minidl.ops` (and :mod:`minidl.autograd.conversions`, for the
device and dtype moves) becomes a section; every :class:`~minidl.autograd.Function`
subclass in it that has a backward becomes a subsection showing

- the forward and backward math, cut from the first paragraph of the class
  docstring at its first ``;`` and typeset (``docmath.py`` says how a
  docstring's equations are written; words around them stay words);
- the rest of the docstring, its formula blocks typeset too (``mathnodes.py``);
- the public functions that call it (linked to the API reference), the cases of
  ``minidl gradcheck`` that check it, and where it is defined.

Nothing is written by hand, so the page cannot drift from the code: add an op
with a docstring and it appears here at the next build. An equation line that
cannot be typeset is a build warning (an error under ``-W``).
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import types
from pathlib import Path

from docmath import line_pieces, op_parts
from docutils import nodes
from docutils.parsers.rst import Directive
from mathnodes import block_nodes, piece_nodes, warn_untypeset
from sphinx import addnodes

# The order a reader meets them in; a module not listed here is appended, so none is ever left out.
FAMILY_ORDER = ["elementwise", "math", "reduction", "scan", "shape", "rearrange", "indexing", "scatter_reduce",
                "linalg", "einsum", "activation", "loss", "distance", "attention", "norm", "regularization", "conv",
                "pool", "resample"]
# The ops of modules whose docstring is about something else.
OWN_WORDS = {"minidl.autograd.conversions": (
    "Moves between devices and dtypes",
    "``t.to(device)`` and the dtype conversions (``t.double()``...) are recorded ops too, so a gradient "
    "flows back to the device and the dtype its input came from.")}
_INLINE = re.compile(r"``(.+?)``|:[\w:.]+:`~?([^`]+)`")


def family_modules():
    """The ops modules in reading order, then minidl.autograd.conversions (ToDevice, Cast)."""
    import minidl.ops
    names = [info.name for info in pkgutil.iter_modules(minidl.ops.__path__)]
    ordered = [n for n in FAMILY_ORDER if n in names] + sorted(n for n in names if n not in FAMILY_ORDER)
    modules = [importlib.import_module(f"minidl.ops.{name}") for name in ordered]
    return modules + [importlib.import_module("minidl.autograd.conversions")]


def op_classes(module):
    """The Function subclasses defined in ``module`` that have a docstring and a backward."""
    from minidl.autograd import Function
    found = []
    for name, obj in vars(module).items():
        if (inspect.isclass(obj) and issubclass(obj, Function) and obj is not Function
                and obj.__module__ == module.__name__ and obj.__dict__.get("__doc__")
                and obj.backward is not Function.backward):
            found.append(obj)
    return sorted(found, key=lambda cls: inspect.getsourcelines(cls)[1])


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # lambdas and nested functions
            names |= _names_used(const)
    return names


def functional_forms(cls, module) -> list[str]:
    """Public functions of ``module`` that call ``cls``, directly or through the module's private helpers."""
    functions = {name: obj for name, obj in vars(module).items()
                 if inspect.isfunction(obj) and obj.__module__ == module.__name__}

    def reaches(name, seen):
        if name in seen or name not in functions:
            return False
        seen.add(name)
        used = _names_used(inspect.unwrap(functions[name]).__code__)  # through decorators (autocast_to)
        return cls.__name__ in used or any(reaches(n, seen) for n in used if n.startswith("_"))

    return [name for name in functions if not name.startswith("_") and reaches(name, set())]


def gradcheck_cases() -> list[str]:
    from minidl.op_cases import cases
    return [name for name, _, _ in cases(0)]


def cases_for(function_names, case_names, public_names) -> list[str]:
    """The gradcheck cases that check these functions: 'pow' and 'pow_scalar' check pow."""
    found = []
    for case in case_names:
        for name in function_names:
            variant = case.startswith(name + "_") and case not in public_names
            if case == name or variant:
                found.append(case)
                break
    return found


# ---------------------------------------------------------------- docutils nodes
def inline_nodes(text: str) -> list[nodes.Node]:
    """Text with ``literal`` and :role:`target` spans as literals, everything else verbatim."""
    out, last = [], 0
    for match in _INLINE.finditer(text):
        if match.start() > last:
            out.append(nodes.Text(text[last:match.start()]))
        literal = match.group(1) or match.group(2)
        out.append(nodes.literal(literal, literal))
        last = match.end()
    if last < len(text):
        out.append(nodes.Text(text[last:]))
    return out


def body_nodes(text: str) -> list[nodes.Node]:
    """Paragraphs of a docstring; an indented or column-aligned paragraph is kept as a literal block."""
    out = []
    for block in re.split(r"\n\s*\n", text.strip("\n")):
        lines = block.splitlines()
        if not block.strip():
            continue
        aligned = any(re.search(r"\S  +\S", line) for line in lines) and len(lines) > 1
        if aligned or all(line.startswith(" ") for line in lines):
            literal = inspect.cleandoc(block)
            out.append(nodes.literal_block(literal, literal))
        else:
            out.append(nodes.paragraph("", "", *inline_nodes(" ".join(line.strip() for line in lines))))
    return out


def op_names(cls) -> set[str]:
    """The parameter names of an op's constructor and forward: symbols in its docstring (``eps``, ``axis``)."""
    names = set()
    for method in (cls.__init__, cls.forward):
        try:
            names |= set(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            continue
    return names - {"self", "args", "kwargs", "xs"}


def math_table(forward: str, backward: str, names=frozenset()) -> nodes.Node:
    """The forward and the backward, each typeset as far as it is math (the words around it as text)."""
    field_list = nodes.field_list(classes=["op-math"])
    for label, text in (("forward", forward), ("backward", backward)):
        if not text:
            continue
        field = nodes.field()
        field += nodes.field_name(label, label)
        field += nodes.field_body("", nodes.paragraph("", "", *piece_nodes(line_pieces(text, names))))
        field_list += field
    return field_list


def shown_docstrings():
    """(what, docstring, symbol names) of every op docstring the ops page shows."""
    for module in family_modules():
        for cls in op_classes(module):
            yield f"{module.__name__}.{cls.__name__}", cls.__doc__, op_names(cls)


def reference(target: str, title: str) -> nodes.Node:
    ref = addnodes.pending_xref("", refdomain="py", reftype="func", reftarget=target, refexplicit=True,
                                refwarn=False)
    ref += nodes.literal(title, title)
    return ref


class OpsDoc(Directive):
    """``.. opsdoc::`` (in MyST: a fenced ``{opsdoc}`` block): every op, grouped by family."""

    has_content = False

    def run(self):
        import minidl
        import minidl.functional as functional

        env = self.state.document.settings.env
        case_names = gradcheck_cases()
        public = set(functional.__all__) | set(minidl.__all__)
        root = Path(minidl.__file__).resolve().parent.parent
        sections = []
        for module in family_modules():
            classes = op_classes(module)
            if not classes:
                continue
            short = module.__name__.rsplit(".", 1)[-1]
            env.note_dependency(module.__file__)
            doc = inspect.cleandoc(module.__doc__ or short)
            heading, _, rest = doc.partition("\n")
            if module.__name__ in OWN_WORDS:  # a module that holds more than ops: say what its ops are
                heading, rest = OWN_WORDS[module.__name__]
            section = self._section(f"family-{short}", heading.strip().rstrip("."))
            where = Path(module.__file__).resolve().relative_to(root).as_posix()
            section += nodes.paragraph("", "", nodes.Text("Module "), nodes.literal(module.__name__, module.__name__),
                                       nodes.Text(f" ({where}), {len(classes)} op{'s' * (len(classes) > 1)}."))
            section += body_nodes(rest)
            for cls in classes:
                section += self._op_section(cls, module, case_names, public, where)
            sections.append(section)
        return sections

    def _section(self, ident: str, title: str) -> nodes.section:
        section = nodes.section(ids=[nodes.make_id(ident)], names=[nodes.fully_normalize_name(ident)])
        section += nodes.title(title, title)
        self.state.document.note_implicit_target(section, section)
        return section

    def _op_section(self, cls, module, case_names, public, where) -> nodes.section:
        import minidl.functional as functional

        env = self.state.document.settings.env
        names = op_names(cls)
        forward, backward, rest = op_parts(cls.__doc__)
        warn_untypeset(cls.__doc__, names, f"{module.__name__}.{cls.__name__}", op=True, location=env.docname)
        section = self._section(f"op-{cls.__name__}", cls.__name__)
        section += math_table(forward, backward, names)
        section += block_nodes(rest, names, env.docname)
        facts = nodes.bullet_list(classes=["op-facts"])
        forms = functional_forms(cls, module)
        if forms:
            links = []
            for name in forms:
                if name in functional.__all__:
                    links.append(reference(f"minidl.functional.{name}", f"F.{name}"))
                else:
                    links.append(nodes.literal(f"{module.__name__}.{name}", f"{module.__name__}.{name}"))
                links.append(nodes.Text(", "))
            facts += nodes.list_item("", nodes.paragraph("", "", nodes.Text("Called by "), *links[:-1]))
        checked = cases_for(forms, case_names, public)
        if checked:
            commands = [nodes.literal(f"minidl gradcheck --only {' '.join(checked)}",
                                      f"minidl gradcheck --only {' '.join(checked)}")]
            facts += nodes.list_item("", nodes.paragraph("", "", nodes.Text("Checked against finite differences by "),
                                                         *commands))
        line = inspect.getsourcelines(cls)[1]
        facts += nodes.list_item("", nodes.paragraph("", "", nodes.Text("Defined in "),
                                                     nodes.literal(f"{where}:{line}", f"{where}:{line}")))
        section += facts
        return section


def setup(app):
    app.add_directive("opsdoc", OpsDoc)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
