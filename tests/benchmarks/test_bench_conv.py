"""benchmarks/bench_conv.py: its FLOP count, its im2col memory figure and its GEMM floor, and one
tiny interleaved run (the script is not part of the package, so nothing else would notice it break)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import bench_conv  # noqa: E402


def test_conv_flops_count_three_products_of_the_textbook_size():
    # N·OH·OW·O·C·K² multiply-adds per product: 2·3·(4·4)·5·7·9 FLOPs each, three products
    assert bench_conv.conv_flops((2, 7, 4, 4), 5, 3, 1, 1) == 3 * 2 * 2 * 4 * 4 * 5 * 7 * 9
    # stride 2, no padding: OH = ⌊(9 − 3)/2⌋ + 1 = 4
    assert bench_conv.conv_flops((1, 1, 9, 9), 1, 3, 2, 0) == 3 * 2 * 16 * 9


def test_im2col_peak_is_the_chunk_that_fits_under_the_limit():
    from minidl.ops import conv
    shape = (32, 64, 32, 32)
    info = bench_conv.im2col_peak_bytes(shape, 64, 3, 1, 1)
    per_sample_mib = 32 * 32 * 64 * 9 * 4 / 2 ** 20
    assert info["unchunked_mib"] == pytest.approx(32 * per_sample_mib)
    assert info["peak_mib"] == pytest.approx(info["chunk"] * per_sample_mib)
    assert info["peak_mib"] * 2 ** 20 <= conv.IM2COL_LIMIT_BYTES < info["unchunked_mib"] * 2 ** 20
    assert bench_conv.im2col_peak_bytes(shape, 128, 1, 1, 0)["peak_mib"] == 0.0  # 1×1 builds no columns


def test_gemm_floor_times_the_three_products():
    seconds = bench_conv.gemm_floor((2, 3, 8, 8), 4, 3, 1, 1, repeat=2)
    assert 0 < seconds < 1.0


def test_one_tiny_interleaved_round_reports_times_and_ratio():
    times = bench_conv.interleaved({"a": lambda: np.zeros(10).sum(), "b": lambda: None}, repeat=3, warmup=1,
                                   pause=0.0)
    assert [len(t) for t in times.values()] == [3, 3]
    out = bench_conv.summary(times, flops=1e6)
    assert out["a"]["best_ms"] == pytest.approx(min(times["a"]) * 1e3)
    assert out["a"]["gflops"] == pytest.approx(1e6 / min(times["a"]) / 1e9)
