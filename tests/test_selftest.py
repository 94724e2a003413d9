"""``minidl selftest --device cuda``, end to end on the CuPy stand-in:
every stage runs, the results folder keeps its limits, the JSON holds what the stages measured; a stage
that fails or runs out of time never stops the rest; without CuPy the command says so and exits 2."""
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from minidl import selftest
from minidl.op_cases import cases
from minidl.selftest import collectives, parity, report
from tests.cupy_standin import nccl as nccl_standin


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run of the whole command on the stand-in, for the tests of this module: (results, folder,
    printed lines). Always the stand-in: on a GPU, benchmarks/gpu_run.sh runs the real thing."""
    from minidl import backend
    from tests import cupy_standin
    previous = backend._use_cupy_module(cupy_standin, cupy_standin.cupyx)
    cupy_standin.reset()
    out = tmp_path_factory.mktemp("selftest")
    lines = []
    try:
        with nccl_of_one_rank(cupy_standin):
            results = selftest.run("cuda", out=str(out), quick=True, log=lines.append)
    finally:
        backend._use_cupy_module(*previous)
    return results, out, lines


@contextlib.contextmanager
def nccl_of_one_rank(standin, module=None):
    """The stand-in with an NCCL binding of one rank (tests/cupy_standin/nccl.py, or ``module``) in the block;
    the default stand-in has none."""
    previous, standin.cuda.nccl = standin.cuda.nccl, module or nccl_standin
    try:
        yield
    finally:
        standin.cuda.nccl = previous


def test_every_stage_passes_and_reports_as_it_ends(quick_run):
    results, _, lines = quick_run
    names = [name for name, _, _ in selftest.STAGES]
    assert list(results["stages"]) == names
    assert {n: r["status"] for n, r in results["stages"].items()} == dict.fromkeys(names, "passed"), \
        "\n".join(f for r in results["stages"].values() for f in r.get("failures", []))
    assert results["passed"]
    # one line per stage, in order, as each ends; then the verdict
    assert [line.split()[1] for line in lines[:len(names)]] == names
    assert all(line.startswith(f"[{i}/{len(names)}]") for i, line in enumerate(lines[:len(names)], 1))
    assert "every stage passed" in lines[-1]


def test_the_results_folder_holds_at_most_eight_small_files_and_no_folder(quick_run):
    _, out, _ = quick_run
    entries = sorted(os.listdir(out))
    assert entries == ["roofline.png", "selftest.json", "step_profile.png", "summary.txt"]
    assert all(os.path.isfile(out / e) and 0 < os.path.getsize(out / e) < 16 << 20 for e in entries)
    for png in ("roofline.png", "step_profile.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.check_folder(str(out)) == []


def test_the_json_holds_what_each_stage_did(quick_run, standin):
    from minidl import backend
    _, out, _ = quick_run
    data = json.loads((out / "selftest.json").read_text())
    stages = data["stages"]
    assert data["device"] == "cuda" and data["quick"] is True and data["passed"] is True
    assert data["stages"]["results"]["status"] == "passed"  # written again once the results stage had ended
    # environment: one entry per GPU CuPy sees
    gpus = data["environment"]["gpus"]
    assert len(gpus) == backend.cupy_module().cuda.runtime.getDeviceCount() and gpus[0]["memory_gib"] > 0
    # parity: every op case and every optimizer compared, the three training runs done
    counts = stages["parity"]["counts"]
    assert counts["op cases"] == f"{len(cases())}/{len(cases())}"
    assert counts["optimizers"] == f"{len(parity.OPTIMIZERS)}/{len(parity.OPTIMIZERS)}"
    assert counts["training runs"] == "3/3"
    # kernels: every fused optimizer compiled its kernel on first call
    fused = set(parity.OPTIMIZERS) - set(parity.UNFUSED)
    assert set(stages["kernels"]["optimizers"]) == fused
    assert all(r["compiled"] and r["kernels"] >= 1 and r["first_s"] > 0
               for r in stages["kernels"]["optimizers"].values())
    # speed: every figure measured; the optimizer's bandwidth is its 7 float32 streams over its time
    figures = stages["speed"]["figures"]
    assert set(figures) == {"roofline", "mlp", "cnn", "gpt", "optimizer", "launch"}
    assert all(figures[k]["minidl"]["best_ms"] > 0 for k in ("mlp", "cnn", "gpt", "optimizer", "launch"))
    opt = figures["optimizer"]
    assert opt["bytes_per_s"] == pytest.approx(7 * 4 * opt["parameters"] / (opt["minidl"]["best_ms"] / 1e3))
    copy = figures["roofline"]["ceilings"]["copy_bandwidth"]
    assert opt["fraction_of_copy_bandwidth"] == pytest.approx(opt["bytes_per_s"] / copy)
    assert figures["gpt"]["peak_bytes"] > 0 and figures["gpt"]["peak_bytes_checkpointed"] > 0
    assert {"add", "matmul", "linear"} <= {key.split()[0] for key in figures["roofline"]["ops"]}
    assert "roofline" not in data  # the suite's raw rows went into the PNGs, not the JSON
    text = (out / "summary.txt").read_text()
    assert all(name in text for name, _, _ in selftest.STAGES) and "verdict: every stage passed" in text


def test_a_failing_or_hanging_stage_is_recorded_and_the_next_one_runs():
    def broken(stage):
        raise ValueError("a planted failure")

    def hanging(stage):
        time.sleep(30)

    def slow_but_polite(stage):
        done = 0
        while not stage.expired():
            time.sleep(0.01)
            done += 1
        return {"partial": True, "summary": f"{done} items before the limit"}

    stage = lambda: selftest.Stage("x", "cuda", True, 0.2, {}, print)  # noqa: E731
    failed = selftest.run_stage(broken, stage())
    assert failed["status"] == "failed" and "a planted failure" in failed["failures"][0]
    started = time.perf_counter()
    hung = selftest.run_stage(hanging, stage(), grace=0.1)
    assert hung["status"] == "timed out" and time.perf_counter() - started < 5
    polite = selftest.run_stage(slow_but_polite, stage(), grace=0.1)
    assert polite["status"] == "timed out" and 0.15 < polite["seconds"] < 2
    assert selftest.run_stage(lambda st: {"skipped": "no NCCL"}, stage())["status"] == "skipped"


def test_without_cupy_the_command_says_what_is_missing_in_one_line_and_exits_2(tmp_path):
    # CuPy made unimportable in a fresh interpreter: what a machine without it sees, GPU or not
    code = ("import sys; sys.modules['cupy'] = None; from minidl.cli import main; "
            f"sys.exit(main(['selftest', '--out', {str(tmp_path / 'out')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1
    assert "CuPy" in done.stderr and "minidl[gpu]" in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_device_beyond_the_machine_s_gpus_is_refused(standin_or_gpu, capsys):
    from minidl import backend
    from minidl.cli import main
    count = backend.cupy_module().cuda.runtime.getDeviceCount()
    assert main(["selftest", "--device", f"cuda:{count}"]) == 2
    assert f"{count} GPU(s)" in capsys.readouterr().err
    for wrong in (["--only", "nothing"], ["--limit", "parity"], ["--limit", "nothing=5"], ["--limit", "speed=-1"]):
        with pytest.raises(SystemExit):
            main(["selftest", *wrong])


@pytest.mark.parametrize("device", ["banana", "cuda:x", "cpu"])
def test_a_device_that_is_no_gpu_is_one_line_naming_it_and_the_choices_exit_2(device, tmp_path):
    # in a fresh interpreter, as a user types it: before, "banana" ended in a traceback
    done = subprocess.run([sys.executable, "-m", "minidl", "selftest", "--device", device, "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert repr(device) in done.stderr and "'cuda' or 'cuda:N'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_nccl_stage_runs_every_collective_minidl_uses(quick_run):
    results, _, _ = quick_run
    nccl = results["stages"]["nccl"]
    assert nccl["status"] == "passed" and not nccl["failures"]
    assert all(name in nccl["nccl"] for name in collectives.COLLECTIVES)
    assert set(collectives.COLLECTIVES) == {"all-reduce", "broadcast", "all-gather", "reduce-scatter", "send/recv",
                                            "overlapped all-reduce"}


def test_the_nccl_stage_fails_when_nccl_cannot_load(standin):
    """No NCCL (the default stand-in, as a CuPy without libnccl): data parallelism over GPUs cannot run, so
    the stage fails and says why; it is never reported as passed."""
    results = selftest.run("cuda", quick=True, only=["nccl"], log=lambda line: None)
    nccl = results["stages"]["nccl"]
    assert nccl["status"] == "failed" and not results["passed"]
    assert any("NCCL cannot be loaded" in f and "NCCL is not available" in f for f in nccl["failures"])


def _broken(method, wrong):
    """The one-rank stand-in NCCL with ``method`` of its communicator (or the module's function) replaced."""
    module = types.SimpleNamespace(**{k: v for k, v in vars(nccl_standin).items() if not k.startswith("__")})
    if method == "groupEnd":
        module.groupEnd = wrong
    else:
        module.NcclCommunicator = type("Broken", (nccl_standin.NcclCommunicator,), {method: wrong})
    return module


def _twice(self, sendbuf, recvbuf, count, datatype, op, stream):
    """An all-reduce that sums as if over two equal ranks: every element doubled."""
    size = count * nccl_standin._ITEMSIZE[datatype]
    ctypes.memmove(recvbuf, sendbuf, size)
    received = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(recvbuf)).view(_NUMPY_TYPES[datatype])
    received *= 2


_NUMPY_TYPES = {0: "i1", 1: "u1", 2: "i4", 3: "u4", 4: "i8", 5: "u8", 6: "f2", 7: "f4", 8: "f8"}  # nccl.h's order


BROKEN = {
    "all-reduce": ("allReduce", _twice, ("all-reduce", "overlapped all-reduce")),
    "broadcast": ("bcast", lambda self, buff, count, datatype, root, stream: _zero(buff, count, datatype),
                  ("broadcast",)),
    "all-gather": ("allGather", lambda self, send, recv, count, datatype, stream: None, ("all-gather",)),
    "reduce-scatter": ("reduceScatter", lambda self, send, recv, count, datatype, op, stream: None,
                       ("reduce-scatter",)),
    "send/recv": ("groupEnd", lambda: _clear_group(), ("send/recv",)),
}


def _zero(buff, count, datatype):
    ctypes.memset(buff, 0, count * nccl_standin._ITEMSIZE[datatype])


def _clear_group():
    nccl_standin._depth[0] -= 1
    nccl_standin._group.clear()  # the receive never gets the bytes


@pytest.mark.parametrize("collective", sorted(BROKEN))
def test_the_nccl_stage_sees_a_wrong_result_of_each_collective(standin, collective):
    method, wrong, named = BROKEN[collective]
    with nccl_of_one_rank(standin, _broken(method, wrong)):
        problems = collectives.collectives("cuda:0")
    assert {p.split(" of ")[0].removeprefix("NCCL ") for p in problems} == set(named)
    assert len(problems) == len(named) * len(collectives.DTYPES)


IMPORTS_UNDER_ALARMS = r"""
import importlib.abc, json, signal, sys, tempfile
armed = []


class Recorder(importlib.abc.MetaPathFinder):  # notes each import that starts while an alarm is armed
    def find_spec(self, fullname, path, target=None):
        if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
            armed.append(fullname)
        return None


sys.meta_path.insert(0, Recorder())
from minidl import backend, selftest
from tests import cupy_standin
backend._use_cupy_module(cupy_standin, cupy_standin.cupyx)
results = selftest.run("cuda", out=tempfile.mkdtemp(), quick=True, log=lambda line: None)
made = [name for name in armed if name in sys.modules and not name.startswith("tests.")]
print(json.dumps({"imported_under_alarm": sorted(set(made)), "imports": results["imports"],
                  "statuses": {k: v["status"] for k, v in results["stages"].items()}}))
"""


def test_every_import_happens_before_any_stage_alarm_is_armed():
    """A stage's alarm raised inside ``import torch`` leaves torch half-made for the rest of the run (the
    speed stage's reference). In a fresh interpreter, every module the stages use (PyTorch where it is
    installed, matplotlib, Pillow's plugins, SciPy, minidl's own) is imported before the first alarm:
    none of them starts importing while one is armed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", IMPORTS_UNDER_ALARMS], capture_output=True, text=True,
                          timeout=600, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported_under_alarm"] == []
    assert report["imports"]["seconds"] > 0 and "nccl" in report["imports"]["failed"]  # the stand-in has none
    assert report["statuses"]["environment"] == report["statuses"]["speed"] == "passed"
