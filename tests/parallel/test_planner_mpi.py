"""The planner's predictions against this machine: step peaks per rank and bytes per step on 2 and 4 MPI ranks.

tests/parallel/plan_worker.py runs data parallelism and ZeRO 1, 2, 3 on 2 and 4 ranks, and on 2 ranks a 1F1B
pipeline of 2 stages and a tensor-parallel GPT, three Adam steps each, and measures every rank's step peak
with ``minidl.memory.track`` (from the level before the model was built) and what one step handed the
communicator (``Communicator.traffic``).

Bytes: the planner's payloads equal the communicator's counts exactly (ZeRO's padded units included: on 4
ranks, Ψ = 528,138 is not a multiple of 4).

Peaks: within 10% of the measured peak, on every rank. The prediction adds each of the step's transients
at its full size as if all were alive at the same moment (a piece's send and receive buffers, the
activations, the largest unit made whole), and leaves out the ops' own temporaries and Python's objects;
measured, its errors run from −7.5% (the GPT, whose ops' temporaries it leaves out) to +6.7% (ZeRO-1). A
missing term is far outside 10%: ZeRO-3's gathered unit is 45% of its peak on 4 ranks, Adam's state 46%
of data parallelism's, a stage's micro-batch gradients 23% of the pipeline's.

minidl's Pipeline keeps the whole model on every rank (its checkpoints are whole), beside the stage it
trains; the planner predicts a pipeline whose rank holds its stage, so the test adds the other stages'
weights, p·(Ψ − Ψ_stage), to the prediction before comparing.
"""
import json
import os

import pytest

from minidl.parallel import launch
from minidl.parallel.planner import Machine, ModelSpec, estimate

HERE = os.path.dirname(os.path.abspath(__file__))
REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")

MLP = ModelSpec.mlp([256, 512, 512, 256, 10])       # benchmarks/bench_zero_memory.py's model
GPT = ModelSpec.gpt(n_layer=2, n_embd=64, n_head=4, block_size=32, vocab_size=64)   # plan_worker.GPT_CONFIG
PER_RANK, BUCKET, GPT_BATCH = 16, 2**18, 8
ZERO = {"dp": 0, "zero1": 1, "zero2": 2, "zero3": 3}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def measured(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"plan{ranks}") / "rows.json"
    job = launch.run(ranks, [os.path.join(HERE, "plan_worker.py"), str(out)], timeout=300)
    assert job.returncode == 0, f"mpiexec failed:\n{job.stdout[-2000:]}\n{job.stderr[-4000:]}"
    return ranks, json.loads(out.read_text())


def _predicted(mode, ranks):
    machine = Machine(devices=ranks, memory=1e12, bandwidth=1e9, latency=0.0, flops=1e9)
    if mode == "pipeline":
        e = estimate(MLP, PER_RANK, machine, pipeline=2, micro_batches=2, schedule="1f1b")
        stage0 = 256 * 512 + 512 + 512 * 512 + 512
        return e, MLP.itemsize * (MLP.parameters - stage0)
    if mode == "tensor":
        return estimate(GPT, GPT_BATCH, machine, tensor=2), 0
    return estimate(MLP, PER_RANK * ranks, machine, data=ranks, zero=ZERO[mode], bucket_bytes=BUCKET), 0


def test_bytes_per_step_equal_the_communicators_count(measured):
    ranks, rows = measured
    assert {row["mode"] for row in rows} == set(ZERO) | ({"pipeline", "tensor"} if ranks == 2 else set())
    for row in rows:
        e, _ = _predicted(row["mode"], ranks)
        (axis, payload), = e.payloads.items()
        assert row["traffic"] == {op: int(n) for op, n in payload.items()}, (row["mode"], row["rank"])
        assert all(float(n).is_integer() for n in payload.values())


def test_step_peaks_per_rank_are_predicted_within_ten_percent(measured):
    ranks, rows = measured
    for row in rows:
        if row["mode"] == "pipeline" and row["rank"] != 0:
            continue  # the planner predicts the rank that holds most: stage 0, the 512×512 layer's
        e, whole_model_extra = _predicted(row["mode"], ranks)
        predicted = e.peak_bytes + whole_model_extra
        assert predicted == pytest.approx(row["peak"], rel=0.10), (row["mode"], row["rank"], predicted, row["peak"])


def test_the_predicted_peaks_order_the_layouts_as_measured(measured):
    ranks, rows = measured
    peak = {mode: max(r["peak"] for r in rows if r["mode"] == mode) for mode in ZERO}
    predicted = {mode: _predicted(mode, ranks)[0].peak_bytes for mode in ZERO}
    for figures in (peak, predicted):
        assert figures["dp"] > figures["zero1"] > max(figures["zero2"], figures["zero3"])
        if ranks == 4:  # on 2 ranks ZeRO-3's gathered layer (half the model) leaves it level with ZeRO-2
            assert figures["zero2"] > figures["zero3"]
