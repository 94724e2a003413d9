"""schedules.cosine: PyTorch's CosineAnnealingLR formula, and ``minidl train --schedule cosine`` uses it."""
import math

import pytest

from minidl.optim import schedules
from tests.optim.test_schedules import _our_lrs, _torch_lrs


def test_cosine_closed_form():
    f = schedules.cosine(0.8, 10, eta_min=0.2)
    # η_min + (a0 − η_min)(1 + cos(πt/T))/2, computed here from the formula
    for t in (0, 1, 3, 5, 7, 10, 13, 20):
        assert f(t) == pytest.approx(0.2 + 0.6 * (1 + math.cos(math.pi * t / 10)) / 2, rel=1e-12)
    assert [f(0), f(5), f(10)] == pytest.approx([0.8, 0.5, 0.2])  # start, halfway, end


@pytest.mark.parametrize("a0, t_max, eta_min, steps", [(0.1, 25, 0.0, 60), (0.05, 7, 0.01, 40)])
def test_cosine_matches_torch_cosine_annealing_lr(torch, a0, t_max, eta_min, steps):
    theirs = _torch_lrs(torch, lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=t_max, eta_min=eta_min),
                        a0, steps)
    # past T_max too: PyTorch's rate climbs back up along the same cosine, and so does ours
    assert _our_lrs(schedules.cosine(a0, t_max, eta_min), a0, steps) == pytest.approx(theirs, rel=1e-9, abs=1e-12)


def test_cosine_rejects_bad_arguments():
    with pytest.raises(ValueError, match="T_max"):
        schedules.cosine(0.1, 0)
    with pytest.raises(ValueError, match="eta_min"):
        schedules.cosine(0.1, 10, eta_min=-1.0)


def test_train_command_cosine_schedule_is_cosine_annealing():
    from minidl.train.recipe import make_schedule
    f = make_schedule("cosine", 0.3, 100)
    g = schedules.cosine(0.3, 100)
    assert [f(t) for t in range(0, 101, 10)] == pytest.approx([g(t) for t in range(0, 101, 10)])
    assert f(100) == pytest.approx(0.0, abs=1e-12) and f(50) == pytest.approx(0.15)
