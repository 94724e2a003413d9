"""minidl.checkpoint imports one way: replay, nonreentrant, policy, segments, offload, plan, schedule, graph,
then checkmate; no cycle, no private names across."""
import ast
import pathlib
import subprocess
import sys

import pytest

import minidl.checkpoint as package

PACKAGE = pathlib.Path(package.__file__).parent
# each imports only those before it
ORDER = ["replay", "nonreentrant", "policy", "segments", "offload", "plan", "schedule", "graph", "checkmate"]


def minidl_imports(module):
    """(imported module, names) for every ``from minidl... import`` and ``import minidl...`` in the file."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}.py: relative import"
            if node.module.startswith("minidl"):
                for alias in node.names:  # `from minidl.checkpoint import segments` imports a module
                    found.append((node.module, alias.name))
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.startswith("minidl")]
    return found, tree


def package_modules_used(imports):
    used = set()
    for module, name in imports:
        if module.startswith("minidl.checkpoint."):
            used.add(module.rsplit(".", 1)[1])
        elif module == "minidl.checkpoint":
            used.add(name)
    return used


def test_the_package_holds_exactly_these_modules():
    assert sorted(p.stem for p in PACKAGE.glob("*.py")) == sorted(ORDER + ["__init__"])


@pytest.mark.parametrize("index", range(len(ORDER)))
def test_each_module_imports_only_earlier_modules_and_no_private_names(index):
    imports, tree = minidl_imports(ORDER[index])
    assert package_modules_used(imports) <= set(ORDER[:index])
    private = [f"{module}.{name}" for module, name in imports if name and name.startswith("_")]
    assert private == []
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "__getattr__" not in functions  # every name is defined or imported where it is used


def test_plan_builds_on_segments_and_replay():
    assert package_modules_used(minidl_imports("plan")[0]) == {"segments", "replay"}
    assert package_modules_used(minidl_imports("segments")[0]) == {"replay", "policy", "nonreentrant"}
    assert package_modules_used(minidl_imports("nonreentrant")[0]) == {"replay"}


@pytest.mark.parametrize("module", ORDER)
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    code = f"import minidl.checkpoint.{module} as m; import minidl.checkpoint as c; print(len(c.__all__))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(package.__all__)


def test_the_public_names():
    for name in package.__all__:
        assert getattr(package, name).__module__ in {f"minidl.checkpoint.{m}" for m in ORDER}
