"""The ring all-reduce cost model: hand-computed times, the fit, and the scaling predictions."""
import numpy as np
import pytest

from minidl.parallel.cost_model import RingAllreduce, StepModel, format_table


def test_ring_time_by_hand():
    ring = RingAllreduce(alpha=1e-5, beta=1e9)
    assert ring.time(1e6, 4) == pytest.approx(1e-5 + 1.5 * 1e6 / 1e9)   # 2(N-1)/N = 1.5 for N = 4
    assert ring.time(1e6, 2) == pytest.approx(1e-5 + 1.0e-3)
    assert ring.time(1e6, 1) == 0.0                                      # one rank sends nothing
    assert ring.time(1e6, 1024) < 2.0 * 1e6 / 1e9 + 1e-5                 # bounded as N grows
    assert ring.time(1e6, 4, messages=3) == pytest.approx(3e-5 + 1.5e-3)
    with pytest.raises(ValueError):
        ring.time(1.0, 0)


@pytest.mark.parametrize("ranks", [2, 4])
def test_fit_recovers_alpha_and_beta(ranks):
    truth = RingAllreduce(alpha=3e-6, beta=5e9)
    sizes = np.logspace(2, 8, 13)
    noise = np.random.default_rng(0).uniform(0.98, 1.02, size=sizes.size)
    fitted = RingAllreduce.fit(sizes, truth.time(sizes, ranks) * noise, ranks)
    assert fitted.alpha == pytest.approx(3e-6, rel=0.05)
    assert fitted.beta == pytest.approx(5e9, rel=0.05)


def test_fit_takes_beta_from_the_large_messages():
    """Mid-sized messages that run from a cache (4x faster) must not make the large ones look fast."""
    sizes = np.logspace(2, 8, 13)
    slow, fast = RingAllreduce(2e-6, 1e9), RingAllreduce(2e-6, 4e9)
    times = np.where((sizes >= 1e4) & (sizes < 1e6), fast.time(sizes, 2), slow.time(sizes, 2))
    fitted = RingAllreduce.fit(sizes, times, 2)
    assert fitted.beta == pytest.approx(1e9, rel=1e-6)
    assert fitted.alpha == pytest.approx(2e-6, rel=0.01)


def test_fit_needs_two_ranks_and_growing_times():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        RingAllreduce.fit([1, 2, 3, 4], [1, 2, 3, 4], ranks=1)
    with pytest.raises(ValueError, match="do not grow"):
        RingAllreduce.fit([1e3, 1e4, 1e5, 1e6], [4e-3, 3e-3, 2e-3, 1e-3], ranks=2)


def _model():
    # 100 MB of gradient over 10 GB/s, 1 ms per sample, 5 ms per step of overhead.
    return StepModel(RingAllreduce(alpha=1e-5, beta=1e10), param_bytes=1e8, time_per_sample=1e-3,
                     fixed_time=5e-3)


def test_strong_scaling_by_hand():
    rows = _model().strong_scaling(global_batch=256)
    assert [r["ranks"] for r in rows] == [1, 2, 4, 8, 16, 32, 64, 128, 256]  # stops where B/N < 1
    r4 = rows[2]
    buckets = 4  # 100 MB in 25 MiB buckets
    comm = buckets * 1e-5 + 1.5 * 1e8 / 1e10
    assert r4["step_time"] == pytest.approx(5e-3 + 64e-3 + comm)
    assert r4["efficiency"] == pytest.approx((5e-3 + 256e-3) / (4 * (5e-3 + 64e-3 + comm)))
    efficiencies = [r["efficiency"] for r in rows]
    assert efficiencies[0] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(efficiencies, efficiencies[1:]))  # only ever worse


def test_weak_scaling_and_the_critical_batch():
    rows = _model().weak_scaling(per_rank_batch=32, critical_batch=512)
    assert rows[0]["efficiency"] == pytest.approx(1.0) and rows[-1]["ranks"] == 1024
    # Throughput keeps growing with N, but past B_crit the time to train saturates:
    speedups = [r["time_to_train_speedup"] for r in rows]
    throughput = [r["samples_per_second"] for r in rows]
    assert all(a < b for a, b in zip(throughput, throughput[1:]))
    t1 = 5e-3 + 32e-3
    t1024 = t1 + 4e-5 + 2 * 1023 / 1024 * 1e-2
    expected = (1 + 512 / 32) * t1 / ((1 + 512 / (1024 * 32)) * t1024)
    assert speedups[-1] == pytest.approx(expected)
    assert speedups[-1] < 1 + 512 / 32       # never more than S(b)/S_min, however many ranks


def test_break_even_batch():
    model = _model()
    assert model.break_even_batch(2) == pytest.approx((4e-5 + 1e-2 - 5e-3) / 1e-3)
    assert "efficiency" in format_table(model.strong_scaling(64))


# ---------------------------------------------------------------- ZeRO
def test_zero_memory_is_the_papers_figure_1():
    """Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B parameters, N = 64, mixed-precision Adam (2 + 2 + 12 bytes):
    120 GB per rank without ZeRO, 31.4 GB with stage 1, 16.6 GB with stage 2, 1.9 GB with stage 3."""
    from minidl.parallel.cost_model import zero_bytes_per_rank
    totals = [zero_bytes_per_rank(7.5e9, 64, stage)["total_bytes"] / 1e9 for stage in range(4)]
    assert totals == pytest.approx([120.0, 31.40625, 16.640625, 1.875])
    stage2 = zero_bytes_per_rank(7.5e9, 64, 2)
    assert stage2["parameter_bytes"] == 2 * 7.5e9 and stage2["gradient_bytes"] == 2 * 7.5e9 / 64
    with pytest.raises(ValueError, match="stage must be 0"):
        zero_bytes_per_rank(10, 2, 4)


def test_ring_bytes_and_the_zero_step_by_hand():
    from minidl.parallel.cost_model import ring_bytes, zero_step_bytes, zero_step_payloads
    assert ring_bytes("allreduce", 1000, 4) == pytest.approx(1500)     # 2·3/4
    assert ring_bytes("reduce_scatter", 1000, 4) == pytest.approx(750)  # 3/4 of the whole vector
    assert ring_bytes("allgather", 250, 4) == pytest.approx(750)        # the 3 other shards
    assert ring_bytes("allreduce", 1000, 1) == 0.0
    assert zero_step_payloads(1000, 4, 2, 2, 2) == {"reduce_scatter": 2000, "allgather": 500}
    assert zero_step_payloads(1000, 4, 3, 2, 2) == {"reduce_scatter": 2000, "allgather": 1000}  # gathered twice
    # stage 2 sends what an all-reduce of the gradients sends; stage 3 1.5× that, as in the paper
    assert zero_step_bytes(1000, 4, 2, 2, 2) == pytest.approx(zero_step_bytes(1000, 4, 0, 2, 2)) == 3000
    assert zero_step_bytes(1000, 4, 3, 2, 2) == pytest.approx(1.5 * 3000)
    # stage 1 (chunks of elements): the all-reduce, then the all-gather of pΨ'/N (Ψ' = 1004 padded: 251 a rank)
    assert zero_step_payloads(1000, 4, 1, 2, 2, padded=1004) == {"allreduce": 2000, "allgather": 502}
    assert zero_step_bytes(1000, 4, 1, 2, 2) == pytest.approx(1.5 * 3000)  # 2·3/4·2000 + 3·500
    with pytest.raises(ValueError, match="unknown operation 'gather'"):
        ring_bytes("gather", 1, 2)
