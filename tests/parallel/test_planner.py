"""The layout planner (minidl.parallel.planner): its sums against published tables, against hand-derived
numbers, and its ranking on machines built to make one resource scarce. Its predictions against this
machine's measurements are test_planner_mpi.py's.

Published numbers:
- ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054, Figure 1): Ψ = 7.5B parameters, N_d = 64, mixed-precision
  Adam (p = g = 2 bytes, K = 12): per device 120 GB (data parallelism), 31.4 GB (P_os, stage 1), 16.6 GB
  (P_os+g, stage 2), 1.9 GB (P_os+g+p, stage 3); the paper rounds to the 0.1 GB it prints.
- The pipeline bubble: GPipe (Huang et al. 2019, arXiv:1811.06965, section 2.3) and Megatron-LM
  (Narayanan et al. 2021, arXiv:2104.04473, section 2.2.1): a step of m micro-batches on p stages takes
  (m + p − 1) micro-batch slots, of which p − 1 are idle: bubble time / ideal time = (p − 1)/m, the idle
  fraction of the step (p − 1)/(m + p − 1).
"""
import math

import pytest

from minidl.parallel.cost_model import ring_bytes
from minidl.parallel.planner import SCHEMES, Machine, ModelSpec, estimate, plan

MB, GB = 1e6, 1e9


def _zero_paper_model():
    """7.5B parameters in one layer's worth of bookkeeping (only Ψ matters to the formulas), fp16 + Adam."""
    return ModelSpec("ZeRO's 7.5B", ((7_500_000_000,),), activation_bytes=0.0, boundary_bytes=0.0, flops=1.0,
                     itemsize=2, state_bytes=12)


@pytest.mark.parametrize("zero, published", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_model_states_per_device_are_the_zero_papers_figure_1(zero, published):
    machine = Machine(devices=64, memory=1e12, bandwidth=1e11, latency=1e-5, flops=1e14)
    e = estimate(_zero_paper_model(), 64, machine, data=64, zero=zero)
    states = e.memory["parameters"] + e.memory["gradients"] + e.memory["optimizer"]
    assert states / GB == pytest.approx(published, abs=0.05)


@pytest.mark.parametrize("stages, micro", [(2, 2), (4, 8), (8, 32), (4, 1)])
def test_the_pipeline_bubble_is_gpipes_and_megatrons(stages, micro):
    spec = ModelSpec.mlp([64] * 9)  # 8 equal layers: any of these stage counts cuts them evenly
    machine = Machine(devices=stages, memory=1e12, bandwidth=1e30, latency=0.0, flops=1e9)
    e = estimate(spec, 64, machine, pipeline=stages, micro_batches=micro)
    assert e.bubble / e.compute == pytest.approx((stages - 1) / micro)                    # Megatron-LM's ratio
    assert e.bubble / e.step_time == pytest.approx((stages - 1) / (micro + stages - 1))   # GPipe's fraction


def test_the_specs_count_minidls_models_parameters():
    from minidl import nn
    from minidl.models.gpt import GPT, GPTConfig
    gpt = ModelSpec.gpt(n_layer=3, n_embd=32, n_head=4, block_size=16, vocab_size=50)
    assert gpt.parameters == sum(p.numel() for p in GPT(GPTConfig(50, 16, 3, 4, 32)).parameters())
    mlp = ModelSpec.mlp([20, 30, 5])
    assert mlp.parameters == sum(p.numel() for p in nn.Sequential(nn.Linear(20, 30), nn.ReLU(),
                                                                  nn.Linear(30, 5)).parameters())


def test_an_mlps_activations_are_what_the_graph_saves():
    """ModelSpec.mlp's count of saved values, against memory.track's count of what the graph holds for backward
    (the input included; the softmax the loss saves besides the logits)."""
    import numpy as np

    import minidl as mdl
    import minidl.functional as F
    from minidl import memory, nn
    sizes, batch = [24, 40, 40, 8], 6
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 8))
    x = mdl.tensor(np.random.default_rng(0).normal(size=(batch, 24)).astype("float32"))
    y = mdl.tensor(np.arange(batch) % 8)
    with memory.track(allocator=False) as tracked:
        loss = F.cross_entropy(model(x), y)
    spec = ModelSpec.mlp(sizes)
    assert tracked.peak_bytes == pytest.approx(spec.activation_bytes * batch, rel=0.1)
    del loss


def test_a_data_parallel_step_by_hand():
    """Ψ = 1,000,000 fp32 parameters on 4 devices of 1 TFLOP/s, links of 1 GB/s and 10 µs, a batch of 8: compute
    6Ψ·8/(4·1e12) = 12 µs; one all-reduce of 4 MB in one 25 MiB bucket: 10 µs + 2·3/4·4e6/1e9 = 6.01 ms; the
    held state 16 bytes × Ψ, the buffers a send and a receive piece of the 4 MB gradient."""
    spec = ModelSpec("by hand", ((1_000_000,),), activation_bytes=100.0, boundary_bytes=0.0, flops=6e6)
    machine = Machine(devices=4, memory=1e9, bandwidth=1e9, latency=1e-5, flops=1e12)
    e = estimate(spec, 8, machine, data=4)
    assert e.compute == pytest.approx(12e-6)
    assert e.communication == pytest.approx(1e-5 + 1.5 * 4e6 / 1e9)
    assert e.wire_bytes == pytest.approx(6e6)
    assert e.payloads == {"data": {"allreduce": 4e6}}
    assert e.memory == pytest.approx({"parameters": 4e6, "gradients": 4e6, "optimizer": 8e6,
                                      "activations": 200.0, "buffers": 8e6})


def test_tensor_parallel_bytes_are_megatrons_four_all_reduces_per_block():
    spec = ModelSpec.gpt(n_layer=2, n_embd=64, n_head=4, block_size=32, vocab_size=100)
    machine = Machine(devices=2, memory=1e12, bandwidth=1e9, latency=0.0, flops=1e12)
    e = estimate(spec, 6, machine, tensor=2)
    payload = 4 * 2 * (6 * 32) * 64 * 4      # 4 all-reduces × blocks × tokens × width × float32
    assert e.payloads == {"tensor": {"allreduce": payload}}
    assert e.wire_bytes == pytest.approx(float(ring_bytes("allreduce", payload, 2)))
    with pytest.raises(ValueError, match="does not split over 3"):
        estimate(spec, 6, Machine(3, 1e12, 1e9, 0.0, 1e12), tensor=3)


def test_every_layout_that_fits_the_devices_is_listed():
    spec = ModelSpec.gpt(n_layer=4, n_embd=64, n_head=4, block_size=32, vocab_size=100)
    table = plan(spec, 16, Machine(4, 1e12, 1e10, 1e-5, 1e12))
    names = {e.layout for e in table.rows}
    assert {"data ×4", "ZeRO-1 ×4", "ZeRO-2 ×4", "ZeRO-3 ×4", "tensor ×4", "data ×2 · tensor ×2",
            "data ×2 · pipeline ×2 (1F1B, m=8)", "pipeline ×2 (1F1B, m=8) · tensor ×2"} <= names
    assert any(n.startswith("pipeline ×4 (GPipe") for n in names)
    assert any(n.startswith("pipeline ×4 (1F1B") for n in names)
    assert not table.dropped
    assert [e.step_time for e in table.rows] == sorted(e.step_time for e in table.rows)
    assert all(e.sizes["data"] * e.sizes["tensor"] * e.sizes["pipeline"] == 4 for e in table.rows)
    text = str(table)
    assert "recommended: " + table.rows[0].layout in text


def _big_gpt():
    return ModelSpec.gpt(n_layer=8, n_embd=512, n_head=8, block_size=64, vocab_size=1000)


def test_a_slow_link_makes_the_layout_that_sends_fewest_bytes_win():
    """With links so slow that communication is all of every step, the fastest layout is the one with the fewest
    bytes on the wire (plus latency): here a pipeline, which sends only activations at its cuts."""
    machine = Machine(devices=4, memory=1e12, bandwidth=1e6, latency=0.0, flops=1e15)
    table = plan(_big_gpt(), 16, machine)
    fewest = min(table.rows, key=lambda e: e.wire_bytes)
    assert table.recommended is fewest
    assert table.recommended.sizes["pipeline"] > 1
    assert "communication" in table.reason
    # and with fast links and slow compute, the bubble-free, split-everything layouts win instead
    fast = plan(_big_gpt(), 16, Machine(devices=4, memory=1e12, bandwidth=1e15, latency=0.0, flops=1e9))
    assert fast.recommended.bubble == 0
    assert "compute" in fast.reason


def test_small_memory_leaves_zero_3_or_a_pipeline():
    """Memory for only a third of data parallelism's peak: only the layouts that shard or cut the model states
    remain, and the recommended one fits."""
    spec = _big_gpt()
    roomy = plan(spec, 16, Machine(devices=4, memory=1e12, bandwidth=1e10, latency=1e-5, flops=1e12))
    dp = next(e for e in roomy.rows if e.layout == "data ×4")
    tight = plan(spec, 16, Machine(devices=4, memory=dp.peak_bytes / 3, bandwidth=1e10, latency=1e-5, flops=1e12))
    assert tight.rows and all(e.peak_bytes <= dp.peak_bytes / 3 for e in tight.rows)
    kinds = {("zero3" if e.options["zero"] == 3 else "pipeline" if e.sizes["pipeline"] > 1 else
              "tensor" if e.sizes["tensor"] > 1 else "other") for e in tight.rows}
    assert kinds <= {"zero3", "pipeline", "tensor"} and kinds & {"zero3", "pipeline"}
    assert {e.layout for e in tight.dropped} >= {"data ×4", "ZeRO-1 ×4"}
    assert "does not fit" in str(tight)


def test_nothing_fits_says_what_the_least_needs():
    table = plan(_big_gpt(), 16, Machine(devices=2, memory=1e3, bandwidth=1e10, latency=0.0, flops=1e12))
    assert table.rows == [] and table.recommended is None
    least = min(table.dropped, key=lambda e: e.peak_bytes)
    assert table.reason.startswith("No layout fits 1 kB per device")
    assert f"the least any layout needs is {least.peak_bytes / 1e6:.3g} MB ({least.layout})" in table.reason


def test_a_new_scheme_is_one_entry_in_the_table():
    def one_rank_does_everything(model, batch, machine, options):
        e = estimate(model, batch, Machine(1, machine.memory, machine.bandwidth, machine.latency, machine.flops))
        e.layout = "rank 0 alone"
        return [e]
    spec = ModelSpec.mlp([32, 32, 4])
    machine = Machine(devices=2, memory=1e9, bandwidth=1e9, latency=0.0, flops=1e9)
    table = plan(spec, 8, machine, schemes={**SCHEMES, "alone": one_rank_does_everything})
    assert "rank 0 alone" in {e.layout for e in table.rows}
    assert len(table.rows) == len(plan(spec, 8, machine).rows) + 1


@pytest.mark.parametrize("call, error, message", [
    (lambda: Machine(devices=0, memory=1, bandwidth=1, latency=0, flops=1), ValueError, "devices must be positive"),
    (lambda: Machine(devices=2, memory=1, bandwidth=1, latency=-1, flops=1), ValueError, "latency must be >= 0"),
    (lambda: plan("gpt", 8, Machine(2, 1, 1, 0, 1)), TypeError, "model must be a ModelSpec"),
    (lambda: plan(ModelSpec.mlp([4, 2]), 0, Machine(2, 1, 1, 0, 1)), ValueError, "batch must be a positive"),
    (lambda: ModelSpec.gpt(2, 30, 4, 8, 10), ValueError, "n_embd divisible by n_head"),
    (lambda: estimate(ModelSpec.mlp([4, 2]), 8, Machine(2, 1, 1, 0, 1), data=4), ValueError, "must equal the machine"),
])
def test_bad_input_is_refused_with_a_clear_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_zero_ranks_between_data_parallel_and_sharding_by_their_bytes():
    """ZeRO-1 and ZeRO-3 send 1.5× data parallelism's bytes (p = g), ZeRO-2 as many (Ψ a multiple of N here)."""
    spec = ModelSpec("even", ((4096,), (4096,)), 0.0, 0.0, 1.0)
    machine = Machine(devices=4, memory=1e12, bandwidth=1e9, latency=0.0, flops=1e12)
    sent = {z: estimate(spec, 4, machine, data=4, zero=z).wire_bytes for z in range(4)}
    assert sent[2] == pytest.approx(sent[0])
    assert sent[1] == pytest.approx(1.5 * sent[0]) and sent[3] == pytest.approx(1.5 * sent[0])
    assert math.isclose(sent[0], 2 * 3 / 4 * 4 * 8192)


def test_a_machine_from_measured_ceilings_shares_them_between_its_ranks():
    from minidl.roofline.ceilings import Ceilings
    ceilings = Ceilings("cpu", peak_flops=8e10, copy_bandwidth=6e9, triad_bandwidth=7e9, cache_bandwidth=3e10,
                        gemm_size=1024, stream_bytes=2**26, threads=2)
    machine = Machine.from_ceilings(ceilings, devices=4, ram=16e9, latency=1e-5)
    assert (machine.devices, machine.memory, machine.bandwidth, machine.flops, machine.latency) == \
        (4, 4e9, 1.5e9, 2e10, 1e-5)
