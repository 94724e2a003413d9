"""`minidl bench` records how busy the machine was and warns in one line when it was busy.

No assertion depends on how busy this machine is: the warning's rule is checked on given loads,
the recorded values against the system's own calls.
"""
import os

import pytest

import minidl
from minidl.roofline import suite
from minidl.roofline.ceilings import Ceilings

TINY = Ceilings("cpu", peak_flops=100e9, copy_bandwidth=10e9, triad_bandwidth=8e9, cache_bandwidth=30e9,
                gemm_size=64, stream_bytes=1 << 16, threads=1)


def test_the_load_is_the_systems_and_the_threads_the_blas():
    load = suite.machine_load()
    assert load["cpus"] == os.cpu_count()
    assert load["blas_threads"] == minidl.get_num_threads() >= 1
    if hasattr(os, "getloadavg"):
        # the 1-minute average moves slowly: two readings a moment apart agree closely
        assert load["load"] == pytest.approx(os.getloadavg()[0], abs=0.5)
    else:
        assert load["load"] is None


def test_the_warning_comes_only_above_one_task_per_core():
    assert suite.busy_warning({"load": 2.0, "cpus": 2, "blas_threads": 2}) is None  # as many tasks as cores
    assert suite.busy_warning({"load": None, "cpus": 2, "blas_threads": 2}) is None  # no load average here
    line = suite.busy_warning({"load": 5.25, "cpus": 2, "blas_threads": 2})
    assert "\n" not in line
    assert "load 5.2 on 2 cores" in line and "2 threads" in line and "will be low" in line


def test_bench_records_the_load_and_prints_the_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(suite.os, "getloadavg", lambda: (99.0, 1.0, 1.0))  # a busy machine, on demand
    logged = []
    results = suite.run("cpu", quick=True, out_dir=None, machine="busy", frameworks=("minidl",), ceilings=TINY,
                        only={"relu"}, repeat=1, min_time=0.0, log=logged.append)
    info = results["info"]
    assert info["load"] == 99.0 and info["cpus"] == os.cpu_count()
    assert info["blas_threads"] == minidl.get_num_threads()
    assert logged[0] == suite.busy_warning(info)  # said first, before the minutes of measuring
    assert suite.busy_warning(info) in suite.summary_table(results)  # and again under the table


def test_bench_numbers_each_case_line_so_a_long_run_shows_its_progress():
    from minidl.roofline import ceilings as ceilings_module
    from minidl.roofline.suite import all_cases, run_cases
    only = ["add", "exp"]
    expected = len([c for c in all_cases(True, "cpu") if c.op in only])
    lines = []
    ceilings = ceilings_module.Ceilings("cpu", peak_flops=1e10, copy_bandwidth=1e10, triad_bandwidth=1e10,
                                        cache_bandwidth=1e11, gemm_size=256, stream_bytes=1 << 20, threads=1)
    run_cases("cpu", True, ceilings, ("minidl",), only, repeat=1, min_time=0.0, log=lines.append)
    assert [line.split("]")[0] for line in lines] == [f"[{i}/{expected}" for i in range(1, expected + 1)]
