"""Lookahead, SWA, Ranger, RangerLARS and update_bn."""
import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.optim import layerwise
from tests.optim._helpers import assert_same_trajectory, gradient, hand_run, minidl_params, run_minidl


def test_lookahead_k1_alpha1_is_the_inner_optimizer():
    ours = run_minidl(lambda p: optim.Lookahead(optim.Adam(p, lr=0.05), k=1, alpha=1.0), 10)
    inner = run_minidl(lambda p: optim.Adam(p, lr=0.05), 10)
    assert_same_trajectory(ours, inner, rtol=0, atol=0)


def test_lookahead_by_hand():
    """SGD inner steps; every k = 3 steps φ ← φ + α(θ − φ), θ ← φ."""
    def update(w, g, s):
        s.setdefault("phi", w.copy())
        s["n"] = s.get("n", 0) + 1
        new = w - 0.1 * g
        if s["n"] % 3 == 0:
            s["phi"] = s["phi"] + 0.5 * (new - s["phi"])
            new = s["phi"].copy()
        return new
    ours = run_minidl(lambda p: optim.Lookahead(optim.SGD(p, lr=0.1), k=3, alpha=0.5), 7)
    assert_same_trajectory(ours, hand_run(update, 7), rtol=1e-12)


def test_ranger_is_lookahead_over_radam_with_decoupled_decay():
    ranger = run_minidl(lambda p: optim.Ranger(p, lr=0.05, weight_decay=0.1), 14)
    manual = run_minidl(lambda p: optim.Lookahead(optim.RAdam(p, lr=0.05, betas=(0.95, 0.999), eps=1e-5,
                                                              weight_decay=0.1, decoupled_weight_decay=True),
                                                  k=6, alpha=0.5), 14)
    assert_same_trajectory(ranger, manual, rtol=0, atol=0)


def test_ranger_lars_with_trust_one_is_ranger(monkeypatch):
    monkeypatch.setattr(layerwise, "trust_ratio", lambda a, b: 1.0)
    from minidl.optim import averaging
    monkeypatch.setattr(averaging, "trust_ratio", lambda a, b: 1.0)
    assert_same_trajectory(run_minidl(lambda p: optim.RangerLARS(p, lr=0.05, weight_decay=0.1), 14),
                           run_minidl(lambda p: optim.Ranger(p, lr=0.05, weight_decay=0.1), 14), rtol=1e-12)


def test_ranger_lars_scales_each_layer_by_its_trust_ratio():
    params = minidl_params()
    opt = optim.RangerLARS(params, lr=0.1)
    before = [p.numpy().copy() for p in params]
    for p in params:
        p.grad = mdl.tensor(gradient(p.numpy()))
    opt.step()
    for w0, p in zip(before, params):  # first step: RAdam's momentum step r = g, u = r
        g = gradient(w0)
        trust = np.linalg.norm(w0) / np.linalg.norm(g)
        np.testing.assert_allclose(p.numpy(), w0 - 0.1 * trust * g, rtol=1e-12)


def test_swa_is_the_mean_of_its_snapshots():
    w = mdl.tensor(np.zeros(4), requires_grad=True, dtype="float64")
    swa = optim.SWA([w])
    snapshots = [np.random.default_rng(i).standard_normal(4) for i in range(5)]
    for snap in snapshots:
        w.array[...] = snap
        swa.update()
    np.testing.assert_allclose(swa.averages[0], np.mean(snapshots, axis=0), rtol=1e-12)
    swa.swap()
    np.testing.assert_allclose(w.numpy(), np.mean(snapshots, axis=0), rtol=1e-12)
    swa.swap()
    np.testing.assert_array_equal(w.numpy(), snapshots[-1])
    restored = optim.SWA([w])
    restored.load_state_dict(swa.state_dict())
    assert restored.n_averaged == 5
    np.testing.assert_array_equal(restored.averages[0], swa.averages[0])


def test_swa_swap_before_update_raises():
    with pytest.raises(RuntimeError, match="update"):
        optim.SWA([mdl.tensor(np.ones(2), requires_grad=True)]).swap()


def test_update_bn_recomputes_running_statistics():
    nn = pytest.importorskip("minidl.nn")
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((8, 3)).astype(np.float32) for _ in range(4)]
    model.eval()
    optim.update_bn([(b, None) for b in batches], model)
    bn = model[1] if hasattr(model, "__getitem__") else list(model.modules())[-1]
    with mdl.no_grad():
        hidden = [model[0](mdl.Tensor(b)).numpy() for b in batches]
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean([h.mean(axis=0) for h in hidden], axis=0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), np.mean([h.var(axis=0, ddof=1) for h in hidden], axis=0),
                               rtol=1e-5, atol=1e-6)
    assert bn.momentum == 0.1 and not model.training


def test_lookahead_rejects_bad_arguments():
    w = mdl.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(ValueError, match="k"):
        optim.Lookahead(optim.SGD([w], lr=0.1), k=0)
    with pytest.raises(ValueError, match="alpha"):
        optim.Lookahead(optim.SGD([w], lr=0.1), alpha=1.5)
    with pytest.raises(TypeError, match="inner optimizer"):
        optim.Lookahead([w])
