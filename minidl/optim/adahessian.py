"""AdaHessian (Yao et al. 2021): Adam with the Hessian's diagonal in place of g².

Adam divides by the running size of the gradient, a rough stand-in for the
curvature. AdaHessian measures the curvature itself: Hutchinson's estimator
gives the diagonal of the Hessian H from one Hessian-vector product,

    z ~ Rademacher (each entry ±1 with probability ½),   E[z ⊙ Hz] = diag(H),

and Hz costs one more backward pass through the graph of the gradient (so
the loss must be backpropagated with ``create_graph=True``). For a
convolution weight the estimate is averaged over each kernel's spatial
positions, which lowers its variance.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.autograd import grad as autograd_grad
from minidl.backend import xp_of
from minidl.optim.adam import adam_moments, bias_corrected
from minidl.optim.kernels import run_update
from minidl.optim.optimizer import Optimizer, check_nonnegative
from minidl.tensor import Tensor


def spatial_average(d):
    """Average |z ⊙ Hz| over the kernel axes (2, 3, ...) of a convolution weight; others unchanged."""
    if d.ndim < 3:
        return d
    mean = d.mean(axis=tuple(range(2, d.ndim)), keepdims=True)
    return xp_of(d).broadcast_to(mean, d.shape)


def hutchinson_diagonal(params, grads, generator):
    """D = |z ⊙ Hz| for each parameter (spatially averaged for conv weights), Hz by autograd.

    ``grads`` are the parameters' gradients with their graph; z is drawn from ``generator``
    (a NumPy Generator) so the estimate is reproducible.
    """
    zs = []
    for p in params:
        z = (generator.integers(0, 2, size=p.shape) * 2 - 1).astype(p.dtype)
        zs.append(Tensor(backend.to_device(z, p.device)))
    live = [i for i, g in enumerate(grads) if g.requires_grad]
    hz = autograd_grad([grads[i] for i in live], params, grad_outputs=[zs[i] for i in live], allow_unused=True)
    diagonals = []
    for p, z, h in zip(params, zs, hz):
        d = p.xp.zeros(p.shape, p.dtype) if h is None else p.xp.abs(z.data * h.data)
        diagonals.append(spatial_average(d))
    return diagonals


def adahessian_update(w, g, d, m, v, *, t, lr, beta1, beta2, eps, hessian_power, weight_decay, tmp=None):
    """One AdaHessian step, in place on w, m, v; D is the Hessian diagonal estimate.

        m ← β₁m + (1 − β₁)g                          the moments of :func:`minidl.optim.adam.adam_moments`
        v ← β₂v + (1 − β₂)D²                         with D in place of g
        m̂ ← m / (1 − β₁ᵗ);   v̂ ← v / (1 − β₂ᵗ)
        w ← w − lr·(m̂ / ((√v̂)^k + ε) + λw)            k = hessian_power
    """
    xp = xp_of(w)
    tmp = xp.empty_like(w) if tmp is None else tmp
    adam_moments(g, m, v, beta1=beta1, beta2=beta2, tmp=tmp, d=d)
    v_hat = bias_corrected(v, beta2, t)
    denom = xp.power(xp.sqrt(v_hat, out=v_hat), hessian_power, out=v_hat)
    denom += eps
    m_hat = bias_corrected(m, beta1, t, out=tmp)
    step = xp.divide(m_hat, denom, out=tmp)
    if weight_decay:
        step += weight_decay * w
    w -= xp.multiply(step, lr, out=tmp)


class AdaHessian(Optimizer):
    """``AdaHessian(params, lr=0.15, betas=(0.9, 0.999), eps=1e-4, weight_decay=0, hessian_power=1.0, seed=None)``.

    Call ``loss.backward(create_graph=True)`` before ``step()``. The Rademacher
    vectors come from the optimizer's own generator, seeded by ``seed`` or,
    when None, from minidl's seeded generator (``mdl.manual_seed``); its state
    is part of ``state_dict()``.
    """

    def __init__(self, params, lr=0.15, betas=(0.9, 0.999), eps=1e-4, weight_decay=0.0, hessian_power=1.0,
                 seed=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      hessian_power=hessian_power))
        if seed is None:
            seed = int(backend.rng("cpu").integers(2 ** 63))
        self.generator = np.random.default_rng(seed)

    def check_group(self, group):
        super().check_group(group)
        power = check_nonnegative(self.name, "hessian_power", group["hessian_power"])
        if power > 1:
            raise ValueError(f"{self.name}: hessian_power must lie in [0, 1], got {power}")
        group["hessian_power"] = power

    def step_groups(self):
        entries = [(pos, p, group) for pos, p, group in self.parameters()
                   if p.grad is not None and p.requires_grad]
        if not entries:
            return
        grads = [p.grad for _, p, _ in entries]
        if not any(g.requires_grad for g in grads):
            raise RuntimeError(
                "AdaHessian.step(): the gradients carry no graph, so the Hessian cannot be probed; "
                "call loss.backward(create_graph=True) before step()")
        params = [p for _, p, _ in entries]
        diagonals = hutchinson_diagonal(params, grads, self.generator)
        for (pos, p, group), d in zip(entries, diagonals):
            state = self.state.setdefault(pos, {})
            if "t" not in state:
                state.update(t=0, m=p.xp.zeros_like(p.data), v=p.xp.zeros_like(p.data))
            state["t"] += 1
            beta1, beta2 = group["betas"]
            run_update(adahessian_update, w=p.data, g=p.grad.data, d=d, m=state["m"], v=state["v"],
                       t=state["t"], lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                       hessian_power=group["hessian_power"], weight_decay=group["weight_decay"])

    def state_dict(self):
        result = super().state_dict()
        result["generator"] = self.generator.bit_generator.state
        return result

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if "generator" in state_dict:
            self.generator.bit_generator.state = state_dict["generator"]
