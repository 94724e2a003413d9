"""benchmarks/gpu_run.sh, the one command for a GPU machine, run here on the CuPy stand-in: its stages
run under their budgets, a failed or timed-out stage never stops the next, and OUT keeps its limits."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_run.sh")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="the script needs bash and coreutils' timeout")


# the selftest itself is tests/test_selftest.py's: here two of its stages, for the script's logic
STANDIN_SELFTEST = f"{sys.executable} -m tests.cupy_standin selftest --device cuda --quick --only environment nccl"


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
    entries = sorted(os.listdir(out))  # .lock: the selftest's claim on its run folder (empty, left in place)
    assert entries == [".lock", "gpu_run.txt", "pytest.txt", "selftest.json", "selftest.log", "summary.txt"]
    assert all(os.path.isfile(out / e) and os.path.getsize(out / e) < 16 << 20 for e in entries)
    # -m cuda picked the test_backend tests whose device is "cuda", and only those
    tail = (out / "pytest.txt").read_text().strip().splitlines()[-1]
    assert " passed" in tail and "deselected" in tail and "failed" not in tail
    assert "every stage passed" in (out / "selftest.log").read_text()


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


# ---------------------------------------------------------------- what pytest -m cuda selects
def test_the_cuda_marker_is_on_the_cuda_case_of_a_device_test(request, device):
    assert (request.node.get_closest_marker("cuda") is not None) == (device == "cuda")


def test_the_cuda_marker_is_on_a_test_of_cuda_wherever_it_runs(request, standin_or_gpu):
    assert request.node.get_closest_marker("cuda") is not None


def test_a_test_of_the_stand_in_itself_is_not_marked(request, standin):
    assert request.node.get_closest_marker("cuda") is None
