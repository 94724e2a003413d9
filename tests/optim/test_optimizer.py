"""The Optimizer base: groups, checkpoints, convergence of every optimizer, bad input, helpers."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from tests.optim._helpers import assert_same_trajectory, minidl_loss, minidl_params

# every optimizer with a learning rate that solves the test quadratic
ALL = {
    "SGD": lambda p: optim.SGD(p, lr=0.05, momentum=0.9),
    "NAG": lambda p: optim.NAG(p, lr=0.05),
    "SGDM": lambda p: optim.SGDM(p, lr=0.2),
    "AdaGrad": lambda p: optim.AdaGrad(p, lr=0.5),
    "RMSProp": lambda p: optim.RMSProp(p, lr=0.01, momentum=0.5, centered=True),
    "AdaDelta": lambda p: optim.AdaDelta(p, lr=1.0, eps=1e-2),
    "Adam": lambda p: optim.Adam(p, lr=0.05),
    "AdamW": lambda p: optim.AdamW(p, lr=0.05, weight_decay=1e-4),
    "AMSGrad": lambda p: optim.AMSGrad(p, lr=0.05),
    "NAdam": lambda p: optim.NAdam(p, lr=0.05),
    "RAdam": lambda p: optim.RAdam(p, lr=0.05),
    "LARS": lambda p: optim.LARS(p, lr=0.1, trust_coefficient=0.1),
    "LAMB": lambda p: optim.LAMB(p, lr=0.05),
    "NovoGrad": lambda p: optim.NovoGrad(p, lr=0.05),
    "AdaHessian": lambda p: optim.AdaHessian(p, lr=0.3, seed=0),
    "Lookahead": lambda p: optim.Lookahead(optim.Adam(p, lr=0.05)),
    "Ranger": lambda p: optim.Ranger(p, lr=0.1),
    "RangerLARS": lambda p: optim.RangerLARS(p, lr=0.1),
}
# a layer-wise trust ratio makes every step a fixed fraction of ‖w‖: these converge only as lr decays
DECAYED = {"LARS", "LAMB", "RangerLARS"}

CURVATURE = [np.array([1.0, 4.0, 0.5]), np.array([[2.0, 0.3, 1.0], [5.0, 1.5, 0.8]])]
TARGET = [np.array([0.5, -1.0, 0.2]), np.array([[-0.4, 0.1, 0.7], [0.2, -0.9, 0.3]])]


def quadratic(params):
    """½ Σ a(w − w*)², minimum at w*."""
    total = 0
    for p, a, target in zip(params, CURVATURE, TARGET):
        d = p - mdl.tensor(target, dtype=p.dtype)
        total = total + (0.5 * mdl.tensor(a, dtype=p.dtype) * d * d).sum()
    return total


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_converges_on_a_convex_quadratic(name, dtype):
    params = [mdl.tensor(np.ones(s), requires_grad=True, dtype=dtype) for s in [(3,), (2, 3)]]
    opt = ALL[name](params)
    lr0 = opt.param_groups[0]["lr"]
    scheduler = optim.ScheduleLR(opt, optim.schedules.exponential(lr0, 0.985 if name in DECAYED else 1.0))
    for _ in range(400):
        opt.zero_grad()
        quadratic(params).backward(create_graph=name == "AdaHessian")
        opt.step()
        scheduler.step()
    for p, target in zip(params, TARGET):
        assert p.dtype == np.dtype(dtype)  # float32 stays float32
        np.testing.assert_allclose(p.numpy(), target, atol=2e-2 if name == "NovoGrad" else 5e-3)


def _plain(value):
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, (np.ndarray, int, float, bool, str, type(None)))


@pytest.mark.parametrize("name", sorted(ALL))
def test_state_dict_resumes_the_same_trajectory(name):
    graph = name == "AdaHessian"

    def train(opt, params, steps):
        for _ in range(steps):
            opt.zero_grad()
            minidl_loss(params).backward(create_graph=graph)
            opt.step()

    params = minidl_params()
    opt = ALL[name](params)
    train(opt, params, 10)
    straight = [p.numpy().copy() for p in params]

    params = minidl_params()
    opt = ALL[name](params)
    train(opt, params, 4)
    saved = opt.state_dict()
    assert _plain(saved)
    train(opt, params, 2)  # wander off: the saved copy must not move with the live state
    resumed_params = [mdl.tensor(p, requires_grad=True) for p in [s for s in _weights_at_4(name)]]
    fresh = ALL[name](resumed_params)
    fresh.load_state_dict(saved)
    train(fresh, resumed_params, 6)
    assert_same_trajectory([[p.numpy() for p in resumed_params]], [straight], rtol=0, atol=0)


def _weights_at_4(name):
    params = minidl_params()
    opt = ALL[name](params)
    for _ in range(4):
        opt.zero_grad()
        minidl_loss(params).backward(create_graph=name == "AdaHessian")
        opt.step()
    return [p.numpy().copy() for p in params]


def test_parameter_groups_have_their_own_learning_rate_and_frozen_ones_stay():
    a = mdl.tensor(np.ones(2), requires_grad=True, dtype="float64")
    b = mdl.tensor(np.ones(2), requires_grad=True, dtype="float64")
    frozen = mdl.tensor(np.ones(2), requires_grad=False, dtype="float64")
    no_grad = mdl.tensor(np.ones(2), requires_grad=True, dtype="float64")
    opt = optim.SGD([{"params": [a], "lr": 0.01}, {"params": [b, frozen, no_grad]}], lr=0.1)
    for p in (a, b, frozen):
        p.grad = mdl.tensor(np.ones(2), dtype="float64")
    opt.step()
    np.testing.assert_allclose(a.numpy(), 0.99)
    np.testing.assert_allclose(b.numpy(), 0.9)
    np.testing.assert_array_equal(frozen.numpy(), 1.0)
    np.testing.assert_array_equal(no_grad.numpy(), 1.0)
    assert opt.state_dict()["param_groups"][1]["params"] == [1, 2, 3]


def test_step_never_writes_into_the_gradient():
    for name, make in ALL.items():
        params = minidl_params()
        opt = make(params)
        minidl_loss(params).backward(create_graph=name == "AdaHessian")
        before = [p.grad.numpy().copy() for p in params]
        if name != "AdaHessian":
            for p in params:
                p.grad.array.flags.writeable = False
        opt.step()
        for p, g in zip(params, before):
            np.testing.assert_array_equal(p.grad.numpy(), g, err_msg=name)


def test_closure_is_called_and_its_loss_returned():
    params = minidl_params()
    opt = optim.SGD(params, lr=0.1)

    def closure():
        opt.zero_grad()
        loss = minidl_loss(params)
        loss.backward()
        return loss
    assert float(opt.step(closure).item()) == pytest.approx(float(minidl_loss(minidl_params()).item()))


@pytest.mark.parametrize("make, message", [
    (lambda p: optim.SGD(p, lr=-0.1), "learning rate must be a number ≥ 0"),
    (lambda p: optim.Adam(p, betas=(0.9, 1.0)), r"betas must lie in \[0, 1\)"),
    (lambda p: optim.Adam(p, betas=(-0.1, 0.9)), r"betas must lie in \[0, 1\)"),
    (lambda p: optim.LAMB(p, betas=0.9), "pair"),
    (lambda p: optim.Adam(p, eps=0.0), "eps must be > 0"),
    (lambda p: optim.RMSProp(p, eps=-1e-8), "eps must be > 0"),
    (lambda p: optim.SGD(p, lr=0.1, momentum=1.5), r"momentum must lie in \[0, 1\)"),
    (lambda p: optim.AdamW(p, weight_decay=-1), "weight_decay must be a number ≥ 0"),
    (lambda p: optim.AdaHessian(p, hessian_power=2), r"hessian_power must lie in \[0, 1\]"),
    (lambda p: optim.SGD([{"params": p, "lr": -1}], lr=0.1), "learning rate"),
], ids=["lr", "beta2", "beta1", "betas-pair", "eps0", "eps-neg", "momentum", "decay", "power", "group-lr"])
def test_bad_hyperparameters_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make(minidl_params())


def test_bad_parameter_lists_raise():
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.Adam([])
    with pytest.raises(ValueError, match="empty parameter list"):
        optim.SGD(iter([]), lr=0.1)
    w = mdl.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(TypeError, match=r"wrap it in a list"):
        optim.SGD(w, lr=0.1)
    with pytest.raises(ValueError, match="more than one place"):
        optim.SGD([w, w], lr=0.1)
    with pytest.raises(TypeError, match="minidl Tensors"):
        optim.SGD([np.ones(2)], lr=0.1)

    class Model:
        def parameters(self):
            return [w]
    with pytest.raises(TypeError, match=r"model.parameters\(\)"):
        optim.SGD(Model(), lr=0.1)


def test_a_non_leaf_tensor_is_refused_with_the_fix():
    w = mdl.randn(3, requires_grad=True) * 0.01  # the scaled copy is what step() would change
    with pytest.raises(ValueError, match=r"SGD: can't optimize a non-leaf tensor \(shape \(3,\), made by Mul\)"
                                         r".*requires_grad_\(\).*nn.Parameter"):
        optim.SGD([w], lr=0.1)
    opt = optim.Adam([mdl.tensor(np.ones(2), requires_grad=True)])
    with pytest.raises(ValueError, match="non-leaf"):
        opt.add_param_group({"params": [w]})
    assert len(opt.param_groups) == 1
    optim.SGD([(mdl.randn(3) * 0.01).requires_grad_()], lr=0.1)  # the fix the message gives


@pytest.mark.parametrize("name", sorted(ALL))
def test_step_makes_a_graph_recorded_before_it_raise(name):
    """Every optimizer changes its parameters in place; a backward through a graph that saved them raises."""
    params = minidl_params()
    opt = ALL[name](params)
    minidl_loss(params).backward(create_graph=name == "AdaHessian")
    stale = sum((p * p).sum() for p in params)
    opt.step()
    with pytest.raises(RuntimeError, match="changed in place"):
        stale.backward()


def test_step_leaves_parameters_without_a_gradient_unmarked():
    w, frozen, v = (mdl.tensor(np.array([1.0, 2.0]), requires_grad=True) for _ in range(3))
    frozen.requires_grad = False
    opt = optim.SGD([w, frozen], lr=0.1)
    (w * w).sum().backward()
    y = (frozen * v).sum()  # dv reads the frozen parameter, which step() skips
    opt.step()
    y.backward()
    np.testing.assert_array_equal(v.grad.numpy(), [1.0, 2.0])
    np.testing.assert_allclose(w.numpy(), [0.8, 1.6])  # w ← w − 0.1·2w


def test_swa_swap_counts_as_an_in_place_change():
    w, v = mdl.tensor([1.0, 2.0], requires_grad=True), mdl.tensor([3.0, 4.0], requires_grad=True)
    swa = optim.SWA([w])
    swa.update()
    y = (w * v).sum()
    swa.swap()
    with pytest.raises(RuntimeError, match="Mul"):
        y.backward()


def test_load_state_dict_checks_the_shape_of_the_groups():
    saved = optim.Adam(minidl_params()).state_dict()
    with pytest.raises(ValueError, match="groups of sizes"):
        optim.Adam(minidl_params()[:1]).load_state_dict(saved)


# ---------------------------------------------------------------- helpers
def test_clip_grad_norm_matches_torch_and_keeps_old_buffers():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    params = [mdl.tensor(np.zeros_like(g), requires_grad=True, dtype="float64") for g in grads]
    for p, g in zip(params, grads):
        buffer = g.copy()
        buffer.flags.writeable = False
        p.grad = mdl.Tensor(buffer)
    total = optim.clip_grad_norm_(params, max_norm=1.0)
    expected = np.sqrt(sum((g ** 2).sum() for g in grads))
    assert float(total) == pytest.approx(expected, rel=1e-12)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.numpy(), g / (expected + 1e-6), rtol=1e-12)
    torch = pytest.importorskip("torch")
    tparams = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in grads]
    for p, g in zip(tparams, grads):
        p.grad = torch.tensor(g)
    assert float(torch.nn.utils.clip_grad_norm_(tparams, 1.0)) == pytest.approx(float(total), rel=1e-12)
    for p, t in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)


def test_clip_grad_norm_leaves_small_gradients_and_supports_inf():
    p = mdl.tensor(np.zeros(3), requires_grad=True, dtype="float64")
    p.grad = mdl.tensor([0.1, -0.2, 0.05], dtype="float64")
    assert float(optim.clip_grad_norm_([p], 10.0)) == pytest.approx(np.sqrt(0.0525))
    np.testing.assert_allclose(p.grad.numpy(), [0.1, -0.2, 0.05])
    assert float(optim.clip_grad_norm_([p], 0.1, norm_type=float("inf"))) == pytest.approx(0.2)
    np.testing.assert_allclose(p.grad.numpy(), np.array([0.1, -0.2, 0.05]) * 0.1 / (0.2 + 1e-6))


def test_clip_grad_value_():
    p = mdl.tensor(np.zeros(3), requires_grad=True)
    buffer = np.array([0.5, -3.0, 2.0], np.float32)
    buffer.flags.writeable = False
    p.grad = mdl.Tensor(buffer)
    optim.clip_grad_value_([p], 1.0)
    np.testing.assert_array_equal(p.grad.numpy(), [0.5, -1.0, 1.0])
    assert p.grad.dtype == np.float32


def test_l1_penalty_and_its_gradient():
    w = mdl.tensor([1.5, -2.0, 0.0], requires_grad=True, dtype="float64")
    v = mdl.tensor([[0.5, -0.25]], requires_grad=True, dtype="float64")
    penalty = optim.l1_penalty([w, v], 0.1)
    assert float(penalty.item()) == pytest.approx(0.1 * 4.25)
    penalty.backward()
    np.testing.assert_allclose(w.grad.numpy(), [0.1, -0.1, 0.0])
    np.testing.assert_allclose(v.grad.numpy(), [[0.1, -0.1]])


def test_weight_decay_groups_exempt_biases_and_norms():
    w = mdl.tensor(np.ones((2, 2)), requires_grad=True)
    b = mdl.tensor(np.ones(2), requires_grad=True)
    gamma = mdl.tensor(np.ones((1, 2)), requires_grad=True)
    frozen = mdl.tensor(np.ones((2, 2)))
    groups = optim.weight_decay_groups([("fc.weight", w), ("fc.bias", b), ("norm.weight", gamma),
                                        ("embed.weight", frozen)], 0.05, lr=0.1)
    assert [len(g["params"]) for g in groups] == [1, 2]
    assert groups[0]["params"][0] is w and groups[0]["weight_decay"] == 0.05 and groups[1]["weight_decay"] == 0
    assert all(g["lr"] == 0.1 for g in groups)
    plain = optim.weight_decay_groups([w, b], 0.05)
    assert plain[0]["params"] == [w] and plain[1]["params"] == [b]
    opt = optim.AdamW(groups)
    assert opt.param_groups[1]["weight_decay"] == 0.0


def test_runs_on_the_device(device):
    w = mdl.tensor(np.linspace(-1, 1, 3000).astype(np.float32), requires_grad=True, device=device)
    for make in (ALL["Adam"], ALL["SGD"], ALL["RMSProp"], ALL["LAMB"], ALL["Ranger"]):
        opt = make([w])
        (w * w).sum().backward()
        opt.step()
        opt.zero_grad()
    assert w.device.startswith(device) and w.dtype == np.float32


# ---------------------------------------------------------------- checked loads: through a file, all or nothing
def _stepped(name, steps):
    graph = name == "AdaHessian"
    params = minidl_params()
    opt = ALL[name](params)
    for _ in range(steps):
        opt.zero_grad()
        minidl_loss(params).backward(create_graph=graph)
        opt.step()
    return opt, params


@pytest.mark.parametrize("name", sorted(ALL))
def test_state_dict_through_a_file_resumes_the_same_trajectory(tmp_path, name):
    graph = name == "AdaHessian"
    opt, params = _stepped(name, 3)
    mdl.save(opt.state_dict(), tmp_path / "opt.safetensors")
    copies = [mdl.tensor(p.numpy().copy(), requires_grad=True) for p in params]
    fresh = ALL[name](copies)
    fresh.load_state_dict(mdl.load(tmp_path / "opt.safetensors"))
    for o, ps in ((opt, params), (fresh, copies)):
        for _ in range(3):
            o.zero_grad()
            minidl_loss(ps).backward(create_graph=graph)
            o.step()
    for a, b in zip(params, copies):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def _adam_state():
    opt, _ = _stepped("Adam", 2)
    return opt.state_dict()


def _set(path, value):
    def damage(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return damage


def _drop(path):
    def damage(state):
        target = state
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return damage


BAD_ADAM = {
    "no v": (_drop(["state", 0, "v"]), "missing \\['v'\\]"),
    "m is text": (_set(["state", 0, "m"], "abc"), "m must be an array of shape \\(3,\\) and dtype float64"),
    "m mis-shaped": (_set(["state", 1, "m"], np.zeros(3)), "m must be an array of shape \\(2, 3\\)"),
    "m of another dtype": (_set(["state", 0, "m"], np.zeros(3, np.float32)), "dtype float64"),
    "t negative": (_set(["state", 0, "t"], -1), "t must be a count"),
    "t a bool": (_set(["state", 0, "t"], True), "t must be a count"),
    "t a float": (_set(["state", 0, "t"], 2.0), "t must be a count"),
    "an extra key": (_set(["state", 0, "s"], np.zeros(3)), "unexpected \\['s'\\]"),
    "betas[0] is text": (_set(["param_groups", 0, "betas"], ("abc", 0.999)), "betas\\[0\\] must be like"),
    "betas of three": (_set(["param_groups", 0, "betas"], (0.9, 0.99, 0.9)), "betas must be like"),
    "betas out of range": (_set(["param_groups", 0, "betas"], (1.5, 0.999)), "must lie in \\[0, 1\\)"),
    "lr is NaN": (_set(["param_groups", 0, "lr"], float("nan")), "lr must be like"),
    "lr negative": (_set(["param_groups", 0, "lr"], -1.0), "learning rate must be a number ≥ 0"),
    "amsgrad a number": (_set(["param_groups", 0, "amsgrad"], 1), "amsgrad must be like"),
    "lr renamed": (lambda s: s["param_groups"][0].__setitem__("rate", s["param_groups"][0].pop("lr")),
                   "missing \\['lr'\\], unexpected \\['rate'\\]"),
    "a position past the end": (_set(["state", 9], {}), "positions .* run from 0 to 1"),
    "params listed wrongly": (_set(["param_groups", 0, "params"], [1, 0]), "lists the parameter positions"),
    "a state that is a list": (_set(["state", 0], [1, 2]), "must be a dict"),
    "no groups": (_drop(["param_groups"]), "expected \\{'state'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ADAM))
def test_a_damaged_state_raises_and_leaves_the_optimizer_as_it_was(case):
    damage, message = BAD_ADAM[case]
    state = _adam_state()
    damage(state)
    opt, params = _stepped("Adam", 1)
    before, weights = opt.state_dict(), [p.numpy().copy() for p in params]
    with pytest.raises(ValueError, match=message):
        opt.check_state_dict(state)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for pos in before["state"]:
        for key, value in before["state"][pos].items():
            np.testing.assert_array_equal(after["state"][pos][key], value)
    opt.zero_grad()
    minidl_loss(params).backward()
    opt.step()   # still a working optimizer
    assert all(not np.array_equal(p.numpy(), w) for p, w in zip(params, weights))


def test_amsgrad_state_must_match_the_saved_groups():
    state = _adam_state()                      # plain Adam: no v_max
    state["param_groups"][0]["amsgrad"] = True
    with pytest.raises(ValueError, match="missing \\['v_max'\\]"):
        optim.Adam(minidl_params(), lr=0.05).load_state_dict(state)
