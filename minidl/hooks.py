"""Hook points for tools that watch every optimizer step or every module call.

The engine's own seams live beside what they watch: :class:`minidl.autograd.FunctionHook`
sees every op call, every node's backward and every backward walk, and
:func:`minidl.backend.rng_hook` every request for a random generator. Two more
seams sit above the engine, in the layers and the optimizers; their registries
are kept here, low in the package, so that a tool below those layers (the
profiler) can attach to them without importing them:

- **optimizer steps** (PyTorch's ``torch.optim.optimizer`` names):
  :func:`register_optimizer_step_pre_hook` and
  :func:`register_optimizer_step_post_hook` for every optimizer,
  ``optimizer.register_step_pre_hook`` / ``register_step_post_hook`` for one
  (:class:`StepHooks`, the optimizers' base);
- **module calls** (PyTorch's ``torch.nn.modules.module`` names):
  :func:`register_module_forward_pre_hook` and
  :func:`register_module_forward_hook` for every module,
  ``module.register_forward_hook`` for one.

Each registry is empty by default, and then a step or a call costs one check.
Every ``register_*`` returns a :class:`RemovableHandle`; ``remove()`` takes
the hook off. This module imports nothing from minidl.
"""
from __future__ import annotations

import functools
import itertools
from collections import OrderedDict

__all__ = ["RemovableHandle", "StepHooks", "register_module_forward_hook", "register_module_forward_pre_hook",
           "register_optimizer_step_post_hook", "register_optimizer_step_pre_hook"]

_ids = itertools.count()

# key -> ("pre", hook) or ("post", hook), in the order they were registered.
module_call_hooks: OrderedDict = OrderedDict()
optimizer_step_hooks: OrderedDict = OrderedDict()


class RemovableHandle:
    """Returned by the ``register_*hook`` functions and methods; ``remove()`` takes the hook off."""

    def __init__(self, hooks: OrderedDict, key: int):
        self.hooks, self.key = hooks, key

    def remove(self) -> None:
        self.hooks.pop(self.key, None)


def add_hook(hooks: OrderedDict, when: str, hook) -> RemovableHandle:
    """Put ``(when, hook)`` last in the registry ``hooks``; its handle."""
    if not callable(hook):
        raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
    key = next(_ids)
    hooks[key] = (when, hook)
    return RemovableHandle(hooks, key)


# ---------------------------------------------------------------- module calls
def register_module_forward_pre_hook(hook) -> RemovableHandle:
    """Call ``hook(module, inputs)`` before every module's ``forward`` (PyTorch's global hook).

    ``inputs`` is the tuple of positional inputs; a hook that returns a value
    replaces them (a tuple, or one value).
    """
    return add_hook(module_call_hooks, "pre", hook)


def register_module_forward_hook(hook) -> RemovableHandle:
    """Call ``hook(module, inputs, output)`` after every module's ``forward`` (PyTorch's global hook).

    A hook that returns a value replaces the output. These run before each
    module's own forward hooks.
    """
    return add_hook(module_call_hooks, "post", hook)


# ---------------------------------------------------------------- optimizer steps
def register_optimizer_step_pre_hook(hook) -> RemovableHandle:
    """Call ``hook(optimizer, args, kwargs)`` before every optimizer's ``step``.

    ``args`` starts with the optimizer, as in PyTorch; a hook that returns
    ``(new_args, new_kwargs)`` replaces them. Hooks for all optimizers run
    before one optimizer's own (see :class:`StepHooks`).
    """
    return add_hook(optimizer_step_hooks, "pre", hook)


def register_optimizer_step_post_hook(hook) -> RemovableHandle:
    """Call ``hook(optimizer, args, kwargs)`` after every optimizer's ``step`` (after its own post-hooks)."""
    return add_hook(optimizer_step_hooks, "post", hook)


class StepHooks:
    """Base of the classes with a ``step`` (the optimizers and their wrappers): step hooks.

    ``register_step_pre_hook(hook)`` calls ``hook(optimizer, args, kwargs)``
    before each ``step`` of this object, ``register_step_post_hook(hook)``
    after it; each returns a :class:`RemovableHandle`. As in PyTorch, ``args``
    starts with the optimizer itself (the step's positional arguments as the
    method receives them), a pre-hook may return ``(new_args, new_kwargs)`` to
    replace them, the pre-hooks for every optimizer run before this one's own
    and the post-hooks after its own, and the post-hooks do not run when the
    step raises. The ``step`` any subclass defines runs between the hooks;
    with none registered it costs one check. A wrapper's step calls its inner
    optimizer's, so both announce themselves.
    """

    _step_hooks = None  # this object's own step hooks, once it has one

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = vars(cls).get("step")
        if step is not None and not getattr(step, "runs_step_hooks", False):
            cls.step = _runs_step_hooks(step)  # the class being defined: its own step, announced

    def register_step_pre_hook(self, hook) -> RemovableHandle:
        """Call ``hook(self, args, kwargs)`` before each ``step``; returning ``(args, kwargs)`` replaces them."""
        if self._step_hooks is None:
            self._step_hooks = OrderedDict()
        return add_hook(self._step_hooks, "pre", hook)

    def register_step_post_hook(self, hook) -> RemovableHandle:
        """Call ``hook(self, args, kwargs)`` after each ``step``."""
        if self._step_hooks is None:
            self._step_hooks = OrderedDict()
        return add_hook(self._step_hooks, "post", hook)


def _runs_step_hooks(step):
    """``step`` between the step hooks (see :class:`StepHooks`)."""

    @functools.wraps(step)
    def hooked_step(*args, **kwargs):
        self = args[0]
        own = self._step_hooks
        if not (optimizer_step_hooks or own):
            return step(*args, **kwargs)
        everyone, own = list(optimizer_step_hooks.values()), list((own or {}).values())
        for when, hook in everyone + own:
            if when == "pre":
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError(f"a step pre-hook must return None or a tuple (new_args, new_kwargs), "
                                           f"got {result!r}")
                    args, kwargs = result
        out = step(*args, **kwargs)
        for when, hook in own + everyone:
            if when == "post":
                hook(self, args, kwargs)
        return out

    hooked_step.runs_step_hooks = True
    return hooked_step
