"""The ceilings' arithmetic (with a fake clock) and a real measurement at tiny sizes."""
import math

import numpy as np
import pytest

from minidl import backend
from minidl.roofline import ceilings
from minidl.roofline.ceilings import Ceilings


def fake_timer(seconds, calls):
    """A timer that runs the measured function once (so its result can be checked) and reports ``seconds``."""
    def timer(fn):
        fn()
        calls.append(fn)
        return seconds
    return timer


def test_gemm_flops_are_2n3_over_time(device):
    calls = []
    flops = ceilings.measure_gemm(32, device, timer=fake_timer(0.5, calls))
    assert flops == 2 * 32 ** 3 / 0.5
    assert len(calls) == 1


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_moves_two_arrays(device, threads):
    nbytes = 4 * 100_003  # not a multiple of the thread count
    rate = ceilings.measure_copy(nbytes, device, threads=threads, timer=fake_timer(0.25, []))
    assert rate == 2 * nbytes / 0.25


@pytest.mark.parametrize("threads", [1, 2])
def test_triad_moves_three_arrays_and_computes_b_plus_s_c(monkeypatch, device, threads):
    nbytes = 4 * (3 * ceilings.TRIAD_CHUNK + 17)  # a partial last chunk
    seen = {}
    real_empty = backend.xp_for(device).empty

    def spy_empty(shape, dtype):  # the output array a is the one created with empty
        seen["a"] = real_empty(shape, dtype)
        return seen["a"]
    monkeypatch.setattr(backend.xp_for(device), "empty", spy_empty)
    rate = ceilings.measure_triad(nbytes, device, threads=threads, timer=fake_timer(2.0, []))
    assert rate == 3 * nbytes / 2.0
    assert np.all(backend.to_numpy(seen["a"]) == 4.0)  # b + 3·c with b = c = 1


def test_balance_and_roof():
    c = Ceilings("cpu", peak_flops=200e9, copy_bandwidth=10e9, triad_bandwidth=8e9, cache_bandwidth=40e9,
                 gemm_size=2048, stream_bytes=1 << 28, threads=2)
    assert c.bandwidth == 10e9  # the better of copy and triad
    assert c.balance == 20.0
    assert c.roof(1.0) == 10e9  # memory-bound side: intensity × bandwidth
    assert c.roof(20.0) == 200e9
    assert c.roof(1000.0) == 200e9  # compute-bound side: the peak
    again = Ceilings.from_dict(c.as_dict())
    assert again == c and again.as_dict()["balance"] == 20.0
    assert "balance 20.0 FLOP/byte" in c.summary()


def test_best_time_takes_the_fastest_and_divides_by_number(monkeypatch):
    clock = iter([0.0, 3.0, 10.0, 12.0, 20.0, 25.0])  # three repeats lasting 3, 2 and 5 seconds
    monkeypatch.setattr(ceilings, "perf_counter", lambda: next(clock))
    calls = []
    assert ceilings.best_time(lambda: calls.append(1), repeat=3, number=4, warmup=1) == 0.5
    assert len(calls) == 1 + 3 * 4


def test_measure_at_tiny_sizes(device):
    c = ceilings.measure(device, quick=True, gemm_size=64, stream_bytes=1 << 18, repeat=1)
    assert c.device == device
    for value in (c.peak_flops, c.copy_bandwidth, c.triad_bandwidth, c.cache_bandwidth, c.balance):
        assert math.isfinite(value) and value > 0
    assert c.gemm_size == 64 and c.stream_bytes == 1 << 18
    assert c.balance == c.peak_flops / max(c.copy_bandwidth, c.triad_bandwidth)


def test_best_of_two_measurements_keeps_each_higher_rate():
    a = Ceilings("cpu", 100e9, 10e9, 8e9, 30e9, 2048, 1 << 28, 2)
    b = Ceilings("cpu", 150e9, 9e9, 12e9, 20e9, 2048, 1 << 28, 2)
    best = a.best(b)
    assert (best.peak_flops, best.copy_bandwidth, best.triad_bandwidth, best.cache_bandwidth) == \
        (150e9, 10e9, 12e9, 30e9)
    assert best.balance == 150e9 / 12e9
