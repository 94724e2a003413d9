"""Learning-rate schedules: plain functions f(t) → lr, and the scheduler that applies them.

t is the number of optimizer steps already taken, so step k (1, 2, ...) runs
with f(k − 1), as with torch.optim.lr_scheduler. Each factory below returns
such a function; they combine like functions do:

    f = warmup(cosine_restarts(0.1, T0=1000), steps=500)       # ramp up, then SGDR
    g = lambda t: 0.5 * step_decay(0.1, 0.1, 30)(t)           # any arithmetic
    scheduler = ScheduleLR(optimizer, f)                      # then scheduler.step() per step

The book's advice: a good default is to decrease the learning rate by 10x
when the validation error plateaus (``step_decay(a0, 0.1, ...)`` does it on a
fixed clock); start large batches and Adam with a short linear warmup, from
about α0/20 over the first ~10% of training, so the early, badly scaled
updates cannot wreck the initialization.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["ScheduleLR", "constant", "cosine", "cosine_restarts", "cyclical", "exponential", "inverse_sqrt",
           "polynomial", "sequential", "step_decay", "warmup"]


def _positive(name: str, value, allow_zero: bool = False) -> float:
    if not isinstance(value, numbers.Real) or not (value >= 0 if allow_zero else value > 0):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"schedule: {name} must be a number {bound}, got {name}={value!r}")
    return float(value)


def _steps(name: str, value) -> int:
    if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"schedule: {name} must be a whole number of steps ≥ 1, got {name}={value!r}")
    return int(value)


def constant(a0: float):
    """f(t) = a0."""
    a0 = _positive("a0", a0, allow_zero=True)
    return lambda t: a0


def step_decay(a0: float, gamma: float, step_size: int):
    """f(t) = a0·γ^⌊t / step_size⌋: multiply by γ every step_size steps (γ = 0.1: the book's 10x drop)."""
    a0, gamma, step_size = _positive("a0", a0, True), _positive("gamma", gamma), _steps("step_size", step_size)
    return lambda t: a0 * gamma ** (t // step_size)


def exponential(a0: float, gamma: float):
    """f(t) = a0·γᵗ."""
    a0, gamma = _positive("a0", a0, True), _positive("gamma", gamma)
    return lambda t: a0 * gamma ** t


def polynomial(a0: float, total: int, power: float = 2.0):
    """f(t) = a0·(1 − t/T)^power until T, then 0: the book's α0(1 − t/T)² for power 2."""
    a0, total, power = _positive("a0", a0, True), _steps("total", total), _positive("power", power, True)
    return lambda t: a0 * (1.0 - min(t, total) / total) ** power


def cyclical(base_lr: float, max_lr: float, step_size_up: int):
    """Triangular cyclical rate (Smith 2017): up from base to max in step_size_up steps, then down.

        cycle = ⌊1 + t/(2s)⌋,   x = |t/s − 2·cycle + 1|,   f(t) = base + (max − base)·max(0, 1 − x)
    """
    base_lr, max_lr = _positive("base_lr", base_lr, True), _positive("max_lr", max_lr, True)
    s = _steps("step_size_up", step_size_up)

    def f(t):
        cycle = math.floor(1 + t / (2 * s))
        x = abs(t / s - 2 * cycle + 1)
        return base_lr + (max_lr - base_lr) * max(0.0, 1.0 - x)
    return f


def cosine(a0: float, T_max: int, eta_min: float = 0.0):  # noqa: N803 - PyTorch's names
    """Cosine annealing (Loshchilov & Hutter 2017, without restarts), PyTorch's ``CosineAnnealingLR``:

        f(t) = η_min + (a0 − η_min)·(1 + cos(π·t/T_max))/2
    From a0 at t = 0 down to η_min at t = T_max. As in PyTorch, the same formula holds after T_max,
    so the rate climbs back up over the next T_max steps: set T_max to the length of training.
    """
    a0, eta_min, T_max = _positive("a0", a0, True), _positive("eta_min", eta_min, True), _steps("T_max", T_max)
    return lambda t: eta_min + (a0 - eta_min) * (1 + math.cos(math.pi * t / T_max)) / 2


def cosine_restarts(a0: float, T0: int, T_mult: int = 1, eta_min: float = 0.0):  # noqa: N803 - the paper's names
    """SGDR (Loshchilov & Hutter 2017): cosine from a0 down to eta_min over T_i steps, then restart.

        f(t) = η_min + (a0 − η_min)·(1 + cos(π·T_cur/T_i))/2,   T_0 = T0,  T_{i+1} = T_mult·T_i
    Each cycle decreases the rate smoothly; the restarts jump it back up.
    """
    a0, eta_min, T0 = _positive("a0", a0, True), _positive("eta_min", eta_min, True), _steps("T0", T0)
    T_mult = _steps("T_mult", T_mult)  # noqa: N806

    def f(t):
        t_cur, t_i = int(t), T0
        if T_mult == 1 and t_cur >= T0:  # equal cycles: one remainder, however many (a large t cannot stall)
            t_cur %= T0
        while t_cur >= t_i:  # whole cycles already finished (exact integers: no log rounding)
            t_cur -= t_i
            t_i *= T_mult
        return eta_min + (a0 - eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2
    return f


def inverse_sqrt(a0: float, warmup: int):
    """f(t) = a0·√(warmup / max(t, warmup)): flat for ``warmup`` steps, then ∝ 1/√t (Transformers).

    Wrap it in :func:`warmup` for the linear ramp at the start.
    """
    a0, warm = _positive("a0", a0, True), _steps("warmup", warmup)
    return lambda t: a0 * math.sqrt(warm / max(t, warm))


def warmup(schedule, steps: int, start_factor: float = 1 / 20):
    """Linear warmup in front of any schedule.

        f(t) = schedule(t)·(start_factor + (1 − start_factor)·min(t, steps)/steps)
    The book: from α0/20 (start_factor 1/20), linearly, over about 10% of training.
    """
    steps = _steps("steps", steps)
    if not 0 < start_factor <= 1:
        raise ValueError(f"warmup: start_factor must lie in (0, 1], got {start_factor!r}")
    return lambda t: schedule(t) * (start_factor + (1 - start_factor) * min(t, steps) / steps)


def sequential(schedules, milestones):
    """Run schedules one after another: schedules[i] from milestones[i-1] on, its t restarted at 0."""
    schedules, milestones = list(schedules), [int(m) for m in milestones]
    if len(milestones) != len(schedules) - 1 or milestones != sorted(milestones):
        raise ValueError(f"sequential: {len(schedules)} schedules need {len(schedules) - 1} increasing "
                         f"milestones, got {milestones}")

    def f(t):
        start = 0
        for schedule, milestone in zip(schedules, milestones + [math.inf]):
            if t < milestone:
                return schedule(t - start)
            start = milestone
        return schedules[-1](t - start)  # pragma: no cover - the inf milestone always matches
    return f


class ScheduleLR:
    """Sets each parameter group's lr from ``schedule(t)`` at every ``step()``.

    The schedule gives the learning rate of the group with the largest initial
    lr; every other group keeps its ratio to it (pretrained layers 10x lower
    stay 10x lower). Construction applies schedule(0), as PyTorch does; call
    ``step()`` once after each ``optimizer.step()``.
    """

    def __init__(self, optimizer, schedule):
        if not callable(schedule):
            raise TypeError(f"ScheduleLR: schedule must be a function of the step t, got {schedule!r}")
        self.optimizer, self.schedule = optimizer, schedule
        initial = [group["lr"] for group in optimizer.param_groups]
        top = max(initial)
        self.scales = [lr / top if top > 0 else 1.0 for lr in initial]
        self.t = 0
        self._apply()

    def _apply(self):
        lr = float(self.schedule(self.t))
        for group, scale in zip(self.optimizer.param_groups, self.scales):
            group["lr"] = lr * scale
        self.last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def step(self):
        self.t += 1
        self._apply()

    def get_last_lr(self) -> list:
        return list(self.last_lr)

    def state_dict(self) -> dict:
        return {"t": self.t, "scales": list(self.scales)}

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        self._checked(state_dict)

    def load_state_dict(self, state_dict: dict):
        """Continue from ``state_dict()``; everything is checked before anything changes."""
        self.t, self.scales = self._checked(state_dict)
        self._apply()

    def _checked(self, state_dict):
        owner = "ScheduleLR.load_state_dict"
        if not isinstance(state_dict, dict) or set(state_dict) != {"t", "scales"}:
            keys = sorted(map(str, state_dict)) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{owner}: expected {{'t': steps taken, 'scales': [one per group]}} as "
                             f"state_dict() returns, got {keys}")
        t, scales = state_dict["t"], state_dict["scales"]
        if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t < 2**63:
            raise ValueError(f"{owner}: t must be a whole number of steps from 0 to 2**63 - 1, got {repr(t)[:80]}")
        groups = len(self.optimizer.param_groups)
        if not (isinstance(scales, (list, tuple)) and len(scales) == groups and all(
                isinstance(s, numbers.Real) and not isinstance(s, bool) and math.isfinite(s) and s >= 0
                for s in scales)):
            raise ValueError(f"{owner}: scales must be {groups} finite numbers ≥ 0 (one per parameter group), "
                             f"got {repr(scales)[:80]}")
        try:
            lr = float(self.schedule(int(t)))
        except (ArithmeticError, ValueError, TypeError) as exc:
            raise ValueError(f"{owner}: the schedule cannot be evaluated at step t={t} ({exc})") from None
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"{owner}: the schedule gives lr={lr} at step t={t}; a learning rate is a number ≥ 0")
        return int(t), [float(s) for s in scales]
