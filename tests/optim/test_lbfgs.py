"""LBFGS: the same iterates as torch.optim.LBFGS (Rosenbrock, a small MLP; fixed step and strong
Wolfe; float64), and its pieces checked on their own: the two-loop recursion against the dense
BFGS inverse-Hessian update, the cubic minimizer against a polynomial's root."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.optim.lbfgs import cubic_minimizer, two_loop_direction


def rosenbrock(x):
    """f(x) = Σ 100 (x_{i+1} − x_i²)² + (1 − x_i)², minimum 0 at x = 1."""
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
@pytest.mark.parametrize("history_size", [100, 3])
def test_rosenbrock_iterates_equal_pytorchs(torch, line_search, history_size):
    start = np.array([-1.5, 2.0, -0.5, 1.2])
    lr = 1.0 if line_search else 0.05
    x = mdl.tensor(start, requires_grad=True)
    tx = torch.tensor(start, requires_grad=True)
    opt = optim.LBFGS([x], lr=lr, max_iter=5, history_size=history_size, line_search_fn=line_search)
    topt = torch.optim.LBFGS([tx], lr=lr, max_iter=5, history_size=history_size, line_search_fn=line_search)

    def closure():
        opt.zero_grad()
        loss = rosenbrock(x)
        loss.backward()
        return loss

    def tclosure():
        topt.zero_grad()
        loss = rosenbrock(tx)
        loss.backward()
        return loss

    # Along Rosenbrock's curved valley a last-bit difference (a dot product summed in another
    # order) grows about tenfold every few iterations: compared over the first 20 iterations
    # with the line search (60 without), where the two agree to 1e-12.
    for _ in range(4 if line_search else 12):
        ours, theirs = float(opt.step(closure)), float(topt.step(tclosure).detach())
        assert ours == pytest.approx(theirs, rel=1e-10, abs=1e-14)
        np.testing.assert_allclose(x.numpy(), tx.detach().numpy(), rtol=1e-10, atol=1e-12)
        state, tstate = opt.state[0], topt.state[tx]
        assert state["func_evals"] == tstate["func_evals"] and state["n_iter"] == tstate["n_iter"]
        assert len(state["old_dirs"]) == len(tstate["old_dirs"]) <= history_size
        assert state["t"] == pytest.approx(float(tstate["t"]), rel=1e-10)
    assert float(rosenbrock(x)) < 0.01 * float(rosenbrock(mdl.tensor(start)))  # it descends


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_small_mlp_iterates_equal_pytorchs(torch, line_search):
    rng = np.random.default_rng(0)
    xs, ys = rng.standard_normal((16, 3)), rng.standard_normal((16, 1))
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()
    with torch.no_grad():
        for p, tp in zip(model.parameters(), tmodel.parameters()):
            tp.copy_(torch.tensor(p.numpy()))
    lr = 1.0 if line_search else 0.5
    opt = optim.LBFGS(model.parameters(), lr=lr, max_iter=4, history_size=5, line_search_fn=line_search)
    topt = torch.optim.LBFGS(tmodel.parameters(), lr=lr, max_iter=4, history_size=5, line_search_fn=line_search)
    x, y, tx, ty = mdl.tensor(xs), mdl.tensor(ys), torch.tensor(xs), torch.tensor(ys)

    def closure():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    def tclosure():
        topt.zero_grad()
        loss = ((tmodel(tx) - ty) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(6):
        ours, theirs = float(opt.step(closure)), float(topt.step(tclosure).detach())
        assert ours == pytest.approx(theirs, rel=1e-9)
        for p, tp in zip(model.parameters(), tmodel.parameters()):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-7, atol=1e-10)
    assert float(closure()) < 0.5 * float(((mdl.tensor(ys) - ys.mean()) ** 2).mean())  # it fits


def test_two_loop_recursion_is_the_bfgs_inverse_hessian_applied_to_the_gradient():
    rng = np.random.default_rng(1)
    n, m = 5, 3
    pairs = []
    for _ in range(m):
        s = rng.standard_normal(n)
        y = s + 0.3 * rng.standard_normal(n)  # yᵀs > 0 for these draws
        assert y @ s > 0
        pairs.append((s, y))
    s_last, y_last = pairs[-1]
    gamma = (s_last @ y_last) / (y_last @ y_last)
    h = gamma * np.eye(n)  # the dense BFGS update (Nocedal & Wright 6.17), oldest pair first
    for s, y in pairs:
        rho = 1 / (y @ s)
        v = np.eye(n) - rho * np.outer(y, s)
        h = v.T @ h @ v + rho * np.outer(s, s)
    g = rng.standard_normal(n)
    p = two_loop_direction(g, [s for s, _ in pairs], [y for _, y in pairs], [1 / (y @ s) for s, y in pairs], gamma)
    np.testing.assert_allclose(p, -h @ g, rtol=1e-12)


def test_cubic_minimizer_finds_a_cubics_minimum():
    # f(a) = a³ − 3a (min at a = 1 on [0, 3]); f' = 3a² − 3
    f, df = (lambda a: a ** 3 - 3 * a), (lambda a: 3 * a * a - 3)
    assert cubic_minimizer(0.0, f(0.0), df(0.0), 3.0, f(3.0), df(3.0)) == pytest.approx(1.0, rel=1e-12)
    assert cubic_minimizer(3.0, f(3.0), df(3.0), 0.0, f(0.0), df(0.0)) == pytest.approx(1.0, rel=1e-12)
    assert cubic_minimizer(0.0, f(0.0), df(0.0), 3.0, f(3.0), df(3.0), bounds=(1.5, 2.0)) == 1.5  # clipped


def test_lbfgs_refuses_bad_settings_and_a_missing_closure():
    w = mdl.tensor(np.zeros(2), requires_grad=True)
    with pytest.raises(ValueError, match="line_search_fn must be None or 'strong_wolfe'"):
        optim.LBFGS([w], line_search_fn="armijo")
    with pytest.raises(ValueError, match="history_size must be a whole number"):
        optim.LBFGS([w], history_size=0)
    with pytest.raises(ValueError, match="one parameter group only"):
        optim.LBFGS([{"params": [w]}, {"params": [mdl.tensor(np.zeros(1), requires_grad=True)]}])
    with pytest.raises(TypeError, match="LBFGS.step needs a closure"):
        optim.LBFGS([w]).step()


def test_a_saved_state_continues_the_same_iterates(tmp_path):
    start = np.array([-1.5, 2.0, -0.5])

    def run(opt, x):
        def closure():
            opt.zero_grad()
            loss = rosenbrock(x)
            loss.backward()
            return loss
        opt.step(closure)

    x = mdl.tensor(start, requires_grad=True)
    opt = optim.LBFGS([x], max_iter=3, line_search_fn="strong_wolfe")
    run(opt, x)
    mdl.save(opt.state_dict(), tmp_path / "opt.safetensors")
    saved_x = x.numpy().copy()
    run(opt, x)  # the uninterrupted run

    y = mdl.tensor(saved_x, requires_grad=True)
    resumed = optim.LBFGS([y], max_iter=3, line_search_fn="strong_wolfe")
    resumed.load_state_dict(mdl.load(tmp_path / "opt.safetensors"))
    run(resumed, y)
    np.testing.assert_array_equal(y.numpy(), x.numpy())
    damaged = opt.state_dict()
    damaged["state"][0]["d"] = np.zeros(2)
    with pytest.raises(ValueError, match="d must be a vector of the parameters' total size 3"):
        resumed.load_state_dict(damaged)


def test_lbfgs_on_the_gpu_gives_the_cpus_iterates(device):
    start = np.array([-1.5, 2.0, -0.5, 1.2])
    results = []
    for where in ("cpu", device):
        x = mdl.tensor(start, requires_grad=True, device=where)
        opt = optim.LBFGS([x], max_iter=5, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = rosenbrock(x)
            loss.backward()
            return loss
        for _ in range(2):
            opt.step(closure)
        assert x.device.startswith(where)
        results.append(x.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12)
