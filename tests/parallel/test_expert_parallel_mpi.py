"""All-to-all and expert parallelism on real MPI ranks (2 and 4), against hand-computed values and one process.

One mpiexec job per world size runs every check of moe_worker.py. The one-process references train the
plain model (nn.MoE with ``groups = N``: the capacity and the auxiliary loss per rank's slice, as the
expert-parallel layer has them) on the global batch, without minidl.parallel.
"""
import json
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.parallel import cost_model, launch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import moe_worker as W  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}ranks")
def job(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"moe{ranks}")
    result = launch.run(ranks, [os.path.join(HERE, "moe_worker.py"), str(out)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return ranks, [(dict(np.load(out / f"rank{r}.npz")), json.loads((out / f"rank{r}.json").read_text()))
                   for r in range(ranks)]


# ---------------------------------------------------------------- the collectives
def test_all_to_all_gives_each_rank_the_row_every_rank_addressed_to_it(job):
    ranks, outputs = job
    for r, (arrays, _) in enumerate(outputs):
        for dtype in ("float16", "float64", "int32"):
            got = arrays[f"exchange/block/{dtype}"]
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, np.stack([W.rank_rows(s, r, (2, 3), dtype) for s in range(ranks)]))


def test_all_to_all_v_exchanges_counts_then_rows_and_its_backward_sends_gradients_home(job):
    ranks, outputs = job
    received = {}
    for r, (arrays, facts) in enumerate(outputs):
        counts = [W.v_counts(s, ranks)[r] for s in range(ranks)]  # what each source sends rank r
        assert facts["exchange"]["recv_counts"] == counts
        want = np.concatenate([np.repeat(W.rank_rows(s, r, (1, 2), "float32"), c, axis=0)
                               for s, c in enumerate(counts)])
        np.testing.assert_array_equal(arrays["exchange/v/rows"], want)
        received[r] = counts
    for r, (arrays, _) in enumerate(outputs):  # row c of the block for rank d: weight 1000·d + its place there
        grad = []
        for d, c in enumerate(W.v_counts(r, ranks)):
            start = sum(received[d][:r])
            places = np.arange(2 * (start + c)).reshape(-1, 2)[start:] + 1000 * d
            grad.append(places)
        np.testing.assert_array_equal(arrays["exchange/v/grad"], np.concatenate(grad))


def test_counted_all_to_all_bytes_equal_the_cost_formula(job):
    """The payload counted, through all_to_all_bytes, equals what left the rank, counted by hand: every
    row but its own (3 block exchanges and the counts of all_to_all_v)."""
    ranks, outputs = job
    for r, (_, facts) in enumerate(outputs):
        traffic = facts["exchange"]["traffic"]
        row_bytes = [2 * 3 * 2, 2 * 3 * 8, 2 * 3 * 4, 8]  # float16, float64, int32 rows; one int64 count
        assert traffic["all_to_all"] == ranks * sum(row_bytes)
        left = (ranks - 1) * sum(row_bytes)
        assert cost_model.all_to_all_bytes(traffic["all_to_all"], ranks) == pytest.approx(left, rel=1e-12)
        assert traffic["all_to_all_v"] == sum(W.v_counts(r, ranks)) * 2 * 4


# ---------------------------------------------------------------- one step, against one process
def _plain_step(case, groups):
    model = W.make_net(case, groups)
    xs, ys = W.batches()
    out = model(mdl.tensor(xs[0]))
    loss = W.loss_fn_for(model)(out, ys[0])
    loss.backward()
    return model, out.numpy(), loss.item()


@pytest.mark.parametrize("case", list(W.CASES))
def test_one_step_equals_one_process_with_a_group_per_rank(job, case):
    ranks, outputs = job
    plain, out, loss = _plain_step(case, ranks)
    layer, per = plain[1], W.BATCH // ranks
    grads = {name: p.grad.numpy() for name, p in plain.named_parameters() if p.grad is not None}
    kept = layer.routing.kept
    for r, (arrays, facts) in enumerate(outputs):
        step = facts[f"step_{case}"]
        np.testing.assert_allclose(arrays[f"step_{case}/out"], out[r * per:(r + 1) * per], rtol=1e-12, atol=1e-14)
        assert step["dropped_here"] == int((~kept[r * per:(r + 1) * per]).sum())
        assert step["dropped_all"] == layer.dropped_tokens
        names = [k.split("/", 2)[2] for k in arrays if k.startswith(f"step_{case}/grad/")]
        assert len(names + step["without_grad"]) == 5 + 4 * (W.EXPERTS // ranks)  # 5 replicated, this rank's experts
        for name in step["without_grad"]:  # an expert no token reached: no gradient, as in one process
            assert "experts." in name and name not in grads
        for name in names:
            np.testing.assert_allclose(arrays[f"step_{case}/grad/{name}"], grads[name], rtol=1e-10, atol=1e-13,
                                       err_msg=f"{case}: {name} on rank {r}")
    assert np.mean([facts[f"step_{case}"]["loss"] for _, facts in outputs]) == pytest.approx(loss, rel=1e-12)
    assert (layer.dropped_tokens > 0) == case.endswith("_drops")


@pytest.mark.parametrize("case", ["top1", "top2"])
def test_with_no_token_dropped_the_outputs_are_the_plain_layers_on_the_whole_batch(job, case):
    ranks, outputs = job
    _, out, _ = _plain_step(case, 1)
    got = np.concatenate([arrays[f"step_{case}/out"] for arrays, _ in outputs])
    np.testing.assert_allclose(got, out, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", list(W.CASES))
def test_a_steps_bytes_are_the_cost_models(job, case):
    ranks, outputs = job
    plain = W.make_net(case)
    replicated = sum(p.array.nbytes for n, p in plain.named_parameters() if "experts." not in n)
    sent = received = 0
    for _, facts in outputs:
        step = facts[f"step_{case}"]
        want = cost_model.expert_parallel_step_payloads(step["exchange"]["sent"], step["exchange"]["received"],
                                                        W.IN, W.OUT, W.EXPERTS, itemsize=8,
                                                        replicated_bytes=replicated)
        assert step["traffic"] == want
        sent += step["exchange"]["sent"]
        received += step["exchange"]["received"]
    assert sent == received  # every row that left a rank arrived at one


# ---------------------------------------------------------------- training through the Trainer, and whole state
@pytest.mark.parametrize("case", ["top2", "top1_drops"])
def test_trainer_run_with_clipping_equals_one_process_and_saves_its_whole_state(job, case):
    from minidl.train import Trainer
    ranks, outputs = job
    plain = W.make_net(case, ranks)
    opt = optim.Adam(plain.parameters(), lr=W.LR)
    xs, ys = W.batches()
    trainer = Trainer(plain, opt, list(zip(xs, ys)), loss_fn=W.loss_fn_for(plain), max_grad_norm=W.CLIP,
                      progress=False, metrics=())
    trainer.fit(epochs=1)
    state, opt_state = plain.state_dict(), opt.state_dict()
    for arrays, facts in outputs:
        got = facts[f"trained_{case}"]
        assert got["keys"] == list(state)
        assert got["train_loss"] == pytest.approx(trainer.history[-1]["train_loss"], rel=1e-10)
        for key, value in state.items():
            np.testing.assert_allclose(arrays[f"trained_{case}/state/{key}"], np.asarray(value), rtol=1e-9, atol=1e-12,
                                       err_msg=key)
        assert got["opt_positions"] == sorted(opt_state["state"])
        for pos, entry in opt_state["state"].items():
            for k, v in entry.items():
                if hasattr(v, "shape"):
                    np.testing.assert_allclose(arrays[f"trained_{case}/opt/{pos}/{k}"], np.asarray(v), rtol=1e-9,
                                               atol=1e-12, err_msg=f"{pos}/{k}")
