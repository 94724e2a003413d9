"""benchmarks/gpu_run.sh, the one command for a GPU machine, run here on the CuPy stand-in: its stages
run under their budgets, a failed or timed-out stage never stops the next, and OUT keeps its limits."""
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_run.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="the script needs bash and coreutils' timeout")


# the selftest itself is tests/test_selftest.py's: here two of its stages, for the script's logic
STANDIN_SELFTEST = f"{sys.executable} -m tests.cupy_standin selftest --device cuda --quick --only environment kernels"


def _run(out, **env):
    environ = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", SCRIPT, str(out)], capture_output=True, text=True, env=environ, timeout=300)


def _report(out):
    lines = (out / "gpu_run.txt").read_text().splitlines()
    return {line.split()[0]: line for line in lines if line.split()[:1] and line.split()[0] in
            ("environment", "selftest", "pytest")}


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", SCRIPT]).returncode == 0
    assert subprocess.run(["bash", SCRIPT], capture_output=True).returncode == 2  # no OUT: usage


def test_every_stage_runs_and_out_holds_the_results(tmp_path):
    out = tmp_path / "out"
    done = _run(out, MINIDL_SELFTEST=STANDIN_SELFTEST,
                GPU_RUN_PYTEST_ARGS="-m cuda -o addopts= -p no:cacheprovider -n 0 -q tests/test_backend.py",
                GPU_RUN_ENVIRONMENT_S="60")
    stages = _report(out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all("passed" in stages[s] for s in ("environment", "selftest", "pytest")), stages
    # five files, none in a folder: room for three more under the device tool's 8 returned
    entries = sorted(os.listdir(out))
    assert entries == ["gpu_run.txt", "gpu_run_rest.tar.gz", "pytest.txt", "selftest.json", "summary.txt"]
    assert all(os.path.isfile(out / e) and os.path.getsize(out / e) < 16 << 20 for e in entries)
    # -m cuda picked the test_backend tests whose device is "cuda", and only those
    tail = (out / "pytest.txt").read_text().strip().splitlines()[-1]
    assert " passed" in tail and "deselected" in tail and "failed" not in tail
    # the selftest's log is in the archive, whole
    with tarfile.open(out / "gpu_run_rest.tar.gz") as archive:
        assert archive.getnames() == ["selftest.log"]
        assert "every stage passed" in archive.extractfile("selftest.log").read().decode()
    assert "packed" in (out / "gpu_run.txt").read_text()


def test_a_stage_out_of_time_or_failing_does_not_stop_the_next(tmp_path):
    out = tmp_path / "out"
    # the whole quick selftest takes seconds (240 op cases alone): a budget of one second stops it
    done = _run(out, MINIDL_SELFTEST=f"{sys.executable} -m tests.cupy_standin selftest --device cuda --quick",
                GPU_RUN_SELFTEST_S="1", GPU_RUN_PYTEST_ARGS="-o addopts= -p no:cacheprovider tests/no_such_file.py",
                GPU_RUN_ENVIRONMENT_S="60")
    stages = _report(out)
    assert done.returncode == 1
    assert "timed out" in stages["selftest"] and "exit 124" in stages["selftest"]
    assert "failed" in stages["pytest"] and "no_such_file" in (out / "pytest.txt").read_text()
    assert "a stage failed" in (out / "gpu_run.txt").read_text().splitlines()[-1]


SHIM = """#!/usr/bin/env bash
# python3 as the script calls it: its arguments recorded, pytest and the selftest not run
echo "$*" >> "$RECORD"
case "$1 $2" in
    "-m pytest"|"-m minidl") exit 0 ;;
esac
exec "$REAL_PYTHON" "$@"
"""


def test_the_default_interpreter_is_python3_and_pytest_prints_test_ids(tmp_path):
    """Without PYTHON the script calls ``python3`` (what the GPU image documents; ``python`` may be absent
    or another Python), for every stage; pytest runs verbose with the failures' summary (-v -rfE)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(SHIM)
    (bin_dir / "python3").chmod(0o755)
    record = tmp_path / "record.txt"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "MINIDL_SELFTEST", "GPU_RUN_PYTEST_ARGS")}
    environ.update(PATH=f"{bin_dir}{os.pathsep}{environ['PATH']}", RECORD=str(record), REAL_PYTHON=sys.executable)
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "out")], capture_output=True, text=True, env=environ,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    calls = record.read_text().splitlines()
    assert calls[0] == "-"  # the environment stage's version listing (a script on stdin)
    assert calls[1] == f"-m minidl selftest --device cuda --out {tmp_path / 'out'} --overwrite"
    assert calls[2] == "-m pytest -m cuda -o addopts= -n 8 -v -rfE tests"


def test_a_pytest_stage_out_of_time_shows_the_test_it_was_in(tmp_path):
    tests = tmp_path / "test_slow.py"
    tests.write_text("import time\n\ndef test_quick():\n    pass\n\ndef test_sleeps():\n    time.sleep(120)\n")
    out = tmp_path / "out"
    done = _run(out, MINIDL_SELFTEST="true", GPU_RUN_PYTEST_S="20",
                GPU_RUN_PYTEST_ARGS=f"-o addopts= -p no:cacheprovider -v -rfE {tests}")
    assert done.returncode == 1
    assert "timed out" in _report(out)["pytest"]
    text = (out / "pytest.txt").read_text()
    assert "test_slow.py::test_quick PASSED" in text and "test_slow.py::test_sleeps" in text


# ---------------------------------------------------------------- what pytest -m cuda selects
def test_the_cuda_marker_is_on_the_cuda_case_of_a_device_test(request, device):
    assert (request.node.get_closest_marker("cuda") is not None) == (device == "cuda")


def test_the_cuda_marker_is_on_a_test_of_cuda_wherever_it_runs(request, standin_or_gpu):
    assert request.node.get_closest_marker("cuda") is not None


def test_a_test_of_the_stand_in_itself_is_not_marked(request, standin):
    assert request.node.get_closest_marker("cuda") is None
