"""The ``optimizers`` and ``schedules`` directives: the Optimizers page, generated from minidl.optim.

``{optimizers}`` gives one section per family module of :mod:`minidl.optim`
(its docstring: what the family is for, and the papers) and in it one section
per optimizer class that ``minidl.optim`` exports, showing

- the signature with its defaults (``inspect.signature``), the paper, where it is defined;
- the class docstring (its comparison with PyTorch is there);
- the docstrings of the update functions the class runs, found by reading the
  code of its methods (``LAMB.update`` calls ``lamb_update``, which calls
  ``adam_moments``), their equation lines typeset (``docmath.py``, ``mathnodes.py``);
- its trajectory on the ravine f = x²/20 + y², run at build time with
  :mod:`minidl.optim.trajectories`.

``{schedules}`` gives every schedule of :mod:`minidl.optim.schedules` with its
docstring's equation and the curve of an example call.

Figures are written to ``docs/_generated/optim/`` (ignored by git), and only
when their bytes change. Add an optimizer or a schedule to minidl and it
appears here at the next build; a schedule without an example call below is
a build warning (an error under ``-W``).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from mathnodes import doc_nodes, warn_untypeset
from optimfigures import SCHEDULE_EXAMPLES, SCHEDULE_STEPS, fmt, ravine_figure, schedule_figure
from sphinx import addnodes
from sphinx.util import logging

FAMILY_ORDER = ["sgd", "adaptive", "adam", "layerwise", "adahessian", "lbfgs", "averaging"]
HELPER_MODULES = {"minidl.optim.optimizer", "minidl.optim.kernels",  # shared plumbing, not equations
                  "minidl.optim.regularization", "minidl.optim.saved_state", "minidl.optim.wrapper"}
logger = logging.getLogger(__name__)


# ---------------------------------------------------------------- docstrings
def symbol_names(obj) -> set[str]:
    """The parameter names of a function or class (base_lr also as base): symbols in its docstring."""
    try:
        params = set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return set()
    return params | {name.removesuffix("_lr") for name in params}


# ---------------------------------------------------------------- what to show for an optimizer
def reference(target: str, title: str) -> nodes.Node:
    """``title`` as code, linked to ``target`` in the API reference."""
    ref = addnodes.pending_xref("", refdomain="py", reftype="obj", reftarget=target, refexplicit=True,
                                refwarn=False)
    ref += nodes.literal(title, title)
    return ref


def signature_text(obj) -> str:
    parts = []
    for name, param in inspect.signature(obj).parameters.items():
        if param.kind is param.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        parts.append(name if param.default is param.empty else f"{name}={fmt(param.default)}")
    return f"{obj.__name__}({', '.join(parts)})"


def optimizer_classes():
    """The classes minidl.optim exports (but the base class and the scheduler), by family, in source order."""
    import minidl.optim as optim
    classes = [getattr(optim, name) for name in optim.__all__
               if inspect.isclass(getattr(optim, name)) and name not in ("Optimizer", "ScheduleLR")]
    classes = list(dict.fromkeys(classes))  # an alias (AdaGrad for Adagrad) is the same class: one section
    modules = sorted({cls.__module__ for cls in classes},
                     key=lambda m: (FAMILY_ORDER + [m.rsplit(".", 1)[-1]]).index(m.rsplit(".", 1)[-1]))
    return [(importlib.import_module(module),
             sorted((c for c in classes if c.__module__ == module), key=lambda c: inspect.getsourcelines(c)[1]))
            for module in modules]


def _names_in_order(code) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names += _names_in_order(const)
    return list(dict.fromkeys(names))


def _is_equation_function(fn) -> bool:
    return (fn.__module__.startswith("minidl.optim.") and fn.__module__ not in HELPER_MODULES
            and bool(fn.__doc__) and ("←" in fn.__doc__ or " = " in fn.__doc__))


def update_functions(cls):
    """(equation functions, component optimizer classes) that ``cls`` runs, read from its methods' code."""
    from minidl.optim.optimizer import Optimizer
    functions, classes, seen = [], [], set()

    def referenced(fn):
        names = _names_in_order(fn.__code__)
        names.sort(key=lambda name: not name.endswith("_update"))  # the update itself before its helpers
        return [fn.__globals__[name] for name in names if name in fn.__globals__]

    def visit_function(fn):
        if fn in seen:
            return
        seen.add(fn)
        if _is_equation_function(fn):
            functions.append(fn)
        for obj in referenced(fn):
            if inspect.isfunction(obj) and obj.__module__.startswith("minidl.optim."):
                visit_function(obj)

    def visit_class(klass):
        for owner in klass.__mro__:
            if owner in (object, Optimizer) or owner in classes:
                continue
            classes.append(owner)
            for name, member in vars(owner).items():
                if not inspect.isfunction(member) or getattr(klass, name, None) is not member:
                    continue  # a method the class overrides is not what it runs
                for obj in referenced(member):
                    if inspect.isfunction(obj) and obj.__module__.startswith("minidl.optim."):
                        visit_function(obj)
                    elif inspect.isclass(obj) and issubclass(obj, Optimizer) and obj is not Optimizer:
                        visit_class(obj)

    visit_class(cls)
    return functions, [c for c in classes if c is not cls]


def paper(cls) -> str | None:
    """The reference the docstrings give right after the name: ``Adam (Kingma & Ba 2015)``."""
    pattern = re.compile(rf"\b{re.escape(cls.__name__)}\s*\(([^()]*\d{{4}}[^()]*)\)")
    for doc in (cls.__doc__, inspect.getmodule(cls).__doc__):
        match = pattern.search(" ".join((doc or "").split()))
        if match:
            return match.group(1)
    return None


def check_docstring_signature(cls, paragraph: str) -> str | None:
    """Compare a paragraph's leading ``Name(a=1, ...)`` literal with the real defaults (a warning on
    drift) and drop it: the section shows the signature already."""
    match = re.match(rf"``{cls.__name__}\(([^`]*)\)``\s*([.:]?)\s*(.*)$", paragraph, re.S)
    if not match:
        return paragraph
    try:
        call = ast.parse(f"f({match.group(1)})", mode="eval").body
        written = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError):
        return paragraph
    params = inspect.signature(cls).parameters
    for name, value in written.items():
        if name not in params or params[name].default != value:
            logger.warning(f"optimdoc: {cls.__name__}'s docstring says {name}={value!r} but its signature "
                           f"has {name}={params[name].default if name in params else '(no such parameter)'!r}")
    if not match.group(2) and match.group(3):
        return paragraph  # the literal is part of a sentence: keep it
    rest = match.group(3).strip()
    return rest[:1].upper() + rest[1:]


def shown_docstrings():
    """(what, docstring, symbol names) of every docstring the Optimizers page shows, in page order."""
    from minidl.optim import schedules
    for module, classes in optimizer_classes():
        yield module.__name__, (module.__doc__ or module.__name__).strip().partition("\n")[2], {"lr"}
        for cls in classes:
            yield cls.__name__, cls.__doc__ or "", symbol_names(cls)
            for fn in update_functions(cls)[0]:
                yield f"{fn.__module__}.{fn.__name__}", fn.__doc__, symbol_names(fn)
    yield schedules.__name__, schedules.__doc__.strip().partition("\n")[2], {"lr"}
    for name in schedules.__all__:
        if inspect.isfunction(getattr(schedules, name)):
            fn = getattr(schedules, name)
            yield f"{fn.__module__}.{fn.__name__}", fn.__doc__, symbol_names(fn)


# ---------------------------------------------------------------- directives
class _Generated(Directive):
    has_content = False

    def docstring(self, doc: str, names, what: str, edit_paragraph=None) -> list[nodes.Node]:
        """``doc`` as nodes; a warning for each of its equation lines that is not typeset."""
        warn_untypeset(doc, names, what, location=self.state.document.settings.env.docname)
        return doc_nodes(doc, names, self.state.document.settings.env.docname, edit_paragraph)

    def section(self, ident: str, title: str) -> nodes.section:
        section = nodes.section(ids=[nodes.make_id(ident)], names=[nodes.fully_normalize_name(ident)])
        section += nodes.title(title, title)
        self.state.document.note_implicit_target(section, section)
        return section

    def figure(self, uri: str, caption, alt: str) -> nodes.figure:
        figure = nodes.figure(classes=["optim-figure"])
        figure += nodes.image(uri=uri, alt=alt)
        figure += nodes.caption("", "", *caption)
        return figure

    def where(self, obj) -> str:
        import minidl
        root = Path(minidl.__file__).resolve().parent.parent
        source = Path(inspect.getsourcefile(obj)).resolve()
        self.state.document.settings.env.note_dependency(str(source))
        return f"{source.relative_to(root).as_posix()}:{inspect.getsourcelines(obj)[1]}"


class OptimizersDoc(_Generated):
    """``{optimizers}``: every optimizer class of minidl.optim, grouped by family."""

    def run(self):
        sections = []
        for module, classes in optimizer_classes():
            doc = module.__doc__ or module.__name__
            heading, _, rest = doc.strip().partition("\n")
            section = self.section(f"family-{module.__name__.rsplit('.', 1)[-1]}", heading.strip().rstrip("."))
            where = self.where(module).rsplit(":", 1)[0]
            section += nodes.paragraph("", "", nodes.Text("Module "), nodes.literal(module.__name__, module.__name__),
                                       nodes.Text(f" ({where})."))
            section += self.docstring(rest, {"lr"}, module.__name__)
            for cls in classes:
                section += self.optimizer_section(cls)
            sections.append(section)
        return sections

    def optimizer_section(self, cls) -> nodes.section:
        section = self.section(f"optimizer-{cls.__name__}", cls.__name__)
        signature = signature_text(cls)
        section += nodes.paragraph("", "", reference(f"minidl.optim.{cls.__name__}", f"optim.{signature}"))
        functions, components = update_functions(cls)
        facts = nodes.bullet_list(classes=["optim-facts"])
        reference_text = paper(cls)
        if reference_text:
            facts += nodes.list_item("", nodes.paragraph("", f"Paper: {reference_text}."))
        else:
            built_on = [f"{c.__name__} ({paper(c)})" for c in components if paper(c)]
            if built_on:
                facts += nodes.list_item("", nodes.paragraph("", "Built on " + " and ".join(built_on) + "."))
        if functions:
            names = [nodes.reference("", "", nodes.literal(fn.__name__, fn.__name__),
                                     refid=nodes.make_id(f"{cls.__name__}-{fn.__name__}")) for fn in functions]
            joined = [piece for name in names for piece in (name, nodes.Text(", "))][:-1]
            facts += nodes.list_item("", nodes.paragraph("", "", nodes.Text("Update equations: "), *joined))
        where = self.where(cls)
        facts += nodes.list_item("", nodes.paragraph("", "", nodes.Text("Defined in "), nodes.literal(where, where)))
        section += facts
        section += self.docstring(cls.__doc__ or "", symbol_names(cls), cls.__name__,
                                  lambda text: check_docstring_signature(cls, text))
        for fn in functions:
            title = f"{fn.__module__}.{fn.__name__}"
            section += nodes.rubric("", "", nodes.literal(title, title),
                                    ids=[nodes.make_id(f"{cls.__name__}-{fn.__name__}")])
            section += self.docstring(fn.__doc__, symbol_names(fn), title)
        figure = ravine_figure(cls)
        if figure:
            section += self.figure(figure[0], figure[1], f"trajectory of {cls.__name__} on the ravine")
        return section


class SchedulesDoc(_Generated):
    """``{schedules}``: every learning-rate schedule of minidl.optim.schedules, with its curve."""

    def run(self):
        from minidl.optim import schedules
        self.where(schedules)
        out = self.docstring(schedules.__doc__.strip().partition("\n")[2], {"lr"}, schedules.__name__)
        functions = [getattr(schedules, name) for name in schedules.__all__
                     if inspect.isfunction(getattr(schedules, name))]
        namespace = {name: getattr(schedules, name) for name in schedules.__all__}
        for fn in sorted(functions, key=lambda f: inspect.getsourcelines(f)[1]):
            section = self.section(f"schedule-{fn.__name__}", fn.__name__)
            signature = signature_text(fn)
            section += nodes.paragraph("", "", reference(f"minidl.optim.schedules.{fn.__name__}",
                                                         f"schedules.{signature}"))
            section += self.docstring(fn.__doc__, symbol_names(fn), f"{fn.__module__}.{fn.__name__}")
            example = SCHEDULE_EXAMPLES.get(fn.__name__)
            if example is None:
                logger.warning(f"optimdoc: the schedule {fn.__name__} has no example call in "
                               "docs/_ext/optimdoc.py SCHEDULE_EXAMPLES, so its curve cannot be drawn")
            else:
                call, log = example
                uri = schedule_figure(fn.__name__, eval(call, dict(namespace)), log)  # noqa: S307 - our table
                caption = [nodes.literal(call, call),
                           nodes.Text(f" for t = 0 … {SCHEDULE_STEPS}" + (" (log scale)." if log else "."))]
                section += self.figure(uri, caption, f"the learning rate of {call}")
            out.append(section)
        return out


def setup(app):
    app.add_directive("optimizers", OptimizersDoc)
    app.add_directive("schedules", SchedulesDoc)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
