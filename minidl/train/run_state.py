"""A run's saved state (a training checkpoint): everything a run needs to continue exactly where it stopped.

(Not :mod:`minidl.checkpoint`, which is gradient checkpointing: recomputing activations in backward.)

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
bytes, everything else as JSON in the header (optimizer states keep their
integer keys and tuples), written to a temporary file and renamed, so a crash
leaves the previous checkpoint untouched. Loading reads numbers and strings
only, and no code from the file is ever run.

Restoring is all or nothing. Every part of the file is checked against the
objects it goes into before any of them changes: the model (names, shapes,
dtypes, buffers), the optimizer (groups, hyperparameter types, each
parameter's state keys, shapes and dtypes), the schedule, the loader position,
every random state and the training loop's own state. A truncated, foreign,
pickled or damaged file raises :class:`CheckpointError` (a ``ValueError``)
naming the damaged part, and leaves every object as it was.
"""
from __future__ import annotations

import os
import random

import numpy as np

from minidl import backend
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer
from minidl.serialization import load, save, short_repr

FORMAT = "minidl.training-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """A file that is not a complete minidl training checkpoint, or a part of one that does not fit.

    The message names the file and the part (model, optimizer, scheduler, loader, rng, trainer).
    """


# ---------------------------------------------------------------- random states
_RNG_KEYS = ("minidl_cpu", "numpy_global", "python", "minidl_cuda")


def get_rng_states() -> dict:
    """Every random state minidl and common user code draw from (and each GPU generator in use)."""
    states = {
        "minidl_cpu": backend.get_rng_state(),
        "numpy_global": np.random.get_state(legacy=False),
        "python": list(random.getstate()),
    }
    gpu = backend.get_gpu_rng_states()  # each GPU generator drawn from (dropout masks on the device)
    if gpu:
        states["minidl_cuda"] = gpu
    return states


def check_rng_states(states) -> None:
    """Raise ValueError naming the state when :func:`set_rng_states` would fail; change nothing.

    Each state is set on a scratch generator of the same kind, which checks it
    exactly as the real one would.
    """
    _checked_rng_states(states)


def set_rng_states(states: dict) -> None:
    """Restore what :func:`get_rng_states` returned (arrays are brought back to NumPy); all or nothing."""
    states = _checked_rng_states(states)
    if "minidl_cpu" in states:
        backend.set_rng_state(states["minidl_cpu"])
    if "numpy_global" in states:
        np.random.set_state(states["numpy_global"])
    if "python" in states:
        random.setstate(states["python"])
    if "minidl_cuda" in states:
        backend.set_gpu_rng_states(states["minidl_cuda"])


def _checked_rng_states(states) -> dict:
    if not isinstance(states, dict) or not set(states) <= set(_RNG_KEYS):
        keys = sorted(map(str, states)) if isinstance(states, dict) else type(states).__name__
        raise ValueError(f"the random states must be a dict with keys among {list(_RNG_KEYS)}, got {keys}")
    states, out = _to_numpy(states), {}
    name = "minidl_cpu"
    try:
        if name in states:
            type(backend.rng("cpu").bit_generator)().state = states[name]
            out[name] = states[name]
        name = "numpy_global"
        if name in states:
            state = dict(states[name])
            state["state"] = dict(state["state"])
            key = np.asarray(state["state"]["key"])
            if key.dtype.kind not in "iu" or key.shape != (624,) or key.min() < 0 or key.max() >= 2**32:
                raise ValueError("the MT19937 key must be 624 integers from 0 to 2**32 - 1")
            state["state"]["key"] = key.astype(np.uint32)
            np.random.RandomState().set_state(state)
            out[name] = state
        name = "python"
        if name in states:
            version, internal, gauss = states[name]
            state = (version, tuple(internal), gauss)
            random.Random().setstate(state)
            out[name] = state
        name = "minidl_cuda"
        if name in states:
            out[name] = backend.check_gpu_rng_states(states[name])
    except Exception as exc:  # the generators raise TypeError, ValueError, KeyError, OverflowError...
        raise ValueError(f"the random state {name!r} is damaged ({type(exc).__name__}: {exc})") from None
    return out


def _to_numpy(value):
    if isinstance(value, dict):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return backend.to_numpy(value)
    return value


# ---------------------------------------------------------------- save / load
_PARTS = ("optimizer", "scheduler", "loader", "rng", "trainer")  # dicts, or None when not saved


def save_checkpoint(path, model, optimizer=None, scheduler=None, loader=None, trainer_state=None,
                    extra=None, write: bool = True) -> None:
    """Write a complete training checkpoint to ``path`` atomically (temporary file, then rename).

    Any argument but ``path`` and ``model`` may be None. ``trainer_state`` and
    ``extra`` are nestings of dicts, lists, tuples, numbers, strings and arrays.

    A model or optimizer whose state is spread over the ranks of a parallel run
    (a wrapper of :mod:`minidl.parallel.protocol`: ZeRO, tensor or pipeline
    parallel) has a ``consolidated_state_dict()``: the state one process would
    save, gathered by a collective. It is used instead of ``state_dict()``, so
    every rank must call this function; ranks other than 0 pass ``write=False``
    (they take part in the gathering and write nothing). ``model`` and
    ``optimizer`` may also be their state dicts, gathered by the caller.
    """
    state = {
        "format": FORMAT,
        "version": VERSION,
        "model": consolidated_state(model),
        "optimizer": consolidated_state(optimizer) if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if _has_state(scheduler) else None,
        "loader": loader.state_dict() if _has_state(loader) else None,
        "rng": get_rng_states(),
        "trainer": trainer_state,
        "extra": extra,
    }
    if write:
        save(state, path)


def consolidated_state(obj) -> dict:
    """The state one process would save: ``obj.consolidated_state_dict()`` for a parallel scheme's wrapper
    (:mod:`minidl.parallel.protocol`: a collective), else ``obj.state_dict()``; a dict is a state already
    gathered and is taken as it is."""
    if isinstance(obj, dict):
        return obj
    if isinstance(obj, (ParallelModule, ParallelOptimizer)):
        return obj.consolidated_state_dict()
    return obj.state_dict()


def _has_state(obj) -> bool:
    return obj is not None and callable(getattr(obj, "state_dict", None))


def read_checkpoint(path, device="cpu") -> dict:
    """Read a checkpoint file and check its outline without applying it; arrays land on ``device``.

    Raises FileNotFoundError for a missing file and :class:`CheckpointError`
    (a ValueError) for a truncated, damaged or foreign file. Whether each part
    fits the objects it is meant for is checked by :func:`load_checkpoint`.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):  # a broken link is read, so that the error says why it cannot be
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
        raise CheckpointError(f"load_checkpoint: {path} has checkpoint version {short_repr(state.get('version'))}; "
                              f"this minidl reads version {VERSION}")
    if not isinstance(state.get("model"), dict):
        raise CheckpointError(f"load_checkpoint: {path} has no model state")
    for part in _PARTS:
        if not isinstance(state.get(part), (dict, type(None))):
            raise CheckpointError(f"load_checkpoint: {path} is damaged: its {part} state is "
                                  f"{short_repr(state.get(part))}, not a dict")
    return state


def own_check(obj):
    """``obj.check_state_dict`` when it checks the format ``obj.load_state_dict`` reads, else None.

    A subclass that overrides ``load_state_dict`` with a format of its own
    (Lookahead saves its inner optimizer's state and its slow weights) inherits
    a ``check_state_dict`` written for its base's format, which is not used.
    """
    def defined_by(name):
        return next((cls for cls in type(obj).__mro__ if name in vars(cls)), None)

    check, loader = defined_by("check_state_dict"), defined_by("load_state_dict")
    if check is None or loader is None or not issubclass(check, loader):
        return None
    return obj.check_state_dict


def load_checkpoint(path, model=None, optimizer=None, scheduler=None, loader=None,
                    restore_rng: bool = True, trainer=None) -> dict:
    """Restore a checkpoint into the given objects; returns the decoded checkpoint.

    ``trainer`` is anything whose ``load_state_dict`` takes the file's
    ``trainer`` entry (a :class:`~minidl.train.Trainer` passes itself). All or
    nothing: every part the file holds for a given object is checked against
    that object (its ``check_state_dict``) before any object changes. Then the
    parts are applied, optimizer first (so the schedule sets the learning
    rate), each after a snapshot of its object is taken, and the model last:
    its load checks everything before it copies. Should a part fail anyway (an
    object whose format cannot be checked ahead, such as Lookahead's), the
    snapshots are put back. Any failure raises :class:`CheckpointError`
    naming the part, and every object is as it was. The returned dict has the
    keys ``model``, ``optimizer``, ``scheduler``, ``loader``, ``rng``,
    ``trainer`` and ``extra``.
    """
    # Read onto the CPU: load_state_dict of model and optimizer moves each array to its parameter's device.
    path = os.fspath(path)
    state = read_checkpoint(path)
    if optimizer is not None and state["optimizer"] is None:
        raise CheckpointError(f"load_checkpoint: {path} holds no optimizer state to resume from")
    parts = [(name, obj) for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("loader", loader),
                                           ("trainer", trainer))
             if obj is not None and state[name] is not None]
    rng = state["rng"] if restore_rng else None

    for name, obj in ([("model", model)] if model is not None else []) + parts:
        check = own_check(obj)
        if check is not None:
            _as_checkpoint_error(path, name, check, state[name])
    if rng is not None:
        _as_checkpoint_error(path, "rng", check_rng_states, rng)

    undo = []
    try:
        for name, obj in parts:  # the way back is recorded first: a failing load may change its object half-way
            undo.append(lambda obj=obj, snapshot=consolidated_state(obj): obj.load_state_dict(snapshot))
            _as_checkpoint_error(path, name, obj.load_state_dict, state[name])
        if rng is not None:
            undo.append(lambda snapshot=get_rng_states(): set_rng_states(snapshot))
            _as_checkpoint_error(path, "rng", set_rng_states, rng)
        if model is not None:
            _as_checkpoint_error(path, "model", model.load_state_dict, state["model"])
    except BaseException:
        for put_back in reversed(undo):
            put_back()
        raise
    return state


def _as_checkpoint_error(path, part: str, fn, value):
    """``fn(value)``, with any failure raised as a one-line CheckpointError that names ``part``."""
    try:
        return fn(value)
    except CheckpointError:
        raise
    except Exception as exc:  # whatever a damaged part makes a load raise, the caller sees one error type
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        kind = "" if isinstance(exc, ValueError) else f"{type(exc).__name__}: "
        raise CheckpointError(f"load_checkpoint: {path}: the {part} state does not fit ({kind}{text}); "
                              "nothing was changed") from None
