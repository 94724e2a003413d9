"""Regularizing the weights: weight decay inside the updates, an L1 penalty, groups without decay.

Two kinds of weight decay run inside the update equations: L2
(:func:`l2_gradient`, g ← g + λw, the gradient of (λ/2)‖w‖² added to the
loss's) and decoupled (:func:`decay_weights_`, w ← w − lr·λw, Loshchilov &
Hutter), which differ once an adaptive method divides the gradient by its
running size. The other helpers act before the optimizer: :func:`l1_penalty`
adds λΣ|w| to the loss, and :func:`weight_decay_groups` exempts biases and
normalization parameters from the decay.
"""
from __future__ import annotations

from minidl.tensor import Tensor


# ---------------------------------------------------------------- inside the update equations
def l2_gradient(g, w, weight_decay: float):
    """g + λw, the gradient of the loss plus (λ/2)||w||² (a new array: g is never written)."""
    if not weight_decay:
        return g
    return g + weight_decay * w


def decay_weights_(w, lr: float, weight_decay: float):
    """Decoupled weight decay (Loshchilov & Hutter, AdamW): w ← w − lr·λ·w, in place."""
    if weight_decay:
        w *= 1.0 - lr * weight_decay
    return w


# ---------------------------------------------------------------- penalties and groups
def l1_penalty(params, strength: float) -> Tensor:
    """λ Σ|w| over ``params``, a Tensor to add to the loss (its gradient is λ·sign(w)).

    L1 pushes weights to exactly zero (sparse models); L2 (weight_decay) only shrinks them.
    """
    params = [params] if isinstance(params, Tensor) else list(params)
    if not params:
        raise ValueError("l1_penalty: got no parameters")
    total = params[0].abs().sum()
    for p in params[1:]:
        total = total + p.abs().sum()
    return total * float(strength)


NO_DECAY_NAMES = ("bias", "norm", "bn", "ln")


def weight_decay_groups(params, weight_decay: float, no_decay_names=NO_DECAY_NAMES, **group_options):
    """Two parameter groups: weights with ``weight_decay``, and biases/normalization parameters without.

    The bias is not regularized (it does not make the function more complex), nor are the
    scale and shift of a normalization layer. ``params`` may be a model (anything with
    ``named_parameters()``), (name, tensor) pairs, or plain tensors; a parameter is exempt when
    it has at most one dimension or its name contains one of ``no_decay_names``. Frozen
    parameters are left out. Extra keyword arguments (e.g. ``lr``) go into both groups.

        opt = AdamW(weight_decay_groups(model, 0.05), lr=1e-3)
    """
    if hasattr(params, "named_parameters"):
        named = list(params.named_parameters())
    else:
        named = [item if isinstance(item, tuple) else ("", item) for item in params]
    decay, no_decay = [], []
    for name, p in named:
        if not p.requires_grad:
            continue
        exempt = p.ndim <= 1 or any(key in name.lower() for key in no_decay_names)
        (no_decay if exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay), **group_options},
              {"params": no_decay, "weight_decay": 0.0, **group_options}]
    return [g for g in groups if g["params"]]
