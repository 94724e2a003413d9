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

Fine-tuning helpers: freeze a pretrained body, swap its head, count what trains::

    nn.utils.freeze(model)                                   # every parameter: requires_grad = False
    nn.utils.replace_module(model, "2", nn.Linear(64, 5))    # a new head (trainable, freshly initialized)
    nn.utils.count_parameters(model, trainable=True)         # only the head's weights now
    nn.utils.unfreeze(model[0])                              # thaw a layer again

A frozen parameter gets no gradient in ``backward()`` and the optimizers skip
it (a parameter whose ``requires_grad`` is False is never updated, even when
it sits in a parameter group). Freezing does not switch a module to eval mode:
a frozen BatchNorm still updates its running statistics in ``train()`` mode;
call ``.eval()`` on it as well to freeze those.

Debugging (the book's step "remove normalization layers temporarily")::

    plain = nn.utils.remove_normalization(model)   # a copy: every norm layer replaced by Identity
"""
from __future__ import annotations

import numpy as np

from minidl.backend import xp_of
from minidl.tensor import Tensor

__all__ = ["clip_grad_norm_", "clip_grad_value_", "count_parameters", "freeze", "remove_normalization",
           "replace_module",
           "unfreeze"]


def _with_grads(params):
    params = [params] if isinstance(params, Tensor) else list(params)
    return [p for p in params if p.grad is not None]


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None):
    """Scale all gradients together so that their joint norm is at most ``max_norm``.

    total = ‖(g₁, g₂, …)‖ over every gradient (the p-norm of ``norm_type``; ``inf``: max |g|);
    g ← g · min(1, max_norm / (total + 1e-6)), PyTorch's rule. For the usual 2-norm each
    ‖gᵢ‖² is one dot product in gᵢ's dtype and the sum of them is taken in float64.
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
    grads = [p.grad.array for p in params]
    if norm_type == float("inf"):
        total = xp.max(xp.stack([_largest_magnitude(g) for g in grads]).astype(np.float64))
    elif norm_type == 2.0:
        total = xp.sqrt(xp.stack([_squared_norm(g) for g in grads]).astype(np.float64).sum())
    else:
        total = sum((xp.abs(g.astype(np.float64)) ** norm_type).sum() for g in grads) ** (1.0 / norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"clip_grad_norm_: the total gradient norm of order {norm_type} is {float(total)}, "
                           "so it cannot be clipped; pass error_if_nonfinite=False to scale by it anyway")
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for p, g in zip(params, grads):
        p.grad = Tensor(g * scale.astype(g.dtype))
    return Tensor(xp.asarray(total, dtype=grads[0].dtype))


def _squared_norm(g):
    """‖g‖² as one dot product of g with itself in g's own dtype (BLAS's sdot for float32: no float64
    copy, no square array); 16-bit gradients are summed in float32, as a GPU accumulates them."""
    flat = g.reshape(-1)
    if flat.dtype.itemsize == 2:
        flat = flat.astype(np.float32)
    return flat @ flat


def _largest_magnitude(g):
    """max |g| from the largest and the smallest entry (two reads, no |g| array); NaN propagates."""
    if g.dtype.kind == "c" or g.size == 0:
        return xp_of(g).abs(g).max()
    return xp_of(g).maximum(g.max(), -g.min())


def clip_grad_value_(params, clip_value: float, foreach=None) -> None:
    """Clip every gradient entry into [−clip_value, clip_value] (new gradient Tensors are assigned).

    ``foreach`` is accepted for PyTorch's signature and changes nothing.
    """
    clip_value = float(clip_value)
    if not clip_value > 0:
        raise ValueError(f"clip_grad_value_: clip_value must be > 0, got {clip_value}")
    for p in _with_grads(params):
        g = p.grad.array
        p.grad = Tensor(p.grad.xp.clip(g, -clip_value, clip_value))


# ------------------------------------------------------------ fine-tuning
def _parameters_of(target, owner: str):
    """The parameters of a Module, or a Tensor, or an iterable of Tensors (checked)."""
    if callable(getattr(target, "parameters", None)):
        return list(target.parameters())
    params = [target] if isinstance(target, Tensor) else list(target)
    bad = [p for p in params if not isinstance(p, Tensor)]
    if bad:
        raise TypeError(f"{owner}: expected a Module, a Tensor or an iterable of Tensors, "
                        f"got an iterable holding {type(bad[0]).__name__}")
    return params


def freeze(target):
    """Freeze a Module (every parameter, recursively) or some parameters: ``requires_grad = False``.

    Returns ``target``. Equivalent to ``module.requires_grad_(False)``, and accepts parameter lists too.
    """
    for p in _parameters_of(target, "freeze"):
        p.requires_grad = False
    return target


def unfreeze(target):
    """Undo :func:`freeze`: ``requires_grad = True`` on every parameter of ``target``. Returns ``target``."""
    for p in _parameters_of(target, "unfreeze"):
        p.requires_grad = True
    return target


def count_parameters(target, trainable: bool = False) -> int:
    """Number of scalar parameters of ``target``; with ``trainable=True`` only those with ``requires_grad``."""
    params = _parameters_of(target, "count_parameters")
    return int(sum(p.array.size for p in params if p.requires_grad or not trainable))


def replace_module(model, name: str, new):
    """Put ``new`` in place of the submodule called ``name`` (dotted, as in ``named_modules()``).

    ``replace_module(model, "classifier", nn.Linear(512, 5))``; in a Sequential the name is the index
    (``"2"``, or ``"-1"`` for the last one). Returns the module that was replaced. This is how a
    pretrained network gets a new head for a new set of classes.
    """
    from minidl.nn.module import Module
    if not isinstance(new, Module):
        raise TypeError(f"replace_module: the replacement must be a Module, got {type(new).__name__}")
    *path, last = str(name).split(".")
    parent = model
    for part in path:
        parent = _child(parent, part, name)
    old = _child(parent, last, name)
    if last.lstrip("-").isdigit() and hasattr(parent, "__setitem__"):
        parent[int(last)] = new
    else:
        setattr(parent, last, new)
    return old


def _child(parent, part: str, full: str):
    children = dict(getattr(parent, "_modules", {}))
    if part.lstrip("-").isdigit() and hasattr(parent, "__getitem__") and part not in children:
        try:
            return parent[int(part)]
        except IndexError:
            pass
    if part not in children:
        raise KeyError(f"replace_module: {type(parent).__name__} has no submodule {part!r} (looking for {full!r}); "
                       f"it has {sorted(children)}")
    return children[part]


def remove_normalization(model, inplace: bool = False):
    """``model`` with every normalization layer replaced by ``nn.Identity``: a deep copy unless ``inplace``.

    The normalization layers are BatchNorm, BatchRenorm, LayerNorm, GroupNorm,
    InstanceNorm and RMSNorm; each maps its input to an output of its shape, so
    Identity can take its place in any network. The book's debugging step: if a
    model trains without its normalization layers and not with them, the bug is
    in how they are used (a batch of one, the wrong axis, train/eval mode).
    """
    import copy

    from minidl.nn.containers import Identity
    from minidl.nn.module import Module
    from minidl.nn.norm import GroupNorm, LayerNorm, RMSNorm, _BatchNorm, _InstanceNorm
    if not isinstance(model, Module):
        raise TypeError(f"remove_normalization: expected a Module, got {type(model).__name__}")
    norms = (_BatchNorm, _InstanceNorm, LayerNorm, GroupNorm, RMSNorm)
    if isinstance(model, norms):
        raise ValueError(f"remove_normalization: the model itself is a {type(model).__name__}; "
                         "use nn.Identity() in its place")
    target = model if inplace else copy.deepcopy(model)
    names = [name for name, m in target.named_modules() if name and isinstance(m, norms)]
    for name in sorted(names, key=lambda n: -n.count(".")):  # the deepest first: a parent's path stays valid
        replace_module(target, name, Identity())
    return target
