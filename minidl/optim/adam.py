"""Adam and its family: Adam, AdamW, AMSGrad, NAdam, RAdam.

Adam (Kingma & Ba 2015) is momentum (a running mean m of the gradient)
divided by RMSProp's running size √v of the gradient, each corrected for
starting at zero. The book's advice: start a new problem with Adam; if the
training loss is noisy or unstable, try a larger ε (1e-3 rather than 1e-8),
which makes the step lean towards SGD with momentum where v is tiny.

- AdamW (Loshchilov & Hutter 2019): decay the weights directly
  (w ← w − lr·λw) instead of adding λw to the gradient, where Adam's
  division would shrink the decay of exactly the weights with large gradients.
- AMSGrad (Reddi, Kale & Kumar 2018): divide by the largest v seen so far,
  so the effective step never grows back (the fix to Adam's convergence proof).
- NAdam (Dozat 2016): Nesterov's look-ahead in Adam, with a momentum schedule.
- RAdam (Liu et al. 2020): while too few gradients have been seen for v to be
  trusted, take plain momentum steps; afterwards rectify the adaptive step by
  r_t, the ratio that removes the excess variance of the early √v.
"""
from __future__ import annotations

import math

from minidl.backend import xp_of
from minidl.optim.kernels import run_update
from minidl.optim.optimizer import Optimizer, check_nonnegative
from minidl.optim.regularization import decay_weights_, l2_gradient


def adam_update(w, g, m, v, v_max=None, *, t, lr, beta1, beta2, eps, weight_decay=0.0, decoupled=False,
                tmp=None):
    """One Adam step at step number t (1, 2, ...), in place on w, m, v (and v_max): the book's lines, in order.

        g ← g + λw                      L2 weight decay (Adam)
        w ← w − lr·λ·w                  decoupled weight decay instead (AdamW)
        m ← β₁m + (1 − β₁)g             first moment: momentum
        v ← β₂v + (1 − β₂)g²            second moment: the gradient's running size
        v_max ← max(v_max, v)           AMSGrad only: v̂ is then made from v_max, the largest v so far
        m̂ = m / (1 − β₁ᵗ)              bias corrections: m and v start at 0
        v̂ = v / (1 − β₂ᵗ)
        w ← w − lr·m̂ / (√v̂ + ε)
    Returns the step lr·m̂/(√v̂ + ε) it took (in ``tmp``, scratch shaped like w, when given).
    A bias correction is a multiply by 1/(1 − βᵗ), twice as fast as a divide.
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    if decoupled:
        decay_weights_(w, lr, weight_decay)
    else:
        g = l2_gradient(g, w, weight_decay)
    m *= beta1                                                    # m ← β₁m + (1 − β₁)g
    m += xp.multiply(g, 1 - beta1, out=tmp)
    v *= beta2                                                    # v ← β₂v + (1 − β₂)g²
    v += xp.multiply(1 - beta2, xp.square(g, out=tmp), out=tmp)
    if v_max is not None:                                         # AMSGrad: v_max ← max(v_max, v)
        v = xp.maximum(v_max, v, out=v_max)
    m_hat = xp.multiply(m, 1 / (1 - beta1 ** t), out=tmp)        # m̂ = m / (1 − β₁ᵗ)
    v_hat = xp.multiply(v, 1 / (1 - beta2 ** t))                 # v̂ = v / (1 − β₂ᵗ)
    denominator = xp.add(xp.sqrt(v_hat, out=v_hat), eps, out=v_hat)          # √v̂ + ε
    step = xp.multiply(xp.divide(m_hat, denominator, out=tmp), lr, out=tmp)  # lr·m̂ / (√v̂ + ε)
    w -= step                                                     # w ← w − lr·m̂ / (√v̂ + ε)
    return step


def adam_moments(g, m, v, *, beta1, beta2, tmp, d=None):
    """Adam's two running averages, in place on m and v: the piece of Adam's lines its family shares.

        m ← β₁m + (1 − β₁)g             first moment: momentum
        v ← β₂v + (1 − β₂)g²            second moment: the gradient's running size
    AdaHessian passes its Hessian diagonal estimate ``d``: v ← β₂v + (1 − β₂)D².
    ``tmp`` is scratch shaped like g (its contents are overwritten). :func:`adam_update` writes
    these lines out itself, so that Adam reads as the book in one place.
    """
    xp = xp_of(g)
    m *= beta1                                      # m ← β₁m + (1 − β₁)g
    m += xp.multiply(g, 1 - beta1, out=tmp)
    v *= beta2                                      # v ← β₂v + (1 − β₂)g²
    v += xp.multiply(1 - beta2, xp.square(g if d is None else d, out=tmp), out=tmp)


def bias_corrected(moment, beta, t, out=None):
    """m̂ = m / (1 − β₁ᵗ) or v̂ = v / (1 − β₂ᵗ): a moment corrected for starting at 0 (into ``out`` or a new array).

    Written as a multiply by 1/(1 − βᵗ), twice as fast as a divide.
    """
    return xp_of(moment).multiply(moment, 1 / (1 - beta ** t), out=out)


class Adam(Optimizer):
    """``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False)``.

    See :func:`adam_update`. Matches torch.optim.Adam. The book: if the loss
    is unstable, try eps=1e-3; the bias corrections matter in the first
    ~1/(1 − β₂) = 1000 steps, when v would otherwise be far too small.
    """

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=bool(amsgrad)))

    def update(self, w, g, state, group):
        if "t" not in state:
            xp = xp_of(w)
            state.update(t=0, m=xp.zeros_like(w), v=xp.zeros_like(w))
            if group["amsgrad"]:
                state["v_max"] = xp.zeros_like(w)
        state["t"] += 1
        beta1, beta2 = group["betas"]
        run_update(adam_update, w=w, g=g, m=state["m"], v=state["v"], v_max=state.get("v_max"), t=state["t"],
                   lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                   weight_decay=group["weight_decay"], decoupled=self.decoupled)


class AdamW(Adam):
    """``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False)``.

    Decoupled weight decay: w ← w − lr·λ·w, then the Adam step (torch.optim.AdamW).
    """

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


class AMSGrad(Adam):
    """Adam with ``amsgrad=True``: v_max ← max(v_max, v), denominator √(v_max / (1 − β₂ᵗ)) + ε."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=True)


# ---------------------------------------------------------------- NAdam
def nadam_momentum(t: int, beta1: float, momentum_decay: float) -> float:
    """Dozat's momentum schedule μ_t = β₁(1 − ½·0.96^(t·ψ)), ψ = momentum_decay."""
    return beta1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))


def nadam_update(w, g, m, v, *, t, lr, beta1, beta2, eps, mu, mu_next, mu_product, weight_decay=0.0,
                 tmp=None):
    """One NAdam step, in place on w, m, v (PyTorch's form of Dozat's algorithm).

        g ← g + λw
        m ← β₁m + (1 − β₁)g ;  v ← β₂v + (1 − β₂)g²
        v̂ ← v / (1 − β₂ᵗ)
        w ← w − lr·(1 − μ_t)/(1 − Π_{i≤t} μ_i) · g/(√v̂ + ε)             the gradient's share, now
        w ← w − lr·μ_{t+1}/(1 − Π_{i≤t+1} μ_i) · m/(√v̂ + ε)             momentum, one step ahead
    ``mu_product`` is Π_{i≤t} μ_i (the class keeps it).
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    adam_moments(g, m, v, beta1=beta1, beta2=beta2, tmp=tmp)
    v_hat = bias_corrected(v, beta2, t)
    denom = xp.sqrt(v_hat, out=v_hat)
    denom += eps
    w -= xp.multiply(lr * (1 - mu) / (1 - mu_product), xp.divide(g, denom, out=tmp), out=tmp)
    w -= xp.multiply(lr * mu_next / (1 - mu_product * mu_next), xp.divide(m, denom, out=tmp), out=tmp)


class NAdam(Optimizer):
    """``NAdam(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, momentum_decay=4e-3, weight_decay=0)``.

    See :func:`nadam_update`; matches torch.optim.NAdam.
    """

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, momentum_decay=4e-3, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, momentum_decay=momentum_decay,
                                      weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["momentum_decay"] = check_nonnegative(self.name, "momentum_decay", group["momentum_decay"])

    def update(self, w, g, state, group):
        if "t" not in state:
            state.update(t=0, mu_product=1.0, m=xp_of(w).zeros_like(w), v=xp_of(w).zeros_like(w))
        state["t"] += 1
        t, (beta1, beta2), psi = state["t"], group["betas"], group["momentum_decay"]
        mu, mu_next = nadam_momentum(t, beta1, psi), nadam_momentum(t + 1, beta1, psi)
        state["mu_product"] *= mu
        run_update(nadam_update, w=w, g=g, m=state["m"], v=state["v"], t=t, lr=group["lr"], beta1=beta1,
                   beta2=beta2, eps=group["eps"], mu=mu, mu_next=mu_next, mu_product=state["mu_product"],
                   weight_decay=group["weight_decay"])


# ---------------------------------------------------------------- RAdam
def radam_rectification(t: int, beta2: float, threshold: float = 5.0):
    """RAdam's r_t, or None while the adaptive step is not yet to be trusted.

        ρ∞ = 2/(1 − β₂) − 1                       the length of the SMA approximating the EMA
        ρ_t = ρ∞ − 2tβ₂ᵗ/(1 − β₂ᵗ)
        r_t = √[(ρ_t − 4)(ρ_t − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρ_t)]      if ρ_t > threshold
    The paper's threshold is 4 (where the variance becomes finite); PyTorch,
    and minidl, use 5, which skips the very first, wildly scaled rectified steps.
    """
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    rho_t = rho_inf - 2.0 * t * beta2 ** t / (1.0 - beta2 ** t)
    if rho_t <= threshold:
        return None
    return math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))


def radam_direction(g, m, v, *, t, beta1, beta2, eps, rect, tmp=None):
    """RAdam's direction r (updates m and v in place; r is written into ``tmp`` if given).

        m ← β₁m + (1 − β₁)g ;  v ← β₂v + (1 − β₂)g²
        m̂ ← m / (1 − β₁ᵗ)
        rectified (r_t given):   l ← √(1 − β₂ᵗ) / (√v + ε);   r ← r_t · m̂ · l
        otherwise:               r ← m̂                         (momentum SGD, as the book says)
    """
    xp = xp_of(g)
    tmp = xp.empty_like(g) if tmp is None else tmp
    adam_moments(g, m, v, beta1=beta1, beta2=beta2, tmp=tmp)
    m_hat = bias_corrected(m, beta1, t, out=tmp)
    if rect is None:
        return m_hat
    denom = xp.sqrt(v)
    denom += eps
    l = xp.divide((1 - beta2 ** t) ** 0.5, denom, out=denom)  # noqa: E741 - the paper's name
    return xp.multiply(m_hat, xp.multiply(l, rect, out=l), out=tmp)


def radam_update(w, g, m, v, *, t, lr, beta1, beta2, eps, rect, weight_decay=0.0, decoupled=False, tmp=None):
    """One RAdam step: weight decay (L2, or decoupled w ← w − lr·λw), then w ← w − lr·r."""
    if decoupled:
        decay_weights_(w, lr, weight_decay)
    else:
        g = l2_gradient(g, w, weight_decay)
    r = radam_direction(g, m, v, t=t, beta1=beta1, beta2=beta2, eps=eps, rect=rect, tmp=tmp)
    w -= xp_of(w).multiply(r, lr, out=r)


class RAdam(Optimizer):
    """``RAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, decoupled_weight_decay=False)``.

    See :func:`radam_update` and :func:`radam_rectification`; matches torch.optim.RAdam.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decoupled_weight_decay=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=bool(decoupled_weight_decay)))

    def begin(self, w, state):
        if "t" not in state:
            state.update(t=0, m=xp_of(w).zeros_like(w), v=xp_of(w).zeros_like(w))
        state["t"] += 1

    def update(self, w, g, state, group):
        self.begin(w, state)
        beta1, beta2 = group["betas"]
        rect = radam_rectification(state["t"], beta2)
        run_update(radam_update, w=w, g=g, m=state["m"], v=state["v"], t=state["t"], lr=group["lr"],
                   beta1=beta1, beta2=beta2, eps=group["eps"], rect=rect, weight_decay=group["weight_decay"],
                   decoupled=group["decoupled_weight_decay"])
