"""One API reference page per public module, written from the module's ``__all__``.

At the start of a build this writes ``docs/api/<module>.rst`` for each module
in :data:`PUBLIC_MODULES`: the module docstring, a summary table of its public
names (autosummary) and the full docstring of each (autodoc). The pages are
generated, not committed, so a name added to ``__all__`` is documented at the
next build and a removed one disappears.

A module that does not exist yet is skipped; a module that exists but fails to
import fails the build.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import types
from pathlib import Path

from sphinx.util import logging

PUBLIC_MODULES = [
    "minidl", "minidl.functional", "minidl.gradcheck", "minidl.func", "minidl.nn", "minidl.nn.init",
    "minidl.nn.utils",
    "minidl.optim", "minidl.optim.schedules", "minidl.optim.lr_scheduler", "minidl.data", "minidl.train",
    "minidl.checkpoint", "minidl.memory", "minidl.amp", "minidl.models", "minidl.profiler", "minidl.parallel",
    "minidl.distributed",
    "minidl.tune", "minidl.nn.prune", "minidl.quant", "minidl.nn.lora",
    "minidl.nn.structured_prune",
    "minidl.optim.offload",
    "minidl.optim.low_precision", "minidl.optim.quantized_grad",
    "minidl.graphdraw",
    "minidl.hooks",
    "minidl.tracing",
    "minidl.tracing_lower",
    "minidl.models.zoo",
]
OUTPUT = Path(__file__).resolve().parent.parent / "api"
logger = logging.getLogger(__name__)


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items()
                 if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__]
    return [n for n in names if not n.startswith("__")]


def _kind(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    if callable(obj):
        return "function"
    return "data"


def _shadowed(module) -> bool:
    """True for a module whose name its package gives to something else: ``minidl.gradcheck`` is the
    function ``gradcheck`` as an attribute of ``minidl``; the function keeps the name in the index."""
    parent, _, leaf = module.__name__.rpartition(".")
    if not parent:
        return False
    value = getattr(importlib.import_module(parent), leaf, module)
    return value is not module


def module_page(module) -> str:
    name = module.__name__
    groups = {"class": [], "function": [], "exception": [], "data": [], "module": []}
    for public in public_names(module):
        groups[_kind(getattr(module, public))].append(public)
    lines = [name, "=" * len(name), "", f".. automodule:: {name}", "   :no-members:"]
    if _shadowed(module):
        lines.append("   :no-index:")
    lines.append("")
    titles = {"class": "Classes", "function": "Functions", "exception": "Exceptions"}
    for kind, title in titles.items():
        if groups[kind]:
            lines += [f".. rubric:: {title}", "", ".. autosummary::", "   :nosignatures:", ""]
            lines += [f"   {item}" for item in groups[kind]] + [""]
    if groups["module"]:
        lines += [".. rubric:: Submodules", ""]
        lines += [f"- :mod:`{name}.{item}`" for item in groups["module"]] + [""]
    lines += ["Reference", "---------", ""]
    for item in groups["class"] + groups["exception"]:
        lines += [f".. autoclass:: {item}", "   :members:", "   :show-inheritance:", ""]
    for item in groups["function"]:
        lines += [f".. autofunction:: {item}", ""]
    for item in groups["data"]:
        lines += [f".. autodata:: {item}", "   :no-value:", ""]
    return "\n".join(lines)


def write_pages(output: Path = OUTPUT) -> list[str]:
    """Write one page per importable public module; return the module names written."""
    output.mkdir(exist_ok=True)
    written = []
    for name in PUBLIC_MODULES:
        try:
            exists = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            exists = False
        if not exists:
            logger.info(f"apipages: {name} does not exist yet; no page for it")
            continue
        module = importlib.import_module(name)  # an import error here is a real bug: let it fail the build
        page = output / f"{name}.rst"
        text = module_page(module)
        if not page.exists() or page.read_text() != text:
            page.write_text(text)
        written.append(name)
    for stale in output.glob("*.rst"):
        if stale.stem not in written:
            stale.unlink()
    return written


def _on_builder_inited(app):
    write_pages()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
