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

A layer is one parameter. The equations below are the papers' lines for one
layer; the norms (and LARS's ndim) come through the parameter's ``layers``
(:class:`Layers`), which a plain parameter answers as one layer.
"""
from __future__ import annotations

from minidl.backend import xp_of
from minidl.optim.adam import adam_moments, bias_corrected
from minidl.optim.optimizer import Optimizer, check_nonnegative, check_unit


def trust_ratio(numerator, denominator):
    """numerator / denominator, or 1 where either is zero (a new or a converged layer).

    Elementwise on arrays (0-d for one layer); the result stays on the device (no sync on a GPU).
    """
    xp = xp_of(numerator)
    ok = (numerator > 0) & (denominator > 0)
    return xp.where(ok, numerator / xp.where(ok, denominator, 1), 1)


def norm(x):
    """The Euclidean norm ‖x‖ as a 0-d array of x's dtype: the whole array is one layer."""
    return xp_of(x).linalg.norm(x.reshape(-1))


class Layers:
    """How the elements of a parameter group into layers: the one seam of the layer-wise equations.

    The layer-wise optimizers measure each layer (a parameter) on its own: its norm,
    its ndim, NovoGrad's one second moment per layer, and SWATS sums over a whole
    parameter group. The update equations take these as arguments, and the
    optimizers take them from each parameter's ``layers`` (:func:`layers_of`):

        norm(x)            ‖·‖ of the layer each element of x belongs to, broadcastable against x
        ndim               the ndim of the layer each element belongs to, broadcastable against it
        layer_norms(x)     ‖·‖ of each layer, one number per layer, as a per-layer state keeps it
        per_element(a)     one number per layer (as layer_norms gives them), broadcastable against the elements
        dots(a, b)         the terms of Σᵢ aᵢbᵢ over the elements, a list of 0-d arrays
        complete_sums_(s)  a parameter group's sums of such terms (a host float64 array), completed in
                           place and returned; a group's parameters share one ``complete_sums_``
        local()            the same layers for a trial step on zero arrays (a state template), which
                           must consult nothing beyond the arrays it is given

    :class:`WholeParameter` is the book's case, where a parameter is one layer, and what
    every plain parameter gets. A parameter whose elements belong to several layers carries
    its own ``layers`` (:mod:`minidl.parallel` gives one to each flat parameter it lays out),
    and the same equations then give each element what its own layer would get.
    """

    def norm(self, x):
        return self.per_element(self.layer_norms(x))

    def layer_norms(self, x):
        raise NotImplementedError(f"{type(self).__name__} must define layer_norms(x)")

    def per_element(self, values):
        raise NotImplementedError(f"{type(self).__name__} must define per_element(values)")

    def dots(self, a, b):
        raise NotImplementedError(f"{type(self).__name__} must define dots(a, b)")

    @staticmethod
    def complete_sums_(sums):
        return sums  # every term is here: one function for every instance, so groups compare alike

    def local(self) -> "Layers":
        return self


class WholeParameter(Layers):
    """The layers of a plain parameter: one, the parameter itself (see :class:`Layers`).

    ``norm(x)`` and ``layer_norms(x)`` are ‖x‖ (a 0-d array), ``per_element(a)`` is ``a``,
    ``ndim`` the parameter's ndim, ``dots(a, b)`` is [Σᵢ aᵢbᵢ] and ``complete_sums_`` leaves the sums as they are.
    """

    def __init__(self, ndim: int):
        self.ndim = ndim

    def norm(self, x):
        return norm(x)

    def layer_norms(self, x):
        return norm(x)

    def per_element(self, values):
        return values

    def dots(self, a, b):
        return [(a * b).sum()]


def layers_of(p, w) -> Layers:
    """The layers of parameter ``p`` (its data ``w``): its own ``layers`` if it carries them, else one whole layer."""
    layers = getattr(p, "layers", None)
    return WholeParameter(w.ndim) if layers is None else layers


class LayerwiseOptimizer(Optimizer):
    """Base of the optimizers whose update needs per-layer norms: ``update(w, g, state, group, layers)``.

    ``layers`` (:class:`Layers`) say how the elements of ``w`` group into layers (a plain
    parameter: one). ``layer_state`` names the state entries holding one number per layer
    (a 0-d array for a whole parameter), so that code which regroups parameters (checkpoints
    of :mod:`minidl.parallel`) knows to keep one number per parameter.
    """

    layer_state: tuple = ()

    def update_parameter(self, p, w, g, state, group, probe=False):
        layers = layers_of(p, w)
        self.update(w, g, state, group, layers.local() if probe else layers)


def lars_update(w, g, b, *, lr, momentum, trust_coefficient, weight_decay, adapt=True, norm=norm):
    """One LARS step, in place on w and the momentum buffer b.

    The paper's local rate of layer l, with η = trust_coefficient and β = weight_decay:
        local ← η‖w‖ / (‖g‖ + β‖w‖)          λˡ in You, Gitman & Ginsburg (2017)
        local ← 1  when ‖w‖ = 0 or ‖g‖ = 0    (not η: a zero layer still moves; the rule of the
                                              reference implementations, e.g. TensorFlow's and timm's)
        local ← 1 and β ← 0  if not adapt     (1-D layers)
        b ← μb + lr·local·(g + βw)
        w ← w − b
    With η = 1, μ = 0, β = 0 this is the book's w ← w − lr·(‖w‖/‖g‖)·g.
    ``norm(x)``: ‖·‖ of the layer each element of x belongs to, broadcastable against x (default:
    the whole array is one layer); ``adapt``: True, False, or a flag for each element's layer.
    """
    xp = xp_of(w)
    if adapt is False:
        local, decay = 1.0, 0.0
    else:
        w_norm, g_norm = norm(w), norm(g)
        local = trust_coefficient * trust_ratio(w_norm, g_norm + weight_decay * w_norm)
        local = xp.where(adapt & (w_norm > 0) & (g_norm > 0), local, 1)
        decay = weight_decay if adapt is True else xp.where(adapt, weight_decay, 0).astype(w.dtype)
    b *= momentum
    b += lr * local * (g + decay * w)
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
                    adapt=layers.ndim > 1, norm=layers.norm)


def lamb_update(w, g, m, v, *, t, lr, beta1, beta2, eps, weight_decay, norm=norm):
    """One LAMB step, in place on w, m, v.

        m ← β₁m + (1 − β₁)g;  v ← β₂v + (1 − β₂)g²      Adam's moments (:func:`minidl.optim.adam.adam_moments`)
        m̂ = m / (1 − β₁ᵗ);  v̂ = v / (1 − β₂ᵗ)
        r ← m̂ / (√v̂ + ε)                                 Adam's direction
        u ← r + λw                                        decoupled weight decay
        trust ← ‖w‖ / ‖u‖                                 per layer; 1 when a norm is zero
        w ← w − lr·trust·u
    ``norm(x)``: ‖·‖ of the layer each element of x belongs to, broadcastable against x (default:
    the whole array is one layer).
    """
    xp = xp_of(w)
    adam_moments(g, m, v, beta1=beta1, beta2=beta2, tmp=xp.empty_like(w))
    m_hat, v_hat = bias_corrected(m, beta1, t), bias_corrected(v, beta2, t)
    r = m_hat / (xp.sqrt(v_hat) + eps)
    u = r + weight_decay * w if weight_decay else r
    trust = trust_ratio(norm(w), norm(u))
    w -= lr * trust * u


class LAMB(LayerwiseOptimizer):
    """``LAMB(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0)``: see :func:`lamb_update`."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, w, g, state, group, layers=None):
        layers = WholeParameter(w.ndim) if layers is None else layers
        if "t" not in state:
            state.update(t=0, m=xp_of(w).zeros_like(w), v=xp_of(w).zeros_like(w))
        state["t"] += 1
        beta1, beta2 = group["betas"]
        lamb_update(w, g, state["m"], state["v"], t=state["t"], lr=group["lr"], beta1=beta1, beta2=beta2,
                    eps=group["eps"], weight_decay=group["weight_decay"], norm=layers.norm)


def novograd_second_moment(g, v, *, beta2, norm=norm):
    """NovoGrad's second moment, one number per layer (``v`` None before the first step):

        v ← ‖g‖²                       on the first step
        v ← β₂v + (1 − β₂)‖g‖²          afterwards
    ``norm(x)``: ‖·‖ of each layer of x, one number per layer (default: the whole array is one layer).
    """
    g_norm2 = norm(g) ** 2
    return g_norm2 if v is None else beta2 * v + (1 - beta2) * g_norm2


def novograd_update(w, g, m, v, *, lr, beta1, eps, weight_decay):
    """One NovoGrad step, in place on w and m; v is the layer's second moment (:func:`novograd_second_moment`),
    broadcastable against w.

        m ← β₁m + g/(√v + ε) + λw
        w ← w − lr·m
    The gradient itself is never modified.
    """
    m *= beta1
    m += g / (xp_of(w).sqrt(v) + eps)
    if weight_decay:
        m += weight_decay * w
    w -= lr * m


class NovoGrad(LayerwiseOptimizer):
    """``NovoGrad(params, lr, betas=(0.95, 0.98), eps=1e-8, weight_decay=0)``: see :func:`novograd_update`.

    Its state keeps v as one number per layer (a 0-d array for a plain parameter).
    """

    def __init__(self, params, lr, betas=(0.95, 0.98), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    layer_state = ("v",)

    def update(self, w, g, state, group, layers=None):
        layers = WholeParameter(w.ndim) if layers is None else layers
        if "m" not in state:
            state["m"] = xp_of(w).zeros_like(w)
        beta1, beta2 = group["betas"]
        v = novograd_second_moment(g, state.get("v"), beta2=beta2, norm=layers.layer_norms)
        state["v"] = xp_of(w).asarray(v, dtype=w.dtype)  # one number per layer; checkpoints keep its exact dtype
        novograd_update(w, g, state["m"], layers.per_element(state["v"]), lr=group["lr"], beta1=beta1,
                        eps=group["eps"], weight_decay=group["weight_decay"])
