"""optim.lr_scheduler: PyTorch's names and learning-rate sequences (against torch.optim.lr_scheduler),
closed forms, ReduceLROnPlateau's rules, OneCycleLR's momentum, state dicts through mdl.save/mdl.load."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.optim import lr_scheduler

LRS = (0.1, 0.03)


def our_optimizer(kind="sgd", lrs=LRS):
    groups = [{"params": [mdl.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs]
    return optim.SGD(groups, lr=lrs[0], momentum=0.9) if kind == "sgd" else optim.Adam(groups, lr=lrs[0])


def torch_optimizer(torch, kind="sgd", lrs=LRS):
    groups = [{"params": [torch.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], momentum=0.9) if kind == "sgd" else torch.optim.Adam(groups, lr=lrs[0])


def momentum_of(group):
    return group["betas"][0] if "betas" in group else group["momentum"]


def sequences(opt, scheduler, steps, metrics=None, torch_opt=False):
    """Per step (the constructor's included): every group's lr, get_last_lr() and momentum."""
    out = []
    for k in range(steps + 1):
        if k:
            if torch_opt:
                opt.step()  # no gradients: changes nothing, keeps torch from warning about the order
            scheduler.step(*(() if metrics is None else (metrics[k - 1],)))
        out.append(([float(g["lr"]) for g in opt.param_groups], list(scheduler.get_last_lr()),
                    [float(momentum_of(g)) for g in opt.param_groups]))
    return out


def compare(ours, theirs, rtol=1e-12):
    for k, ((lr_o, last_o, m_o), (lr_t, last_t, m_t)) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(lr_o, lr_t, rtol=rtol, atol=1e-15, err_msg=f"lr at step {k}")
        np.testing.assert_allclose(last_o, [float(x) for x in last_t], rtol=rtol, atol=1e-15,
                                   err_msg=f"get_last_lr at step {k}")
        np.testing.assert_allclose(m_o, m_t, rtol=rtol, atol=1e-15, err_msg=f"momentum at step {k}")


CASES = [
    ("StepLR", dict(step_size=7, gamma=0.5), 40),
    ("StepLR", dict(step_size=1), 10),
    ("MultiStepLR", dict(milestones=[3, 10, 10, 25], gamma=0.3), 40),
    ("ExponentialLR", dict(gamma=0.93), 60),
    ("CosineAnnealingLR", dict(T_max=12), 50),  # past T_max: back up the cosine, as torch
    ("CosineAnnealingLR", dict(T_max=20, eta_min=0.004), 45),
    ("LinearLR", {}, 12),
    ("LinearLR", dict(start_factor=0.05, end_factor=0.8, total_iters=17), 30),
    ("LinearLR", dict(start_factor=1.0, end_factor=0.0, total_iters=9), 15),
    ("OneCycleLR", dict(max_lr=1.0, total_steps=40), 40),
    ("OneCycleLR", dict(max_lr=[0.5, 2.0], total_steps=37, anneal_strategy="linear", pct_start=0.25), 37),
    ("OneCycleLR", dict(max_lr=0.8, epochs=4, steps_per_epoch=11, three_phase=True), 44),
    ("OneCycleLR", dict(max_lr=0.8, total_steps=30, three_phase=True, anneal_strategy="linear",
                        div_factor=10.0, final_div_factor=100.0, base_momentum=0.8, max_momentum=0.9), 30),
    ("OneCycleLR", dict(max_lr=0.8, total_steps=30, cycle_momentum=False), 30),
]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name,kwargs,steps", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_sequence_matches_torch(torch, name, kwargs, steps, kind):
    ours_opt, theirs_opt = our_optimizer(kind), torch_optimizer(torch, kind)
    ours = getattr(lr_scheduler, name)(ours_opt, **kwargs)
    theirs = getattr(torch.optim.lr_scheduler, name)(theirs_opt, **kwargs)
    compare(sequences(ours_opt, ours, steps), sequences(theirs_opt, theirs, steps, torch_opt=True))
    assert ours.last_epoch == theirs.last_epoch == steps


def test_lambda_lr_matches_torch_with_one_and_per_group_functions(torch):
    for lam in (lambda e: 0.97 ** e, [lambda e: 1 / (1 + e), lambda e: 0.5 * (1 + math.cos(e / 3))]):
        ours_opt, theirs_opt = our_optimizer(), torch_optimizer(torch)
        ours, theirs = lr_scheduler.LambdaLR(ours_opt, lam), torch.optim.lr_scheduler.LambdaLR(theirs_opt, lam)
        compare(sequences(ours_opt, ours, 25), sequences(theirs_opt, theirs, 25, torch_opt=True))


SEQUENTIAL = [
    (lambda m, o: [m.LinearLR(o, start_factor=0.1, total_iters=5), m.CosineAnnealingLR(o, T_max=10)], [5], 25),
    (lambda m, o: [m.StepLR(o, 2, 0.5), m.MultiStepLR(o, [2, 4]), m.ExponentialLR(o, 0.9)], [4, 9], 20),
    (lambda m, o: [m.ExponentialLR(o, 0.8), m.LinearLR(o, 0.5, 1.0, 3)], [0], 8),
]


@pytest.mark.parametrize("make,milestones,steps", SEQUENTIAL)
def test_sequential_lr_matches_torch(torch, make, milestones, steps):
    ours_opt, theirs_opt = our_optimizer(), torch_optimizer(torch)
    ours = lr_scheduler.SequentialLR(ours_opt, make(lr_scheduler, ours_opt), milestones)
    theirs = torch.optim.lr_scheduler.SequentialLR(theirs_opt, make(torch.optim.lr_scheduler, theirs_opt),
                                                   milestones)
    compare(sequences(ours_opt, ours, steps), sequences(theirs_opt, theirs, steps, torch_opt=True))


PLATEAU = [
    {}, dict(patience=2), dict(patience=0, factor=0.5), dict(mode="max", patience=1),
    dict(threshold=0.05, patience=1), dict(threshold_mode="abs", threshold=0.02, patience=1),
    dict(mode="max", threshold_mode="abs", threshold=0.01, patience=0, cooldown=2),
    dict(patience=1, cooldown=3, factor=0.3), dict(patience=0, min_lr=0.01, factor=0.5),
    dict(patience=0, min_lr=[0.02, 0.0], factor=0.2), dict(patience=0, factor=0.9, eps=0.004),
]


@pytest.mark.parametrize("kwargs", PLATEAU)
def test_reduce_lr_on_plateau_matches_torch(torch, kwargs):
    rng = np.random.default_rng(0)
    # a loss that improves, stalls (with small and larger wiggles), improves, then plateaus for good
    metrics = np.concatenate([np.linspace(1.0, 0.5, 6), 0.5 + rng.uniform(-0.01, 0.015, 8),
                              np.linspace(0.48, 0.3, 5), 0.3 + rng.uniform(-0.02, 0.03, 25)])
    if kwargs.get("mode") == "max":
        metrics = 1 - metrics
    ours_opt, theirs_opt = our_optimizer(), torch_optimizer(torch)
    ours = lr_scheduler.ReduceLROnPlateau(ours_opt, **kwargs)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(theirs_opt, **kwargs)
    got = sequences(ours_opt, ours, len(metrics), metrics=[mdl.tensor(m) for m in metrics])
    compare(got, sequences(theirs_opt, theirs, len(metrics), metrics=list(metrics), torch_opt=True))
    assert len({tuple(lrs) for lrs, _, _ in got}) > 1  # the schedule did reduce
    assert ours.best == theirs.best and ours.num_bad_epochs == theirs.num_bad_epochs
    assert ours.cooldown_counter == theirs.cooldown_counter


def test_reduce_lr_on_plateau_by_the_rules():
    opt = our_optimizer(lrs=(1.0,))
    s = lr_scheduler.ReduceLROnPlateau(opt, patience=2, factor=0.5, cooldown=1)
    for metric, lr in [(1.0, 1.0), (1.0, 1.0), (1.0, 1.0), (1.0, 0.5),  # 3 bad steps > patience 2: halve
                       (1.0, 0.5),                                        # cooldown: not counted
                       (1.0, 0.5), (1.0, 0.5), (1.0, 0.25),               # 3 more bad steps
                       (0.5, 0.25), (0.49996, 0.25), (0.49996, 0.25), (0.49996, 0.125)]:  # < rel 1e-4: bad
        s.step(metric)
        assert s.get_last_lr() == [lr]


def closed_forms():
    return {
        "StepLR": (dict(step_size=3, gamma=0.5), lambda t: 0.5 ** (t // 3)),
        "MultiStepLR": (dict(milestones=[2, 5], gamma=0.1), lambda t: 0.1 ** ((t >= 2) + (t >= 5))),
        "ExponentialLR": (dict(gamma=0.9), lambda t: 0.9 ** t),
        "CosineAnnealingLR": (dict(T_max=8), lambda t: (1 + math.cos(math.pi * t / 8)) / 2),
        "LinearLR": (dict(start_factor=0.25, total_iters=4), lambda t: 0.25 + 0.75 * min(t, 4) / 4),
    }


@pytest.mark.parametrize("name", list(closed_forms()))
def test_closed_forms_without_torch(name):
    kwargs, factor = closed_forms()[name]
    opt = our_optimizer()
    s = getattr(lr_scheduler, name)(opt, **kwargs)
    for t in range(20):
        np.testing.assert_allclose(s.get_last_lr(), [lr * factor(t) for lr in LRS], rtol=1e-12, atol=1e-16)
        s.step()


def test_one_cycle_by_the_formula_and_its_end():
    opt = our_optimizer("adam", lrs=(0.1,))
    s = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=10, pct_start=0.3)
    lrs, betas = [], []
    for t in range(11):
        lrs.append(s.get_last_lr()[0])
        betas.append(opt.param_groups[0]["betas"])
        if t < 10:
            s.step()
    assert lrs[0] == pytest.approx(1 / 25) and lrs[2] == pytest.approx(1.0) and lrs[9] == pytest.approx(1 / 25 / 1e4)
    assert lrs[1] == pytest.approx(1.0 + (1 / 25 - 1.0) / 2 * (math.cos(math.pi * 0.5) + 1))
    assert betas[0] == (0.95, 0.999) and betas[2][0] == pytest.approx(0.85) and isinstance(betas[2], tuple)
    with pytest.raises(ValueError, match="OneCycleLR: tried to step 11 times"):
        s.step()
    with pytest.raises(ValueError, match="cycle_momentum=True needs an optimizer with a momentum or betas"):
        lr_scheduler.OneCycleLR(optim.AdaGrad([mdl.zeros(1, requires_grad=True)]), max_lr=1.0, total_steps=5)
    with pytest.raises(ValueError, match="give total_steps, or epochs and steps_per_epoch"):
        lr_scheduler.OneCycleLR(our_optimizer(), max_lr=1.0)


# ---------------------------------------------------------------- state dicts
class Halving:
    """A callable object: LambdaLR saves its attributes (PyTorch's rule), never the object."""

    def __init__(self):
        self.rate = 0.5

    def __call__(self, epoch):
        return self.rate ** (epoch // 4)


RESUMABLE = [
    lambda m, o: m.StepLR(o, 4, 0.5),
    lambda m, o: m.MultiStepLR(o, [3, 10], 0.2),
    lambda m, o: m.ExponentialLR(o, 0.9),
    lambda m, o: m.CosineAnnealingLR(o, 9, 0.001),
    lambda m, o: m.LinearLR(o, 0.1, 0.9, 10),
    lambda m, o: m.LambdaLR(o, [lambda e: 0.9 ** e, Halving()]),
    lambda m, o: m.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=16, three_phase=True),
    lambda m, o: m.SequentialLR(o, [m.LinearLR(o, 0.5, total_iters=3), m.ExponentialLR(o, 0.8)], [4]),
    lambda m, o: m.ReduceLROnPlateau(o, patience=1, cooldown=1, min_lr=[0.0, 0.001]),
]


@pytest.mark.parametrize("make", RESUMABLE, ids=[f"s{i}" for i in range(len(RESUMABLE))])
def test_state_dict_round_trips_through_save_and_load(make, tmp_path):
    metrics = [1.0, 0.9, 0.95, 0.97, 0.99, 0.9, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0, 1.0]
    plateau = isinstance(make(lr_scheduler, our_optimizer()), lr_scheduler.ReduceLROnPlateau)

    def run(s, opt, ks):
        for k in ks:
            s.step(metrics[k]) if plateau else s.step()
        return [float(g["lr"]) for g in opt.param_groups], [float(momentum_of(g)) for g in opt.param_groups]

    opt = our_optimizer()
    straight = make(lr_scheduler, opt)
    want = [run(straight, opt, [k]) for k in range(16)]

    opt = our_optimizer()
    first = make(lr_scheduler, opt)
    run(first, opt, range(7))
    if isinstance(first, lr_scheduler.LambdaLR):
        first.lr_lambdas[1].rate = 0.25  # the object's state is what gets saved
        want = None
    mdl.save({"scheduler": first.state_dict(), "optimizer_lrs": [g["lr"] for g in opt.param_groups]},
             tmp_path / "s.safetensors")
    saved = mdl.load(tmp_path / "s.safetensors")

    opt2 = our_optimizer()
    second = make(lr_scheduler, opt2)
    second.check_state_dict(saved["scheduler"])
    second.load_state_dict(saved["scheduler"])
    assert second.get_last_lr() == first.get_last_lr() == saved["optimizer_lrs"]
    assert [g["lr"] for g in opt2.param_groups] == saved["optimizer_lrs"]
    if want is None:  # LambdaLR: the restored object attribute drives the rest
        assert second.lr_lambdas[1].rate == 0.25
        return
    got = [run(second, opt2, [k]) for k in range(7, 16)]
    np.testing.assert_allclose(np.array(got, float), np.array(want[7:], float), rtol=1e-15)
    assert len({tuple(lrs) for lrs, _ in want[7:]}) > 1  # the rest of the schedule is not constant


def test_load_state_dict_checks_before_changing():
    opt = our_optimizer()
    s = lr_scheduler.StepLR(opt, 3)
    s.step()
    good = s.state_dict()
    for bad, match in [({**good, "extra": 1}, "expected the keys"), ({**good, "gamma": "x"}, "gamma must be like"),
                       ({**good, "base_lrs": [0.1]}, "base_lrs must be like"), ([], "expected the keys")]:
        with pytest.raises(ValueError, match=match):
            s.load_state_dict(bad)
        assert s.state_dict() == good
    with pytest.raises(ValueError, match="last_epoch=-1"):
        lr_scheduler.StepLR(opt, 3, last_epoch=5)
    with pytest.raises(ValueError, match="step_size must be a whole number"):
        lr_scheduler.StepLR(opt, 0)
    with pytest.raises(TypeError, match="expected an optimizer"):
        lr_scheduler.ExponentialLR([1, 2], 0.9)
    with pytest.raises(ValueError, match="factor must lie in"):
        lr_scheduler.ReduceLROnPlateau(opt, factor=1.0)
    with pytest.raises(ValueError, match="ReduceLROnPlateau .* cannot be sequenced"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.ReduceLROnPlateau(opt)], [])
    inner = lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 2)], [])
    with pytest.raises(TypeError, match="cannot be nested"):
        lr_scheduler.SequentialLR(opt, [lr_scheduler.StepLR(opt, 2), inner], [3])


def test_a_second_scheduler_starts_from_the_optimizers_first_rates():
    """As PyTorch's initial_lr: building one scheduler changes the lr, the next one still starts from the original."""
    opt = our_optimizer()
    lr_scheduler.LinearLR(opt, start_factor=0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    exp = lr_scheduler.ExponentialLR(opt, 0.5)
    assert exp.base_lrs == list(LRS)


def test_trainer_style_loop_uses_the_scheduled_rate():
    """The optimizer's step runs with the rate the schedule set: a plain SGD step moves w by lr·g."""
    w = mdl.zeros(1, requires_grad=True)
    opt = optim.SGD([w], lr=1.0)
    s = lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    moved = []
    for _ in range(3):
        before = float(w.numpy()[0])
        w.grad = mdl.ones(1)
        opt.step()
        s.step()
        moved.append(before - float(w.numpy()[0]))
    np.testing.assert_allclose(moved, [1.0, 0.5, 0.25])


def test_load_state_dict_refuses_a_fractional_step_count():
    s = lr_scheduler.ExponentialLR(our_optimizer(), 0.9)
    with pytest.raises(ValueError, match="last_epoch must be like"):
        s.load_state_dict({**s.state_dict(), "last_epoch": 2.5})
    s.load_state_dict({**s.state_dict(), "gamma": 1})  # a whole number where a number is expected is fine
    assert s.gamma == 1


@pytest.mark.parametrize("T_0,T_mult,eta_min", [(3, 2, 0.01), (5, 1, 0.0), (2, 3, 0.001)])
def test_cosine_annealing_warm_restarts_equals_pytorchs_over_50_steps(torch, T_0, T_mult, eta_min):  # noqa: N803
    from minidl.optim.lr_scheduler import CosineAnnealingWarmRestarts
    w = mdl.tensor([1.0], requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    schedule = CosineAnnealingWarmRestarts(opt, T_0=T_0, T_mult=T_mult, eta_min=eta_min)
    tw = torch.tensor([1.0], requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tschedule = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(topt, T_0=T_0, T_mult=T_mult, eta_min=eta_min)
    ours, theirs = [], []
    for _ in range(50):
        ours.append(opt.param_groups[0]["lr"])
        theirs.append(topt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
        topt.step()
        tschedule.step()
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)
    assert max(ours) == 0.1 and ours.count(0.1) > 1  # it did restart
