"""Run a few of minidl's own test files against several assignment copies, one forked child per copy.

Usage: python own_tests_runner.py PLAN.json, where PLAN is [[copy folder, [test files]], ...]; prints one
JSON object {copy: exit code}. The third-party modules every run needs (NumPy, pytest and its plugins, CuPy
for the test suite's stand-in) are imported once, here, before any minidl; each child then puts its copy
first on the path, so that ``import minidl`` (in the suite's conftest too) imports the copy, and runs
pytest on the files and on a guard test that checks which minidl it got.
"""
import importlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUARD = '''
import os
import minidl

def test_the_minidl_under_test_is_the_copy():
    assert os.path.dirname(os.path.dirname(os.path.abspath(minidl.__file__))) == os.environ["COURSE_COPY"]
'''


def main(plan_path):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") not in (ROOT, os.path.dirname(__file__))]
    for name in ("numpy", "pytest", "hypothesis", "cupy", "xdist", "nbmake"):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module that is absent or does not load here
            pass
    assert "minidl" not in sys.modules
    import pytest
    with open(plan_path) as f:
        plan = json.load(f)
    codes = {}
    for copy, files in plan:
        guard = os.path.join(os.path.dirname(plan_path), f"test_guard_{len(codes)}.py")
        with open(guard, "w") as f:
            f.write(GUARD)
        pid = os.fork()
        if pid == 0:
            os.environ["COURSE_COPY"] = copy
            sys.path.insert(0, copy)
            os.chdir(copy)
            code = pytest.main(["-q", "-p", "no:cacheprovider", "--import-mode=append", f"--rootdir={ROOT}",
                                "-c", os.path.join(ROOT, "pyproject.toml"), guard,
                                *[os.path.join(ROOT, f) for f in files]])
            sys.stdout.flush()
            os._exit(int(code))
        _, status = os.waitpid(pid, 0)
        codes[copy] = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
    print(json.dumps(codes))


if __name__ == "__main__":
    main(sys.argv[1])
