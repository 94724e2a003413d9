"""Local SGD on real MPI ranks (2 and 4), 16 steps of scheme_cases' MLP, every rank on its slice of each global
batch of 13 (uneven: 7 + 6, and 4 + 3 + 3 + 3).

- H = 1 with plain SGD is data parallelism: the averaged weights equal one process's on the global batch
  (Σ_r (n_r/B)(w − η g_r) = w − η g); with momentum too, when the optimizer state is averaged with them
  (the momentum is linear in the gradients); and driven by the Trainer.
- H = 4 and H = 16 equal a replay made here without minidl.parallel (one model per rank, stepped alone,
  their weights averaged every H steps with the sample weights), and differ from one process by a
  measured amount.
- The bytes: one all-reduce of the weights every H steps, ``cost_model.local_sgd_step_payloads``.
"""
import json
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import parallel
from minidl.parallel import cost_model, launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import local_sgd_worker  # noqa: E402
import scheme_cases as cases  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
STEPS = local_sgd_worker.STEPS


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"local{ranks}")
    result = launch.run(ranks, [os.path.join(HERE, "local_sgd_worker.py"), str(out)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return ranks, out, [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def _weights(path):
    got = np.load(path)
    return [got[f"arr_{k}"] for k in range(len(got.files))]


def _replay(ranks, period):
    """One model per rank, each stepped alone by plain SGD on its slice; every ``period`` steps (and at the
    end, for the consolidated weights) the weighted average of their weights. Returns (each rank's, average)."""
    models = [cases.make_model("mlp") for _ in range(ranks)]
    opts = [cases.make_optimizer(m.parameters(), "sgd") for m in models]
    counts = np.zeros(ranks)
    fn = cases.loss_fn("mlp")

    def average():
        weights = counts / counts.sum()
        return [sum(wt * p.array for wt, p in zip(weights, ps)) for ps in zip(*[m.parameters() for m in models])]

    for step, (x, y) in enumerate(cases.batches("mlp", STEPS), start=1):
        for r, (model, opt) in enumerate(zip(models, opts)):
            xs, ys = parallel.shard(x, r, ranks), parallel.shard(y, r, ranks)
            opt.zero_grad()
            fn(model(mdl.tensor(xs)), mdl.tensor(ys)).backward()
            opt.step()
            counts[r] += len(xs)
        if step % period == 0:
            for k, mean in enumerate(average()):
                for model in models:
                    list(model.parameters())[k].array[...] = mean
            counts[:] = 0
    return [[p.array for p in m.parameters()] for m in models], average() if counts.sum() else \
        [p.array for p in models[0].parameters()]


@pytest.mark.parametrize("name,kind", [("h1_sgd", "sgd"), ("h1_momentum_state", "momentum"), ("trainer", "sgd")])
def test_period_one_equals_one_process(job, name, kind):
    ranks, out, _ = job
    want, _ = cases.one_process("mlp", kind, STEPS)
    for k, (g, w) in enumerate(zip(_weights(out / f"{name}.npz"), want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12, err_msg=f"{name} parameter {k}")
    if name != "trainer":
        for r in range(ranks):  # averaged at every step: every rank holds the same weights
            for g, w in zip(_weights(out / f"{name}_rank{r}.npz"), want):
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("period", [4, 16])
def test_longer_periods_are_the_replay_and_differ_from_one_process(job, period):
    ranks, out, _ = job
    each, average = _replay(ranks, period)
    for r in range(ranks):
        for g, w in zip(_weights(out / f"h{period}_sgd_rank{r}.npz"), each[r]):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)
    got = _weights(out / f"h{period}_sgd.npz")
    for g, w in zip(got, average):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)
    want, _ = cases.one_process("mlp", "sgd", STEPS)
    difference = np.sqrt(sum(((g - w) ** 2).sum() for g, w in zip(got, want)))
    assert difference > 1e-4, difference  # the ranks drift apart between averages: not one process's run


@pytest.mark.parametrize("period", [1, 4, 16])
def test_traffic_is_the_cost_model(job, period):
    ranks, _, facts = job
    name = {1: "h1_sgd", 4: "h4_sgd", 16: "h16_sgd"}[period]
    for rank_facts in facts:
        fact = rank_facts[name]
        want = cost_model.local_sgd_step_payloads(fact["param_bytes"], period)
        assert fact["traffic"] == pytest.approx({op: v * STEPS for op, v in want.items()}, rel=1e-12)
    averaged = facts[0]["h1_momentum_state"]["traffic"]["allreduce"]  # momentum buffers: as many bytes again
    assert averaged == 2 * facts[0][name]["param_bytes"] * STEPS


def test_bad_period_names_the_fix():
    from minidl import nn
    with pytest.raises(ValueError, match="period .* must be an int >= 1"):
        parallel.LocalSGD(nn.Linear(2, 2), parallel.LocalComm(), period=0)
    with pytest.raises(ValueError, match="period"):
        cost_model.local_sgd_step_payloads(10, 0)
