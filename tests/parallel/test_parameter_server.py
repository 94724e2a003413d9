"""The parameter server on real MPI ranks (1 server + 1 worker, 1 + 3, 2 + 2).

Synchronous: the servers' weights after 15 steps equal one process's on the global batch, for SGD, SGD
with momentum and Adam (each server keeping its shard's state), and through the Trainer too.

Asynchronous with bounded staleness τ (plain SGD on a linear regression, seed 5): τ = 0 equals the
synchronous run; for τ > 0 the run equals a NumPy replay of the delayed update

    a_{t+1} = a_t − η Σ_w c_w ∇L_{t,w}(a_{v(w,t)}),    c_w = n_w / B,   t − v(w,t) ≤ τ,

and differs from the synchronous run s_t by a measured amount that the following bound holds. Each
step's loss is a quadratic with Hessian H_t = Σ_w c_w H_{t,w}, so a_{t+1} = a_t − η(H_t a_t − b_t)
+ η Σ_w c_w H_{t,w} (a_t − a_{v(w,t)}), and the error e = a − s obeys

    e_{t+1} = (I − η H_t) e_t + η Σ_w c_w H_{t,w} (a_t − a_{v(w,t)}).

With 0 ≤ η λ_max(H_t) ≤ 2 (checked), ‖I − η H_t‖ ≤ 1, hence, from e_0 = 0,

    ‖a_K − s_K‖ ≤ Σ_t η Σ_w c_w ‖H_{t,w}‖ · ‖a_t − a_{v(w,t)}‖,

each term computed from the replayed run (‖H_{t,w}‖ = 2 σ_max(X̃_{t,w})² / (3 n_w) for the mean
squared error over 3 outputs, X̃ the inputs with a column of ones for the bias).
"""
import json
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl.parallel import cost_model, launch, shard_bounds

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ps_worker  # noqa: E402
import scheme_cases as cases  # noqa: E402

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")

LAYOUTS = [(2, 1), (4, 1), (4, 2)]  # (ranks, servers)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda rs: f"{rs[0]}ranks-{rs[1]}servers")
def job(request, tmp_path_factory):
    ranks, servers = request.param
    out = tmp_path_factory.mktemp(f"ps{ranks}-{servers}")
    result = launch.run(ranks, [os.path.join(HERE, "ps_worker.py"), str(out), str(servers)], timeout=300)
    assert result.returncode == 0, f"mpiexec failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    facts = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    return ranks, servers, out, facts


def _weights(out, name):
    got = np.load(out / f"{name}.npz")
    return [got[f"arr_{k}"] for k in range(len(got.files))]


@pytest.mark.parametrize("name,kind", [("sync_sgd", "sgd"), ("sync_momentum", "momentum"), ("sync_adam", "adam"),
                                       ("trainer", "momentum")])
def test_synchronous_equals_one_process(job, name, kind):
    _, _, out, facts = job
    want, losses = cases.one_process("mlp", kind)
    start = [p.array for p in cases.make_model("mlp").parameters()]
    assert max(np.abs(w - s).max() for w, s in zip(want, start)) > 1e-2  # the steps move the weights
    for k, (g, w) in enumerate(zip(_weights(out, name), want)):
        # float64 sums of the workers' pushes in another order: last-place differences over 15 steps
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12, err_msg=f"{name} parameter {k}")
    logged = facts[0]["trainer" if name == "trainer" else name]["losses"]
    np.testing.assert_allclose(logged, losses, rtol=1e-12, atol=0)  # every rank logs the global batch's loss


def test_servers_hold_the_optimizer_state_in_shards(job):
    ranks, servers, out, facts = job
    for rank in range(ranks):  # a server: the momentum of its own parameters only; a worker: none
        fact = facts[rank]["sync_momentum"]
        assert fact["own_state"] == fact["own_params"]
        assert fact["whole_module_matches"]
    assert sorted(p for r in range(servers) for p in facts[r]["sync_momentum"]["own_state"]) == list(range(4))
    model = cases.make_model("mlp")
    opt = cases.make_optimizer(model.parameters(), "momentum")
    for x, y in cases.batches("mlp"):
        opt.zero_grad()
        cases.loss_fn("mlp")(model(mdl.tensor(x)), mdl.tensor(y)).backward()
        opt.step()
    got = np.load(out / "momentum_state.npz")
    for k in range(4):  # consolidated: one process's momentum buffers
        np.testing.assert_allclose(got[f"arr_{k}"], opt.state[k]["b"], rtol=0, atol=1e-12)


def test_a_resume_from_the_whole_state_continues_the_one_process_run(job):
    _, _, out, _ = job
    want, _ = cases.one_process("mlp", "momentum", cases.STEPS + ps_worker.RESUMED)
    for g, w in zip(_weights(out, "resumed"), want):  # weights and momentum both restored on their servers
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


def test_staleness_zero_is_the_synchronous_run(job):
    _, _, out, _ = job
    want, _ = cases.one_process("linreg", "sgd")
    for g, w in zip(_weights(out, "async_0"), want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)


def _replay(staleness, workers, seed=ps_worker.SEED):
    """The delayed update in NumPy on Θ = [W | b] (3 × 6), the schedule rebuilt from its documented draws.
    Returns the final Θ and the bound on ‖a_K − s_K‖ (see the module docstring)."""
    model = cases.make_model("linreg")
    theta = np.concatenate([model.weight.array, model.bias.array[:, None]], axis=1)
    versions, held, age, bound = [theta], np.zeros(workers, int), np.zeros(workers, int), 0.0
    for t, (x, y) in enumerate(cases.batches("linreg")):
        xt = np.concatenate([x, np.ones((len(x), 1))], axis=1)
        lam = 2.0 / (3 * len(x)) * np.linalg.norm(xt, 2) ** 2
        assert cases.LR * lam <= 2.0  # ‖I − η H_t‖ ≤ 1: the bound's condition
        grad = np.zeros_like(theta)
        for w in range(workers):
            lo, hi = shard_bounds(len(x), w, workers)
            xw, yw, old = xt[lo:hi], y[lo:hi], versions[held[w]]
            c = (hi - lo) / len(x)
            grad += c * 2.0 / (3 * (hi - lo)) * (xw @ old.T - yw).T @ xw
            h_norm = 2.0 / (3 * (hi - lo)) * np.linalg.norm(xw, 2) ** 2
            bound += cases.LR * c * h_norm * np.linalg.norm(versions[t] - old)
        versions.append(versions[t] - cases.LR * grad)
        keep = np.random.default_rng([seed, t, 1]).random(workers) < 0.5
        pull = ~keep | (age + 1 > staleness)
        age = np.where(pull, 0, age + 1)
        held = np.where(pull, t + 1, held)
    return versions[-1], bound


def _mse(theta):
    data = cases.batches("linreg")
    x = np.concatenate([np.concatenate([x, np.ones((len(x), 1))], axis=1) for x, _ in data])
    y = np.concatenate([y for _, y in data])
    return float(((x @ theta.T - y) ** 2).mean())


@pytest.mark.parametrize("staleness", [1, 3])
def test_bounded_staleness_differs_by_at_most_the_bound(job, staleness):
    ranks, servers, out, _ = job
    workers = ranks - servers
    weight, bias = _weights(out, f"async_{staleness}")
    got = np.concatenate([weight, bias[:, None]], axis=1)
    replayed, bound = _replay(staleness, workers)
    np.testing.assert_allclose(got, replayed, rtol=0, atol=1e-12)  # the run is the delayed update
    sync_weight, sync_bias = cases.one_process("linreg", "sgd")[0]
    sync = np.concatenate([sync_weight, sync_bias[:, None]], axis=1)
    difference = np.linalg.norm(got - sync)
    assert 1e-6 < difference <= bound, (difference, bound)
    start = np.concatenate([cases.make_model("linreg").weight.array,
                            cases.make_model("linreg").bias.array[:, None]], axis=1)
    # it still trains: the loss over the 15 batches falls to within 25% of the synchronous run's
    assert _mse(got) < 0.2 * _mse(start)
    assert _mse(got) < 1.25 * _mse(sync)


@pytest.mark.parametrize("name", ["sync_sgd", "async_3"])
def test_traffic_is_the_cost_model(job, name):
    ranks, servers, _, facts = job
    workers, steps = ranks - servers, cases.STEPS
    pulls = sum(facts[r][name]["pulls"] for r in range(servers, ranks))  # each worker's pulls
    for rank in range(ranks):
        fact = facts[rank][name]
        if rank < servers:
            want = cost_model.parameter_server_step_payloads(fact["shard_bytes"][rank], workers, "server",
                                                             pulls=pulls / steps)
        else:
            want = cost_model.parameter_server_step_payloads(fact["param_bytes"], workers, "worker",
                                                             pulls=fact["pulls"] / steps)
        for op in ("send", "recv"):
            assert fact["traffic"].get(op, 0) == pytest.approx(want[op] * steps, rel=1e-12), (rank, op)
        assert set(fact["traffic"]) <= {"send", "recv"}  # point-to-point only: no collective in a step
    if name == "sync_sgd":
        assert pulls == workers * steps
    else:
        assert pulls < workers * steps  # the asynchronous workers skipped pulls


def test_expected_pull_fraction_matches_the_schedule():
    from minidl.parallel.parameter_server import StalenessSchedule
    for staleness in (0, 1, 3):
        schedule = StalenessSchedule(workers=50, staleness=staleness, seed=1)
        share = np.mean([schedule.pulls_after(t).mean() for t in range(400)])
        assert share == pytest.approx(cost_model.expected_pull_fraction(staleness), abs=0.02)


def test_bad_arguments_name_the_fix():
    from minidl import nn, parallel
    with pytest.raises(ValueError, match="servers must be an int in"):
        parallel.ParameterServer(nn.Linear(2, 2), parallel.LocalComm(), servers=1)  # no rank left for a worker
    assert cost_model.parameter_server_step_payloads(100, 3, "server", pulls=2) == {"send": 200.0, "recv": 300.0}
    assert cost_model.expected_pull_fraction(1) == pytest.approx(2 / 3)
