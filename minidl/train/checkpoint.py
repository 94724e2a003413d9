"""Training checkpoints: everything a run needs to continue exactly where it stopped.

    save_checkpoint("run/last.safetensors", model, optimizer, scheduler, loader, trainer_state)
    state = load_checkpoint("run/last.safetensors", model, optimizer, scheduler, loader)

A checkpoint holds

- the model's state dict (parameters and buffers such as BatchNorm's running statistics);
- the optimizer's state (moments, step counts, each group's lr) and the schedule's step;
- the data loader's position (seed, epoch, batch), so the next batch is the one
  the uninterrupted run would have seen;
- every random state: minidl's CPU generator (dropout masks, initializers),
  NumPy's legacy global generator and Python's ``random``;
- the training loop's own counters, history and callback states.

With all of that restored, a run stopped and resumed on the CPU ends with
exactly the weights of the run that never stopped (tested bit for bit). On a
GPU the data order, the optimizer and the CPU generators resume exactly, but
CuPy's generator state is not saved, so dropout masks drawn on the GPU differ.

The file is safetensors written through :func:`minidl.save`: arrays as raw
bytes, everything else as JSON in the header, written to a temporary file and
renamed, so a crash leaves the previous checkpoint untouched. Loading reads
numbers and strings only; a truncated, foreign or pickled file raises a
``ValueError`` and no code from it is ever run.
"""
from __future__ import annotations

import os
import random

import numpy as np

from minidl import backend
from minidl.serialization import load, save

FORMAT = "minidl.training-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A file that is not a complete minidl training checkpoint."""


# ---------------------------------------------------------------- packing
# mdl.save stores dicts with string keys, lists, arrays, numbers and strings.
# Optimizer states are keyed by parameter position (ints) and hold tuples
# (Adam's betas), so they are packed into that vocabulary with two markers and
# unpacked to the same Python values on load.
_DICT, _TUPLE = "__dict_items__", "__tuple__"


def pack(value):
    """``value`` with int-keyed dicts and tuples turned into marked JSON-able structures."""
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _DICT not in value and _TUPLE not in value:
            return {k: pack(v) for k, v in value.items()}
        return {_DICT: [[pack(k), pack(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {_TUPLE: [pack(v) for v in value]}
    if isinstance(value, list):
        return [pack(v) for v in value]
    return value


def unpack(value):
    """The inverse of :func:`pack`."""
    if isinstance(value, dict):
        if set(value) == {_DICT}:
            return {_hashable(unpack(k)): unpack(v) for k, v in value[_DICT]}
        if set(value) == {_TUPLE}:
            return tuple(unpack(v) for v in value[_TUPLE])
        return {k: unpack(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unpack(v) for v in value]
    return value


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


# ---------------------------------------------------------------- random states
def get_rng_states() -> dict:
    """Every CPU random state minidl and common user code draw from."""
    return {
        "minidl_cpu": backend.get_rng_state(),
        "numpy_global": np.random.get_state(legacy=False),
        "python": list(random.getstate()),
    }


def set_rng_states(states: dict) -> None:
    """Restore what :func:`get_rng_states` returned (arrays are brought back to NumPy)."""
    states = _to_numpy(states)
    if "minidl_cpu" in states:
        backend.set_rng_state(states["minidl_cpu"])
    if "numpy_global" in states:
        state = dict(states["numpy_global"])
        state["state"] = dict(state["state"])
        state["state"]["key"] = np.asarray(state["state"]["key"], dtype=np.uint32)
        np.random.set_state(state)
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(int(v) for v in internal), gauss))


def _to_numpy(value):
    if isinstance(value, dict):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return backend.to_numpy(value)
    return value


# ---------------------------------------------------------------- save / load
def save_checkpoint(path, model, optimizer=None, scheduler=None, loader=None, trainer_state=None,
                    extra=None) -> None:
    """Write a complete training checkpoint to ``path`` atomically (temporary file, then rename).

    Any argument but ``path`` and ``model`` may be None. ``trainer_state`` and
    ``extra`` are nestings of dicts, lists, tuples, numbers, strings and arrays.
    """
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": model.state_dict(),
        "optimizer": pack(optimizer.state_dict()) if optimizer is not None else None,
        "scheduler": pack(scheduler.state_dict()) if _has_state(scheduler) else None,
        "loader": pack(loader.state_dict()) if _has_state(loader) else None,
        "rng": get_rng_states(),
        "trainer": pack(trainer_state),
        "extra": pack(extra),
    }
    save(state, path)


def _has_state(obj) -> bool:
    return obj is not None and callable(getattr(obj, "state_dict", None))


def read_checkpoint(path, device="cpu") -> dict:
    """Read and validate a checkpoint file without applying it; arrays land on ``device``.

    Raises FileNotFoundError for a missing file and :class:`CheckpointError`
    (a ValueError) for a truncated, damaged or foreign file.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"load_checkpoint: no checkpoint at {path}")
    try:
        state = load(path, device=device)
    except ValueError as exc:
        raise CheckpointError(f"load_checkpoint: cannot read {path}: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"load_checkpoint: {path} is a safetensors file but not a minidl training checkpoint "
            f"(no '{FORMAT}' marker). If it holds model weights only, load them with "
            "model.load_state_dict(minidl.load(path)).")
    if state.get("version") != VERSION:
        raise CheckpointError(f"load_checkpoint: {path} has checkpoint version {state.get('version')!r}; "
                              f"this minidl reads version {VERSION}")
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(f"load_checkpoint: {path} has no model state")
    return state


def load_checkpoint(path, model=None, optimizer=None, scheduler=None, loader=None,
                    restore_rng: bool = True) -> dict:
    """Restore a checkpoint into the given objects; returns the decoded checkpoint.

    The file is read and checked completely before anything is changed, and
    the model's ``load_state_dict`` checks every key and shape first, so a bad
    file leaves model and optimizer as they were. The returned dict has the
    keys ``model``, ``optimizer``, ``scheduler``, ``loader``, ``rng``,
    ``trainer`` and ``extra`` (unpacked Python values).
    """
    # Read onto the CPU: load_state_dict of model and optimizer moves each array to its parameter's device.
    state = read_checkpoint(path)
    for key in ("optimizer", "scheduler", "loader", "trainer", "extra"):
        state[key] = unpack(state.get(key))
    if optimizer is not None and state["optimizer"] is None:
        raise CheckpointError(f"load_checkpoint: {path} holds no optimizer state to resume from")
    if model is not None:
        model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    if loader is not None and state["loader"] is not None:
        loader.load_state_dict(_to_numpy(state["loader"]))
    if restore_rng and state.get("rng"):
        set_rng_states(state["rng"])
    return state
