"""Layer-wise adaptive rates for large batches: LARS, LAMB, NovoGrad.

With very large batches the learning rate must grow, and one global rate
becomes wrong for some layers: where ‖g‖ is large compared with ‖w‖, a step
of lr·g wipes the layer out; where it is small, nothing moves. These
optimizers scale each layer's step by a *trust ratio* built from norms of
that layer only, so every layer moves by a similar fraction of its size.

- LARS (You, Gitman & Ginsburg 2017): SGD with momentum, each layer's rate
  scaled by η‖w‖/(‖g‖ + β‖w‖).
- LAMB (You et al. 2020): the same idea on Adam's direction; trained BERT
  with batches of 64k.
- NovoGrad (Ginsburg et al. 2019): Adam with one second moment per layer
  (a scalar) instead of one per weight: less memory, and the gradient is
  normalized per layer before it enters the momentum.

A layer is one parameter. The equations take its norms from the parameter's
``layers`` (:class:`WholeParameter`: the plain norm), so that a ZeRO-2/3 shard,
a flat piece of several parameters, gives each element the norm of its own
parameter, added over the ranks (:class:`minidl.parallel.sharded.ShardLayers`).
"""
from __future__ import annotations

import numbers

from minidl.backend import xp_of
from minidl.optim.adam import adam_direction
from minidl.optim.optimizer import Optimizer, check_nonnegative, check_unit


def trust_ratio(numerator, denominator):
    """numerator / denominator, or 1 when either is zero (a new or a converged layer).

    Both are 0-d arrays; the result stays on the device (no sync on a GPU).
    """
    xp = xp_of(numerator)
    ok = (numerator > 0) & (denominator > 0)
    return xp.where(ok, numerator / xp.where(ok, denominator, 1), 1)


def norm(x):
    """The Euclidean norm ‖x‖ as a 0-d array of x's dtype."""
    return xp_of(x).linalg.norm(x.reshape(-1))


class WholeParameter:
    """The layers of a plain parameter, for the per-layer norms: one, the parameter itself.

    The seam between the update equations below and a sharded run. The
    equations ask a parameter's ``layers`` for
        norms(x)       ‖x‖ of each layer: a 0-d array here
        spread(a)      a per-layer value for each element of the parameter: ``a`` itself here
        ndims          each layer's ndim (LARS skips 1-D layers): the parameter's ndim here
        shape          the shape of a per-layer value: () here
    A ZeRO-2/3 shard holds pieces of several parameters (and padding); its
    ``layers`` (:class:`minidl.parallel.sharded.ShardLayers`) give one norm per
    parameter of the unit, added over the ranks, so the same equations give
    what one process gives.

    Sums over a whole parameter group (SWATS's pᵀp and pᵀg, :mod:`minidl.optim.switch`)
    take two more:
        dots(a, b)          Σ aᵢbᵢ over each parameter's elements held here, a list of 0-d
                            arrays: [(a * b).sum()] here (a shard: one per piece, no padding)
        sum_over_ranks_(s)  the group's sums s (a host float64 array) added over the ranks
                            that hold the other pieces, in place: none here (``comm`` is None)
    """

    shape = ()
    comm = None

    def __init__(self, ndim: int):
        self.ndims = ndim

    def norms(self, x):
        return norm(x)

    def spread(self, values):
        return values

    def dots(self, a, b):
        return [(a * b).sum()]

    def sum_over_ranks_(self, sums):
        return sums


def layers_of(p, w) -> WholeParameter:
    """The layers of parameter ``p`` (its data ``w``): its own ``layers`` (a shard's), else the whole parameter."""
    layers = getattr(p, "layers", None)
    return WholeParameter(w.ndim) if layers is None else layers


class LayerwiseOptimizer(Optimizer):
    """Base of the optimizers whose update needs per-layer norms: ``update(w, g, state, group, layers)``.

    ``layers`` say how the elements of ``w`` group into layers (:class:`WholeParameter`: one
    layer, the parameter; a ZeRO shard: the pieces of the unit's parameters it holds).
    ``layer_state`` names the state entries holding one number per layer (a 0-d array for a
    whole parameter): a sharded run's checkpoint turns each into one number per parameter.
    """

    layer_state: tuple = ()

    def update_parameter(self, p, w, g, state, group, probe=False):
        layers = layers_of(p, w)
        if probe and hasattr(layers, "local"):  # a trial on zeros (checkpoint checks): no collective
            layers = layers.local()
        self.update(w, g, state, group, layers)


def lars_update(w, g, b, *, lr, momentum, trust_coefficient, weight_decay, adapt=True, layers=None):
    """One LARS step, in place on w and the momentum buffer b.

    The paper's local rate of layer l, with η = trust_coefficient and β = weight_decay:
        local ← η‖w‖ / (‖g‖ + β‖w‖)          λˡ in You, Gitman & Ginsburg (2017)
        local ← 1  when ‖w‖ = 0 or ‖g‖ = 0    (not η: a zero layer still moves; the rule of the
                                              reference implementations, e.g. TensorFlow's and timm's)
        local ← 1 and β ← 0  if not adapt     (1-D parameters)
        b ← μb + lr·local·(g + βw)
        w ← w − b
    With η = 1, μ = 0, β = 0 this is the book's w ← w − lr·(‖w‖/‖g‖)·g.
    ``layers`` (default: w is one layer) give the norms per layer and spread ``local`` and β
    over the layers' elements (:class:`WholeParameter`); ``adapt`` is then one flag per layer.
    """
    layers = WholeParameter(w.ndim) if layers is None else layers
    decay = weight_decay
    if adapt is False:
        local, decay = 1.0, 0.0
    else:
        w_norm, g_norm = layers.norms(w), layers.norms(g)
        ratio = trust_coefficient * trust_ratio(w_norm, g_norm + weight_decay * w_norm)
        adapt = adapt if adapt is True else xp_of(w).asarray(adapt)  # one flag per layer: on w's device
        local = xp_of(w).where(adapt & (w_norm > 0) & (g_norm > 0), ratio, 1)
        if adapt is not True and weight_decay:  # no decay on the layers that skip
            decay = layers.spread(xp_of(w).where(adapt, weight_decay, 0).astype(w.dtype))
    step = g + decay * w if not isinstance(decay, numbers.Real) or decay else g
    b *= momentum
    b += layers.spread(lr * local) * step
    w -= b


class LARS(LayerwiseOptimizer):
    """``LARS(params, lr, momentum=0.9, trust_coefficient=0.001, weight_decay=0)``: see :func:`lars_update`.

    1-D parameters (biases, normalization scales) skip the adaptation and the
    weight decay, as in the paper's implementation: their local rate is 1.
    """

    def __init__(self, params, lr, momentum=0.9, trust_coefficient=0.001, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, trust_coefficient=trust_coefficient,
                                      weight_decay=weight_decay))

    def check_group(self, group):
        super().check_group(group)
        group["momentum"] = check_unit(self.name, "momentum", group["momentum"])
        group["trust_coefficient"] = check_nonnegative(self.name, "trust_coefficient", group["trust_coefficient"])

    def update(self, w, g, state, group, layers=None):
        layers = WholeParameter(w.ndim) if layers is None else layers
        if "b" not in state:
            state["b"] = xp_of(w).zeros_like(w)
        lars_update(w, g, state["b"], lr=group["lr"], momentum=group["momentum"],
                    trust_coefficient=group["trust_coefficient"], weight_decay=group["weight_decay"],
                    adapt=layers.ndims > 1, layers=layers)


def lamb_update(w, g, m, v, *, t, lr, beta1, beta2, eps, weight_decay, layers=None):
    """One LAMB step, in place on w, m, v.

        r ← the Adam direction m̂/(√v̂ + ε)      (:func:`minidl.optim.adam.adam_direction`)
        u ← r + λw                               decoupled weight decay
        trust ← ‖w‖ / ‖u‖                        per layer; 1 when a norm is zero
        w ← w − lr·trust·u
    ``layers`` (default: w is one layer) give the norms per layer and spread the trust ratios
    over the layers' elements (:class:`WholeParameter`).
    """
    layers = WholeParameter(w.ndim) if layers is None else layers
    r = adam_direction(g, m, v, t=t, beta1=beta1, beta2=beta2, eps=eps)
    u = r + weight_decay * w if weight_decay else r
    trust = trust_ratio(layers.norms(w), layers.norms(u))
    w -= layers.spread(lr * trust) * u


class LAMB(LayerwiseOptimizer):
    """``LAMB(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0)``: see :func:`lamb_update`."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, w, g, state, group, layers=None):
        if "t" not in state:
            state.update(t=0, m=xp_of(w).zeros_like(w), v=xp_of(w).zeros_like(w))
        state["t"] += 1
        beta1, beta2 = group["betas"]
        lamb_update(w, g, state["m"], state["v"], t=state["t"], lr=group["lr"], beta1=beta1, beta2=beta2,
                    eps=group["eps"], weight_decay=group["weight_decay"], layers=layers)


def novograd_update(w, g, m, v, *, lr, beta1, beta2, eps, weight_decay, first, layers=None):
    """One NovoGrad step, in place on w and m; returns the new per-layer v (a 0-d array; one per layer).

        v ← ‖g‖²  on the first step, then  v ← β₂v + (1 − β₂)‖g‖²      one number per layer
        m ← β₁m + g/(√v + ε) + λw
        w ← w − lr·m
    The gradient itself is never modified. ``layers`` (default: w is one layer) give the norms
    per layer and spread √v over the layers' elements (:class:`WholeParameter`).
    """
    layers = WholeParameter(w.ndim) if layers is None else layers
    g_norm2 = layers.norms(g) ** 2
    v = g_norm2 if first else beta2 * v + (1 - beta2) * g_norm2
    m *= beta1
    m += g / (layers.spread(xp_of(w).sqrt(v)) + eps)
    if weight_decay:
        m += weight_decay * w
    w -= lr * m
    return v


class NovoGrad(LayerwiseOptimizer):
    """``NovoGrad(params, lr, betas=(0.95, 0.98), eps=1e-8, weight_decay=0)``: see :func:`novograd_update`."""

    def __init__(self, params, lr, betas=(0.95, 0.98), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    layer_state = ("v",)

    def update(self, w, g, state, group, layers=None):
        layers = WholeParameter(w.ndim) if layers is None else layers
        first = "m" not in state
        if first:
            state.update(m=xp_of(w).zeros_like(w), v=xp_of(w).zeros(layers.shape, w.dtype))
        beta1, beta2 = group["betas"]
        v = novograd_update(w, g, state["m"], state["v"], lr=group["lr"], beta1=beta1, beta2=beta2,
                            eps=group["eps"], weight_decay=group["weight_decay"], first=first, layers=layers)
        state["v"] = xp_of(w).asarray(v, dtype=w.dtype)  # a 0-d array: checkpoints keep its exact dtype
