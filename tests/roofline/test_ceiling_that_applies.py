"""Each op is judged against the ceiling that applies to it, and the output says which."""
import dataclasses

import pytest

from minidl.roofline import suite
from minidl.roofline.ceilings import Ceilings
from minidl.roofline.opcosts import Cost

# peak 100 GFLOP/s, main memory 10 GB/s, cache 30 GB/s; 1 MB moved by the in-cache copy
C = Ceilings("cpu", peak_flops=100e9, copy_bandwidth=10e9, triad_bandwidth=8e9, cache_bandwidth=30e9,
             gemm_size=64, stream_bytes=1 << 24, threads=1, cache_bytes=1 << 20)


def test_large_data_are_judged_against_main_memory():
    # 1 GFLOP over 1 GB in 0.2 s: 5 GFLOP/s at intensity 1; memory roof 10 GFLOP/s -> 50%
    row = suite.analyse(0.2, Cost(1e9, 1e9), C)
    assert row["ceiling"] == "memory" and row["roofline_fraction"] == pytest.approx(0.5)


def test_data_that_fit_in_cache_are_judged_against_the_cache_roof():
    # 0.5 MB and 0.5 MFLOP in 50 µs: 10 GFLOP/s at intensity 1; in-cache roof 30 GFLOP/s -> 1/3, not 100%
    row = suite.analyse(50e-6, Cost(0.5e6, 0.5e6), C)
    assert row["ceiling"] == "cache" and row["roofline_fraction"] == pytest.approx(1 / 3)
    # no arithmetic (a copy): achieved GB/s over the in-cache bandwidth
    row = suite.analyse(50e-6, Cost(0, 0.5e6), C)
    assert row["ceiling"] == "cache" and row["roofline_fraction"] == pytest.approx(10e9 / 30e9)


def test_data_faster_than_main_memory_allows_came_from_cache():
    # 8 MB (over the cache size) at 20 GB/s, twice main memory's: the 177% of old becomes 20/30 of the cache roof
    row = suite.analyse(0.4e-3, Cost(8e6, 8e6), C)
    assert row["ceiling"] == "cache" and row["roofline_fraction"] == pytest.approx(20 / 30)


def test_without_a_faster_cache_the_memory_roof_stays():
    slow_cache = dataclasses.replace(C, cache_bandwidth=5e9)
    row = suite.analyse(50e-6, Cost(0.5e6, 0.5e6), slow_cache)
    assert row["ceiling"] == "memory" and row["roofline_fraction"] == pytest.approx(1.0)


def _results(rows, torch=False):
    return {"name": "box", "device": "cpu", "info": {}, "ceilings": C.as_dict(), "rows": rows}


def _row(op, seconds, cost, framework="minidl"):
    return {"op": op, "size": "n", "phase": "forward", "framework": framework, "params": {},
            **suite.analyse(seconds, cost, C)}


def test_summary_names_the_ceiling_and_explains_anything_above_it():
    rows = [_row("relu", 0.2, Cost(1e9, 1e9)), _row("exp", 10e-6, Cost(0.5e6, 0.5e6))]  # exp: 50 GFLOP/s > 30
    table = suite.summary_table(_results(rows))
    lines = {line.split()[0]: line for line in table.splitlines() if line.split()[:1] in (["relu"], ["exp"])}
    assert "50.0  memory" in lines["relu"]
    assert "166.7* cache" in lines["exp"]
    assert "roof % = achieved / the ceiling in column 'of'" in table
    assert "* above 100%: faster than even the measured ceiling (exp forward)" in table


def test_roofline_title_names_only_the_frameworks_measured():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from minidl.roofline.figures import roofline_figure
    rows = [_row("relu", 0.2, Cost(1e9, 1e9)), _row("relu", 0.2, Cost(1e9, 1e9), framework="numpy")]
    fig = roofline_figure(_results(rows))
    assert "torch" not in fig.axes[0].get_title() and "minidl (outlined)" in fig.axes[0].get_title()
    plt.close(fig)
    fig = roofline_figure(_results(rows + [_row("relu", 0.1, Cost(1e9, 1e9), framework="torch")]))
    assert "vs torch (faint)" in fig.axes[0].get_title()
    plt.close(fig)
