"""Every extra in setup.cfg installs what it promises.

``pip install -e '.[docs]'`` must build the docs, and the build executes every
notebook: so the ``docs`` extra (with minidl's own requirements) must provide
every package a notebook imports and every optional package minidl loads
(inside a ``try: import ... except ImportError``, or a function that imports
on call, such as ``tpe_search`` and Optuna). The packages are read from the
code itself (``ast``), and the extras from setup.cfg (``configparser``, with
``minidl[x]`` resolved), so a new import that no extra provides fails here,
not on a contributor's fresh machine.

A slower check builds the docs in a fresh virtual environment made from
``.[docs]`` alone; it needs the network and several minutes, so it runs only
when ``MINIDL_TEST_FRESH_DOCS=1`` is set (``python -m pytest -n 0 -o addopts=
-m slow tests/test_extras.py``).
"""
from __future__ import annotations

import ast
import configparser
import json
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# An import name whose distribution is named differently on PyPI; every other one is its own name.
DISTRIBUTIONS = {"tensorboardX": "tensorboardx", "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn",
                 "imblearn": "imbalanced-learn", "cupyx": "cupy", "cupy_backends": "cupy"}

# Optional packages minidl loads that the notebooks do not need, and why.
NOT_FOR_THE_NOTEBOOKS = {
    "cupy": "the GPU: the notebooks and the docs build run on the CPU ([gpu] extras)",
    "torch": "PyTorch is a reference for the tests and `minidl bench`, never a dependency of minidl",
}


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement line ('ml_dtypes>=0.4; ...' -> 'ml-dtypes')."""
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _setup() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    return config


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def extra(name: str, config: configparser.ConfigParser | None = None, seen: frozenset = frozenset()) -> set[str]:
    """The distributions extra ``name`` installs, ``minidl[x]`` lines resolved to extra x's."""
    config = config or _setup()
    extras = config["options.extras_require"]
    if name not in extras:
        raise KeyError(f"setup.cfg has no extra {name!r}")
    found = set()
    for line in _lines(extras[name]):
        self_reference = re.fullmatch(r"minidl\[([\w-]+)\]", line.split(";")[0].strip())
        if self_reference:
            if self_reference.group(1) not in seen:
                found |= extra(self_reference.group(1), config, seen | {name})
        else:
            found.add(_name(line))
    return found


def required() -> set[str]:
    return {_name(line) for line in _lines(_setup()["options"]["install_requires"])}


def _third_party(tree: ast.AST) -> set[str]:
    """The top-level names of the absolute imports in ``tree`` that are neither minidl nor the standard library."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {name for name in names if name != "minidl" and name not in sys.stdlib_module_names}


def notebook_imports() -> dict[str, set[str]]:
    """Each notebook's third-party imports, read from its code cells (IPython's % and ! lines left out)."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")
        code = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
        found[path.name] = _third_party(ast.parse(code, str(path)))
    return found


def minidl_imports() -> dict[str, set[str]]:
    """Each third-party package minidl's code imports, with the modules that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "minidl").rglob("*.py")):
        for name in _third_party(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def distribution(module: str) -> str:
    return DISTRIBUTIONS.get(module, module).lower().replace("_", "-")


def test_extras_resolve_their_self_references():
    # Checked against setup.cfg as written: [test] takes in [docs], which takes in [tune].
    assert "optuna" in extra("tune")
    assert {"optuna", "sphinx", "myst-nb"} <= extra("docs") <= extra("test")
    with pytest.raises(KeyError, match="no extra 'nope'"):
        extra("nope")


def test_the_reader_finds_imports_in_try_blocks_and_functions():
    tree = ast.parse("import os\ndef f():\n    try:\n        import optuna.samplers\n    except ImportError:\n"
                     "        pass\nfrom ml_dtypes import bfloat16\nfrom minidl import nn\nfrom . import x\n")
    assert _third_party(tree) == {"optuna", "ml_dtypes"}
    assert _name("nvidia-nccl-cu12>=2.18; sys_platform == 'linux'") == "nvidia-nccl-cu12"


def test_the_docs_extra_provides_every_notebook_import():
    provided = required() | extra("docs")
    missing = {notebook: sorted(distribution(m) for m in modules if distribution(m) not in provided)
               for notebook, modules in notebook_imports().items()}
    missing = {notebook: modules for notebook, modules in missing.items() if modules}
    assert not missing, f"setup.cfg's docs extra lacks what these notebooks import: {missing}"


def test_the_docs_extra_provides_every_optional_package_minidl_loads():
    # A notebook that calls tpe_search needs Optuna though it never imports it: so the docs extra
    # provides every package minidl imports, except the GPU's and PyTorch (NOT_FOR_THE_NOTEBOOKS).
    provided = required() | extra("docs")
    imports = minidl_imports()
    assert "optuna" in imports and "ml_dtypes" in imports  # the reader sees the optional imports
    missing = {distribution(m): sorted(where) for m, where in imports.items()
               if distribution(m) not in provided and distribution(m) not in NOT_FOR_THE_NOTEBOOKS}
    assert not missing, f"setup.cfg's docs extra lacks these packages minidl imports: {missing}"


def test_no_notebook_needs_what_the_docs_extra_leaves_out():
    for notebook, modules in notebook_imports().items():
        assert not {distribution(m) for m in modules} & set(NOT_FOR_THE_NOTEBOOKS), notebook


def test_the_test_extra_installs_the_pytorch_that_ci_installs():
    # README's `pip install -e '.[test]' && python -m pytest -n 2 -q` must run the PyTorch comparisons
    # as CI does: the [test] extra pins the version .ci/run installs.
    pinned = [line for line in _lines(_setup()["options.extras_require"]["test"]) if _name(line) == "torch"]
    ci = re.search(r"pip install -q (torch==\S+)", (ROOT / ".ci" / "run").read_text(encoding="utf-8"))
    assert ci and pinned == [ci.group(1)]
    assert "torch" not in required()  # a test dependency only


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MINIDL_TEST_FRESH_DOCS") != "1",
                    reason="builds the docs in a fresh venv from .[docs] (network, minutes): "
                           "set MINIDL_TEST_FRESH_DOCS=1 to run it")
def test_the_docs_build_in_a_fresh_environment_from_the_docs_extra(tmp_path):
    # MINIDL_TEST_DOCS_VENV names a folder to keep the environment in between runs.
    env_dir = Path(os.environ.get("MINIDL_TEST_DOCS_VENV") or tmp_path / "venv")
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.create(env_dir, with_pip=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "-e", f"{ROOT}[docs]"], check=True, timeout=1800)
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["MINIDL_DOCS_EXECUTE"] = "force"  # run every notebook in this environment, not from the cache
    result = subprocess.run([python, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-q",
                             str(ROOT / "docs"), str(tmp_path / "html")],
                            cwd=ROOT, env=environment, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stderr[-8000:]
    assert (tmp_path / "html" / "notebooks" / "12_tuning.html").exists()
