"""Optimizer state in host memory: Adam's m and v off the GPU.

Adam keeps two numbers beside every weight: for N float32 parameters, 8N
bytes of state, twice the weights themselves, on the GPU for the whole
run. ZeRO-Offload and the offloaded optimizers of DeepSpeed and
bitsandbytes keep that state in host memory instead, where it is plentiful,
and pay in transfers over the bus. ``OffloadedOptimizer`` does the same for
any optimizer of this package that updates each parameter through its
``update(w, g, state, group)`` (all but the wrappers: Lookahead, SWA…)::

    opt = offload(optim.Adam(model.parameters(), lr=1e-3))                     # update on the host
    opt = offload(optim.Adam(model.parameters()), mode="stream", chunk_bytes=2**26)

Two ways to run the step:

- ``mode="host"``: each parameter and its gradient are copied to the host,
  the update equation runs there with NumPy on the host state, and the new
  parameter is copied back into the device buffer. The device never holds
  any state; each step moves 3·(parameter bytes) over the bus, and the
  update runs at the host's speed (ZeRO-Offload's CPU Adam).
- ``mode="stream"``: the state stays in host memory between steps; during
  the step it is brought to the device a chunk of parameters at a time (at
  most ``chunk_bytes`` of parameters per chunk; a larger parameter is a
  chunk alone), the optimizer's own device update runs on it (its fused
  kernel: the same arithmetic as without offload) and the state goes back
  to the host. The device holds one chunk's state, during the step only;
  each step moves 2·(state bytes).

On the CPU there is nothing to move: the state is in host memory already.
Offloading an optimizer whose parameters are all on the CPU warns once, says
so, and steps the optimizer as it is.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.optim.optimizer import Optimizer
from minidl.optim.wrapper import WrapsOptimizer
from minidl.tensor import mark_changed

__all__ = ["OffloadedOptimizer", "offload", "state_bytes"]


def _moved(value, device):
    """A copy of a state entry with its arrays on ``device`` (numbers and the rest as they are)."""
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, np.ndarray) or backend.is_device_array(value):
        return backend.to_device(value, device)
    return value


def _array_bytes(value, where: dict):
    if isinstance(value, dict):
        for v in value.values():
            _array_bytes(v, where)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _array_bytes(v, where)
    elif isinstance(value, np.ndarray) or backend.is_device_array(value):
        kind = "cpu" if isinstance(value, np.ndarray) else "device"
        where[kind] += int(value.nbytes)


def state_bytes(optimizer) -> dict:
    """{"cpu": bytes, "device": bytes} of the arrays in an optimizer's state, by where they live."""
    where = {"cpu": 0, "device": 0}
    _array_bytes(list(optimizer.state.values()), where)
    return where


class OffloadedOptimizer(WrapsOptimizer):
    """``OffloadedOptimizer(optimizer, mode="host", chunk_bytes=64 MiB)``: its state in host memory.

    ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are the
    wrapped optimizer's; ``param_groups`` and ``state`` are its too (so a
    learning-rate schedule drives it). ``peak_device_state_bytes`` is the
    most state the last step held on the device at once (0 with mode="host").
    """

    modes = ("host", "stream")

    def __init__(self, optimizer, mode: str = "host", chunk_bytes: int = 64 * 2**20):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"offload: expected a minidl.optim optimizer, got {type(optimizer).__name__}")
        name = type(optimizer).__name__
        if type(optimizer).step is not Optimizer.step or type(optimizer).step_groups is not Optimizer.step_groups:
            raise TypeError(f"offload: {name} has its own step, not one update(w, g, state, group) per "
                            "parameter, so its state cannot be moved parameter by parameter; offload the "
                            "optimizer it wraps or an optimizer such as Adam, SGD or LAMB")
        if mode not in self.modes:
            raise ValueError(f"offload: mode must be 'host' (update on the host) or 'stream' (state streamed "
                             f"to the device in chunks), got {mode!r}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, numbers.Integral) or chunk_bytes < 1:
            raise ValueError(f"offload: chunk_bytes must be a positive number of bytes, got {chunk_bytes!r}")
        self.optimizer, self.mode, self.chunk_bytes = optimizer, mode, int(chunk_bytes)
        self.peak_device_state_bytes = 0
        self._to_host()
        self._warned = False

    @property
    def name(self) -> str:
        return f"Offloaded{self.optimizer.name}"

    def _warn_if_on_cpu(self):
        params = [p for _, p, _ in self.optimizer.parameters()]
        if not self._warned and not any(backend.is_device_array(p.array) for p in params):
            self._warned = True
            warnings.warn(f"offload: the parameters of {self.optimizer.name} are on the CPU, so its state is in "
                          "host memory already; offloading changes nothing and the optimizer steps as it is",
                          UserWarning, stacklevel=3)

    def _to_host(self):
        state = self.optimizer.state
        for position in list(state):
            state[position] = _moved(state[position], "cpu")

    # ------------------------------------------------------------ the step
    def step(self, closure=None):
        """One update of every parameter with a gradient, the state kept in host memory (see the module)."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        items = [(position, p, group) for position, p, group in self.optimizer.parameters()
                 if p.grad is not None and p.requires_grad]
        on_device = [item for item in items if backend.is_device_array(item[1].array)]
        self.peak_device_state_bytes = 0
        self._warn_if_on_cpu()
        with no_grad():
            for item in items:
                if not backend.is_device_array(item[1].array):  # on the CPU: the state is in host memory already
                    self._update(*item)
            if self.mode == "host":
                for item in on_device:
                    self._update_on_host(*item)
            else:
                for chunk in self._chunks(on_device):
                    self._update_chunk(chunk)
        mark_changed(*[p for _, p, _ in items])  # as Optimizer.step: a graph recorded before this step is stale
        return loss

    def _update(self, position, p, group):
        state = self.optimizer.state.setdefault(position, {})
        self.optimizer.update_parameter(p, p.array, p.grad.array, state, group)

    def _update_on_host(self, position, p, group):
        w = backend.to_numpy(p.array)
        g = backend.to_numpy(p.grad.array)
        state = self.optimizer.state.setdefault(position, {})
        self.optimizer.update_parameter(p, w, g, state, group)
        with backend.using_array(p.array):
            p.array[...] = backend.to_device(w, p.device)  # into the same buffer: views of it stay valid

    def _chunks(self, items):
        chunk, size = [], 0
        for item in items:
            nbytes = int(item[1].array.nbytes)
            if chunk and size + nbytes > self.chunk_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(item)
            size += nbytes
        if chunk:
            yield chunk

    def _update_chunk(self, chunk):
        device = chunk[0][1].device
        states = self.optimizer.state
        with backend.using(device):
            moved = {position: _moved(states.get(position, {}), p.device) for position, p, _ in chunk}
            for position, p, group in chunk:
                self.optimizer.update_parameter(p, p.array, p.grad.array, moved[position], group)
            held = {"cpu": 0, "device": 0}
            _array_bytes(list(moved.values()), held)
            self.peak_device_state_bytes = max(self.peak_device_state_bytes, held["device"])
            for position, state in moved.items():
                states[position] = _moved(state, "cpu")

    # ------------------------------------------------------------ the rest is the wrapped optimizer's
    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict):
        """The wrapped optimizer's ``load_state_dict`` (all or nothing), its state then kept on the host."""
        self.optimizer.load_state_dict(state_dict)
        self._to_host()

    def state_bytes(self) -> dict:
        """{"cpu": bytes, "device": bytes} of the state now (between steps the device's is 0)."""
        return state_bytes(self.optimizer)

    def __repr__(self):
        return f"OffloadedOptimizer(mode={self.mode!r}, chunk_bytes={self.chunk_bytes}) of {self.optimizer!r}"


def offload(optimizer, mode: str = "host", chunk_bytes: int = 64 * 2**20) -> OffloadedOptimizer:
    """``optimizer`` with its state kept in host memory: see :class:`OffloadedOptimizer`."""
    return OffloadedOptimizer(optimizer, mode=mode, chunk_bytes=chunk_bytes)
