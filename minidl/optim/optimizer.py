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
(``np.savez(..., allow_pickle=False)`` or safetensors); ``load_state_dict``
checks all of it before it changes anything (:mod:`minidl.optim.saved_state`).
Weight decay, the L1 penalty and groups without decay are in
:mod:`minidl.optim.regularization`.
"""
from __future__ import annotations

import numbers

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.hooks import StepHooks
from minidl.hooks import register_optimizer_step_post_hook as register_optimizer_step_post_hook  # PyTorch's path
from minidl.hooks import register_optimizer_step_pre_hook as register_optimizer_step_pre_hook  # PyTorch's path
from minidl.optim.saved_state import checked_state, host_copy, on_device
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
                p.grad = Tensor(p.grad.xp.zeros_like(p.grad.array))

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
            self.update_parameter(p, p.array, p.grad.array, state, group)

    def update_parameter(self, p, w, g, state: dict, group: dict, probe: bool = False):
        """Parameter ``p``'s update on the arrays ``w`` and ``g`` (its data and gradient): ``update``.

        The seam for optimizers that need more of a parameter than its arrays: the layer-wise
        ones (:class:`minidl.optim.layerwise.LayerwiseOptimizer`) ask it how its elements group
        into layers (:class:`minidl.optim.layerwise.Layers`). ``probe``: a trial on zero arrays,
        to learn the state one step creates (checkpoint checks), which must consult nothing else.
        """
        self.update(w, g, state, group)

    def update(self, w, g, state: dict, group: dict):
        raise NotImplementedError(f"{self.name} must define update(w, g, state, group)")

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """{"state": {position: {...}}, "param_groups": [{..., "params": [positions]}]} of plain values."""
        groups, position = [], 0
        for group in self.param_groups:
            entry = {k: host_copy(v) for k, v in group.items() if k != "params"}
            entry["params"] = list(range(position, position + len(group["params"])))
            position += len(group["params"])
            groups.append(entry)
        state = {pos: {k: host_copy(v) for k, v in s.items()} for pos, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing.

        Checked: as many groups, as large, as this optimizer has; the same
        hyperparameter names, each value of the kind this optimizer holds and
        passing its own checks (``check_group``); and each parameter's state:
        empty, or the keys, kinds, shapes and dtypes that one step of this
        optimizer creates for that parameter.
        """
        checked_state(self, state_dict)

    def load_state_dict(self, state_dict: dict):
        """Restore hyperparameters and state saved by ``state_dict()`` (copied onto each parameter's device).

        All or nothing: everything is checked first (see :meth:`check_state_dict`),
        so a damaged state raises ValueError and leaves the optimizer as it was.
        """
        groups, state = checked_state(self, state_dict)
        params = {pos: p for pos, p, _ in self.parameters()}
        state = {pos: {k: on_device(v, params[pos].device) for k, v in saved.items()} for pos, saved in state.items()}
        for group, saved in zip(self.param_groups, groups):
            group.update(saved)
        self.state = state

    def __repr__(self):
        lines = [f"{self.name} ("]
        for i, group in enumerate(self.param_groups):
            hyper = ", ".join(f"{k}={v}" for k, v in group.items() if k != "params")
            lines.append(f"  group {i}: {len(group['params'])} tensors, {hyper}")
        return "\n".join(lines + [")"])
