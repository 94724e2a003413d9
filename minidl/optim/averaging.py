"""Averaging weights: Lookahead, SWA, and the book's recommended Ranger and RangerLARS.

- Lookahead (Zhang et al. 2019) keeps slow weights φ beside the fast weights
  θ that an inner optimizer moves. Every k steps φ moves a fraction α towards
  θ and θ restarts from φ: the inner optimizer explores, the slow weights
  keep only its average progress, which steadies training.
- SWA (Izmailov et al. 2018) averages the weights visited late in training:
  the average lies nearer the centre of a wide, flat minimum, which tends to
  generalize better. The book's recipe: train as usual for 75% of the
  budget, then call ``update()`` once per epoch (at a constant or cyclical
  learning rate), ``swap()`` in the average, and recompute the BatchNorm
  statistics with ``update_bn`` (the average of the weights is not matched by
  the average of the running statistics).
- Ranger = Lookahead over RAdam (with decoupled weight decay); RangerLARS =
  the same with each layer's RAdam step scaled by LAMB's trust ratio. The
  book recommends these two; they need little tuning.
"""
from __future__ import annotations

import numbers

from minidl.autograd import no_grad
from minidl.backend import xp_of
from minidl.optim.adam import RAdam, radam_direction, radam_rectification
from minidl.optim.kernels import run_update
from minidl.optim.layerwise import LayerwiseOptimizer, WholeParameter, norm, trust_ratio
from minidl.optim.optimizer import Optimizer, check_unit
from minidl.optim.saved_state import host_copy, on_device
from minidl.optim.wrapper import WrapsOptimizer
from minidl.tensor import Tensor, mark_changed


def lookahead_update(w, phi, *, alpha):
    """The slow-weight step: φ ← φ + α(θ − φ);  θ ← φ   (θ is w, the fast weights)."""
    phi += alpha * (w - phi)
    xp_of(w).copyto(w, phi)


class Lookahead(WrapsOptimizer, Optimizer):
    """``Lookahead(optimizer, k=5, alpha=0.5)``: slow weights over any inner optimizer.

    φ₀ = θ₀; after every k steps of ``optimizer``: φ ← φ + α(θ − φ), θ ← φ.
    ``param_groups`` and ``state`` are the inner optimizer's, so schedulers work unchanged.
    """

    def __init__(self, optimizer: Optimizer, k: int = 5, alpha: float = 0.5):  # noqa: D107 - no super().__init__
        if not isinstance(optimizer, Optimizer):
            raise TypeError("Lookahead: expected an inner optimizer (e.g. RAdam(params)), "
                            f"got {type(optimizer).__name__}")
        if not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"Lookahead: k (inner steps per slow update) must be an integer ≥ 1, got k={k!r}")
        self.optimizer = optimizer
        self.k = int(k)
        self.alpha = check_unit("Lookahead", "alpha", alpha, closed_top=True)
        self.defaults = optimizer.defaults
        self.slow = {pos: p.array.copy() for pos, p, _ in optimizer.parameters()}
        self.inner_steps = 0

    def add_param_group(self, group):
        self.optimizer.add_param_group(group)
        self.slow = {pos: self.slow.get(pos, p.array.copy()) for pos, p, _ in self.optimizer.parameters()}

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.inner_steps += 1
        if self.inner_steps % self.k == 0:
            with no_grad():
                for pos, p, _ in self.optimizer.parameters():
                    run_update(lookahead_update, w=p.array, phi=self.slow[pos], alpha=self.alpha)
                mark_changed(*[p for _, p, _ in self.optimizer.parameters()])
        return loss

    def state_dict(self):
        return {"inner": self.optimizer.state_dict(), "slow": {pos: host_copy(a) for pos, a in self.slow.items()},
                "inner_steps": self.inner_steps, "k": self.k, "alpha": self.alpha}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["inner"])
        devices = {pos: p.device for pos, p, _ in self.optimizer.parameters()}
        self.slow = {int(pos): on_device(a, devices[int(pos)]) for pos, a in state_dict["slow"].items()}
        self.inner_steps = int(state_dict["inner_steps"])
        self.k, self.alpha = int(state_dict["k"]), float(state_dict["alpha"])

    def __repr__(self):
        return f"Lookahead(k={self.k}, alpha={self.alpha}, {self.optimizer!r})"


class Ranger(Lookahead):
    """``Ranger(params, lr=1e-3, betas=(0.95, 0.999), eps=1e-5, weight_decay=0, k=6, alpha=0.5)``.

    Lookahead over RAdam with decoupled weight decay (w ← w − lr·λw each step).
    """

    def __init__(self, params, lr=1e-3, betas=(0.95, 0.999), eps=1e-5, weight_decay=0.0, k=6, alpha=0.5):
        super().__init__(RAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                               decoupled_weight_decay=True), k=k, alpha=alpha)


def radam_lamb_update(w, g, m, v, *, t, lr, beta1, beta2, eps, rect, weight_decay, norm=norm):
    """RAdam's direction scaled per layer by LAMB's trust ratio (the inner step of RangerLARS).

        r ← RAdam's direction (:func:`minidl.optim.adam.radam_direction`)
        u ← r + λw
        trust ← ‖w‖ / ‖u‖          1 when a norm is zero
        w ← w − lr·trust·u
    ``norm(x)``: ‖·‖ of the layer each element of x belongs to, as in :func:`minidl.optim.layerwise.lamb_update`.
    """
    r = radam_direction(g, m, v, t=t, beta1=beta1, beta2=beta2, eps=eps, rect=rect)
    u = r + weight_decay * w if weight_decay else r
    trust = trust_ratio(norm(w), norm(u))
    w -= lr * trust * u


class LayerwiseRAdam(LayerwiseOptimizer, RAdam):
    """RAdam whose step is scaled per layer by LAMB's trust ratio: see :func:`radam_lamb_update`."""

    def update(self, w, g, state, group, layers=None):
        layers = WholeParameter(w.ndim) if layers is None else layers
        self.begin(w, state)
        beta1, beta2 = group["betas"]
        radam_lamb_update(w, g, state["m"], state["v"], t=state["t"], lr=group["lr"], beta1=beta1, beta2=beta2,
                          eps=group["eps"], rect=radam_rectification(state["t"], beta2),
                          weight_decay=group["weight_decay"], norm=layers.norm)


class RangerLARS(Lookahead):
    """``RangerLARS(params, lr=1e-3, betas=(0.95, 0.999), eps=1e-5, weight_decay=0, k=6, alpha=0.5)``.

    Ranger with each layer's RAdam step scaled by LAMB's trust ratio ‖w‖/‖u‖.
    """

    def __init__(self, params, lr=1e-3, betas=(0.95, 0.999), eps=1e-5, weight_decay=0.0, k=6, alpha=0.5):
        super().__init__(LayerwiseRAdam(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         k=k, alpha=alpha)


# ---------------------------------------------------------------- SWA
def swa_update(w_swa, w, *, n):
    """The book's running average: w_SWA ← (w_SWA·n + w) / (n + 1), n models averaged so far."""
    w_swa *= n
    w_swa += w
    w_swa /= n + 1


class SWA:
    """Stochastic weight averaging of ``params`` (a list of Tensors or a model).

    ``update()`` folds the current weights into the average; ``swap()``
    exchanges the averaged and the current weights (call it again to swap
    back). ``n_averaged`` counts the snapshots.
    """

    def __init__(self, params):
        if hasattr(params, "parameters") and callable(params.parameters):
            params = params.parameters()
        self.params = [params] if isinstance(params, Tensor) else list(params)
        if not self.params:
            raise ValueError("SWA: got an empty parameter list")
        self.averages = [p.xp.zeros_like(p.array) for p in self.params]
        self.n_averaged = 0

    def update(self):
        """w_SWA ← (w_SWA·n + w)/(n + 1) for every parameter."""
        for p, average in zip(self.params, self.averages):
            run_update(swa_update, w_swa=average, w=p.array, n=self.n_averaged)
        self.n_averaged += 1

    def swap(self):
        """Exchange the averaged and the current weights, in place."""
        if self.n_averaged == 0:
            raise RuntimeError("SWA.swap(): no snapshot averaged yet; call update() first")
        for p, average in zip(self.params, self.averages):
            current = p.array.copy()
            xp_of(current).copyto(p.array, average)
            xp_of(current).copyto(average, current)
        mark_changed(*self.params)

    def state_dict(self):
        return {"averages": [host_copy(a) for a in self.averages], "n_averaged": self.n_averaged}

    def load_state_dict(self, state_dict):
        self.averages = [on_device(a, p.device) for a, p in zip(state_dict["averages"], self.params)]
        self.n_averaged = int(state_dict["n_averaged"])


def update_bn(loader, model):
    """Recompute every BatchNorm's running mean and variance for the current (e.g. averaged) weights.

    ``loader`` yields input batches (or (x, y) pairs, whose x is used). Each
    normalization layer (any module with ``running_mean``) is reset and set to a
    cumulative average (momentum None) over one pass; training mode and the
    momenta are restored afterwards, as torch.optim.swa_utils.update_bn does.
    """
    layers = [m for m in model.modules() if getattr(m, "running_mean", None) is not None]
    if not layers:
        return
    momenta = []
    for layer in layers:
        if hasattr(layer, "reset_running_stats"):
            layer.reset_running_stats()
        else:
            layer.running_mean.array[...] = 0
            layer.running_var.array[...] = 1
        momenta.append((layer, layer.momentum))
        layer.momentum = None
    was_training = getattr(model, "training", True)
    model.train()
    with no_grad():
        for batch in loader:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            model(x if isinstance(x, Tensor) else Tensor(x))
    for layer, momentum in momenta:
        layer.momentum = momentum
    model.train(was_training)
