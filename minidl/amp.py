"""Mixed precision: 16-bit math where it is safe, float32 where it is not, and loss scaling.

Two tools, as PyTorch's ``torch.amp``:

    with amp.autocast("cpu", dtype=mdl.bfloat16):   # or ("cuda", dtype=mdl.float16)
        loss = F.cross_entropy(model(x), y)          # matmuls in bfloat16, the loss in float32
    scaler.scale(loss).backward()                    # loss · S: small gradients stay representable
    scaler.step(optimizer)                           # unscale (g / S); skip the step on inf or NaN
    scaler.update()                                  # S ← S·backoff after an inf, S·growth after N good steps

**autocast** casts the inputs of a few ops on entry, by the op's entry in
``amp.OPS`` (autocast itself is a mode of the engine, kept in
:mod:`minidl.autocast_mode` below the ops, as ``no_grad`` is; this module
offers its names beside ``GradScaler``): the matrix products (``linear``, ``matmul``, the convolutions)
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

import numpy as np

from minidl import autocast_mode, backend
from minidl.autocast_mode import autocast, get_autocast_dtype, is_autocast_enabled
from minidl.tensor import Tensor

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]

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

    An optimizer whose gradient is spread over several processes (a sharded
    data-parallel run: ``parallel.DistributedOptimizer`` over ZeRO shards) has
    ``reduce_found_inf(found_inf) -> bool``: whether any process found an inf or
    NaN in its part (a collective). ``unscale_`` calls it where it exists, so every
    process skips the same steps and keeps the same S; one process is unchanged.
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
        found_inf = self._unscale_grads(optimizer, inv_scale)
        reduce_found_inf = getattr(optimizer, "reduce_found_inf", None)
        if callable(reduce_found_inf):  # the gradient is spread over processes: all of them skip, or none
            found_inf = bool(reduce_found_inf(found_inf))
        state["found_inf"] = found_inf
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
                g = p.grad.array
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
        return dict(autocast_mode.OPS)
    raise AttributeError(f"module 'minidl.amp' has no attribute {name!r}")
