"""Gradient descent and its momentum forms: SGD, NAG (Nesterov), SGDM.

Gradient descent is w ← w − lr·∇L(w) on the whole training set; stochastic
gradient descent is the same line on a mini-batch's gradient, so "gradient
descent" here is simply ``SGD`` fed the full batch. Momentum keeps a running
direction b that averages out the zig-zag of a ravine (the book's figure:
plain SGD bounces between the steep walls of an elongated quadratic, SGD with
momentum rolls along its floor).

Two momentum conventions are in use and both are here:

- ``SGD(momentum=μ)``, the classic heavy ball (Polyak 1964; Sutskever et al.
  2013) as PyTorch writes it: b ← μb + g, w ← w − lr·b. The step after a
  long constant gradient is lr·g/(1 − μ), ten times lr·g for μ = 0.9.
- ``SGDM(beta=β)``, the book's exponential average: m ← βm + (1 − β)g,
  w ← w − lr·m. Its step stays lr·g in size; it equals the classic form with
  the learning rate multiplied by (1 − β).
"""
from __future__ import annotations

from minidl.backend import xp_of
from minidl.optim.kernels import run_update
from minidl.optim.optimizer import Optimizer, check_unit
from minidl.optim.regularization import l2_gradient


def sgd_update(w, g, b=None, *, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0, tmp=None):
    """One SGD step, in place on w (and the momentum buffer b).

        g ← g + λw                  weight decay: the gradient of (λ/2)‖w‖²
        b ← μb + (1 − τ)g           b starts at 0 and τ (dampening) is 0 on the first step, so b₁ = g
        w ← w − lr·b                classic momentum
        w ← w − lr·(g + μb)         Nesterov: step from the look-ahead point
        w ← w − lr·g                no momentum (μ = 0, b unused)
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    if momentum:
        b *= momentum
        b += xp.multiply(g, 1 - dampening, out=tmp) if dampening else g
        direction = g + momentum * b if nesterov else b
    else:
        direction = g
    w -= xp.multiply(direction, lr, out=tmp)


class SGD(Optimizer):
    """Stochastic gradient descent, with optional (Nesterov) momentum: see :func:`sgd_update`.

    ``SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False)``, torch.optim.SGD's
    signature and trajectory. Full-batch gradients make it plain gradient descent.
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=bool(nesterov),
                                      weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["momentum"] = check_unit(self.name, "momentum", group["momentum"])
        group["dampening"] = check_unit(self.name, "dampening", group.get("dampening", 0.0), closed_top=True)
        if group["nesterov"] and (not group["momentum"] or group["dampening"]):
            raise ValueError(f"{self.name}: nesterov=True needs a momentum > 0 and dampening 0 (got momentum="
                             f"{group['momentum']}, dampening={group['dampening']})")

    def update(self, w, g, state, group):
        first = group["momentum"] and "b" not in state
        if first:
            state["b"] = xp_of(w).zeros_like(w)
        run_update(sgd_update, w=w, g=g, b=state.get("b"), lr=group["lr"], momentum=group["momentum"],
                   dampening=0.0 if first else group["dampening"], nesterov=group["nesterov"],
                   weight_decay=group["weight_decay"])


class NAG(SGD):
    """Nesterov's accelerated gradient under the book's name: ``SGD(..., nesterov=True)``.

    The gradient is taken where momentum is about to carry the weights, so the
    step corrects itself before overshooting: b ← μb + g, w ← w − lr·(g + μb).
    """

    def __init__(self, params, lr, momentum=0.9, weight_decay=0.0):
        super().__init__(params, lr, momentum=momentum, nesterov=True, weight_decay=weight_decay)


def sgdm_update(w, g, m, *, lr, beta, weight_decay=0.0, tmp=None):
    """The book's SGD with momentum, in place on w and m.

        g ← g + λw                  weight decay
        m ← βm + (1 − β)g           m₀ = 0: an exponential average of the gradients
        w ← w − lr·m
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    g = l2_gradient(g, w, weight_decay)
    m *= beta
    m += xp.multiply(g, 1 - beta, out=tmp)
    w -= xp.multiply(m, lr, out=tmp)


class SGDM(Optimizer):
    """SGD with the book's momentum, m ← βm + (1 − β)g, w ← w − lr·m: see :func:`sgdm_update`.

    ``SGDM(params, lr, beta=0.9, weight_decay=0)``. With lr·(1 − β) in place of lr
    it follows the classic ``SGD(momentum=β)`` trajectory (both start from a zero buffer).
    """

    def __init__(self, params, lr, beta=0.9, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, beta=beta, weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["beta"] = check_unit(self.name, "beta", group["beta"])

    def update(self, w, g, state, group):
        if "m" not in state:
            state["m"] = xp_of(w).zeros_like(w)
        run_update(sgdm_update, w=w, g=g, m=state["m"], lr=group["lr"], beta=group["beta"],
                   weight_decay=group["weight_decay"])
