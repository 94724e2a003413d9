"""``optim.lr_scheduler``: PyTorch's learning-rate schedulers, by name and by number.

    scheduler = optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)
    for epoch in range(100):
        train(...);  opt.step() ...
        scheduler.step()               # once per epoch (or per batch: the schedule counts calls)
    scheduler.get_last_lr()            # [lr of each parameter group]

Each scheduler keeps ``last_epoch`` (the number of ``step()`` calls; the
constructor makes the first one, as PyTorch's does, so the optimizer starts
at the schedule's value for 0) and sets every parameter group's ``lr`` to

    lr_i = base_lr_i · f(last_epoch)

with ``base_lr_i`` the group's learning rate when the first scheduler of that
optimizer was built (PyTorch's ``initial_lr``) and ``f`` the schedule, whose
formula each class's docstring gives; StepLR and ExponentialLR take theirs
from :mod:`minidl.optim.schedules`. ReduceLROnPlateau alone reacts to a
measured metric instead of counting. Given the same calls, every class gives
the learning rates ``torch.optim.lr_scheduler`` gives (the tests compare them
step by step).

``state_dict()`` holds numbers, strings and lists only (never a function), so
it round-trips through ``mdl.save``/``mdl.load``; ``load_state_dict`` checks
everything before it changes anything. :class:`minidl.optim.ScheduleLR` is
minidl's other scheduler, driven by any schedule function ``f(t) → lr``.
"""
from __future__ import annotations

import math
import numbers
import types
import weakref
from bisect import bisect_right

from minidl.optim import schedules
from minidl.optim.saved_state import host_copy

__all__ = ["CosineAnnealingLR", "CosineAnnealingWarmRestarts", "ExponentialLR", "LRScheduler", "LambdaLR", "LinearLR",
           "MultiStepLR", "OneCycleLR", "ReduceLROnPlateau", "SequentialLR", "StepLR"]

# The learning rates each optimizer's groups had when its first scheduler was built (PyTorch keeps
# them in the groups as "initial_lr"; minidl's groups hold hyperparameters only, so they live here).
_INITIAL_LRS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _initial_lrs(optimizer) -> list:
    lrs = [float(group["lr"]) for group in optimizer.param_groups]
    try:
        known = _INITIAL_LRS.setdefault(optimizer, lrs)
    except TypeError:  # an optimizer that cannot be weakly referenced: its current rates
        return lrs
    known += lrs[len(known):]  # groups added since
    return list(known[:len(lrs)])


def _check_optimizer(owner, optimizer):
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"{owner}: expected an optimizer (with param_groups holding an 'lr'), "
                        f"got {type(optimizer).__name__}")


def _number(owner, name, value, low=None, high=None, low_open=False, high_open=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")
    if (low is not None and (value <= low if low_open else value < low)) or \
            (high is not None and (value >= high if high_open else value > high)):
        bounds = f"{'(' if low_open else '['}{low if low is not None else '-inf'}, " \
                 f"{high if high is not None else 'inf'}{')' if high_open else ']'}"
        raise ValueError(f"{owner}: {name} must lie in {bounds}, got {value!r}")
    return float(value)


def _whole(owner, name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{owner}: {name} must be a whole number ≥ {low}, got {value!r}")
    return int(value)


def _per_group(owner, name, value, optimizer) -> list:
    """One value per parameter group: a list as given (checked for its length), or a number repeated."""
    count = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{owner}: expected {count} values of {name} (one per parameter group), got {len(value)}")
        return [_number(owner, name, v) for v in value]
    return [_number(owner, name, value)] * count


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, numbers.Integral):
        return "whole number"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


class LRScheduler:
    """Base of the PyTorch-style schedulers: subclasses define ``get_lr()``, the rates at ``last_epoch``.

    ``step()`` adds one to ``last_epoch`` and writes ``get_lr()`` into the groups;
    ``get_last_lr()`` returns what was written last. ``last_epoch`` must be -1 (a new
    schedule): to resume, build the scheduler anew and call ``load_state_dict``.
    """

    _hyperparameters: tuple = ()  # saved by state_dict besides the counters (the schedule's settings)

    def __init__(self, optimizer, last_epoch: int = -1):
        owner = type(self).__name__
        _check_optimizer(owner, optimizer)
        if last_epoch != -1:
            raise ValueError(f"{owner}: last_epoch={last_epoch!r}: minidl keeps the base learning rates in the "
                             "scheduler's state, not in the parameter groups; build the scheduler with "
                             "last_epoch=-1 and resume with scheduler.load_state_dict(saved)")
        self.optimizer = optimizer
        if not hasattr(self, "base_lrs"):
            self.base_lrs = _initial_lrs(optimizer)
        self.last_epoch = -1
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self.step()

    def get_lr(self) -> list:
        raise NotImplementedError(f"{type(self).__name__} must define get_lr(): the rates at self.last_epoch")

    def step(self) -> None:
        """One step of the schedule: ``last_epoch += 1``, then each group's lr ← get_lr()."""
        self._step_count += 1
        self.last_epoch += 1
        self._set(self.get_lr())

    def _set(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = float(lr)
        self._last_lr = [float(group["lr"]) for group in self.optimizer.param_groups]

    def get_last_lr(self) -> list:
        """The learning rate of each parameter group, as the last step set it."""
        return list(self._last_lr)

    # ------------------------------------------------------------ state
    def _state_keys(self):
        return ("last_epoch", "_step_count", "base_lrs", "_last_lr") + self._hyperparameters

    def state_dict(self) -> dict:
        """The counters, base rates, last rates and settings: numbers and lists only (``mdl.save`` stores it)."""
        return {key: host_copy(getattr(self, key)) for key in self._state_keys()}

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        self._checked(state_dict)

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue from ``state_dict()``: everything is checked before anything changes; the groups' lr
        are set to the saved last rates."""
        for key, value in self._checked(state_dict).items():
            setattr(self, key, value)
        self._restore_lr()

    def _restore_lr(self):
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def _checked(self, state_dict) -> dict:
        owner = f"{type(self).__name__}.load_state_dict"
        expected = set(self._state_keys())
        if not isinstance(state_dict, dict) or set(state_dict) != expected:
            got = sorted(map(str, state_dict)) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{owner}: expected the keys {sorted(expected)} as state_dict() returns, got {got}")
        out = {}
        for key in self._state_keys():
            value, current = state_dict[key], getattr(self, key)
            if not _like(value, current) or (isinstance(current, (list, tuple)) and (
                    len(value) != len(current) or not all(_like(a, b) for a, b in zip(value, current)))):
                raise ValueError(f"{owner}: {key} must be like this scheduler's {host_copy(current)!r}, "
                                 f"got {repr(value)[:80]}")
            out[key] = type(current)(value) if isinstance(current, (list, tuple)) else value
        groups = len(self.optimizer.param_groups)
        for key in ("base_lrs", "_last_lr"):
            if key in out and len(out[key]) != groups:
                raise ValueError(f"{owner}: {key} has {len(out[key])} values, this optimizer {groups} groups")
        return out


def _like(value, current) -> bool:
    """Whether a saved value may replace ``current``: the same kind (a whole number also for a number)."""
    kind, want = _kind(value), _kind(current)
    return kind == want or (want == "number" and kind == "whole number")


class LambdaLR(LRScheduler):
    """lr_i = base_lr_i · λ_i(last_epoch): any factor function (or one per parameter group).

    The functions are not saved: ``state_dict()`` holds None for a plain function and the
    attribute dict of a callable object, as PyTorch's does.
    """

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1):
        _check_optimizer("LambdaLR", optimizer)
        count = len(optimizer.param_groups)
        lambdas = list(lr_lambda) if isinstance(lr_lambda, (list, tuple)) else [lr_lambda] * count
        if len(lambdas) != count:
            raise ValueError(f"LambdaLR: expected {count} lr_lambdas (one per parameter group), got {len(lambdas)}")
        if not all(callable(f) for f in lambdas):
            raise TypeError(f"LambdaLR: lr_lambda must be a function of the epoch (or a list of them), "
                            f"got {lr_lambda!r}")
        self.lr_lambdas = lambdas
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(vars(f)) for f in self.lr_lambdas]
        return state

    def _checked(self, state_dict):
        if not isinstance(state_dict, dict) or "lr_lambdas" not in state_dict:
            raise ValueError("LambdaLR.load_state_dict: expected the dict state_dict() returns (with lr_lambdas)")
        saved = state_dict["lr_lambdas"]
        if not isinstance(saved, list) or len(saved) != len(self.lr_lambdas) or \
                not all(s is None or isinstance(s, dict) for s in saved):
            raise ValueError(f"LambdaLR.load_state_dict: lr_lambdas must be {len(self.lr_lambdas)} entries, "
                             f"None or dicts, got {repr(saved)[:80]}")
        out = super()._checked({k: v for k, v in state_dict.items() if k != "lr_lambdas"})
        out["_lambda_states"] = saved
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        checked = self._checked(state_dict)
        for f, saved in zip(self.lr_lambdas, checked.pop("_lambda_states")):
            if saved is not None:
                vars(f).update(saved)
        for key, value in checked.items():
            setattr(self, key, value)
        self._restore_lr()


class StepLR(LRScheduler):
    """lr = base_lr · γ^⌊last_epoch / step_size⌋: multiply by γ every step_size steps
    (:func:`minidl.optim.schedules.step_decay`). PyTorch's default γ = 0.1."""

    _hyperparameters = ("step_size", "gamma")

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size = _whole("StepLR", "step_size", step_size)
        self.gamma = _number("StepLR", "gamma", gamma, 0, low_open=True)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        factor = schedules.step_decay(1.0, self.gamma, self.step_size)(self.last_epoch)
        return [base * factor for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = base_lr · γ^(number of milestones ≤ last_epoch): multiply by γ at each milestone
    (a milestone listed twice multiplies twice, as in PyTorch)."""

    _hyperparameters = ("milestones", "gamma")

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1):
        self.milestones = sorted(_whole("MultiStepLR", "a milestone", m, 0) for m in milestones)
        self.gamma = _number("MultiStepLR", "gamma", gamma, 0, low_open=True)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        factor = self.gamma ** bisect_right(self.milestones, self.last_epoch)
        return [base * factor for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr = base_lr · γ^last_epoch (:func:`minidl.optim.schedules.exponential`)."""

    _hyperparameters = ("gamma",)

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1):
        self.gamma = _number("ExponentialLR", "gamma", gamma, 0, low_open=True)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        factor = schedules.exponential(1.0, self.gamma)(self.last_epoch)
        return [base * factor for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = η_min + (base_lr − η_min)·(1 + cos(π·last_epoch/T_max))/2 (Loshchilov & Hutter 2017,
    without restarts; :func:`minidl.optim.schedules.cosine`): from base_lr down to η_min over
    T_max steps. Stepped past T_max it follows the cosine back up (period 2·T_max), as PyTorch's does."""

    _hyperparameters = ("T_max", "eta_min")

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):  # noqa: N803
        self.T_max = _whole("CosineAnnealingLR", "T_max", T_max)  # noqa: N815 - PyTorch's name
        self.eta_min = _number("CosineAnnealingLR", "eta_min", eta_min, 0)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [schedules.cosine(base, self.T_max, self.eta_min)(self.last_epoch) for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    """SGDR (Loshchilov & Hutter 2017): lr = η_min + (base_lr − η_min)·(1 + cos(π·T_cur/T_i))/2, where
    T_cur counts the steps since the last restart and the i-th cycle lasts T_i = T_0·T_multⁱ steps:
    the rate falls along a cosine, jumps back to base_lr, and falls again over a longer cycle.
    Stepped once per epoch or per batch, with integer steps (PyTorch also takes fractional epochs);
    the formula is :func:`minidl.optim.schedules.cosine_restarts`."""

    _hyperparameters = ("T_0", "T_mult", "eta_min")

    def __init__(self, optimizer, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):  # noqa: N803
        self.T_0 = _whole("CosineAnnealingWarmRestarts", "T_0", T_0)  # noqa: N815 - PyTorch's names
        self.T_mult = _whole("CosineAnnealingWarmRestarts", "T_mult", T_mult)  # noqa: N815
        self.eta_min = _number("CosineAnnealingWarmRestarts", "eta_min", eta_min, 0)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [schedules.cosine_restarts(base, self.T_0, self.T_mult, self.eta_min)(max(self.last_epoch, 0))
                for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = base_lr · (s + (e − s)·min(last_epoch, total_iters)/total_iters): a linear ramp of the
    factor from start_factor s to end_factor e over total_iters steps, then e (a warmup when s < e).
    PyTorch's defaults: s = 1/3, e = 1, total_iters = 5."""

    _hyperparameters = ("start_factor", "end_factor", "total_iters")

    def __init__(self, optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5,
                 last_epoch: int = -1):
        self.start_factor = _number("LinearLR", "start_factor", start_factor, 0, 1, low_open=True)
        self.end_factor = _number("LinearLR", "end_factor", end_factor, 0, 1)
        self.total_iters = _whole("LinearLR", "total_iters", total_iters)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        s, e = self.start_factor, self.end_factor
        factor = s + (e - s) * min(self.total_iters, self.last_epoch) / self.total_iters
        return [base * factor for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy (Smith & Topin 2019): up from max_lr/div_factor to max_lr over the first
    pct_start of total_steps, then down to max_lr/(div_factor·final_div_factor); the momentum
    (SGD's ``momentum`` or Adam's β₁) moves the other way, max_momentum → base_momentum → back.

    Each phase anneals from a to b with p = the fraction of the phase done:
        'cos':     b + (a − b)·(1 + cos(π·p))/2
        'linear':  a + (b − a)·p
    three_phase=True: up, back down to the initial rate (symmetrically), then down to the minimum.
    Meant to be stepped after every batch; stepping past total_steps is an error.
    """

    _hyperparameters = ("total_steps", "pct_start", "anneal_strategy", "cycle_momentum", "three_phase",
                        "initial_lrs", "max_lrs", "min_lrs", "max_momentums", "base_momentums", "use_beta1")

    def __init__(self, optimizer, max_lr, total_steps: int | None = None, epochs: int | None = None,
                 steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 cycle_momentum: bool = True, base_momentum=0.85, max_momentum=0.95, div_factor: float = 25.0,
                 final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1):
        owner = "OneCycleLR"
        _check_optimizer(owner, optimizer)
        if total_steps is not None:
            self.total_steps = _whole(owner, "total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = _whole(owner, "epochs", epochs) * _whole(owner, "steps_per_epoch", steps_per_epoch)
        else:
            raise ValueError(f"{owner}: give total_steps, or epochs and steps_per_epoch")
        self.pct_start = _number(owner, "pct_start", pct_start, 0, 1)
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"{owner}: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy, self.three_phase = anneal_strategy, bool(three_phase)
        div_factor = _number(owner, "div_factor", div_factor, 0, low_open=True)
        final_div_factor = _number(owner, "final_div_factor", final_div_factor, 0, low_open=True)
        self.max_lrs = _per_group(owner, "max_lr", max_lr, optimizer)
        self.initial_lrs = [m / div_factor for m in self.max_lrs]
        self.min_lrs = [i / final_div_factor for i in self.initial_lrs]
        self.cycle_momentum = bool(cycle_momentum)
        self.use_beta1 = all("betas" in g for g in optimizer.param_groups)
        self.max_momentums = self.base_momentums = []
        if self.cycle_momentum:
            if not self.use_beta1 and not all("momentum" in g for g in optimizer.param_groups):
                raise ValueError(f"{owner}: cycle_momentum=True needs an optimizer with a momentum or betas "
                                 f"hyperparameter ({type(optimizer).__name__} has neither); "
                                 "pass cycle_momentum=False")
            self.max_momentums = _per_group(owner, "max_momentum", max_momentum, optimizer)
            self.base_momentums = _per_group(owner, "base_momentum", base_momentum, optimizer)
            for group, m in zip(optimizer.param_groups, self.max_momentums):
                self._set_momentum(group, m)
        self.base_lrs = list(self.initial_lrs)
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _phases(self, i):
        """(end step, start lr, end lr, start momentum, end momentum) of each phase, for group i."""
        lo, top, bottom = self.initial_lrs[i], self.max_lrs[i], self.min_lrs[i]
        m_hi, m_lo = (self.max_momentums[i], self.base_momentums[i]) if self.cycle_momentum else (0.0, 0.0)
        up = float(self.pct_start * self.total_steps) - 1
        if self.three_phase:
            return [(up, lo, top, m_hi, m_lo), (float(2 * self.pct_start * self.total_steps) - 2, top, lo, m_lo, m_hi),
                    (self.total_steps - 1, lo, bottom, m_hi, m_hi)]
        return [(up, lo, top, m_hi, m_lo), (self.total_steps - 1, top, bottom, m_lo, m_hi)]

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: tried to step {t} times; the schedule has total_steps="
                             f"{self.total_steps} (for epochs x steps_per_epoch, step once per batch)")
        lrs = []
        for i, group in enumerate(self.optimizer.param_groups):
            phases, start_step = self._phases(i), 0.0
            for k, (end_step, lr_a, lr_b, m_a, m_b) in enumerate(phases):
                if t <= end_step or k == len(phases) - 1:
                    pct = (t - start_step) / (end_step - start_step)
                    lrs.append(self._anneal(lr_a, lr_b, pct))
                    if self.cycle_momentum:
                        self._set_momentum(group, self._anneal(m_a, m_b, pct))
                    break
                start_step = end_step
        return lrs

    def _restore_lr(self):
        super()._restore_lr()
        if self.cycle_momentum and self.last_epoch <= self.total_steps:
            self.get_lr()  # puts the momentum of last_epoch back


class SequentialLR(LRScheduler):
    """Runs ``schedulers`` one after another: schedulers[i] from milestones[i-1] on, its own count
    restarted at 0 there. The schedulers must drive this ``optimizer``; building this one resets
    the learning rates and the schedulers' counts, as PyTorch's does."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch: int = -1):
        owner = "SequentialLR"
        _check_optimizer(owner, optimizer)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError(f"{owner}: expected at least one scheduler, got none")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(f"{owner}: ReduceLROnPlateau (scheduler {i}) needs a metric at every step and "
                                 "cannot be sequenced")
            if not isinstance(s, LRScheduler) or isinstance(s, SequentialLR):
                raise TypeError(f"{owner}: scheduler {i} is a {type(s).__name__}; expected one of the "
                                "optim.lr_scheduler schedules (a SequentialLR cannot be nested)")
            if s.optimizer is not optimizer:
                raise ValueError(f"{owner}: scheduler {i} ({type(s).__name__}) drives another optimizer")
        milestones = [_whole(owner, "a milestone", m, 0) for m in milestones]
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"{owner}: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        if last_epoch != -1:
            raise ValueError(f"{owner}: build with last_epoch=-1 and resume with load_state_dict")
        self.optimizer, self._schedulers, self._milestones = optimizer, schedulers, milestones
        self.base_lrs = _initial_lrs(optimizer)
        self.last_epoch, self._step_count = 0, 1
        for group, lr in zip(optimizer.param_groups, self.base_lrs):  # undo what building the schedulers did
            group["lr"] = lr
        for s in schedulers:
            s.last_epoch -= 1  # undo the step each made when it was built
        first = self._schedulers[bisect_right(milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:
        self._step_count += 1
        self.last_epoch += 1
        i = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            scheduler.last_epoch = 0  # the next scheduler starts at its own step 0
            scheduler._set(scheduler.get_lr())
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def get_lr(self):
        return self._schedulers[bisect_right(self._milestones, self.last_epoch)].get_lr()

    def _state_keys(self):
        return ("last_epoch", "_step_count", "base_lrs", "_last_lr", "_milestones")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def _checked(self, state_dict):
        saved = state_dict.get("_schedulers") if isinstance(state_dict, dict) else None
        if not isinstance(saved, list) or len(saved) != len(self._schedulers):
            raise ValueError(f"SequentialLR.load_state_dict: expected the dict state_dict() returns, with "
                             f"{len(self._schedulers)} scheduler states under '_schedulers'")
        for s, sub in zip(self._schedulers, saved):
            s.check_state_dict(sub)
        out = super()._checked({k: v for k, v in state_dict.items() if k != "_schedulers"})
        out["_schedulers_states"] = saved
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        checked = self._checked(state_dict)
        for s, sub in zip(self._schedulers, checked.pop("_schedulers_states")):
            s.load_state_dict(sub)
        for key, value in checked.items():
            setattr(self, key, value)
        self._restore_lr()


class ReduceLROnPlateau(LRScheduler):
    """Multiply every group's lr by ``factor`` when the metric has stopped improving (the book's
    default: drop the rate 10x when the validation error plateaus). Call ``step(metric)``.

    Improvement over the best value so far (mode 'min'; 'max' mirrors it):
        threshold_mode 'rel':  metric < best·(1 − threshold);   'abs':  metric < best − threshold.
    After more than ``patience`` steps without improvement: lr ← max(lr·factor, min_lr) (a change
    smaller than eps is skipped), then ``cooldown`` steps during which bad steps are not counted.
    """

    _hyperparameters = ("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lrs",
                        "eps", "best", "num_bad_epochs", "cooldown_counter", "mode_worse")

    def __init__(self, optimizer, mode: str = "min", factor: float = 0.1, patience: int = 10,
                 threshold: float = 1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0.0,
                 eps: float = 1e-8):
        owner = "ReduceLROnPlateau"
        _check_optimizer(owner, optimizer)
        if mode not in ("min", "max"):
            raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"{owner}: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}")
        self.optimizer = optimizer
        self.mode, self.threshold_mode = mode, threshold_mode
        self.factor = _number(owner, "factor", factor, 0, 1, high_open=True)
        self.patience = _whole(owner, "patience", patience, 0)
        self.threshold = _number(owner, "threshold", threshold, 0)
        self.cooldown = _whole(owner, "cooldown", cooldown, 0)
        self.min_lrs = _per_group(owner, "min_lr", min_lr, optimizer)
        self.eps = _number(owner, "eps", eps, 0)
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self.last_epoch, self._step_count = 0, 0
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.best, self.num_bad_epochs, self.cooldown_counter = self.mode_worse, 0, 0
        self._last_lr = list(self.base_lrs)

    def _is_better(self, a, best):
        if self.mode == "min":
            return a < (best * (1.0 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
        return a > (best * (1.0 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)

    def step(self, metrics) -> None:  # noqa: D401 - PyTorch's signature: step(metrics)
        """Record one measurement of the metric (a number or a 0-d Tensor) and reduce the lr if it plateaued."""
        current = float(metrics)
        self._step_count += 1
        self.last_epoch += 1
        if self._is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad steps during the cooldown do not count
        if self.num_bad_epochs > self.patience:
            for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs):
                old = float(group["lr"])
                new = max(old * self.factor, min_lr)
                if old - new > self.eps:
                    group["lr"] = new
            self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def _checked(self, state_dict):
        out = super()._checked(state_dict)
        if out["mode"] not in ("min", "max") or out["threshold_mode"] not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau.load_state_dict: mode {out['mode']!r} / threshold_mode "
                             f"{out['threshold_mode']!r} is not one of 'min'/'max' and 'rel'/'abs'")
        return out
