"""The proof: N ranks with B/N samples each train exactly as one process with batch B.

The tests start real MPI jobs (mpiexec, 2 and 4 ranks) running dp_worker.py,
and compare each rank's parameters after 20 steps with a single-process run
computed here without minidl.parallel. Ranks start from different
initializations, so the start-up broadcast is exercised too.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from minidl.parallel import launch, shard_bounds

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import scenarios  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")


def _run_job(ranks, script_args, timeout=120):
    return launch.run(ranks, [os.path.join(HERE, script_args[0])] + list(script_args[1:]), timeout=timeout)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    """Each rank's final parameters and facts for every scenario, from one mpiexec run."""
    ranks = request.param
    out = tmp_path_factory.mktemp(f"dp{ranks}")
    result = _run_job(ranks, ["dp_worker.py", str(out)])
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout}\n{result.stderr[-4000:]}"
    ranks_out = []
    for r in range(ranks):
        arrays = dict(np.load(out / f"rank{r}.npz"))
        facts = json.loads((out / f"rank{r}.json").read_text())
        ranks_out.append((arrays, facts))
    return ranks, ranks_out


_references = {}


def _reference(name):
    if name not in _references:
        _references[name] = scenarios.reference(name)
    return _references[name]


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_same_parameters_as_one_process(job, name):
    ranks, outputs = job
    expected, _ = _reference(name)
    dtype = scenarios.SCENARIOS[name][1]
    for rank, (arrays, facts) in enumerate(outputs):
        assert facts["world"] == {"rank": rank, "size": ranks, "backend": "mpi"}
        for i, want in enumerate(expected):
            got = arrays[f"{name}/{i}"]
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=0, atol=scenarios.TOLERANCE[dtype],
                                       err_msg=f"{name}: parameter {i} on rank {rank} of {ranks}")


def test_the_run_is_not_trivially_equal(job):
    """Guard against a vacuous proof: training moved the weights, and rank 1 started elsewhere."""
    _, outputs = job
    trained, _ = _reference("adam_f64")
    start = [p.array for p in scenarios.make_model(0, "float64").parameters()]
    other_start = [p.array for p in scenarios.make_model(1, "float64").parameters()]
    assert max(np.abs(a - b).max() for a, b in zip(trained, start)) > 1e-2
    assert max(np.abs(a - b).max() for a, b in zip(other_start, start)) > 1e-2


def test_uneven_batches_are_weighted_by_sample_count(job):
    ranks, outputs = job
    counts = [len(range(*shard_bounds(11, r, ranks))) for r in range(ranks)]
    assert sum(counts) == 11 and len(set(counts)) == 2  # really uneven: 6+5, or 3+3+3+2
    for rank, (_, facts) in enumerate(outputs):
        sync = facts["uneven_adam_f64"]["sync"]
        assert sync["samples"] == 11
        assert sync["weight"] == pytest.approx(counts[rank] / 11)


def test_small_buckets_mean_several_all_reduces(job):
    _, outputs = job
    for _, facts in outputs:
        # 256-byte buckets: [fc1.weight (384 B, alone)], [fc1.bias 64 B + fc2.weight 192 B], [fc2.bias]
        assert facts["small_buckets_sgd_f32"]["sync"]["buckets"] == 3
        assert facts["sgd_f32"]["sync"]["buckets"] == 1
        assert facts["sgd_f32"]["sync"]["bytes"] == 4 * (16 * 6 + 16 + 3 * 16 + 3)


def test_overlap_starts_buckets_during_backward(job):
    """256-byte buckets filled last layer first; in float64 no two parameters fit in one (fc2.bias 24 B,
    fc2.weight 384 B, fc1.bias 128 B, fc1.weight 768 B), so 4 buckets. fc2's two are final once fc2's backward
    has run, and start while backward goes on through fc1; fc1's are final at the last node, and start at the sync."""
    _, outputs = job
    for _, facts in outputs:
        sync = facts["overlap_small_buckets_uneven_adam_f64"]["sync"]
        assert sync["buckets"] == 4 and sync["started_in_backward"] == 2
        assert facts["overlap_adam_f64"]["sync"]["buckets"] == 1


def test_zero_shards_the_optimizer_state(job):
    ranks, outputs = job
    _, reference_opt = _reference("zero_adam_f64")
    full = scenarios.state_bytes(reference_opt)
    reports = [facts["zero_adam_f64"]["memory"] for _, facts in outputs]
    elements = sum(p.numel() for p in scenarios.make_model(0, "float64").parameters())
    padded = ranks * -(-elements // ranks)                      # the flat vector, padded to N·⌈Ψ/N⌉
    per_element = full // elements                              # Adam's m and v: 16 bytes in float64
    assert full == per_element * elements
    # partitioned by elements: every rank holds the state of an even chunk, whatever the parameters' sizes
    assert all(r["state_bytes"] == per_element * padded // ranks for r in reports)
    assert all(r["replicated_bytes"] == per_element * padded for r in reports)
    assert all(r["saved_bytes"] == r["replicated_bytes"] - r["state_bytes"] for r in reports)
    assert sum(r["elements_owned"] for r in reports) == reports[0]["padded_elements"] == padded
    assert reports[0]["parameters_total"] == 4 and all(1 <= r["parameters_owned"] <= 4 for r in reports)
    # The consolidated state equals the unsharded optimizer's, moment by moment.
    consolidated = outputs[0][1]["zero_adam_f64"]["consolidated"]
    for pos, state in reference_opt.state.items():
        for key in ("m", "v"):
            np.testing.assert_allclose(np.array(consolidated[f"{pos}/{key}"]), state[key], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["zero_lamb_f64", "zero_novograd_f64", "zero_adahessian_f64"])
def test_zero_stage_1_consolidates_the_state_one_process_keeps(job, name):
    """The chunks' state all-gathered and cut into the parameters' shapes (NovoGrad's v: one number per parameter,
    the same on every rank) equals the unsharded optimizer's, entry by entry, on every rank."""
    _, outputs = job
    _, reference_opt = _reference(name)
    for _, facts in outputs:
        consolidated = facts[name]["consolidated"]
        want = {f"{pos}/{key}": np.asarray(value) for pos, state in reference_opt.state.items()
                for key, value in state.items() if hasattr(value, "shape")}
        assert sorted(consolidated) == sorted(want)
        for key, value in want.items():
            np.testing.assert_allclose(np.array(consolidated[key]), value, rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.mark.parametrize("name", ["zero_adam_f64", "zero_sgd_f32"])
def test_zero_stage_1_hands_the_communicator_what_the_cost_model_says(job, name):
    """Per step: the all-reduce of gΨ (DataParallel's), then the all-gather of this rank's chunk, pΨ'/N with
    Ψ' = N·⌈Ψ/N⌉ (cost_model.zero_step_payloads, stage 1); on a ring 1.5× plain data parallelism's bytes."""
    from minidl.parallel import cost_model
    ranks, outputs = job
    itemsize = np.dtype(scenarios.SCENARIOS[name][1]).itemsize
    elements = sum(p.numel() for p in scenarios.make_model(0, "float64").parameters())
    padded = ranks * -(-elements // ranks)
    payloads = cost_model.zero_step_payloads(elements, ranks, 1, itemsize, itemsize, padded=padded)
    assert payloads == {"allreduce": itemsize * elements, "allgather": itemsize * padded / ranks}  # by hand
    for _, facts in outputs:
        assert facts[name]["traffic"] == {op: scenarios.STEPS * n for op, n in payloads.items()}
    sent = cost_model.zero_step_bytes(elements, ranks, 1, itemsize, itemsize, padded=padded)
    assert sent == pytest.approx((ranks - 1) / ranks * itemsize * (2 * elements + padded))


def test_an_exception_on_one_rank_ends_the_job_naming_the_rank(tmp_path):
    start = time.perf_counter()
    # Without `python -m mpi4py`: the abort must come from minidl.parallel.init's exception hook.
    cmd = launch.mpiexec_command(2, [os.path.join(HERE, "fault_worker.py"), "raise"], use_mpi4py_runner=False)
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    elapsed = time.perf_counter() - start
    assert result.returncode != 0
    assert "rank 1 of 2 failed" in result.stderr
    assert "deliberate failure at step 3" in result.stderr
    assert "finished without an abort" not in result.stdout
    assert elapsed < 30, f"the job took {elapsed:.1f} s to end"


def test_an_exception_in_a_pipeline_stage_ends_the_job_while_the_other_waits_for_it(tmp_path):
    start = time.perf_counter()
    cmd = launch.mpiexec_command(2, [os.path.join(HERE, "fault_worker.py"), "pipeline"], use_mpi4py_runner=False)
    env = dict(os.environ, OMPI_MCA_mpi_yield_when_idle="1")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode != 0
    assert "rank 1 of 2 failed" in result.stderr and "deliberate failure at step 3" in result.stderr
    assert "finished without an abort" not in result.stdout
    assert time.perf_counter() - start < 30


def test_mismatched_models_are_detected_at_start():
    result = _run_job(2, ["fault_worker.py", "mismatch"], timeout=60)
    assert result.returncode != 0
    assert "the model differs between ranks" in result.stderr
    assert "rank 1: parameter 'fc1.weight' has shape (17, 6)" in result.stderr
    assert "rank 0: parameter 'fc1.weight' has shape (16, 6)" in result.stderr
