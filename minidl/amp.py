"""Mixed precision: 16-bit math where it is safe, float32 where it is not, and loss scaling.

Two tools, as PyTorch's ``torch.amp``:

    with amp.autocast("cpu", dtype=mdl.bfloat16):   # or ("cuda", dtype=mdl.float16)
        loss = F.cross_entropy(model(x), y)          # matmuls in bfloat16, the loss in float32
    scaler.scale(loss).backward()                    # loss · S: small gradients stay representable
    scaler.step(optimizer)                           # unscale (g / S); skip the step on inf or NaN
    scaler.update()                                  # S ← S·backoff after an inf, S·growth after N good steps

**autocast** casts the inputs of a few ops on entry, by the op's entry in
``amp.OPS``: the matrix products (``linear``, ``matmul``, the convolutions)
run in the low dtype, where 16 bits of input lose little (each product is
exact in float32 and the sums accumulate in float32, see
``minidl.backend.matmul``); softmax, log_softmax, the losses and the
normalizations run in float32, where a 16-bit exponent or a long sum would
overflow or round away. Every other op runs in the dtype of what it is given.
Parameters stay float32 (the *master weights*): a cast is an op
(``minidl.autograd.Cast``) whose backward casts back, so each gradient
arrives in its parameter's dtype, and the update ``w − lr·g`` happens in
float32, where a small ``lr·g`` is not rounded away.

**GradScaler** multiplies the loss by S (2¹⁶ at first) before backward, so
that gradients too small for float16 (below 6·10⁻⁸) stay representable, and
divides the gradients by S before the step. An inf or NaN in any gradient
means S was too large: the step is skipped and S halves; after
``growth_interval`` good steps in a row S doubles. bfloat16 has float32's
exponent range and rarely needs it.

Activations saved for backward are 16-bit under autocast: the activation
memory falls towards one half as the activations outgrow the 16-bit copies
of the weights (measure it with :func:`minidl.memory.track`). On the CPU
it is no speed-up: NumPy has no 16-bit matrix product, so the 16-bit
operands are widened to float32 for BLAS and the products rounded back.
"""
from __future__ import annotations

import functools

import numpy as np

from minidl import backend
from minidl.autograd import Cast, is_grad_enabled
from minidl.tensor import Tensor, version_of

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]

# The autocast table, op name -> "lower" or "float32", filled by the ops themselves as their modules
# load (``autocast_to``); read it as ``amp.OPS`` (see __getattr__ at the end).
_OPS: dict[str, str] = {}

# The active autocast: None (the common case, one check per listed op call) or an _Autocast.
_state = None


def _low_dtype(dtype, device_type: str):
    """autocast's dtype argument as a NumPy dtype: float16 or bfloat16, else a TypeError."""
    if dtype is None:  # PyTorch's defaults: bfloat16 on the CPU, float16 on the GPU
        dtype = "bfloat16" if device_type == "cpu" else "float16"
    try:
        name = np.dtype(dtype).name  # mdl.float16, np.float16, "float16", "half"; bfloat16 once ml_dtypes is loaded
    except TypeError:
        name = str(dtype)
    name = {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(name, name)
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
        if not backend.device_of(value.data).startswith(self.device_type):
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
        _OPS[fn.__name__] = policy

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
    device = backend.device_of(tensor.data)
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


# ---------------------------------------------------------------- loss scaling
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


class GradScaler:
    """Dynamic loss scaling with PyTorch's semantics (``torch.amp.GradScaler``).

    Per step: ``scaler.scale(loss).backward()``, optionally
    ``scaler.unscale_(optimizer)`` (then clip), ``scaler.step(optimizer)``,
    ``scaler.update()``. With S the scale:

        backward of S·L gives S·g;   unscale_: g ← (S·g) · (1/S), found_inf = any gradient not finite
        step: skipped if found_inf, else the optimizer's update
        update: found_inf → S ← S·backoff_factor, good = 0
                else good ← good + 1;  good = growth_interval → S ← S·growth_factor (if finite), good = 0

    S is a float32 number, as PyTorch's scale tensor (the products are
    float32's). ``device`` is accepted for ported code (``GradScaler("cuda")``):
    the scale lives on the host, and deciding whether to skip a step reads one
    number from the device per step, as PyTorch's unfused optimizers do.
    With ``enabled=False`` every method passes through and ``get_scale()`` is 1.

    minidl adds ``skipped_steps``: how many steps were skipped so far (it is in
    the state dict too, so a resumed run keeps counting).
    """

    def __init__(self, device: str = "cpu", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        if not growth_factor > 1.0:
            raise ValueError(f"GradScaler: growth_factor must be > 1, got {growth_factor}")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError(f"GradScaler: growth_interval must be a positive int, got {growth_interval!r}")
        if not init_scale > 0:
            raise ValueError(f"GradScaler: init_scale must be > 0, got {init_scale}")
        self.device = device
        self._enabled = bool(enabled)
        self._scale = np.float32(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self.skipped_steps = 0
        self._per_optimizer: dict[int, dict] = {}

    # ------------------------------------------------------------ the four calls of a step
    def scale(self, outputs):
        """``outputs`` · S: a Tensor, or a list/tuple of them (nested), scaled alike."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * float(self._scale)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise TypeError(f"GradScaler.scale: outputs must be a Tensor or a list/tuple of Tensors, "
                        f"got {type(outputs).__name__}")

    def unscale_(self, optimizer):
        """Divide the gradients of ``optimizer``'s parameters by S in place (new gradient Tensors
        are assigned) and note whether any is inf or NaN. At most once per optimizer between updates."""
        if not self._enabled:
            return
        state = self._state_of(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = np.float32(1.0 / np.float64(self._scale))  # PyTorch: scale.double().reciprocal().float()
        state["found_inf"] = self._unscale_grads(optimizer, inv_scale)
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step()`` unless a gradient was inf or NaN (then nothing; returns None).
        Unscales first if :meth:`unscale_` was not called this iteration."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._state_of(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale=None):
        """Back off or grow S from this iteration's inf checks (or set S to ``new_scale``)."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if isinstance(new_scale, Tensor) else new_scale
            if not isinstance(value, (int, float, np.floating)):
                raise TypeError(f"GradScaler.update: new_scale must be a number or a one-element Tensor, "
                                f"got {type(new_scale).__name__}")
            self._scale = np.float32(value)
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values() if "found_inf" in s]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update(): call scaler.step(optimizer) "
                                   "(or scaler.unscale_(optimizer)) before scaler.update()")
            if any(found):
                self._scale = np.float32(self._scale * np.float32(self._backoff_factor))
                self._growth_tracker = 0
                self.skipped_steps += 1
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    with np.errstate(over="ignore"):  # a scale grown past float32's range is not taken
                        grown = np.float32(self._scale * np.float32(self._growth_factor))
                    if np.isfinite(grown):
                        self._scale = grown
                    self._growth_tracker = 0
        self._per_optimizer = {}

    # ------------------------------------------------------------ inspection and settings
    def get_scale(self) -> float:
        """S as a Python float (1.0 when disabled)."""
        return float(self._scale) if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float):
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float):
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int):
        self._growth_interval = int(new_interval)

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict:
        """The scale and its counters (empty when disabled, as PyTorch), for checkpoints."""
        if not self._enabled:
            return {}
        return {"scale": float(self._scale), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state_dict: dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = np.float32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))

    def __repr__(self):
        return (f"GradScaler(scale={self.get_scale():g}, growth_tracker={self._growth_tracker}, "
                f"skipped_steps={self.skipped_steps}, enabled={self._enabled})")

    # ------------------------------------------------------------ helpers
    def _state_of(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(id(optimizer), {"stage": _READY})

    @staticmethod
    def _unscale_grads(optimizer, inv_scale) -> bool:
        """g ← g · inv_scale for every gradient; True if any was inf or NaN (one device read)."""
        finite = []
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.data
                if g.dtype == np.float16:
                    raise ValueError("Attempting to unscale FP16 gradients: a float16 parameter's update "
                                     "w - lr*g rounds small steps away. Keep the parameters float32 (master "
                                     "weights) and let autocast cast them inside the ops")
                xp = backend.xp_of(g)
                finite.append(xp.isfinite(g).all())
                p.grad = Tensor(g * inv_scale.astype(g.dtype) if g.dtype.itemsize < 4 else g * inv_scale)
        if not finite:
            return False
        xp = backend.xp_of(finite[0])
        return not bool(xp.stack(finite).all())


def __getattr__(name):
    """``amp.OPS``: the autocast table, op name -> "lower" (autocast's 16-bit dtype) or "float32".

    Every op module is loaded first (``minidl.functional`` imports them all), so the table is
    complete whichever ops the program has used; docs/mixed_precision.md shows it.
    """
    if name == "OPS":
        import minidl.functional  # noqa: F401 - the ops register themselves when their module loads
        return dict(_OPS)
    raise AttributeError(f"module 'minidl.amp' has no attribute {name!r}")
