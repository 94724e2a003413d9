"""The package's shape, read from its source with ``ast``: imports run down the layers, no module patches another.

The layers are those of the design (CONTRIBUTING.md's map of the package):
each module imports only from its own layer and the layers below it,
function-local imports included, and the only import cycle is tensor ↔ autograd
(the package: inside it, its modules import one another in one direction only).
Extensions go through hook points (FunctionHook, the walk's and the step's
hooks, module hooks, ``backend.rng_hook``), so no module assigns to an
attribute of another module or of a class at run time; attaching Tensor's
methods when the ops load is the one exception. (``minidl.hooks.StepHooks``
wraps the ``step`` a subclass defines while that class is being created, in
``__init_subclass__``: part of defining the class, as a decorator would be.)
"""
import ast
import functools
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minidl"

# Lowest first. A module belongs to the longest prefix listed; it may import its own layer and lower ones.
LAYERS = [
    # arrays and devices; hook registries; PyTorch's paths that hand on outside packages
    ["minidl.backend", "minidl.array_kernels", "minidl.hooks", "minidl.backends", "minidl.utils.tensorboard"],
    ["minidl.tensor"],  # imports minidl.autograd: the one circle allowed (ALLOWED_CYCLE)
    ["minidl.autograd"],
    ["minidl.autocast_mode"],  # the precision mode the ops read; imports no op
    ["minidl.ops"],
    ["minidl.functional"],
    # verification and measurement; `minidl` itself (the package face imports up to here, the rest lazily)
    ["minidl.gradcheck", "minidl.func", "minidl.serialization", "minidl.profiler", "minidl.memory",
     "minidl.op_cases", "minidl"],
    ["minidl.nn", "minidl.quant"],  # quantized layers and their conversion: layers, beside nn
    ["minidl.optim"],
    ["minidl.amp", "minidl.cuda", "minidl.accelerator"],  # GradScaler drives an optimizer; minidl.cuda.amp is
    # PyTorch's path to amp; minidl.accelerator asks minidl.cuda
    ["minidl.checkpoint", "minidl.utils.checkpoint"],
    ["minidl.data", "minidl.utils.data", "minidl.utils"],
    ["minidl.parallel", "minidl.distributed"],  # PyTorch's torch.distributed names over parallel's communicators
    ["minidl.train"],
    ["minidl.roofline", "minidl.models", "minidl.tune", "minidl.selftest", "minidl.course"],
    ["minidl.cli", "minidl.__main__"],  # the command: imports everything, nothing imports it
]
ALLOWED_CYCLE = {"minidl.tensor", "minidl.autograd"}  # autograd's modules that import Tensor join it

# Assignments that set a documented switch, not another module's code: (file, what is assigned).
SETTINGS = {
    ("minidl/ops/__init__.py", "T"),  # Tensor's operators and methods, attached when the ops load
    ("minidl/selftest/speed.py", "torch.backends.cuda.matmul.allow_tf32"),  # PyTorch's TF32 switch
    ("minidl/parallel/world.py", "sys.excepthook"),  # Python's hook for uncaught exceptions
}


# ---------------------------------------------------------------- reading the source
def module_files(package=PACKAGE):
    """{dotted module name: path} of every module of the package."""
    files = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    return files


@functools.lru_cache(maxsize=None)
def parsed() -> dict:
    """{dotted module name: (path, syntax tree)}, read once for all the tests."""
    return {name: (path, ast.parse(path.read_text())) for name, path in module_files().items()}


def _tree(source):
    return ast.parse(source) if isinstance(source, str) else source


def imports_of(name: str, source, known) -> list[tuple[str, int]]:
    """(imported module, line) for every minidl import in ``source``, at any depth in the code.

    ``from package import name`` imports the module ``package.name`` when there is one, else
    the package's face; ``known`` is the set of module names.
    """
    is_package = known.get(name, "").endswith("__init__.py") if isinstance(known, dict) else False
    here = name if is_package else name.rpartition(".")[0]

    def resolve(dotted):
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    found = []
    for node in ast.walk(_tree(source)):
        if isinstance(node, ast.Import):
            found += [(resolve(a.name), node.lineno) for a in node.names if a.name.split(".")[0] == "minidl"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base.split(".")[0] != "minidl":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in known else resolve(base), node.lineno))
    return found


def layer_of(module: str) -> int:
    best, rank = "", None
    for index, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, index
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to CONTRIBUTING.md's map)")
    return rank


@functools.lru_cache(maxsize=None)
def import_graph():
    files = parsed()
    known = {name: str(path) for name, (path, _) in files.items()}
    return {name: imports_of(name, tree, known) for name, (path, tree) in files.items()}


def upward_imports(graph) -> list[str]:
    bad = []
    for module, imported in graph.items():
        for target, line in imported:
            if target == module or (module, target) == ("minidl.tensor", "minidl.autograd"):
                continue
            if layer_of(target) > layer_of(module):
                bad.append(f"{module}:{line} imports {target} (layer {layer_of(target)} > {layer_of(module)})")
    return bad


def cycles(graph) -> list[set]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    edges = {m: sorted({t for t, _ in targets if t != m}) for m, targets in graph.items()}
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def patches(relative: str, source) -> list[str]:
    """Assignments (=, +=, del, setattr, delattr, __dict__[...]) to an attribute of a module or a class.

    A module or a class is a name bound by an import or a ``class`` statement in the file, or
    taken from ``sys.modules`` / ``importlib.import_module``. Attributes of instances (``self.x``)
    are the objects' own business.
    """
    tree = _tree(source)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Attribute) and (n.attr, ast.unparse(n.value)) == ("modules", "sys")
                or getattr(n, "id", getattr(n, "attr", None)) == "import_module"
                for n in ast.walk(node.value)):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))

    def root(expr):
        while isinstance(expr, (ast.Attribute, ast.Subscript, ast.Call)):
            expr = expr.func if isinstance(expr, ast.Call) else expr.value
        return expr.id if isinstance(expr, ast.Name) else None

    def hits(target):
        if isinstance(target, (ast.Tuple, ast.List)):
            return [t for e in target.elts for t in hits(e)]
        if isinstance(target, ast.Attribute) and root(target) in bound:
            return [ast.unparse(target)]
        if isinstance(target, ast.Subscript) and (
                (isinstance(target.value, ast.Attribute) and target.value.attr == "__dict__")
                or (isinstance(target.value, ast.Call) and ast.unparse(target.value.func) == "vars")):
            return [ast.unparse(target.value)]
        return []

    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and root(node.args[0]) in bound:
            found.append((node.lineno, ast.unparse(node.args[0])))
        for target in targets:
            found += [(node.lineno, what) for what in hits(target)]
    return [f"{relative}:{line} assigns to {what}" for line, what in found
            if (relative, what) not in SETTINGS and not any(relative == f and what.startswith(w + ".")
                                                             for f, w in SETTINGS)]


# ---------------------------------------------------------------- the package
def test_every_import_runs_down_the_layers():
    assert upward_imports(import_graph()) == []


def _in_autograd(module: str) -> bool:
    return module == "minidl.autograd" or module.startswith("minidl.autograd.")


def test_the_only_import_cycle_is_tensor_and_autograd():
    """tensor imports backward, Cast, ToDevice and is_grad_enabled late, from autograd's face; the
    autograd modules that make or read Tensors import tensor: that is the one cycle. Inside the
    package the modules form a chain of layers of their own (no cycle among them)."""
    graph = import_graph()
    (cycle,) = cycles(graph)
    assert ALLOWED_CYCLE <= cycle and all(m == "minidl.tensor" or _in_autograd(m) for m in cycle), cycle
    assert {t for t, _ in graph["minidl.tensor"] if _in_autograd(t)} == {"minidl.autograd"}
    inside = {m: [(t, line) for t, line in imported if t.startswith("minidl.autograd.")]
              for m, imported in graph.items() if m.startswith("minidl.autograd.")}
    assert cycles(inside) == []


def test_nothing_imports_the_command_line():
    graph = import_graph()
    importers = {(module, target) for module, imported in graph.items() for target, _ in imported
                 if target.split(".")[:2] == ["minidl", "cli"] and module.split(".")[:2] != ["minidl", "cli"]
                 and module != "minidl.__main__"}
    assert not importers, importers


def test_the_parallel_package_face_only_hands_names_on():
    tree = ast.parse((PACKAGE / "parallel" / "__init__.py").read_text())
    for node in tree.body:
        is_docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        is_all = isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
        assert is_docstring or is_all or isinstance(node, (ast.Import, ast.ImportFrom)), ast.unparse(node)[:80]
    graph = import_graph()
    assert [m for m, imported in graph.items() if m.startswith("minidl.parallel.")
            and any(t == "minidl.parallel" for t, _ in imported)] == []


def test_no_module_assigns_to_another_modules_or_a_class_attributes():
    found = []
    for path, tree in parsed().values():
        found += patches(path.relative_to(ROOT).as_posix(), tree)
    assert found == []


# ---------------------------------------------------------------- the checks can fail
def test_the_import_reader_sees_local_relative_and_from_imports():
    known = {"minidl": "minidl/__init__.py", "minidl.nn": "minidl/nn/__init__.py", "minidl.nn.module": "m.py",
             "minidl.tensor": "t.py", "minidl.train": "minidl/train/__init__.py", "minidl.train.loop": "l.py"}
    source = ("import numpy\nfrom minidl import nn\nfrom . import module\n"
              "def f():\n    from minidl.train.loop import fit\n    import minidl.tensor as t\n"
              "from minidl.nn import Linear\n")
    assert sorted(imports_of("minidl.nn.module", source, known)) == [
        ("minidl.nn", 2), ("minidl.nn", 7), ("minidl.nn.module", 3), ("minidl.tensor", 6),
        ("minidl.train.loop", 5)]


def test_an_upward_import_and_a_cycle_are_found():
    graph = {"minidl.nn.module": [("minidl.optim.sgd", 3)], "minidl.optim.sgd": [("minidl.nn.module", 1)],
             "minidl.tensor": [("minidl.autograd", 1)], "minidl.autograd": [("minidl.tensor", 2)]}
    assert upward_imports(graph) == ["minidl.nn.module:3 imports minidl.optim.sgd (layer 8 > 7)"]
    assert sorted(map(sorted, cycles(graph))) == [["minidl.autograd", "minidl.tensor"],
                                                  ["minidl.nn.module", "minidl.optim.sgd"]]
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("minidl_extra.thing")


@pytest.mark.parametrize("line", [
    "from minidl import autograd\nautograd.backward = None",
    "from minidl.nn.module import Module\nModule.__call__ = None",
    "import minidl.backend\nminidl.backend.rng = None",
    "from minidl import backend\nsetattr(backend, 'rng', None)",
    "import sys\nm = sys.modules['minidl.optim']\nm.Optimizer.step = None",
    "from minidl.optim import SGD\nSGD.step += 1",
    "def f(owner):\n    owner.__dict__['step'] = None",
    "class A:\n    pass\ndel A.x",
])
def test_the_patch_reader_finds_assignments_to_modules_and_classes(line):
    assert len(patches("minidl/x.py", line)) == 1


def test_the_patch_reader_leaves_instances_alone():
    source = ("class A:\n    def __init__(self):\n        self.x = 1\n        setattr(self, 'y', 2)\n"
              "def f(op):\n    op.forward = None\n")
    assert patches("minidl/x.py", source) == []
