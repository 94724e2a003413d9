"""The Optimizer base class: parameter groups, per-parameter state, checkpoints.

An optimizer is an update equation (a plain function of arrays, one per file
in this package) plus bookkeeping, and this class is the bookkeeping:

- ``param_groups``: a list of dicts, each with its ``params`` and its own
  hyperparameters (``lr``, ``betas``...). Fine-tuning uses this: pretrained
  layers at a 10-100x smaller learning rate, new layers at the regular one.
- ``state``: one dict per parameter (moments, step count), keyed by the
  parameter's position in the flattened group order. Positions, unlike
  ``id()``, are the same in the next run, so ``state_dict()`` saved now and
  loaded later continues the very same trajectory.
- ``step()`` loops over the groups and calls the subclass's ``update`` for
  each parameter that has a gradient. Frozen parameters
  (``requires_grad=False``) and parameters without a gradient are skipped.

The values in ``state_dict()`` are NumPy arrays, Python numbers, and dicts,
lists and tuples of those, so it can be written without pickle
(``np.savez(..., allow_pickle=False)`` or safetensors).
"""
from __future__ import annotations

import copy
import numbers

import numpy as np

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.tensor import Tensor


# ---------------------------------------------------------------- hyperparameter checks
def check_lr(owner: str, lr) -> float:
    if not isinstance(lr, numbers.Real) or not lr >= 0:
        raise ValueError(f"{owner}: the learning rate must be a number ≥ 0, got lr={lr!r}")
    return float(lr)


def check_betas(owner: str, betas, name: str = "betas") -> tuple:
    try:
        values = tuple(float(b) for b in betas)
    except TypeError:
        raise ValueError(f"{owner}: {name} must be a pair (beta1, beta2), got {betas!r}") from None
    if len(values) != 2 or not all(0.0 <= b < 1.0 for b in values):
        raise ValueError(f"{owner}: each of {name} must lie in [0, 1), got {name}={betas!r} "
                         "(typical: (0.9, 0.999))")
    return values


def check_unit(owner: str, name: str, value, closed_top: bool = False) -> float:
    """A coefficient in [0, 1) (momentum, rho, beta), or [0, 1] with closed_top."""
    ok = isinstance(value, numbers.Real) and (0.0 <= value <= 1.0 if closed_top else 0.0 <= value < 1.0)
    if not ok:
        interval = "[0, 1]" if closed_top else "[0, 1)"
        raise ValueError(f"{owner}: {name} must lie in {interval}, got {name}={value!r}")
    return float(value)


def check_eps(owner: str, eps) -> float:
    if not isinstance(eps, numbers.Real) or not eps > 0:
        raise ValueError(f"{owner}: eps must be > 0 (it keeps a division away from zero), got eps={eps!r}")
    return float(eps)


def check_nonnegative(owner: str, name: str, value) -> float:
    if not isinstance(value, numbers.Real) or not value >= 0:
        raise ValueError(f"{owner}: {name} must be a number ≥ 0, got {name}={value!r}")
    return float(value)


# ---------------------------------------------------------------- weight decay
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


# ---------------------------------------------------------------- the base class
class Optimizer:
    """Base of every optimizer: ``Optimizer(params, defaults)``.

    ``params`` is an iterable of Tensors (with ``requires_grad=True``) or of
    dicts, each a parameter group ``{"params": [...], "lr": ..., ...}`` whose
    missing hyperparameters come from ``defaults``. Subclasses define
    ``update(w, g, state, group)`` on raw arrays (the parameter's data and
    gradient) and, optionally, ``check_group(group)`` to validate a group.
    """

    def __init__(self, params, defaults: dict):
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.state: dict[int, dict] = {}
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of Tensors or of dicts, "
                            "got a single Tensor; wrap it in a list: [w]")
        if hasattr(params, "parameters") and callable(params.parameters):
            raise TypeError(f"{type(self).__name__}: got a model, expected its parameters: "
                            f"{type(self).__name__}(model.parameters(), ...)")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__}: got an empty parameter list; pass the tensors to "
                             "optimize, e.g. model.parameters() (did a generator get used up already?)")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    @property
    def name(self) -> str:
        return type(self).__name__

    def add_param_group(self, group: dict):
        """Add a group of parameters with its own hyperparameters (defaults fill the rest)."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError(f"{self.name}: a parameter group is a dict with a 'params' entry, got {group!r}")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{self.name}: parameters must be minidl Tensors, got {type(p).__name__}")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params) or len({id(p) for p in params}) != len(params):
            raise ValueError(f"{self.name}: a parameter appears in more than one place; each tensor may "
                             "be listed once across all parameter groups")
        full = {**self.defaults, **group, "params": params}
        self.check_group(full)
        self.param_groups.append(full)

    def check_group(self, group: dict):
        """Validate (and normalize) a group's hyperparameters; subclasses extend this."""
        if "lr" in group:
            group["lr"] = check_lr(self.name, group["lr"])
        if "weight_decay" in group:
            group["weight_decay"] = check_nonnegative(self.name, "weight_decay", group["weight_decay"])
        if "betas" in group:
            group["betas"] = check_betas(self.name, group["betas"])
        if "eps" in group:
            group["eps"] = check_eps(self.name, group["eps"])

    # ------------------------------------------------------------ the step
    def parameters(self):
        """(position, parameter, group) for every parameter, in the flattened group order."""
        position = 0
        for group in self.param_groups:
            for p in group["params"]:
                yield position, p, group
                position += 1

    def zero_grad(self, set_to_none: bool = True):
        """Forget every gradient (``p.grad = None``; zeros in a new buffer with set_to_none=False)."""
        for _, p, _ in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:  # a fresh buffer: the old one may be shared and must not be written
                p.grad = Tensor(p.grad.xp.zeros_like(p.grad.data))

    def step(self, closure=None):
        """Apply one update to every parameter that has a gradient.

        ``closure``, if given, recomputes the loss (with its backward) and its
        value is returned, as in PyTorch.
        """
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            self.step_groups()
        return loss

    def step_groups(self):
        """Loop over the groups and parameters; ``update`` does the math."""
        for position, p, group in self.parameters():
            if p.grad is None or not p.requires_grad:
                continue
            state = self.state.setdefault(position, {})
            self.update(p.data, p.grad.data, state, group)

    def update(self, w, g, state: dict, group: dict):
        raise NotImplementedError(f"{self.name} must define update(w, g, state, group)")

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """{"state": {position: {...}}, "param_groups": [{..., "params": [positions]}]} of plain values."""
        groups, position = [], 0
        for group in self.param_groups:
            entry = {k: _plain(v) for k, v in group.items() if k != "params"}
            entry["params"] = list(range(position, position + len(group["params"])))
            position += len(group["params"])
            groups.append(entry)
        state = {pos: {k: _plain(v) for k, v in s.items()} for pos, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict):
        """Restore hyperparameters and state saved by ``state_dict()`` (copied onto each parameter's device)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(group["params"]) for saved, group in zip(groups, self.param_groups)):
            mine = [len(g["params"]) for g in self.param_groups]
            theirs = [len(g["params"]) for g in groups]
            raise ValueError(f"{self.name}.load_state_dict: the saved optimizer has groups of sizes {theirs} "
                             f"but this one has {mine}; build it over the same parameters in the same order")
        for saved, group in zip(groups, self.param_groups):
            for key, value in saved.items():
                if key != "params":
                    group[key] = tuple(value) if isinstance(value, list) and key == "betas" else copy.deepcopy(value)
        params = {pos: p for pos, p, _ in self.parameters()}
        self.state = {}
        for pos, saved in state_dict["state"].items():
            pos = int(pos)
            if pos not in params:
                raise ValueError(f"{self.name}.load_state_dict: state for parameter position {pos}, "
                                 f"but there are only {len(params)} parameters")
            device = params[pos].device
            self.state[pos] = {k: _on_device(v, device) for k, v in saved.items()}

    def __repr__(self):
        lines = [f"{self.name} ("]
        for i, group in enumerate(self.param_groups):
            hyper = ", ".join(f"{k}={v}" for k, v in group.items() if k != "params")
            lines.append(f"  group {i}: {len(group['params'])} tensors, {hyper}")
        return "\n".join(lines + [")"])


def _plain(value):
    """A copy of ``value`` made of NumPy arrays and Python values only (CuPy arrays come to the host)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, Tensor):
        value = value.data
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return np.array(backend.to_numpy(value), copy=True)
    if isinstance(value, np.generic):
        return value.item()
    return copy.deepcopy(value)


def _on_device(value, device):
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_device(v, device) for v in value)
    if isinstance(value, np.ndarray):
        return backend.xp_for(device).array(backend.to_device(value, device), copy=True)
    return copy.deepcopy(value)


# ---------------------------------------------------------------- gradient clipping
def _with_grads(params):
    params = [params] if isinstance(params, Tensor) else list(params)
    return [p for p in params if p.grad is not None]


def clip_grad_norm_(params, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
    """Scale all gradients together so that their joint norm is at most ``max_norm``.

    total = ‖(g₁, g₂, …)‖ over every gradient;  g ← g · min(1, max_norm / (total + 1e-6)).
    Returns the total norm before clipping, as a 0-d Tensor (``float(...)`` gives the number).
    New gradient Tensors are assigned (``p.grad = ...``); the old buffers are never written,
    since one may be shared with another tensor. The scale stays on the device: no sync on a GPU.
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
        raise RuntimeError(f"clip_grad_norm_: the total gradient norm is {float(total)}; "
                           "pass error_if_nonfinite=False to clip anyway")
    scale = xp.minimum(max_norm / (total + 1e-6), 1.0)
    for p, g in zip(params, grads):
        p.grad = Tensor(g * scale.astype(g.dtype))
    return Tensor(xp.asarray(total, dtype=grads[0].dtype))


def clip_grad_value_(params, clip_value: float):
    """Clip every gradient entry into [−clip_value, clip_value] (new gradient Tensors are assigned)."""
    clip_value = float(clip_value)
    if not clip_value > 0:
        raise ValueError(f"clip_grad_value_: clip_value must be > 0, got {clip_value}")
    for p in _with_grads(params):
        g = p.grad.data
        p.grad = Tensor(p.grad.xp.clip(g, -clip_value, clip_value))


# ---------------------------------------------------------------- regularization helpers
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


class WrapsOptimizer:
    """Mixin for optimizers built around another one (``self.optimizer``): Lookahead, the
    data-parallel wrappers. Schedules and training loops read the inner optimizer's groups
    and state through these, so one LRScheduler drives the wrapped optimizer too."""

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

