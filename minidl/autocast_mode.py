"""Autocast, the engine's precision mode: which dtype the listed ops compute in.

Like ``no_grad``, autocast is a mode the ops read when they are called, so it
lives low in the package, below ``minidl.ops``: it holds the active mode
(``_state``), the context that sets it (:class:`autocast`), and the decorator
the ops put on their public functions (:func:`autocast_to`), which also
registers each op's policy in :data:`OPS` as its module loads. It imports no
op. ``minidl.amp`` offers these names to users beside ``GradScaler`` and
explains the mixed-precision recipe.
"""
from __future__ import annotations

import functools

import numpy as np

from minidl import backend
from minidl.autograd import Cast, is_grad_enabled
from minidl.tensor import Tensor, version_of

__all__ = ["autocast", "autocast_to", "get_autocast_dtype", "is_autocast_enabled"]

# The autocast table, op name -> "lower" or "float32", filled by the ops themselves as their modules
# load (``autocast_to``). ``minidl.amp.OPS`` is the complete table (it loads every op module first).
OPS: dict[str, str] = {}

# The active autocast: None (the common case, one check per listed op call) or an _Autocast.
_state = None


def _low_dtype(dtype, device_type: str):
    """autocast's dtype argument as a NumPy dtype: float16 or bfloat16, else a TypeError."""
    if dtype is None:  # PyTorch's defaults: bfloat16 on the CPU, float16 on the GPU
        dtype = "bfloat16" if device_type == "cpu" else "float16"
    name = backend.sixteen_bit_name(dtype)
    if name == "bfloat16":
        if device_type == "cuda":
            raise TypeError("autocast('cuda', dtype=bfloat16): CuPy has no bfloat16 arrays; use "
                            "dtype=mdl.float16 on the GPU (with a GradScaler)")
        return backend.bfloat16()
    if name == "float16":
        return np.dtype(np.float16)
    raise TypeError(f"autocast: dtype must be float16 or bfloat16, got {dtype!r}")


class autocast:
    """Context (or decorator) in which the ops of ``amp.OPS`` cast their inputs.

    ``device_type`` is 'cpu' or 'cuda': only tensors on that kind of device are
    cast, as PyTorch. ``dtype`` is the low precision (float16 or bfloat16;
    default bfloat16 on the CPU, float16 on the GPU). ``enabled=False`` turns
    autocast off inside the block (also inside an enclosing autocast).
    ``cache_enabled`` keeps, for the block, the 16-bit copy of each leaf
    tensor that requires grad (a weight used by several ops is cast once).

    float64 tensors are never cast (gradient checks stay exact). Run the
    backward pass after the block, as in PyTorch: each gradient flows back
    through the casts and arrives in its tensor's dtype.
    """

    def __init__(self, device_type: str = "cpu", dtype=None, enabled: bool = True, cache_enabled: bool = True):
        kind, _ = backend.parse_device(device_type)
        if ":" in str(device_type):
            raise ValueError(f"autocast: device_type is 'cpu' or 'cuda', without an index; got {device_type!r}")
        self.device_type = kind
        self.enabled = bool(enabled)
        self.dtype = _low_dtype(dtype, kind) if self.enabled else None
        self.cache_enabled = bool(cache_enabled)
        self._previous = []

    def __enter__(self):
        global _state
        self._previous.append(_state)
        _state = _Autocast(self.device_type, self.dtype, self.cache_enabled) if self.enabled else None
        return self

    def __exit__(self, *exc):
        global _state
        _state = self._previous.pop()
        return False

    def __call__(self, fn):
        """``@autocast('cpu')`` on a function: its body runs under autocast."""
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with autocast(self.device_type, self.dtype, self.enabled, self.cache_enabled):
                return fn(*args, **kwargs)
        return run


class _Autocast:
    """What the listed ops read while autocast is on: the device kind, the low dtype, the cast cache."""

    __slots__ = ("device_type", "dtype", "cache")

    def __init__(self, device_type, dtype, cache_enabled):
        self.device_type, self.dtype = device_type, dtype
        self.cache = {} if cache_enabled else None  # id(leaf) -> (leaf, its version, the cast copy)

    def cast(self, value, policy):
        """``value`` as the op of ``policy`` wants it: cast if it is a floating Tensor on our device."""
        if not isinstance(value, Tensor):
            return value
        dtype = value.dtype
        sixteen = dtype == np.float16 or backend.is_bfloat16(dtype)
        if policy == "lower":  # float32 and the other 16-bit dtype go down; float64, complex, integers stay
            if dtype == self.dtype or not (sixteen or dtype == np.float32):
                return value
            target = self.dtype
        else:  # "float32": widen the 16-bit floats
            if not sixteen:
                return value
            target = np.dtype(np.float32)
        if not backend.device_of(value.array).startswith(self.device_type):
            return value
        cacheable = self.cache is not None and value.requires_grad and value.creator is None and is_grad_enabled()
        if cacheable:
            hit = self.cache.get(id(value))
            if hit is not None and hit[0] is value and hit[1] == version_of(value) and hit[2].dtype == target:
                return hit[2]
        out = Cast(target)(value)
        if cacheable:  # the leaf is held too, so its id cannot be reused while the entry lives
            self.cache[id(value)] = (value, version_of(value), out)
        return out


def autocast_to(policy: str):
    """Decorator for an op's public function: under autocast its Tensor arguments are cast first.

    ``policy`` is "lower" (floating inputs other than float64 go to autocast's
    16-bit dtype) or "float32" (16-bit floats go to float32). The op's body runs
    with autocast off, as PyTorch's: an op it calls inside is not cast again.
    Outside autocast the call costs one check.
    """
    if policy not in ("lower", "float32"):
        raise ValueError(f"autocast_to: policy must be 'lower' or 'float32', got {policy!r}")

    def decorate(fn):
        OPS[fn.__name__] = policy

        @functools.wraps(fn)
        def op(*args, **kwargs):
            global _state
            if backend._cupy is not None and args and isinstance(args[0], Tensor):
                gpu = _other_gpu(args[0])
                if gpu is not None:  # its array work (targets, masks) must run on the input's GPU too
                    with backend._cupy.cuda.Device(gpu):
                        return op(*args, **kwargs)
            state = _state
            if state is None:
                return fn(*args, **kwargs)
            args = [state.cast(a, policy) for a in args]
            kwargs = {k: state.cast(v, policy) for k, v in kwargs.items()}
            _state = None
            try:
                return fn(*args, **kwargs)
            finally:
                _state = state
        return op
    return decorate


def _other_gpu(tensor):
    """The index of ``tensor``'s GPU when that is not the current GPU; None otherwise (or on the CPU)."""
    device = backend.device_of(tensor.array)
    if device == "cpu":
        return None
    index = int(device[5:])
    return index if index != backend._cupy.cuda.get_device_id() else None


def is_autocast_enabled(device_type: str | None = None) -> bool:
    """True inside an enabled autocast (for ``device_type`` when given: 'cpu' or 'cuda')."""
    if _state is None:
        return False
    return device_type is None or backend.parse_device(device_type)[0] == _state.device_type


def get_autocast_dtype(device_type: str = "cpu"):
    """The dtype the active autocast casts to on ``device_type``; PyTorch's default when none is active."""
    if is_autocast_enabled(device_type):
        return _state.dtype
    return _low_dtype(None, backend.parse_device(device_type)[0])
