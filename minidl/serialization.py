"""Saving and loading state without pickle: ``mdl.save`` / ``mdl.load``.

Files are safetensors: a JSON header naming each array's dtype, shape and
byte range, then the raw bytes. Loading reads numbers, never code, so a file
from anywhere is safe to open. Anything that is not an array (step counts,
learning rates, RNG states, nested dicts of optimizer state) travels in the
header's metadata as JSON, with each array replaced by a reference to its
tensor entry; a flat ``{name: array}`` state dict is therefore an ordinary
safetensors file that other tools read too.

Writing goes to a temporary file in the same folder that is then renamed
over the target, so a crash leaves either the old file or the new one,
never half of one.
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from minidl import backend
from minidl.tensor import Tensor

_STRUCTURE_KEY = "minidl.structure"


def _encode(value, key, tensors):
    """A JSON-able copy of ``value`` with arrays moved into ``tensors``."""
    if isinstance(value, Tensor):
        value = value.data
    if hasattr(value, "__array_namespace__") or isinstance(value, np.ndarray):
        array = backend.to_numpy(value)
        tensors[key] = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d 1-d
        return {"__tensor__": key}
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"save: dictionary keys must be strings, got {k!r} at {key or 'the top level'}")
        return {k: _encode(v, f"{key}.{k}" if key else k, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{key}.{i}" if key else str(i), tensors) for i, v in enumerate(value)]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"save: cannot store a {type(value).__name__} at {key or 'the top level'}; "
                    "only arrays, Tensors, numbers, strings, None, lists and dicts are saved (no pickle)")


def _decode(value, tensors):
    if isinstance(value, dict):
        if set(value) == {"__tensor__"}:
            return tensors[value["__tensor__"]]
        return {k: _decode(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    return value


def atomic_write(path, write_to):
    """Call ``write_to(temporary_path)``, then rename the result over ``path``."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=folder)
    os.close(handle)
    try:
        write_to(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def save(obj, path) -> None:
    """Write a state dict (or any nesting of dicts, lists, arrays, numbers) to ``path``."""
    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    structure = _encode(obj, "", tensors)
    metadata = {_STRUCTURE_KEY: json.dumps(structure)}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load(path, device="cpu"):
    """Read what :func:`save` wrote (or any safetensors file) with arrays on ``device``."""
    from safetensors import SafetensorError, safe_open

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"load: no file at {path}")
    try:
        with safe_open(path, framework="np") as f:
            metadata = f.metadata() or {}
            tensors = {k: backend.to_device(f.get_tensor(k), device) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(f"load: {path} is not a complete safetensors file ({exc}); "
                         "it may be truncated or of another format. Nothing was executed.") from None
    if _STRUCTURE_KEY not in metadata:
        return tensors  # a plain safetensors file from elsewhere: a flat dict of arrays
    try:
        structure = json.loads(metadata[_STRUCTURE_KEY])
        return _decode(structure, tensors)
    except (json.JSONDecodeError, KeyError) as exc:
        raise ValueError(f"load: {path} has a damaged minidl header ({exc})") from None
