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


def _ceilings():
    from minidl.roofline import ceilings as ceilings_module
    return ceilings_module.Ceilings("cpu", peak_flops=1e10, copy_bandwidth=1e10, triad_bandwidth=1e10,
                                    cache_bandwidth=1e11, gemm_size=256, stream_bytes=1 << 20, threads=1)


def test_bench_shows_a_bar_over_its_cases_and_one_line_per_case(capsys):
    from minidl.roofline.suite import all_cases, run_cases
    only = ["add", "exp"]
    expected = [c for c in all_cases(True, "cpu") if c.op in only]
    lines = []
    run_cases("cpu", True, _ceilings(), ("minidl",), only, repeat=1, min_time=0.0, log=lines.append, progress=True)
    assert [line.split()[:2] for line in lines] == [[c.op, c.size.split()[0]] for c in expected]
    bar = capsys.readouterr().err
    assert f"bench:   0%|          | 0/{len(expected)}" in bar  # a bar over the cases, on stderr
    assert all(f"{c.op} {c.size}" in bar for c in expected)  # naming the case being timed


def test_bench_times_the_smallest_cases_on_one_thread(monkeypatch):
    from threadpoolctl import threadpool_limits

    from minidl import backend
    from minidl.roofline.suite import SMALL_WORK_FLOPS, all_cases, run_cases
    seen = []
    timed = suite.time_side_by_side

    def time_and_count_threads(fns, *args, **kwargs):
        seen.append(backend.get_num_threads())
        return timed(fns, *args, **kwargs)

    monkeypatch.setattr(suite, "time_side_by_side", time_and_count_threads)
    cases = {c.size: c for c in all_cases(True, "cpu") if c.op == "linear"}
    assert max(cases["batch 1"].costs["backward"].flops, cases["batch 1"].costs["forward"].flops) < SMALL_WORK_FLOPS
    assert cases["batch 256"].costs["forward"].flops > SMALL_WORK_FLOPS
    with threadpool_limits(2, "blas"):
        rows = run_cases("cpu", True, _ceilings(), ("numpy",), ["linear"], repeat=1, min_time=0.0, log=None)
        threads = {row["size"]: row["threads"] for row in rows}
        assert threads["batch 1"] == 1 and threads["batch 256"] == backend.get_num_threads() == 2
        assert backend.get_num_threads() == 2  # the limit was lifted after the small case
    assert len(seen) == len(cases) and sorted(seen) == [1, 2, 2]  # the small case really ran on one thread
