"""The suite end to end at tiny sizes, into tmp_path. No assertion here depends on how fast anything ran."""
import json
import math

import pytest

import minidl
from minidl import cli
from minidl.roofline import ceilings as ceilings_module
from minidl.roofline import suite
from minidl.roofline.cases import cases
from minidl.roofline.ceilings import Ceilings
from minidl.roofline.opcosts import Cost

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = Ceilings("cpu", peak_flops=100e9, copy_bandwidth=10e9, triad_bandwidth=8e9, cache_bandwidth=30e9,
                gemm_size=64, stream_bytes=1 << 16, threads=1)


def test_analyse_by_hand():
    # 2 GFLOP over 0.1 GB in 0.04 s: 50 GFLOP/s at intensity 20 ≥ balance 10: compute-bound, half the peak
    row = suite.analyse(0.04, Cost(2e9, 1e8), TINY)
    assert row["flops_per_s"] == pytest.approx(50e9) and row["bytes_per_s"] == pytest.approx(2.5e9)
    assert row["intensity"] == 20 and row["verdict"] == "compute-bound"
    assert row["roofline_fraction"] == pytest.approx(0.5)
    # intensity 1: the roof is 1 × 10 GB/s = 10 GFLOP/s; 5 GFLOP/s reached is half of it
    row = suite.analyse(0.2, Cost(1e9, 1e9), TINY)
    assert row["verdict"] == "memory-bound" and row["roofline_fraction"] == pytest.approx(0.5)
    # no arithmetic: judged by bandwidth alone
    row = suite.analyse(0.1, Cost(0, 5e8), TINY)
    assert row["intensity"] == 0 and row["verdict"] == "memory-bound"
    assert row["roofline_fraction"] == pytest.approx(0.5)
    # nothing to do at all (add's backward): no place on the roofline
    row = suite.analyse(1e-6, Cost(0, 0), TINY)
    assert row["verdict"] == "no work" and row["intensity"] is None and row["roofline_fraction"] is None


def test_quick_suite_writes_results_and_figures(tmp_path):
    results = suite.run("cpu", quick=True, out_dir=str(tmp_path), machine="smoke", frameworks=("minidl", "numpy"),
                        ceilings=TINY, repeat=1, min_time=0.0, log=None)
    path = tmp_path / "smoke-quick.json"
    assert results["json"] == str(path)
    data = json.loads(path.read_text())
    assert data["ceilings"]["balance"] == pytest.approx(10.0)
    expected = {(c.op, c.size, phase) for c in cases(quick=True) for phase in c.phases}
    for framework in ("minidl", "numpy"):
        got = {(r["op"], r["size"], r["phase"]) for r in data["rows"] if r["framework"] == framework}
        assert got == expected
    ops = {r["op"] for r in data["rows"]}
    assert {"matmul", "linear", "add", "mul", "relu", "exp", "sum", "softmax", "log_softmax", "conv2d",
            "batch_norm", "layer_norm", "sgd", "adam"} <= ops
    for r in data["rows"]:
        assert r["seconds"] > 0 and math.isfinite(r["flops_per_s"])
        if (r["op"], r["phase"]) in (("add", "backward"), ("sum", "backward")):
            assert r["verdict"] == "no work"
            continue
        assert r["verdict"] == ("compute-bound" if r["intensity"] >= 10.0 else "memory-bound")
        assert r["roofline_fraction"] > 0
    step = data["training_step"]
    names = {row["name"] for row in step["rows"]}
    assert {"Linear", "ReLU", "CrossEntropy", "autograd engine"} <= names
    for key in ("roofline", "batch_sweep", "step_profile"):
        png = tmp_path / f"smoke-quick_{key}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
    assert not list(tmp_path.glob("*.tmp"))
    table = suite.summary_table(data)
    assert "conv2d" in table and "balance 10.0 FLOP/byte" in table


def test_torch_side_by_side_where_installed():
    torch = pytest.importorskip("torch")
    rows = suite.run_cases("cpu", quick=True, ceilings=TINY, frameworks=("torch",), only={"linear", "adam"},
                           repeat=1, min_time=0.0, log=None)
    assert {(r["op"], r["phase"]) for r in rows} == {("linear", "forward"), ("linear", "backward"),
                                                      ("adam", "update")}
    assert torch.__version__


def test_cases_agree_across_frameworks():
    """The three implementations of each case compute the same forward values."""
    torch = pytest.importorskip("torch")
    import numpy as np
    for case in cases(quick=True):
        if case.op in ("sgd", "adam"):
            continue
        arrays = case.arrays()
        import minidl.functional as F
        ours = case.minidl(F, *[minidl.tensor(a) for a in arrays]).numpy()
        plain = case.numpy(np, *arrays)[0]()
        theirs = case.torch(torch, *[torch.tensor(a) for a in arrays]).numpy()
        np.testing.assert_allclose(ours, plain, rtol=2e-4, atol=2e-4, err_msg=case.op)
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-4, err_msg=case.op)


def test_cli_bench_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(ceilings_module.SIZES, ("cpu", True), (64, 1 << 16, 1))
    code = cli.main(["bench", "--quick", "--out", str(tmp_path), "--machine", "clitest", "--skip", "torch",
                     "--only", "relu"])
    assert code == 0
    data = json.loads((tmp_path / "clitest-quick.json").read_text())
    assert {r["op"] for r in data["rows"]} == {"relu"}
    assert "balance" in capsys.readouterr().out


def test_cli_bench_cuda_without_a_gpu(tmp_path, capsys):
    if minidl.gpu_available():
        pytest.skip("this machine has a GPU")
    assert cli.main(["bench", "--device", "cuda", "--quick", "--out", str(tmp_path)]) == 2
    assert "CuPy" in capsys.readouterr().out


def test_results_name():
    assert suite.results_name("cpu", False, "box") == "box"
    assert suite.results_name("cpu", True, "box") == "box-quick"
    assert suite.results_name("cuda:0", False, "box") == "box-cuda"


def test_side_by_side_timing_runs_each_callable_in_turn():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = suite.time_side_by_side(fns, {"a": lambda: None, "b": lambda: None}, repeat=3, min_time=0.0)
    assert set(times) == {"a", "b"} and all(t >= 0 for t in times.values())
    # calibration (one warm-up and one timed call each), then the repeats in turn, back and forth
    assert order == ["a", "a", "b", "b"] + ["b", "a", "a", "b", "b", "a"]


def test_switching_thread_pools_pauses(monkeypatch):
    """After NumPy's BLAS threads, PyTorch's would find the cores busy spinning: a pause separates them."""
    sleeps = []
    monkeypatch.setattr(suite.time, "sleep", sleeps.append)
    fns = {("minidl", "f"): lambda: None, ("numpy", "f"): lambda: None, ("torch", "f"): lambda: None}
    pools = {("minidl", "f"): "numpy", ("numpy", "f"): "numpy", ("torch", "f"): "torch"}
    suite.time_side_by_side(fns, dict.fromkeys(fns, lambda: None), repeat=2, min_time=0.0, pools=pools, pause=0.5)
    # calibration: numpy → torch; then the rounds go torch, numpy | numpy, torch: one change of pool each
    assert sleeps == [0.5] * 3
