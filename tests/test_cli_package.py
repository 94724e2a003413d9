"""The ``minidl`` command is one package, minidl/cli/: every command module in it, imported explicitly,
and nothing in the library imports it."""
import ast
import pathlib
import subprocess
import sys

import minidl
import minidl.cli

PACKAGE = pathlib.Path(minidl.__file__).parent


def _imported_modules(path: pathlib.Path):
    """Every module an ``import`` or ``from ... import`` names in ``path``, function-local ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_no_library_module_imports_the_command_line():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("cli", "__main__.py"):
            continue
        named = [m for m in _imported_modules(path) if m == "minidl.cli" or m.startswith("minidl.cli.")]
        if named:
            offenders.append(f"{relative}: {sorted(set(named))}")
    assert offenders == []


def test_every_command_module_of_the_package_is_registered():
    files = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "args"}
    registered = {m.__name__.rsplit(".", 1)[1] for m in minidl.cli.COMMANDS}
    assert registered == files
    parser = minidl.cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)
    assert commands == {"gradcheck", "train", "diagnose", "optimizers", "lr-find", "bench", "predict", "gpt",
                        "tune", "selftest", "course", "plan"}


def test_a_command_that_fails_to_import_is_an_error_not_a_missing_command():
    code = ("import sys; sys.modules['minidl.cli.tune'] = None\n"
            "try:\n    import minidl.cli\nexcept ImportError as exc:\n    print('ImportError', exc)\n"
            "else:\n    print('imported')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert out.stdout.startswith("ImportError") and "minidl.cli.tune" in out.stdout, out.stdout + out.stderr


def test_python_dash_m_minidl_is_the_command():
    out = subprocess.run([sys.executable, "-m", "minidl", "--version"], capture_output=True, text=True,
                         timeout=120, cwd=PACKAGE.parent)
    assert out.returncode == 0 and out.stdout.strip() == f"minidl {minidl.__version__}"
