"""Per-coordinate learning rates: AdaGrad, RMSProp, AdaDelta.

Each divides the step of every weight by a running size of its own
gradients, so steep directions take small steps and flat ones large steps:

- AdaGrad (Duchi, Hazan & Singer 2011) divides by the root of the *sum* of
  all squared gradients so far, so its steps only shrink; good for sparse
  features, too cautious for long deep-learning runs.
- RMSProp (Hinton's lecture 6e, 2012) replaces the sum by an exponential
  average, so the step size recovers when the gradients get small.
- AdaDelta (Zeiler 2012) also rescales the numerator by the average size of
  the past updates, which makes the step carry the units of w and the
  learning rate (1.0) almost a formality.
"""
from __future__ import annotations

from minidl.backend import xp_of
from minidl.optim.kernels import run_update
from minidl.optim.optimizer import Optimizer, check_unit, l2_gradient


def adagrad_update(w, g, s, *, lr, eps, weight_decay=0.0, tmp=None):
    """One AdaGrad step, in place on w and s.

        g ← g + λw              weight decay
        s ← s + g²              the sum of every squared gradient so far
        w ← w − lr·g / (√s + ε)
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    s += xp.square(g, out=tmp)
    denom = xp.sqrt(s, out=tmp)
    denom += eps
    r = xp.divide(g, denom, out=tmp)
    w -= xp.multiply(r, lr, out=tmp)


class AdaGrad(Optimizer):
    """``AdaGrad(params, lr=1e-2, eps=1e-10, weight_decay=0)``: see :func:`adagrad_update`.

    Matches torch.optim.Adagrad with lr_decay=0 and initial_accumulator_value=0.
    """

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay))

    def update(self, w, g, state, group):
        if "s" not in state:
            state["s"] = xp_of(w).zeros_like(w)
        run_update(adagrad_update, w=w, g=g, s=state["s"], lr=group["lr"], eps=group["eps"],
                   weight_decay=group["weight_decay"])


def rmsprop_update(w, g, s, b=None, g_avg=None, *, lr, rho, eps, momentum=0.0, weight_decay=0.0, tmp=None):
    """One RMSProp step, in place on w and the averages.

        g ← g + λw                      weight decay
        s ← ρs + (1 − ρ)g²              running mean of the squared gradient
        ḡ ← ρḡ + (1 − ρ)g               centered only: running mean of the gradient
        r ← g / (√s + ε)                 or, centered, g / (√(s − ḡ²) + ε): the variance
        b ← μb + r;  r ← b               with momentum only
        w ← w − lr·r
    ε is outside the square root, as in PyTorch.
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    s *= rho
    s += xp.multiply(1 - rho, xp.square(g, out=tmp), out=tmp)
    if g_avg is not None:
        g_avg *= rho
        g_avg += xp.multiply(g, 1 - rho, out=tmp)
        denom = xp.subtract(s, xp.square(g_avg, out=tmp), out=tmp)
        denom = xp.sqrt(denom, out=tmp)
    else:
        denom = xp.sqrt(s, out=tmp)
    denom += eps
    r = xp.divide(g, denom, out=tmp)
    if momentum:
        b *= momentum
        b += r
        r = b
    w -= xp.multiply(r, lr, out=tmp)


class RMSProp(Optimizer):
    """``RMSProp(params, lr=1e-2, rho=0.99, eps=1e-8, momentum=0, centered=False, weight_decay=0)``.

    See :func:`rmsprop_update`. ``rho`` is PyTorch's ``alpha``; the trajectory matches
    torch.optim.RMSprop, centered and with momentum included.
    """

    def __init__(self, params, lr=1e-2, rho=0.99, eps=1e-8, momentum=0.0, centered=False, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, momentum=momentum, centered=bool(centered),
                                      weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["rho"] = check_unit(self.name, "rho", group["rho"])
        group["momentum"] = check_unit(self.name, "momentum", group["momentum"])

    def update(self, w, g, state, group):
        xp = xp_of(w)
        if "s" not in state:
            state["s"] = xp.zeros_like(w)
            if group["momentum"]:
                state["b"] = xp.zeros_like(w)
            if group["centered"]:
                state["g_avg"] = xp.zeros_like(w)
        run_update(rmsprop_update, w=w, g=g, s=state["s"], b=state.get("b"), g_avg=state.get("g_avg"),
                   lr=group["lr"], rho=group["rho"], eps=group["eps"], momentum=group["momentum"],
                   weight_decay=group["weight_decay"])


def adadelta_update(w, g, v, u, *, lr, rho, eps, weight_decay=0.0, tmp=None):
    """One AdaDelta step (Zeiler 2012, Algorithm 1), in place on w, v and u.

        g  ← g + λw                             weight decay
        v  ← ρv + (1 − ρ)g²                     E[g²], running mean of squared gradients
        Δw ← −(√(u + ε) / √(v + ε)) · g         RMS of past updates over RMS of gradients
        u  ← ρu + (1 − ρ)Δw²                    E[Δw²], running mean of squared updates
        w  ← w + lr·Δw
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    v *= rho
    v += xp.multiply(1 - rho, xp.square(g, out=tmp), out=tmp)
    delta = xp.sqrt(u + eps) / xp.sqrt(v + eps) * g        # −Δw
    u *= rho
    u += xp.multiply(1 - rho, xp.square(delta, out=tmp), out=tmp)
    w -= xp.multiply(delta, lr, out=tmp)


class AdaDelta(Optimizer):
    """``AdaDelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0)``: see :func:`adadelta_update`.

    Matches torch.optim.Adadelta.
    """

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["rho"] = check_unit(self.name, "rho", group["rho"])

    def update(self, w, g, state, group):
        if "v" not in state:
            state["v"] = xp_of(w).zeros_like(w)
            state["u"] = xp_of(w).zeros_like(w)
        run_update(adadelta_update, w=w, g=g, v=state["v"], u=state["u"], lr=group["lr"], rho=group["rho"],
                   eps=group["eps"], weight_decay=group["weight_decay"])
