"""The benchmarks with ``--device cuda``, run on the CuPy stand-in: each builds its steps on the device and
times them with CUDA events, one synchronization per timed round and none inside a step."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_amp  # noqa: E402
import bench_conv  # noqa: E402
import bench_gpt  # noqa: E402
import bench_mlp  # noqa: E402
import common  # noqa: E402


def test_mlp_steps_run_on_the_device_and_only_the_timer_synchronizes(standin):
    standin.syncs.reset()
    ms = bench_mlp.run(repeat=2, device="cuda", sizes=(20, 16, 4), batch=8)
    assert {"numpy", "minidl"} <= set(ms) and all(v > 0 for v in ms.values())
    # per system: one timer call after the warm-up, then one per round; each waits for its end event and
    # reads the time between its two events (the stand-in counts both): nothing else reads the device
    calls = len(ms) * (1 + 2)
    assert standin.syncs.count == 2 * calls, standin.syncs.where
    assert all("timing.py" in where for where in standin.syncs.where)


def test_conv_and_cnn_steps_on_the_device(standin):
    fns = bench_conv.conv_fns((2, 3, 8, 8), 4, 3, 1, 1, device="cuda")
    times = bench_conv.interleaved(fns, 2, warmup=1, device="cuda")
    assert set(times) >= {"minidl"} and all(len(t) == 2 and min(t) > 0 for t in times.values())
    weights, x, y = bench_conv.cnn_weights()
    step = bench_conv.cnn_minidl(weights, x, y, "cuda")
    standin.syncs.reset()
    step()
    assert standin.syncs.count == 0, standin.syncs.where  # a training step never waits for the GPU


def test_gpt_on_the_device_times_both_and_measures_the_pool(standin):
    from minidl.selftest.speed import gpt_settings
    out = bench_gpt.on_gpu(gpt_settings(quick=True), 2, "cuda", gemm_n=64)
    assert out["minidl"]["best_ms"] > 0 and out["minidl"]["rounds"] == 2
    assert 0 < out["minidl_checkpoint_pool_peak_bytes"] and 0 < out["minidl_plain_pool_peak_bytes"]
    assert out["gemm_peak_flops"] > 0


def test_amp_training_on_the_device_in_float32_and_float16(standin):
    import minidl as mdl
    from minidl import nn
    mdl.manual_seed(0)
    small = {"mlp": (nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10)).to("cuda"),
                     mdl.randn(32, 12, device="cuda"))}
    rows = bench_amp.training(1, "cuda", small)
    for row in rows.values():
        assert set(row) == {"float32", "float16"}  # CuPy has no bfloat16
        assert row["float32"]["time_vs_float32"] == 1.0 and row["float16"]["step_seconds"] > 0
        assert row["float16"]["peak_activation_bytes"] < row["float32"]["peak_activation_bytes"]


def test_without_a_gpu_device_cuda_says_so():
    from minidl import backend
    if backend.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="--device cuda"):
        common.require_device("cuda")
