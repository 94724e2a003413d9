"""An optimizer's state dict: plain values out, checked values in.

``Optimizer.state_dict()`` turns hyperparameters and per-parameter state into
NumPy arrays and Python values (:func:`host_copy`), so a checkpoint can be written
without pickle. ``Optimizer.load_state_dict()`` first checks everything
(:func:`checked_state`): the groups' sizes and hyperparameters, each
hyperparameter of the kind this optimizer holds and passing its own
``check_group``, and each parameter's state against the state one step of this
optimizer creates (:func:`state_template`), keys, kinds, shapes and dtypes.
Only then does it change anything, copying the arrays onto each parameter's
device (:func:`on_device`). A damaged file raises ValueError and leaves the
optimizer as it was.
"""
from __future__ import annotations

import copy
import math
import numbers
import warnings

import numpy as np

from minidl import backend
from minidl.autograd import no_grad
from minidl.serialization import is_number
from minidl.tensor import Tensor


def host_copy(value):
    """A copy of ``value`` made of NumPy arrays and Python values only (CuPy arrays come to the host):
    what a state dict holds."""
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    if isinstance(value, Tensor):
        value = value.array
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return np.array(backend.to_numpy(value), copy=True)
    if isinstance(value, np.generic):
        return value.item()
    return copy.deepcopy(value)


def on_device(value, device):
    """A copy of a state value with its NumPy arrays on ``device`` (the inverse of :func:`host_copy`)."""
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_device(v, device) for v in value)
    if isinstance(value, np.ndarray):
        return backend.xp_for(device).array(backend.to_device(value, device), copy=True)
    return copy.deepcopy(value)


def checked_state(optimizer, state_dict):
    """(hyperparameters of each group, {position: state}) from ``optimizer``'s state dict, checked completely.

    Raises ValueError naming what is wrong; changes nothing (the optimizer's ``load_state_dict`` applies the result).
    """
    owner = f"{optimizer.name}.load_state_dict"
    if not (isinstance(state_dict, dict) and isinstance(state_dict.get("param_groups"), (list, tuple))
            and isinstance(state_dict.get("state"), dict)):
        raise ValueError(f"{owner}: expected {{'state': {{...}}, 'param_groups': [...]}} as state_dict() "
                         f"returns, got {_describe(state_dict)}")
    saved_groups = state_dict["param_groups"]
    sizes = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), (list, tuple)) else None
             for g in saved_groups]
    mine = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != mine:
        raise ValueError(f"{owner}: the saved optimizer has groups of sizes {sizes} but this one has "
                         f"{mine}; build it over the same parameters in the same order")
    groups, first = [], 0
    for index, (saved, group) in enumerate(zip(saved_groups, optimizer.param_groups)):
        groups.append(_checked_group(optimizer, index, saved, group, first))
        first += len(group["params"])
    index_of = {id(group): index for index, group in enumerate(optimizer.param_groups)}
    params = {pos: (p, index_of[id(group)]) for pos, p, group in optimizer.parameters()}
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
            cache = (index, tuple(p.shape), str(p.dtype), id(getattr(p, "layers", None)))  # its own layers, if any
            if cache not in templates:
                templates[cache] = state_template(optimizer, p, {**optimizer.param_groups[index], **groups[index]})
            _check_state_entry(where, saved, templates[cache], p)
        state[pos] = saved
    return groups, state


def state_template(optimizer, p, group):
    """The state one step of ``optimizer`` creates for a parameter like ``p`` (None if unknown).

    Found by running ``update`` on zero arrays of p's shape and dtype, so
    every optimizer defines its own expected state just by defining its step.
    """
    state = {}
    try:
        with no_grad(), np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optimizer.update_parameter(p, np.zeros(p.shape, p.dtype), np.zeros(p.shape, p.dtype), state, group,
                                       probe=True)
    except Exception:  # no update of its own (NotImplementedError), or one that needs more than arrays
        return None
    return state


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



def _same_kind(where: str, name: str, value, current):
    """``value`` (a saved hyperparameter) if it is of the kind of ``current`` (this optimizer's), else ValueError."""
    if isinstance(current, (bool, np.bool_)):
        ok = isinstance(value, (bool, np.bool_))
    elif isinstance(current, numbers.Integral):
        ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    elif isinstance(current, numbers.Real):
        ok = is_number(value) and math.isfinite(value)
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
                  or (is_number(value) and math.isfinite(value)) or isinstance(value, (bool, np.bool_)))
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
        if not (is_number(value) and math.isfinite(value)):
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
