"""Per-coordinate learning rates: Adagrad, RMSprop, Adadelta (PyTorch's spellings; AdaGrad, RMSProp, AdaDelta too).

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
from minidl.optim.optimizer import Optimizer, check_unit
from minidl.optim.regularization import l2_gradient


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


class Adagrad(Optimizer):
    """``Adagrad(params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10)``.

    torch.optim.Adagrad's signature and trajectory (``AdaGrad`` is the same class): see
    :func:`adagrad_update`, with s starting at ``initial_accumulator_value`` and the step t
    (from 1) using the learning rate lr / (1 + (t − 1)·lr_decay).
    """

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps))

    def check_group(self, group):
        super().check_group(group)
        for key in ("lr_decay", "initial_accumulator_value"):
            value = group.setdefault(key, 0.0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{self.name}: {key} must be a number >= 0, got {key}={value!r}")

    def update(self, w, g, state, group):
        if "s" not in state:
            state["s"] = xp_of(w).full_like(w, group["initial_accumulator_value"])
            state["step"] = 0
        state["step"] += 1
        lr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        run_update(adagrad_update, w=w, g=g, s=state["s"], lr=lr, eps=group["eps"],
                   weight_decay=group["weight_decay"])


AdaGrad = Adagrad  # minidl's earlier spelling


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


class RMSprop(Optimizer):
    """``RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False)``.

    torch.optim.RMSprop's signature and trajectory, centered and with momentum included
    (``RMSProp`` is the same class): see :func:`rmsprop_update`, where PyTorch's ``alpha``
    is the average's ρ (``rho=`` is accepted as its other name, and is the group's key).
    """

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, *,
                 rho=None):
        if rho is not None and alpha != 0.99:
            raise TypeError(f"RMSprop: got alpha={alpha!r} and rho={rho!r}; pass one (they are the same ρ)")
        super().__init__(params, dict(lr=lr, rho=alpha if rho is None else rho, eps=eps, momentum=momentum,
                                      centered=bool(centered), weight_decay=weight_decay))

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


class Adadelta(Optimizer):
    """``Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0)``: see :func:`adadelta_update`.

    torch.optim.Adadelta's signature and trajectory (``AdaDelta`` is the same class).
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


RMSProp = RMSprop  # minidl's earlier spellings
AdaDelta = Adadelta
