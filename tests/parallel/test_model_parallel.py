"""Model parallelism on real MPI ranks: groups and meshes, point to point, tensor parallelism.

One mpiexec job per world size (2 and 4 ranks) runs every check of mp_worker.py;
the tests compare what each rank saved with values computed here, by hand or by
a plain single-process run that uses nothing from minidl.parallel.
"""
import json
import os
import sys

import numpy as np
import pytest

from minidl.parallel import launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mp_scenarios  # noqa: E402
import mp_worker  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")

# The mesh of mp_worker, drawn by hand: data × tensor, row-major (tensor varies fastest).
#   2 ranks (1 × 2):  [0 1]            4 ranks (2 × 2):  [0 1]
#                                                        [2 3]
GROUPS = {2: {"tensor": [[0, 1]], "data": [[0], [1]]},
          4: {"tensor": [[0, 1], [2, 3]], "data": [[0, 2], [1, 3]]}}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"mp{ranks}")
    result = launch.run(ranks, [os.path.join(HERE, "mp_worker.py"), str(out)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return ranks, [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
                   for r in range(ranks)]


def _group_of(ranks, axis, rank):
    return next(g for g in GROUPS[ranks][axis] if rank in g)


# ---------------------------------------------------------------- groups and meshes
def test_each_rank_knows_its_place_and_its_groups(job):
    ranks, outputs = job
    for rank, (_, facts) in enumerate(outputs):
        assert facts["world"] == {"rank": rank, "size": ranks, "backend": "mpi"}
        for axis in ("data", "tensor"):
            members = _group_of(ranks, axis, rank)
            assert facts["groups"]["members"][axis] == members
            gathered = facts["groups"][axis].pop("gathered")
            assert gathered == (members if rank == members[-1] else None)  # gather_object to the last member
            assert facts["groups"][axis] == {"rank": members.index(rank), "size": len(members), "backend": "mpi"}
            assert facts["groups"]["coordinates"][axis] == members.index(rank)


def test_collectives_of_a_group_involve_its_members_only(job):
    ranks, outputs = job
    base = np.arange(1, 6, dtype=np.float64)  # rank r contributes (r + 1) · base
    for rank, (arrays, _) in enumerate(outputs):
        for axis in ("data", "tensor"):
            members = _group_of(ranks, axis, rank)
            np.testing.assert_array_equal(arrays[f"groups/{axis}/allreduce"], sum(m + 1 for m in members) * base)
            np.testing.assert_array_equal(arrays[f"groups/{axis}/allgather"],
                                          np.stack([(m + 1) * base for m in members]).astype(np.float32))
            np.testing.assert_array_equal(arrays[f"groups/{axis}/broadcast"], (members[-1] + 1) * base)


def test_send_and_receive_around_a_ring_and_within_a_group(job):
    ranks, outputs = job
    for rank, (arrays, _) in enumerate(outputs):
        source = (rank - 1) % ranks
        for index, (shape, dtype) in enumerate(mp_worker.P2P_MESSAGES):
            got = arrays[f"p2p/ring/{index}"]
            assert got.dtype == np.dtype(dtype) and got.shape == shape
            want = (10 * source + np.arange(int(np.prod(shape)))).reshape(shape).astype(dtype)
            np.testing.assert_array_equal(got, want)
        tensor_group = _group_of(ranks, "tensor", rank)
        if tensor_group.index(rank) == 1:
            np.testing.assert_array_equal(arrays["p2p/group"], 10 * tensor_group[0] + np.arange(3.0))
        else:
            assert "p2p/group" not in arrays


# ---------------------------------------------------------------- tensor parallelism
# Float64 tolerance: the split model sums the same products in another order (a partial sum per
# rank, then the all-reduce), so each step's numbers may differ from the plain model's by a few
# units in the last place (~1e-16 relative). Over 4 Adam steps, whose update m̂/(√v̂ + ε) is bounded,
# that stays many orders below 1e-10 (measured: 3e-14 for the GPT, 6e-17 for the MLP); a wrong
# slice or a missing all-reduce changes the weights by more than 1e-3.
TENSOR_TOLERANCE = 1e-10
_references = {}



@pytest.mark.parametrize("n", mp_worker.RING_LENGTHS)
def test_the_hand_written_ring_all_reduce_sums_over_the_group_and_sends_the_ring_bytes(job, n):
    """Each rank ends with Σ of its group's arrays (summed here with NumPy); over the world each rank sent
    2(N−1) chunks: 2(N−1)/N · n elements when N divides n (the cost model's ring bytes), and between
    2(N−1)·⌊n/N⌋ and 2(N−1)·⌈n/N⌉ elements otherwise."""
    from minidl.parallel.cost_model import ring_bytes
    ranks, outputs = job
    for rank, (arrays, facts) in enumerate(outputs):
        world_sum = sum(mp_worker.ring_values(r, n) for r in range(ranks))
        np.testing.assert_allclose(arrays[f"ring/world/{n}"], world_sum, rtol=1e-12, atol=1e-12)
        group_sum = sum(mp_worker.ring_values(r, n) for r in _group_of(ranks, "tensor", rank))
        np.testing.assert_allclose(arrays[f"ring/tensor/{n}"], group_sum, rtol=1e-12, atol=1e-12)
        sent = facts["ring"][f"sent/{n}"]
        if n % ranks == 0:
            assert sent == ring_bytes("allreduce", 8 * n, ranks)
        else:
            assert 2 * (ranks - 1) * 8 * (n // ranks) <= sent <= 2 * (ranks - 1) * 8 * -(-n // ranks)


def test_the_ring_all_reduce_of_one_rank_is_the_identity_and_refuses_a_strided_array():
    from minidl.parallel import LocalComm
    from minidl.parallel.ring import chunk_bounds, ring_allreduce_
    x = np.arange(6.0)
    assert ring_allreduce_(LocalComm(), x) is x
    np.testing.assert_array_equal(x, np.arange(6.0))
    with pytest.raises(ValueError, match="C-contiguous"):
        ring_allreduce_(LocalComm(), np.arange(12.0).reshape(3, 4)[:, ::2])
    assert chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]

def _reference(kind):
    if kind not in _references:
        _references[kind] = mp_scenarios.reference(kind)
    return _references[kind]


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_tensor_parallel_training_equals_one_process(job, kind):
    ranks, outputs = job
    want, want_losses = _reference(kind)
    for rank, (arrays, facts) in enumerate(outputs):
        got = {k[len(f"tensor_{kind}/full/"):]: v for k, v in arrays.items() if k.startswith(f"tensor_{kind}/full/")}
        assert set(got) == set(want)
        for name, value in want.items():
            assert got[name].shape == value.shape
            np.testing.assert_allclose(got[name], value, rtol=0, atol=TENSOR_TOLERANCE,
                                       err_msg=f"{kind}: {name} on rank {rank} of {ranks}")
        np.testing.assert_allclose(facts[f"tensor_{kind}"]["losses"], want_losses, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_tensor_parallel_layers_hold_their_slice_of_the_seeded_weights(job, kind):
    """Each rank holds 1/N of every split weight, and at the start that slice is the plain model's."""
    ranks, outputs = job
    plain = mp_scenarios.make_mlp() if kind == "mlp" else mp_scenarios.make_gpt()
    start = {mp_scenarios.MLP_NAMES.get(k, k) if kind == "mlp" else k: v for k, v in plain.state_dict().items()}
    trained, _ = _reference(kind)
    assert max(np.abs(trained[k] - start[k]).max() for k in start) > 1e-3  # training moved the weights
    for rank, (arrays, facts) in enumerate(outputs):
        split = facts[f"tensor_{kind}"]["split_layers"]
        assert len(split) == (2 if kind == "mlp" else 4 * mp_scenarios.GPT_CONFIG.n_layer)
        for layer in split:
            local = arrays[f"tensor_{kind}/initial/{layer}.weight"]
            full = start[f"{layer}.weight"]
            if layer.endswith(("fc", "qkv")):  # column-parallel: rows of each stacked block
                blocks = 3 if layer.endswith("qkv") else 1
                per = full.shape[0] // blocks // ranks
                rows = np.concatenate([np.arange(b * full.shape[0] // blocks + rank * per,
                                                 b * full.shape[0] // blocks + (rank + 1) * per)
                                       for b in range(blocks)])
                np.testing.assert_array_equal(local, full[rows])
            else:  # row-parallel: columns
                per = full.shape[1] // ranks
                np.testing.assert_array_equal(local, full[:, rank * per:(rank + 1) * per])


# ---------------------------------------------------------------- ZeRO stages 2 and 3
@pytest.mark.parametrize("name", list(mp_scenarios.ZERO_RUNS))
def test_sharded_training_equals_one_process(job, name):
    """Every rank starts from its own weights (rank 0's are broadcast) and ends with the plain run's."""
    ranks, outputs = job
    want = mp_scenarios.zero_reference(name)
    start = [p.array for p in mp_scenarios.make_sequential().parameters()]
    assert max(np.abs(w - s).max() for w, s in zip(want, start)) > 1e-2  # training moved the weights
    for rank, (arrays, _) in enumerate(outputs):
        for i, value in enumerate(want):
            np.testing.assert_allclose(arrays[f"{name}/{i}"], value, rtol=0, atol=TENSOR_TOLERANCE,
                                       err_msg=f"{name}: parameter {i} on rank {rank} of {ranks}")


@pytest.mark.parametrize("name", list(mp_scenarios.ZERO_RUNS))
def test_sharded_optimizer_state_consolidates_to_one_process_and_shards_back(job, name):
    """The state every rank's consolidated_state_dict gives is the plain optimizer's, entry by entry, of the
    same shapes (NovoGrad's v: a 0-d array per parameter); loaded back, each rank holds its state again."""
    ranks, outputs = job
    _, want = mp_scenarios.zero_reference(name, with_state=True)
    for rank, (arrays, facts) in enumerate(outputs):
        assert facts[name]["reloaded"], f"{name}: rank {rank} of {ranks} did not get its shard's state back"
        got = {key[len(name) + len("/state/"):]: value for key, value in arrays.items()
               if key.startswith(f"{name}/state/")}
        expected = {f"{pos}/{key}": np.asarray(value) for pos, entry in want["state"].items()
                    for key, value in entry.items()}
        assert sorted(got) == sorted(expected)
        for key, value in expected.items():
            assert got[key].shape == value.shape, (name, key, got[key].shape, value.shape)
            np.testing.assert_allclose(got[key], value, rtol=1e-9, atol=TENSOR_TOLERANCE,
                                       err_msg=f"{name}: state {key} on rank {rank} of {ranks}")


@pytest.mark.parametrize("name", list(mp_scenarios.ZERO_RUNS))
def test_sharded_memory_and_traffic_are_the_zero_formulas(job, name):
    """Measured bytes per rank equal the ZeRO paper's formula (padded Ψ), and the payloads each step handed
    the communicator equal the cost model's: a reduce-scatter of gΨ and an all-gather of pΨ/N (twice at stage 3);
    a layer-wise optimizer adds one all-reduce of one number per parameter (4 in all) for each norm it takes."""
    from minidl.parallel import cost_model
    ranks, outputs = job
    stage, kind, _ = mp_scenarios.ZERO_RUNS[name]
    layers = (78, 70, 15) if stage == 3 else (163,)                 # elements of each flat unit
    padded = sum(ranks * -(-n // ranks) for n in layers)             # N·⌈Ψ_u/N⌉ per unit
    # per element, float64: Adam and LAMB keep m and v; SGD and LARS a momentum; NovoGrad m, and one v per
    # parameter (4 numbers, on every rank)
    # SWATS measured before its first SGD step: Adam's m and v
    state_bytes = {"adam": 16, "lamb": 16, "sgd": 8, "lars": 8, "novograd": 8, "switch": 16, "adahessian": 16}[kind]
    per_layer = 4 * 8 if kind == "novograd" else 0
    want = cost_model.zero_bytes_per_rank(padded, ranks, stage, param_bytes=8, grad_bytes=8, state_bytes=state_bytes)
    want = {**want, "optimizer_bytes": want["optimizer_bytes"] + per_layer,
            "total_bytes": want["total_bytes"] + per_layer}
    payloads = cost_model.zero_step_payloads(padded, ranks, stage, param_bytes=8, grad_bytes=8)
    norms = mp_scenarios.NORMS_PER_STEP[kind]
    if norms:
        payloads = {**payloads, "allreduce": norms * 4 * 8}
    if kind == "adahessian":  # Hz of the 163 whole weights all-reduced; stage 3 keeps each unit whole from its
        payloads = {**payloads, "allreduce": 163 * 8}        # forward to the sync: one all-gather per step
        if stage == 3:
            payloads["allgather"] /= 2
    traffic = {op: mp_scenarios.STEPS * n for op, n in payloads.items()}
    if kind == "switch":  # SWATS: one all-reduce of its 2 sums (pᵀp, pᵀg) per Adam step, none once on SGD
        traffic["allreduce"] = mp_scenarios.SWITCH_AT * 2 * 8
    for _, facts in outputs:
        memory = facts[name]["memory"]
        assert (memory["elements"], memory["padded_elements"]) == (163, padded)
        for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "total_bytes"):
            assert memory[key] == want[key], (key, memory, want)
        assert facts[name]["traffic"] == traffic
    payloads.pop("allreduce", None)  # the ring below: the ZeRO payloads alone
    if kind == "adahessian" and stage == 3:
        payloads["allgather"] *= 2   # the formula's two gathers per step (AdaHessian's run makes one: above)
    # what the ring then sends per step: (N−1)/N·(g + p)·Ψ at stage 2, the same as one all-reduce of the
    # gradients; (N−1)/N·(g + 2p)·Ψ at stage 3, which gathers the weights again for backward (the paper's 1.5×)
    sent = sum(cost_model.ring_bytes(op, n, ranks) for op, n in payloads.items())
    assert sent == pytest.approx((ranks - 1) / ranks * (8 + 8 * (2 if stage == 3 else 1)) * padded)
    assert sent == pytest.approx(cost_model.zero_step_bytes(padded, ranks, 0, 8, 8) * (1.5 if stage == 3 else 1))


@pytest.mark.parametrize("name", [n for n, (_, kind, _) in mp_scenarios.ZERO_RUNS.items() if kind == "switch"])
def test_sharded_swats_switches_on_every_rank_at_the_plain_step_with_the_plain_rate(job, name):
    """pᵀp and pᵀg added over the ranks are the whole group's, so every rank's estimate is one process's:
    each switches after the same Adam step with the same SGD rate Λ, and the consolidated state keeps both.
    (Measured with each rank's own pieces alone, no all-reduce: the ranks switched after steps 2, 3, 4 or
    not at all, each at its own rate, and the weights missed the plain run's by 8.8e-3 on 2 and on 4 ranks,
    which this test and test_sharded_training_equals_one_process catch.)"""
    ranks, outputs = job
    _, want = mp_scenarios.zero_reference(name, with_state=True)
    (switch,) = want["switch"]
    assert switch["switched_at"] == mp_scenarios.SWITCH_AT < mp_scenarios.STEPS  # the plain run switched, then SGD
    assert want["param_groups"][0]["lr"] == switch["estimate"] > 0
    for rank, (_, facts) in enumerate(outputs):
        for got in (facts[name]["switch"], facts[name]["consolidated_switch"]):
            (got,) = got
            assert (got["t"], got["switched_at"]) == (switch["t"], switch["switched_at"]), (rank, got, switch)
            for key in ("lam", "estimate"):
                assert got[key] == pytest.approx(switch[key], rel=1e-12, abs=0), (rank, key, got, switch)
        assert facts[name]["lr"] == [pytest.approx(switch["estimate"], rel=1e-12, abs=0)]


# ---------------------------------------------------------------- pipelines
@pytest.mark.parametrize("name", list(mp_scenarios.PIPELINE_RUNS))
def test_pipeline_training_equals_one_process(job, name):
    """Each rank holds its stage's layers only; together they end with the plain run's weights and losses."""
    ranks, outputs = job
    want, want_losses = mp_scenarios.pipeline_reference()
    seen = {}
    for rank, (arrays, facts) in enumerate(outputs):
        mine = {k[len(name) + 1:]: v for k, v in arrays.items() if k.startswith(f"{name}/")}
        assert mine and not set(mine) & set(seen)          # a stage of its own, no layer on two ranks
        seen.update(mine)
        np.testing.assert_allclose(facts[name]["losses"], want_losses, rtol=0, atol=1e-12)
    assert set(seen) == set(want)
    for key, value in want.items():
        np.testing.assert_allclose(seen[key], value, rtol=0, atol=TENSOR_TOLERANCE, err_msg=f"{name}: {key}")


@pytest.mark.parametrize("name", list(mp_scenarios.PIPELINE_RUNS))
def test_pipeline_runs_its_schedule_and_holds_what_it_should(job, name):
    """GPipe: all forwards, then all backwards, m micro-batches' activations held on every stage.
    1F1B (PipeDream-Flush): stage s holds at most min(p − s, m)."""
    ranks, outputs = job
    kind, m = mp_scenarios.PIPELINE_RUNS[name]
    for stage, (_, facts) in enumerate(outputs):
        ops = [tuple(op) for op in facts[name]["ops"]]
        if kind == "gpipe":
            assert ops == [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
            assert facts[name]["peak_in_flight"] == m
        else:
            warmup = min(ranks - 1 - stage, m)
            steady = [op for k in range(m - warmup) for op in (("F", warmup + k), ("B", k))]
            assert ops == [("F", k) for k in range(warmup)] + steady + [("B", k) for k in range(m - warmup, m)]
            assert facts[name]["peak_in_flight"] == min(ranks - stage, m)


# ---------------------------------------------------------------- hybrids on a 2 × 2 mesh
def _four_ranks(job):
    ranks, outputs = job
    if ranks != 4:
        pytest.skip("a 2 × 2 mesh needs 4 ranks; the 2-rank job checks each scheme alone")
    return outputs


def test_data_times_tensor_equals_one_process(job):
    """GPT split over each tensor group {0, 1} {2, 3}, data-parallel over {0, 2} {1, 3} (2 + 1 sequences)."""
    outputs = _four_ranks(job)
    want, _ = _reference("gpt")
    for rank, (arrays, facts) in enumerate(outputs):
        assert facts["hybrid_data_tensor"] == {"ran": True, "samples": 3}
        for name, value in want.items():
            np.testing.assert_allclose(arrays[f"hybrid_data_tensor/{name}"], value, rtol=0, atol=TENSOR_TOLERANCE,
                                       err_msg=f"{name} on rank {rank}")


def test_data_times_pipeline_equals_one_process(job):
    """A 2-stage 1F1B pipeline in each pipe group {0, 1} {2, 3}, each stage data-parallel over {0, 2} {1, 3}."""
    outputs = _four_ranks(job)
    want, _ = mp_scenarios.pipeline_reference()
    stages = [{k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("hybrid_data_pipeline/")}
              for arrays, _ in outputs]
    assert set(stages[0]) == set(stages[2]) and set(stages[1]) == set(stages[3])   # replicas of one stage
    assert set(stages[0]) | set(stages[1]) == set(want) and not set(stages[0]) & set(stages[1])
    for rank, stage in enumerate(stages):
        for name, value in stage.items():
            np.testing.assert_allclose(value, want[name], rtol=0, atol=TENSOR_TOLERANCE,
                                       err_msg=f"{name} on rank {rank}")


# ---------------------------------------------------------------- checkpoints
def test_a_consolidated_checkpoint_loads_into_one_process_and_splits_again_for_another_world(job, tmp_path):
    """The gathered state of the split GPT is a plain GPT's checkpoint: it loads into one process (strict),
    computes what the plain run computes, and splits again for any tensor-parallel size."""
    from test_tensor_parallel_local import ClaimedGroup

    import minidl as mdl
    from minidl.models.gpt import GPT, tensor_parallel
    from minidl.nn import StateDictError

    ranks, outputs = job
    arrays, _ = outputs[0]
    state = {k[len("tensor_gpt/full/"):]: v for k, v in arrays.items() if k.startswith("tensor_gpt/full/")}
    mdl.save(state, str(tmp_path / "gpt.safetensors"))
    plain = GPT(mp_scenarios.GPT_CONFIG).to(dtype=np.float64)
    plain.load_state_dict(mdl.load(str(tmp_path / "gpt.safetensors")))
    reference = mp_scenarios.make_gpt()
    mp_scenarios.train(reference, "gpt")
    tokens, _ = mp_scenarios.gpt_batches()
    np.testing.assert_allclose(plain(tokens[0]).numpy(), reference(tokens[0]).numpy(), rtol=0, atol=1e-9)
    other = 2 if ranks == 4 else 4  # resume with another tensor-parallel size
    resplit = tensor_parallel(plain, ClaimedGroup(rank=1, size=other))
    qkv = state["blocks.0.attn.qkv.weight"]  # (3C, C): rank 1's rows of Q, K and V
    per = qkv.shape[0] // 3 // other
    rows = np.concatenate([np.arange(b * qkv.shape[0] // 3 + per, b * qkv.shape[0] // 3 + 2 * per) for b in range(3)])
    np.testing.assert_array_equal(resplit.blocks[0].attn.qkv.weight.numpy(), qkv[rows])
    # a split model's own (unconsolidated) state does not load into another split: the error names each
    # parameter and both shapes
    with pytest.raises(StateDictError, match=r"blocks.0.attn.qkv.weight: the module expects shape \(48, 16\), "
                                             rf"the state has \({48 // other}, 16\)"):
        GPT(mp_scenarios.GPT_CONFIG).to(dtype=np.float64).load_state_dict(resplit.state_dict())


# ---------------------------------------------------------------- the cost model against what was counted
def test_tensor_and_pipeline_bytes_are_the_cost_models(job):
    """The payloads each rank's communicator counted equal the cost model's: for the split GPT,
    4 all-reduces of tokens × width per block and step; for a pipeline stage, the batch's
    activations (8 features, float64) out and their gradients back, to each neighbour it has."""
    from minidl.parallel import cost_model
    ranks, outputs = job
    cfg = mp_scenarios.GPT_CONFIG
    tokens = 3 * cfg.block_size  # 3 sequences per batch
    per_step = cost_model.tensor_parallel_step_payloads(tokens, cfg.n_embd, cfg.n_layer, itemsize=8)
    for stage, (_, facts) in enumerate(outputs):
        assert facts["tensor_gpt"]["traffic"] == {op: mp_scenarios.STEPS * n for op, n in per_step.items()}
        for name in mp_scenarios.PIPELINE_RUNS:
            steps = facts[name]["traffic"]
            header = 9 * 8  # the first step also passes the shapes down the pipe: 9 int64
            want = cost_model.pipeline_step_payloads(stage, ranks, 12, 8, itemsize=8)
            assert steps[1:] == [{k: v for k, v in want.items() if v}] * (len(steps) - 1)
            first = {"send": want["send"] + header * (stage < ranks - 1), "recv": want["recv"] + header * (stage > 0)}
            assert steps[0] == {k: v for k, v in first.items() if v}
    assert cost_model.pipeline_bubble(4, 4) == pytest.approx(3 / 7)


def test_sharded_clipping_uses_the_global_norm(job):
    """ShardedDataParallel.clip_grad_norm_ adds every rank's shard: the norms it reports before clipping are
    the plain run's, and clipping happened (they exceed the limit, so the weights would differ otherwise)."""
    from minidl import nn
    model = mp_scenarios.make_sequential()
    want = mp_scenarios.train_sequential(model, mp_scenarios.make_optimizer("adam", model.parameters()), 12,
                                         clip=lambda c: nn.utils.clip_grad_norm_(model.parameters(), c))
    assert min(want) > 2 * mp_scenarios.CLIP
    for _, (_, facts) in enumerate(job[1]):
        np.testing.assert_allclose(facts["zero2_adam_clip"]["norms"], want, rtol=1e-12)


def test_tensor_parallel_clipping_uses_the_unsplit_models_norm(job):
    """tensor_parallel.clip_grad_norm_ adds the replicated parameters' squares once and every rank's slices:
    the norm and the clipped gradients (gathered whole) are those of the plain GPT clipped in one process,
    to float64 rounding; and clipping happened (the norm exceeds the limit), so a wrong norm would show."""
    from minidl import nn
    model = mp_scenarios.make_gpt()
    mp_scenarios.gpt_loss(model).backward()
    want = float(nn.utils.clip_grad_norm_(model.parameters(), mp_scenarios.CLIP))
    assert want > 2 * mp_scenarios.CLIP
    grads = {name: p.grad.array for name, p in model.named_parameters()}
    for rank, (arrays, facts) in enumerate(job[1]):
        assert facts["tensor_gpt_clip"]["norm"] == pytest.approx(want, rel=1e-12)
        got = {k[len("tensor_gpt_clip/"):]: v for k, v in arrays.items() if k.startswith("tensor_gpt_clip/")}
        assert set(got) == set(grads)
        for name, value in grads.items():
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-14, err_msg=f"{name} on rank {rank}")
