"""Start with Adam, finish with SGD with momentum: SWATS (Keskar & Socher 2017).

The book's advice: Adam makes fast progress early, SGD with momentum often
generalizes better at the end, so start with one and finish with the other.
The hard part is the learning rate SGD should take over with. Keskar &
Socher's "Improving Generalization Performance by Switching from Adam to SGD"
(arXiv:1712.07628) estimates it from Adam's own steps: the SGD step along the
gradient g whose projection on Adam's step p equals p,

    γ = pᵀp / (−pᵀg)                 the SGD learning rate that reproduces Adam's step along p
    λ ← β₂λ + (1 − β₂)γ              an exponential average of γ (λ₀ = 0)
    switch when |λ/(1 − β₂ᵗ) − γ| < tol     the bias-corrected average has settled
    Λ = λ/(1 − β₂ᵗ)                  SGD's learning rate from then on

and after the switch the SGD-with-momentum step with β = β₁ (the paper's
v ← β₁v + g, w ← w − (1 − β₁)Λv, which is the book's SGDM m ← β₁m + (1 − β₁)g,
w ← w − Λm). The estimate is kept per parameter group (the paper's Algorithm 1
treats the whole parameter vector as one group, the default here). On a GPU the
Adam phase reads the two dot products back once per step (a synchronization);
the SGD phase does not.

The sums run over every element of the group: each parameter's ``layers``
(:class:`minidl.optim.layerwise.Layers`, the layer-wise optimizers' seam) give its
terms (``dots``; a plain parameter gives one, Σᵢ aᵢbᵢ), added in the group's
order, and the group's ``complete_sums_`` finishes the two sums (a plain group has
nothing to add). Parameters laid out otherwise (the flat parameters of
:mod:`minidl.parallel`) bring their own ``layers``, and get the sums, so the
switch and its Λ, of one plain group.
"""
from __future__ import annotations

import numbers

import numpy as np

from minidl.backend import fetch, xp_of
from minidl.optim.adam import adam_update
from minidl.optim.kernels import run_update
from minidl.optim.layerwise import layers_of
from minidl.optim.optimizer import Optimizer, check_nonnegative
from minidl.optim.regularization import l2_gradient
from minidl.optim.sgd import sgdm_update


def swats_learning_rate(p_dot_p: float, p_dot_g: float, lam: float, t: int, beta2: float):
    """One step of the estimate: returns (γ, λ, Λ = λ/(1 − β₂ᵗ)); γ is None when pᵀg = 0 (λ unchanged)."""
    if p_dot_g == 0:
        return None, lam, lam / (1 - beta2 ** t)
    gamma = p_dot_p / -p_dot_g
    lam = beta2 * lam + (1 - beta2) * gamma
    return gamma, lam, lam / (1 - beta2 ** t)


def _complete_sums(index: int, live):
    """The ``complete_sums_`` of the group's parameters' layers (:class:`minidl.optim.layerwise.Layers`):
    pᵀp and pᵀg are sums over the whole group, so its parameters must all complete them alike."""
    layers = [layers_of(p, p.array) for _, p in live]
    if len({each.complete_sums_ for each in layers}) > 1:
        kinds = ", ".join(sorted({type(each).__name__ for each in layers}))
        raise ValueError(f"SwitchOptimizer: parameter group {index} mixes parameters whose sums pᵀp and pᵀg are "
                         f"completed differently ({kinds}); its sums must be over one kind: put the kinds in "
                         "separate parameter groups")
    return layers[0].complete_sums_


class SwitchOptimizer(Optimizer):
    """``SwitchOptimizer(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, switch_at=None,
    tol=1e-9, sgd_lr=None)``: Adam, then SGD with momentum β₁ (SWATS; see the module docstring).

    - ``switch_at=None``: switch when SWATS's criterion holds (per group, tolerance ``tol``);
      ``switch_at=k``: switch after exactly k Adam steps.
    - The SGD learning rate is the SWATS estimate Λ at the switch, or ``sgd_lr`` when given.
    - ``weight_decay`` is L2 (added to the gradient) in both phases.

    ``phase(i)`` says 'adam' or 'sgd' for group i; ``switched_at[i]`` is the step of
    the switch (None before) and ``group["lr"]`` becomes Λ at the switch, so a schedule
    set on the group afterwards scales SGD's learning rate.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, switch_at=None,
                 tol=1e-9, sgd_lr=None):
        if switch_at is not None and not (isinstance(switch_at, numbers.Integral) and switch_at >= 1):
            raise ValueError(f"SwitchOptimizer: switch_at must be a step number >= 1 or None (SWATS's criterion), "
                             f"got {switch_at!r}")
        if sgd_lr is not None and not (isinstance(sgd_lr, numbers.Real) and sgd_lr > 0):
            raise ValueError(f"SwitchOptimizer: sgd_lr must be a positive number or None (the SWATS estimate), "
                             f"got {sgd_lr!r}")
        self.switch_at, self.tol, self.sgd_lr = switch_at, check_nonnegative("SwitchOptimizer", "tol", tol), sgd_lr
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.switch = [{"t": 0, "lam": 0.0, "estimate": None, "switched_at": None} for _ in self.param_groups]

    def add_param_group(self, group: dict):
        super().add_param_group(group)
        if hasattr(self, "switch"):
            self.switch.append({"t": 0, "lam": 0.0, "estimate": None, "switched_at": None})

    def phase(self, index: int = 0) -> str:
        return "adam" if self.switch[index]["switched_at"] is None else "sgd"

    @property
    def switched_at(self) -> list:
        return [s["switched_at"] for s in self.switch]

    def step_groups(self):
        first = 0
        for index, group in enumerate(self.param_groups):
            live = [(first + i, p) for i, p in enumerate(group["params"]) if p.grad is not None and p.requires_grad]
            first += len(group["params"])
            if not live:
                continue
            if self.phase(index) == "sgd":
                for position, p in live:
                    state = self.state.setdefault(position, {})
                    if "b" not in state:
                        state["b"] = xp_of(p.array).zeros_like(p.array)
                    run_update(sgdm_update, w=p.array, g=p.grad.array, m=state["b"], lr=group["lr"],
                               beta=group["betas"][0], weight_decay=group["weight_decay"])
            else:
                self._adam_step(index, group, live)

    def _adam_step(self, index, group, live):
        beta1, beta2 = group["betas"]
        complete_sums_ = _complete_sums(index, live)
        sw = self.switch[index]
        sw["t"] += 1
        t = sw["t"]
        p_dot_p_terms, p_dot_g_terms = [], []                # the terms of pᵀp and pᵀg, on the device
        for position, p in live:
            state = self.state.setdefault(position, {})
            if "m" not in state:
                xp = xp_of(p.array)
                state.update(m=xp.zeros_like(p.array), v=xp.zeros_like(p.array))
            g = l2_gradient(p.grad.array, p.array, group["weight_decay"])
            step = -adam_update(p.array, g, state["m"], state["v"], t=t, lr=group["lr"], beta1=beta1, beta2=beta2,
                                eps=group["eps"])            # p: Adam's step, w ← w + p
            layers = layers_of(p, p.array)
            p_dot_p_terms += layers.dots(step, step)
            p_dot_g_terms += layers.dots(step, g)
        values = fetch(*p_dot_p_terms, *p_dot_g_terms)       # one device-to-host copy per step
        n = len(p_dot_p_terms)
        sums = complete_sums_(np.array([float(sum(values[:n])), float(sum(values[n:]))]))
        p_dot_p, p_dot_g = float(sums[0]), float(sums[1])
        gamma, sw["lam"], sw["estimate"] = swats_learning_rate(p_dot_p, p_dot_g, sw["lam"], t, beta2)
        settled = gamma is not None and t > 1 and abs(sw["estimate"] - gamma) < self.tol
        if (self.switch_at is None and settled) or (self.switch_at is not None and t >= self.switch_at):
            sw["switched_at"] = t
            group["lr"] = float(self.sgd_lr if self.sgd_lr is not None else sw["estimate"])

    def state_dict(self) -> dict:
        return {**super().state_dict(), "switch": [dict(s) for s in self.switch]}

    def load_state_dict(self, state_dict: dict):
        switch = state_dict.get("switch") if isinstance(state_dict, dict) else None
        if not (isinstance(switch, list) and len(switch) == len(self.param_groups)
                and all(isinstance(s, dict) and set(s) == {"t", "lam", "estimate", "switched_at"} for s in switch)):
            raise ValueError("SwitchOptimizer.load_state_dict: expected a 'switch' entry with one "
                             "{t, lam, estimate, switched_at} per parameter group, as state_dict() returns")
        super().load_state_dict(state_dict)
        self.switch = [dict(s) for s in switch]
