"""``minidl.nn.utils``: gradient clipping, under PyTorch's names.

    loss.backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)   # the norm before clipping
    opt.step()

Clipping rescales the gradients between ``backward()`` and the optimizer's
step, so one bad batch (an exploding RNN gradient, a loss spike) cannot throw
the weights far away. ``clip_grad_norm_`` keeps the gradient's direction and
shrinks its length; ``clip_grad_value_`` clips each entry on its own (the
direction changes). Both are also ``minidl.optim.clip_grad_norm_`` /
``clip_grad_value_``.
"""
from __future__ import annotations

import numpy as np

from minidl.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _with_grads(params):
    params = [params] if isinstance(params, Tensor) else list(params)
    return [p for p in params if p.grad is not None]


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    """Scale all gradients together so that their joint norm is at most ``max_norm``.

    total = ‖(g₁, g₂, …)‖ over every gradient (the p-norm of ``norm_type``; ``inf``: max |g|);
    g ← g · min(1, max_norm / (total + 1e-6)), PyTorch's rule.
    Returns the total norm before clipping, as a 0-d Tensor (``float(...)`` gives the number).
    A non-finite total raises RuntimeError when ``error_if_nonfinite``. New gradient Tensors are
    assigned (``p.grad = ...``); the old buffers are never written, since one may be shared with
    another tensor. The scale stays on the device: no sync on a GPU. ``foreach`` is accepted for
    PyTorch's signature and changes nothing.
    """
    max_norm, norm_type = float(max_norm), float(norm_type)
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be > 0, got {max_norm}")
    params = _with_grads(params)
    if not params:
        return Tensor(np.zeros((), np.float32))
    xp = params[0].grad.xp
    grads = [p.grad.data for p in params]
    if norm_type == float("inf"):
        total = xp.max(xp.stack([xp.abs(g).max() for g in grads]).astype(np.float64))
    else:
        total = sum((xp.abs(g.astype(np.float64)) ** norm_type).sum() for g in grads) ** (1.0 / norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"clip_grad_norm_: the total gradient norm of order {norm_type} is {float(total)}, "
                           "so it cannot be clipped; pass error_if_nonfinite=False to scale by it anyway")
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for p, g in zip(params, grads):
        p.grad = Tensor(g * scale.astype(g.dtype))
    return Tensor(xp.asarray(total, dtype=grads[0].dtype))


def clip_grad_value_(params, clip_value: float, foreach=None) -> None:
    """Clip every gradient entry into [−clip_value, clip_value] (new gradient Tensors are assigned).

    ``foreach`` is accepted for PyTorch's signature and changes nothing.
    """
    clip_value = float(clip_value)
    if not clip_value > 0:
        raise ValueError(f"clip_grad_value_: clip_value must be > 0, got {clip_value}")
    for p in _with_grads(params):
        g = p.grad.data
        p.grad = Tensor(p.grad.xp.clip(g, -clip_value, clip_value))
