"""Learning-rate schedules: closed forms, composition, ScheduleLR, and torch.optim.lr_scheduler."""
import math

import numpy as np
import pytest

import minidl as mdl
from minidl import optim
from minidl.optim import schedules


def test_closed_forms():
    assert schedules.constant(0.3)(1000) == 0.3
    assert [schedules.step_decay(1.0, 0.1, 3)(t) for t in (0, 2, 3, 6)] == pytest.approx([1, 1, 0.1, 0.01])
    assert schedules.exponential(2.0, 0.5)(3) == pytest.approx(0.25)
    f = schedules.polynomial(0.8, 10)  # the book's α0(1 − t/T)²
    assert [f(t) for t in (0, 5, 10, 15)] == pytest.approx([0.8, 0.2, 0.0, 0.0])
    g = schedules.cyclical(0.1, 1.0, 4)
    assert [g(t) for t in (0, 2, 4, 6, 8, 12)] == pytest.approx([0.1, 0.55, 1.0, 0.55, 0.1, 1.0])
    h = schedules.cosine_restarts(1.0, 4, T_mult=2, eta_min=0.0)
    assert [h(t) for t in (0, 2, 4, 8, 12)] == pytest.approx([1.0, 0.5, 1.0, 0.5, 1.0])
    s = schedules.inverse_sqrt(1.0, 100)
    assert [s(t) for t in (0, 100, 400)] == pytest.approx([1.0, 1.0, 0.5])
    w = schedules.warmup(schedules.constant(1.0), 10)
    assert [w(t) for t in (0, 5, 10, 50)] == pytest.approx([0.05, 0.05 + 0.95 / 2, 1.0, 1.0])
    q = schedules.sequential([schedules.constant(0.5), schedules.exponential(1.0, 0.5)], [3])
    assert [q(t) for t in (0, 2, 3, 5)] == pytest.approx([0.5, 0.5, 1.0, 0.25])


def _torch_lrs(torch, make_scheduler, base_lr, steps, momentum=0.0):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base_lr, momentum=momentum)
    scheduler = make_scheduler(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


def _our_lrs(schedule, base_lr, steps):
    opt = optim.SGD([mdl.tensor(np.zeros(1), requires_grad=True)], lr=base_lr)
    scheduler = optim.ScheduleLR(opt, schedule)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize("ours, theirs", [
    (schedules.step_decay(0.1, 0.5, 7), lambda t, o: t.optim.lr_scheduler.StepLR(o, step_size=7, gamma=0.5)),
    (schedules.exponential(0.1, 0.95), lambda t, o: t.optim.lr_scheduler.ExponentialLR(o, gamma=0.95)),
    (schedules.cosine_restarts(0.1, 10), lambda t, o: t.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=10)),
    (schedules.cosine_restarts(0.1, 5, T_mult=2, eta_min=0.01),
     lambda t, o: t.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=0.01)),
    (schedules.polynomial(0.1, 40, power=2.0),
     lambda t, o: t.optim.lr_scheduler.PolynomialLR(o, total_iters=40, power=2.0)),
    (schedules.polynomial(0.1, 30, power=1.0),
     lambda t, o: t.optim.lr_scheduler.PolynomialLR(o, total_iters=30, power=1.0)),
    (schedules.warmup(schedules.constant(0.1), 12), lambda t, o: t.optim.lr_scheduler.LinearLR(o, start_factor=1 / 20,
                                                                                              total_iters=12)),
    (schedules.warmup(schedules.constant(0.1), 8, start_factor=0.25),
     lambda t, o: t.optim.lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=8)),
], ids=["step", "exponential", "cosine-restarts", "cosine-restarts-mult", "polynomial2", "polynomial1",
        "warmup", "warmup-quarter"])
def test_matches_torch(torch, ours, theirs):
    np.testing.assert_allclose(_our_lrs(ours, 0.1, 60), _torch_lrs(torch, lambda o: theirs(torch, o), 0.1, 60),
                               rtol=1e-9, atol=1e-12)


def test_cyclical_matches_torch_triangular(torch):
    theirs = _torch_lrs(torch, lambda o: torch.optim.lr_scheduler.CyclicLR(
        o, base_lr=0.01, max_lr=0.1, step_size_up=5, mode="triangular"), 0.01, 40, momentum=0.9)
    np.testing.assert_allclose(_our_lrs(schedules.cyclical(0.01, 0.1, 5), 0.01, 40), theirs, rtol=1e-9)


def test_scheduler_keeps_the_ratio_between_groups_and_resumes():
    a = mdl.tensor(np.zeros(1), requires_grad=True)
    b = mdl.tensor(np.zeros(1), requires_grad=True)
    opt = optim.SGD([{"params": [a], "lr": 1e-3}, {"params": [b], "lr": 1e-2}], lr=1e-2)
    scheduler = optim.ScheduleLR(opt, schedules.step_decay(0.2, 0.1, 2))
    assert scheduler.get_last_lr() == pytest.approx([0.02, 0.2])
    scheduler.step()
    scheduler.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.002, 0.02])
    again = optim.ScheduleLR(opt, schedules.step_decay(0.2, 0.1, 2))
    again.load_state_dict(scheduler.state_dict())
    assert again.get_last_lr() == pytest.approx([0.002, 0.02])


def test_warmup_follows_the_book():
    """From α0/20, linearly, to α0 at the end of the warmup."""
    f = schedules.warmup(schedules.polynomial(1.0, 100), 10)
    assert f(0) == pytest.approx(1 / 20)
    assert f(10) == pytest.approx((1 - 10 / 100) ** 2)
    assert all(f(t) < f(t + 1) for t in range(9))


@pytest.mark.parametrize("make, message", [
    (lambda: schedules.step_decay(0.1, 0.5, 0), "step_size must be a whole number"),
    (lambda: schedules.exponential(-1.0, 0.5), "a0 must be a number ≥ 0"),
    (lambda: schedules.warmup(schedules.constant(1.0), 10, start_factor=0), "start_factor"),
    (lambda: schedules.sequential([schedules.constant(1.0)], [3]), "milestones"),
    (lambda: optim.ScheduleLR(optim.SGD([mdl.tensor(np.zeros(1), requires_grad=True)], lr=0.1), 0.1),
     "function of the step"),
])
def test_bad_schedules_raise(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_every_schedule_is_positive_and_finite():
    for f in (schedules.cyclical(0.0, 1.0, 3), schedules.cosine_restarts(1.0, 3, 3), schedules.inverse_sqrt(1.0, 5)):
        values = [f(t) for t in range(200)]
        assert all(math.isfinite(v) and v >= 0 for v in values)


def test_each_scheduler_has_one_name():
    """ScheduleLR (a schedule f(t) sets the rates) and PyTorch's LRScheduler (the base of StepLR...) are two
    concepts with two names: no LRScheduler is left in optim or optim.schedules to be taken for the other."""
    assert optim.ScheduleLR is schedules.ScheduleLR
    assert not hasattr(optim, "LRScheduler") and not hasattr(schedules, "LRScheduler")
    assert all(issubclass(cls, optim.lr_scheduler.LRScheduler)
               for cls in (optim.lr_scheduler.StepLR, optim.lr_scheduler.LambdaLR, optim.lr_scheduler.OneCycleLR))
    assert not issubclass(optim.ScheduleLR, optim.lr_scheduler.LRScheduler)
