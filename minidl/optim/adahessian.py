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


def hessian_vector_products(params, grads, generator):
    """z and Hz (arrays) for each parameter: z Rademacher from ``generator``, Hz by a second backward.

    ``grads`` are the parameters' gradients with their graph (None, or without a graph: Hz = 0 for
    that parameter); z is drawn for every parameter, in order, so the generator advances alike
    whatever the gradients hold.
    """
    zs = []
    for p in params:
        z = (generator.integers(0, 2, size=p.shape) * 2 - 1).astype(p.dtype)
        zs.append(Tensor(backend.to_device(z, p.device)))
    live = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
    hz = [None] * len(params)
    if live:
        hz = autograd_grad([grads[i] for i in live], params, grad_outputs=[zs[i] for i in live],
                           allow_unused=True)
    products = [p.xp.zeros(p.shape, p.dtype) if h is None else h.array for p, h in zip(params, hz)]
    return [z.array for z in zs], products


def hutchinson_diagonal(params, grads, generator, reduce=None):
    """D = |z ⊙ Hz| for each parameter (spatially averaged for conv weights), Hz by autograd.

    ``grads`` are the parameters' gradients with their graph; z is drawn from ``generator``
    (a NumPy Generator) so the estimate is reproducible. ``reduce`` (a list of arrays -> a list
    of arrays), when given, acts on the Hz before the absolute value: data parallelism's
    weighted all-reduce, Hz = Σ_r w_r H_r z, the product of the whole batch's Hessian.
    """
    zs, products = hessian_vector_products(params, grads, generator)
    if reduce is not None:
        products = reduce(products)
    return [spatial_average(xp_of(z).abs(z * h)) for z, h in zip(zs, products)]


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

    Data parallelism probes the Hessian through :meth:`probe` before the
    gradients are all-reduced (the all-reduced gradients carry no graph);
    ``step()`` then uses the D the probe kept.
    """

    def __init__(self, params, lr=0.15, betas=(0.9, 0.999), eps=1e-4, weight_decay=0.0, hessian_power=1.0,
                 seed=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      hessian_power=hessian_power))
        if seed is None:
            seed = int(backend.rng("cpu").integers(2 ** 63))
        self.generator = np.random.default_rng(seed)
        self._probed = None  # {id(parameter): D} kept by probe() for the next step

    def check_group(self, group):
        super().check_group(group)
        power = check_nonnegative(self.name, "hessian_power", group["hessian_power"])
        if power > 1:
            raise ValueError(f"{self.name}: hessian_power must lie in [0, 1], got {power}")
        group["hessian_power"] = power

    def probe(self, params, reduce=None, place=None) -> None:
        """Hutchinson's D = |z ⊙ Hz| now, while the gradients carry their graph; kept for the next ``step()``.

        The seam of data parallelism (``DistributedOptimizer.synchronize`` calls it before the
        gradients are averaged, which drops their graph). ``params``: the parameters to draw z for,
        in the order one process draws them; they may be more than this optimizer's own (so the
        generator advances as in one process), and D is kept for this optimizer's own.
        ``reduce``: the list of Hz -> the Hz of the whole batch's loss (the gradients' weighted
        average), applied before the absolute value; by default Hz as it is. ``place``: the list
        of D (one per parameter of ``params``) -> (parameter, D) pairs of this optimizer's
        parameters, where they are laid out otherwise than ``params``; by default each parameter
        keeps its own D. Every caller must draw the same z: ``DistributedOptimizer`` gives every
        copy of the optimizer the same generator state (:meth:`set_generator_state`).
        """
        params = list(params)
        grads = [p.grad for p in params]
        if any(g is not None for g in grads) and not any(g is not None and g.requires_grad for g in grads):
            raise RuntimeError(
                "AdaHessian.probe(): the gradients carry no graph, so the Hessian cannot be probed; "
                "call loss.backward(create_graph=True) before the optimizer synchronizes and steps")
        diagonals = hutchinson_diagonal(params, grads, self.generator, reduce)
        pairs = zip(params, diagonals) if place is None else place(diagonals)
        own = {id(p) for _, p, _ in self.parameters()}
        self._probed = {id(p): d for p, d in pairs if id(p) in own}

    def generator_state(self) -> dict:
        """The state of the generator of z (a dict of plain numbers)."""
        return self.generator.bit_generator.state

    def set_generator_state(self, state: dict) -> None:
        """Continue z from ``state`` (data parallelism gives every process the same, so z is the same everywhere)."""
        self.generator.bit_generator.state = state

    def zero_grad(self, set_to_none: bool = True):
        self._probed = None  # a probe belongs to the gradients it was taken from
        super().zero_grad(set_to_none)

    def step_groups(self):
        entries = [(pos, p, group) for pos, p, group in self.parameters()
                   if p.grad is not None and p.requires_grad]
        probed, self._probed = self._probed, None
        if not entries:
            return
        if probed is None:
            grads = [p.grad for _, p, _ in entries]
            if not any(g.requires_grad for g in grads):
                raise RuntimeError(
                    "AdaHessian.step(): the gradients carry no graph, so the Hessian cannot be probed; "
                    "call loss.backward(create_graph=True) before step()")
            params = [p for _, p, _ in entries]
            diagonals = hutchinson_diagonal(params, grads, self.generator)
        else:
            missing = [pos for pos, p, _ in entries if id(p) not in probed]
            if missing:
                raise RuntimeError(f"AdaHessian.step(): parameters at positions {missing} have a gradient but "
                                   "were not probed; probe() must be given every parameter that steps")
            diagonals = [probed[id(p)] for _, p, _ in entries]
        for (pos, p, group), d in zip(entries, diagonals):
            state = self.state.setdefault(pos, {})
            if "t" not in state:
                state.update(t=0, m=p.xp.zeros_like(p.array), v=p.xp.zeros_like(p.array))
            state["t"] += 1
            beta1, beta2 = group["betas"]
            run_update(adahessian_update, w=p.array, g=p.grad.array, d=d, m=state["m"], v=state["v"],
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
