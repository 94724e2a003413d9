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
import math
import numbers
import warnings

import numpy as np

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.hooks import StepHooks
from minidl.hooks import register_optimizer_step_post_hook as register_optimizer_step_post_hook  # PyTorch's path
from minidl.hooks import register_optimizer_step_pre_hook as register_optimizer_step_pre_hook  # PyTorch's path
from minidl.tensor import Tensor, mark_changed


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
class Optimizer(StepHooks):
    """Base of every optimizer: ``Optimizer(params, defaults)``.

    ``params`` is an iterable of Tensors (with ``requires_grad=True``) or of
    dicts, each a parameter group ``{"params": [...], "lr": ..., ...}`` whose
    missing hyperparameters come from ``defaults``. Subclasses define
    ``update(w, g, state, group)`` on raw arrays (the parameter's data and
    gradient) and, optionally, ``check_group(group)`` to validate a group.
    ``register_step_pre_hook`` / ``register_step_post_hook`` (PyTorch's) come
    from :class:`minidl.hooks.StepHooks`.
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
            if p.creator is not None:  # the update would change a temporary, not the tensor the graph starts from
                raise ValueError(
                    f"{self.name}: can't optimize a non-leaf tensor (shape {p.shape}, made by "
                    f"{type(p.creator).__name__}); create it with requires_grad=True after scaling, e.g. "
                    "(mdl.randn(3) * 0.01).requires_grad_(), or use nn.Parameter")
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
        first = next((p for _, p, _ in self.parameters()), None)
        with no_grad(), backend.using(first.device if first is not None else "cpu"):  # the parameters' GPU
            self.step_groups()
        # One place for every update equation: the parameters just written in place get a
        # new version, so a backward through a graph recorded before this step raises.
        mark_changed(*[p for _, p, _ in self.parameters() if p.grad is not None and p.requires_grad])
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

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing.

        Checked: as many groups, as large, as this optimizer has; the same
        hyperparameter names, each value of the kind this optimizer holds and
        passing its own checks (``check_group``); and each parameter's state:
        empty, or the keys, kinds, shapes and dtypes that one step of this
        optimizer creates for that parameter.
        """
        self._checked_state(state_dict)

    def load_state_dict(self, state_dict: dict):
        """Restore hyperparameters and state saved by ``state_dict()`` (copied onto each parameter's device).

        All or nothing: everything is checked first (see :meth:`check_state_dict`),
        so a damaged state raises ValueError and leaves the optimizer as it was.
        """
        groups, state = self._checked_state(state_dict)
        params = {pos: p for pos, p, _ in self.parameters()}
        state = {pos: {k: _on_device(v, params[pos].device) for k, v in saved.items()} for pos, saved in state.items()}
        for group, saved in zip(self.param_groups, groups):
            group.update(saved)
        self.state = state

    def _checked_state(self, state_dict):
        """(hyperparameters of each group, {position: state}) from a state dict, checked completely."""
        owner = f"{self.name}.load_state_dict"
        if not (isinstance(state_dict, dict) and isinstance(state_dict.get("param_groups"), (list, tuple))
                and isinstance(state_dict.get("state"), dict)):
            raise ValueError(f"{owner}: expected {{'state': {{...}}, 'param_groups': [...]}} as state_dict() "
                             f"returns, got {_describe(state_dict)}")
        saved_groups = state_dict["param_groups"]
        sizes = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), (list, tuple)) else None
                 for g in saved_groups]
        mine = [len(g["params"]) for g in self.param_groups]
        if sizes != mine:
            raise ValueError(f"{owner}: the saved optimizer has groups of sizes {sizes} but this one has "
                             f"{mine}; build it over the same parameters in the same order")
        groups, first = [], 0
        for index, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            groups.append(_checked_group(self, index, saved, group, first))
            first += len(group["params"])
        index_of = {id(group): index for index, group in enumerate(self.param_groups)}
        params = {pos: (p, index_of[id(group)]) for pos, p, group in self.parameters()}
        state, templates = {}, {}
        for key, saved in state_dict["state"].items():
            pos = _position(key)
            if pos not in params:
                raise ValueError(f"{owner}: state for parameter position {key!r}, but the positions of this "
                                 f"optimizer's {len(params)} parameters run from 0 to {len(params) - 1}")
            if pos in state:
                raise ValueError(f"{owner}: two states for parameter position {pos}")
            if not isinstance(saved, dict) or not all(isinstance(k, str) for k in saved):
                raise ValueError(f"{owner}: the state of parameter {pos} must be a dict with string keys, "
                                 f"got {_describe(saved)}")
            p, index = params[pos]
            if saved:
                where = f"{owner}: the state of parameter {pos} (shape {tuple(p.shape)}, {p.dtype})"
                cache = (index, tuple(p.shape), str(p.dtype))
                if cache not in templates:
                    templates[cache] = self._state_template(p, {**self.param_groups[index], **groups[index]})
                _check_state_entry(where, saved, templates[cache], p)
            state[pos] = saved
        return groups, state

    def _state_template(self, p, group):
        """The state one step of this optimizer creates for a parameter like ``p`` (None if unknown).

        Found by running ``update`` on zero arrays of p's shape and dtype, so
        every optimizer defines its own expected state just by defining its step.
        """
        if type(self).update is Optimizer.update:
            return None
        state = {}
        try:
            with no_grad(), np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.update(np.zeros(p.shape, p.dtype), np.zeros(p.shape, p.dtype), state, group)
        except Exception:  # an update that needs more than arrays (a graph, a device): check loosely
            return None
        return state

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


def _position(key):
    """A state key as a parameter position: an int, or its decimal text (other formats key by strings)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        return int(key)
    if isinstance(key, str) and key.isdecimal() and len(key) < 19:
        return int(key)
    return None


def _describe(value) -> str:
    if _is_array(value):
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:60] + '...'}"


def _is_array(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _same_kind(where: str, name: str, value, current):
    """``value`` (a saved hyperparameter) if it is of the kind of ``current`` (this optimizer's), else ValueError."""
    if isinstance(current, (bool, np.bool_)):
        ok = isinstance(value, (bool, np.bool_))
    elif isinstance(current, numbers.Integral):
        ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    elif isinstance(current, numbers.Real):
        ok = _is_number(value) and math.isfinite(value)
    elif isinstance(current, (tuple, list)):
        ok = isinstance(value, (tuple, list)) and len(value) == len(current)
        if ok:
            return type(current)(_same_kind(where, f"{name}[{i}]", v, c)
                                 for i, (v, c) in enumerate(zip(value, current)))
    elif current is None:
        ok = value is None or isinstance(value, (bool, numbers.Real, str))
    else:
        ok = type(value) is type(current)
    if not ok:
        raise ValueError(f"{where}: {name} must be like this optimizer's {current!r} "
                         f"({type(current).__name__}), the state has {_describe(value)}")
    return copy.deepcopy(value)


def _checked_group(optimizer, index: int, saved, group: dict, first: int) -> dict:
    """The saved hyperparameters of group ``index``, checked against the group and ``check_group``."""
    where = f"{optimizer.name}.load_state_dict: parameter group {index}"
    expected = list(range(first, first + len(group["params"])))
    listed = saved["params"]
    if not all(_position(k) is not None and not isinstance(k, str) for k in listed) or list(listed) != expected:
        raise ValueError(f"{where} lists the parameter positions {_describe(list(listed))}; this optimizer's "
                         f"are {expected[0] if expected else ''}..{expected[-1] if expected else ''}")
    names, theirs = set(group) - {"params"}, set(saved) - {"params"}
    if names != theirs:
        raise ValueError(f"{where} has the hyperparameters {sorted(map(str, theirs))}, this optimizer "
                         f"{sorted(names)}: missing {sorted(names - theirs)}, unexpected "
                         f"{sorted(map(str, theirs - names))}")
    candidate = {**group, **{k: _same_kind(where, k, saved[k], group[k]) for k in names}}
    try:
        optimizer.check_group(candidate)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    return {k: v for k, v in candidate.items() if k != "params"}


def _check_state_entry(where: str, saved: dict, template, p) -> None:
    """``saved`` must hold what ``template`` (one step's state) holds, or, without one, plausible values."""
    if template is None:
        for key, value in saved.items():
            ok = ((_is_array(value) and tuple(value.shape) in (tuple(p.shape), ())
                   and np.dtype(value.dtype).kind in "biuf")
                  or (_is_number(value) and math.isfinite(value)) or isinstance(value, (bool, np.bool_)))
            if not ok:
                raise ValueError(f"{where}: {key} is {_describe(value)}, neither a number nor an array of the "
                                 "parameter's shape")
        return
    if set(saved) != set(template):
        raise ValueError(f"{where} has the keys {sorted(saved)}, but a step keeps {sorted(template)}: missing "
                         f"{sorted(set(template) - set(saved))}, unexpected {sorted(set(saved) - set(template))}")
    for key, expected in template.items():
        _check_like(f"{where}: {key}", saved[key], expected)


def _check_like(where: str, value, expected) -> None:
    if _is_array(expected):
        ok = _is_array(value) and tuple(value.shape) == tuple(expected.shape) and value.dtype == expected.dtype
        if not ok:
            raise ValueError(f"{where} must be an array of shape {tuple(expected.shape)} and dtype "
                             f"{expected.dtype}, the state has {_describe(value)}")
    elif isinstance(expected, (bool, np.bool_)):
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{where} must be True or False, the state has {_describe(value)}")
    elif isinstance(expected, numbers.Integral):
        if not (isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
                and 0 <= value < 2**63):
            raise ValueError(f"{where} must be a count (an int from 0 to 2**63 - 1), the state has "
                             f"{_describe(value)}")
    elif isinstance(expected, numbers.Real):
        if not (_is_number(value) and math.isfinite(value)):
            raise ValueError(f"{where} must be a finite number, the state has {_describe(value)}")
    elif isinstance(expected, dict):
        if not isinstance(value, dict) or set(value) != set(expected):
            raise ValueError(f"{where} must be a dict with the keys {sorted(expected)}, the state has "
                             f"{_describe(value)}")
        for key in expected:
            _check_like(f"{where}.{key}", value[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(expected):
            raise ValueError(f"{where} must be a sequence of {len(expected)}, the state has {_describe(value)}")
        for i, (v, e) in enumerate(zip(value, expected)):
            _check_like(f"{where}[{i}]", v, e)
    elif type(value) is not type(expected):
        raise ValueError(f"{where} must be like {expected!r}, the state has {_describe(value)}")


def _on_device(value, device):
    if isinstance(value, dict):
        return {k: _on_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_device(v, device) for v in value)
    if isinstance(value, np.ndarray):
        return backend.xp_for(device).array(backend.to_device(value, device), copy=True)
    return copy.deepcopy(value)


# ---------------------------------------------------------------- gradient clipping
# Lives in minidl.nn.utils (PyTorch's place, and below optim in the layers); re-exported here.
from minidl.nn.utils import clip_grad_norm_, clip_grad_value_  # noqa: E402,F401


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


class WrapsOptimizer(StepHooks):
    """Mixin for optimizers built around another one (``self.optimizer``): Lookahead, the
    data-parallel wrappers. Schedules and training loops read the inner optimizer's groups
    and state through these, so one LRScheduler drives the wrapped optimizer too."""

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

