"""What a recomputation must replay or restore: the random draws and the stateful layers' buffers.

A checkpointed segment runs twice, once in forward and once more during
backward. For the second run to build the same graph it must draw the same
random numbers (dropout masks): :class:`RngState` snapshots the generators
and :func:`first_draws_recorded` takes that snapshot lazily, just before
fn's first draw from each device. And it must not update BatchNorm running
statistics a second time: :class:`BufferGuard` copies the buffers of every
module called inside it and puts them back on exit. The planning helpers'
dry runs use both to leave a model as they found it.
"""
from __future__ import annotations

import contextlib

from minidl import backend
from minidl.nn.module import register_module_forward_pre_hook

__all__ = ["RngState", "first_draws_recorded", "BufferGuard"]


# ---------------------------------------------------------------- random state
def _gpu_state(generator):
    """The device array holding a CuPy generator's state (its cuRAND states), or None if not reachable."""
    state = getattr(getattr(generator, "bit_generator", None), "_state", None)
    return state if state is not None and hasattr(state, "copy") else None


class RngState:
    """Snapshots of the random generators of some devices, to draw the same numbers again.

    A checkpoint records them lazily (:func:`first_draws_recorded`): only the
    generators fn draws from, just before its first draw. A function without
    randomness costs nothing, and no GPU state (megabytes of cuRAND states) is copied.
    """

    def __init__(self):
        self.cpu, self.gpu = None, {}

    @classmethod
    def of(cls, devices) -> "RngState":
        """The generators of ``devices`` (and the CPU's) as they are now."""
        state = cls()
        for device in set(devices) | {"cpu"}:
            state.take(device, backend.rng(device))
        return state

    def take(self, device, generator):
        kind, index = backend.parse_device(device)
        if kind == "cpu":
            if self.cpu is None:
                self.cpu = backend.get_rng_state()
        elif index not in self.gpu:
            state = _gpu_state(generator)
            if state is None:  # replaying other masks would give silently wrong gradients: refuse
                raise RuntimeError(f"checkpoint: cannot save the state of the random generator of {device} "
                                   f"({type(generator).__name__} exposes no bit_generator._state); use "
                                   "preserve_rng_state=False only if fn draws no random numbers there")
            self.gpu[index] = state.copy()

    def now(self) -> "RngState":
        """The current state of the same generators."""
        return RngState.of(["cpu"] * (self.cpu is not None) + [f"cuda:{i}" for i in self.gpu])

    def restore(self):
        if self.cpu is not None:
            backend.set_rng_state(self.cpu)
        for index, saved in self.gpu.items():
            _gpu_state(backend.rng(f"cuda:{index}"))[...] = saved

    def __bool__(self):
        return self.cpu is not None or bool(self.gpu)


@contextlib.contextmanager
def first_draws_recorded(state: RngState):
    """Inside: the first time a device's generator is asked for, its state is recorded first."""
    with backend.rng_hook(state.take):
        yield state


# ---------------------------------------------------------------- stateful layers
_guards: list = []  # buffer guards open now (recomputations in progress)
_hook = None  # the handle of the module hook the guards share, while any is open


def _remember_buffers(module, inputs):
    """A module is about to run: each open guard copies its buffers (once)."""
    for guard in _guards:
        guard.remember(module)


class BufferGuard:
    """Inside: each module called has its buffers copied first; on exit they are put back.

    Recomputing a BatchNorm in training mode would update its running
    statistics a second time; this undoes that (the recomputed output uses the
    batch statistics, so it does not depend on them). The guards watch the
    module calls through one global forward pre-hook
    (:func:`minidl.nn.module.register_module_forward_pre_hook`), registered
    while any guard is open.
    """

    def __enter__(self):
        global _hook
        self.saved = {}
        if not _guards:
            _hook = register_module_forward_pre_hook(_remember_buffers)
        _guards.append(self)
        return self

    def remember(self, module):
        if id(module) in self.saved:
            return
        self.saved[id(module)] = [(module, name, t, t.array, t.array.copy())
                                  for name, t in module._buffers.items() if t is not None]

    def __exit__(self, *exc):
        global _hook
        _guards.remove(self)
        if not _guards:
            _hook.remove()
            _hook = None
        for entries in self.saved.values():
            for module, name, tensor, array, copy in entries:
                module._buffers[name] = tensor
                tensor.array = array
                array[...] = copy  # in place: anyone holding the array sees the restored values
        return False
