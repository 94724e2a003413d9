"""Module and Parameter: the containers every layer is built from.

A :class:`Module` holds three kinds of state, each registered automatically
when assigned as an attribute (in insertion order, so ``parameters()`` and
``state_dict()`` list things in the order the layer defined them):

- parameters: :class:`Parameter` tensors the optimizer updates;
- buffers: Tensors without gradient that belong to the model (BatchNorm's
  running mean and variance), registered with ``register_buffer``;
- child modules, whose state is reached with dotted names (``"0.weight"``).

``state_dict()`` returns an ``OrderedDict`` of name → a *copy* of the array
(NumPy on the CPU, CuPy on the GPU: on the device the value lives on), so a
saved snapshot never changes when training goes on. ``load_state_dict``
copies values *into* the existing arrays, so an optimizer holding the
parameters keeps working after a load.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict, namedtuple

import numpy as np

from minidl import backend
from minidl.hooks import (  # noqa: F401 - PyTorch's torch.nn.modules.module names
    RemovableHandle,
    module_call_hooks,
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from minidl.tensor import Parameter, Tensor, mark_changed, tensor  # noqa: F401 - nn.Parameter


class StateDictError(ValueError, RuntimeError):
    """load_state_dict got a state that does not fit the module (missing, unexpected or mis-shaped keys).

    It is a ValueError (bad input) and a RuntimeError (what PyTorch raises here).
    """


_hook_ids = itertools.count()
IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _call_with_global_hooks(module, args, kwargs):
    """``module(*args, **kwargs)`` between the global hooks and then the module's own forward hooks."""
    hooks = list(module_call_hooks.values())
    for when, hook in hooks:
        if when == "pre":
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    out = module.forward(*args, **kwargs)
    for hook in [hook for when, hook in hooks if when == "post"] + list(module._forward_hooks.values()):
        result = hook(module, args, out)
        if result is not None:
            out = result
    return out


class Module:
    """Base class of every layer and model. Subclasses define ``forward``.

    ``module(x)`` calls ``forward(x)`` (and then any forward hooks). Assigning a
    Parameter or a Module as an attribute registers it; ``register_buffer``
    registers a Tensor that is state but not trained. ``training`` is True
    after construction and switched by ``train()`` / ``eval()``.
    """

    # A Module may declare itself indivisible: tools that cut a model into
    # segments (gradient checkpointing) must never split it. See Residual.
    checkpoint_atomic = False

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_forward_hooks", OrderedDict())
        object.__setattr__(self, "training", True)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def __call__(self, *args, **kwargs):
        for arg in args:
            if not isinstance(arg, Tensor):  # the common case costs this one check per input
                args = tuple(self._as_input(a) for a in args)
                break
        if module_call_hooks:  # a hook for every module (minidl.hooks): the same call, announced to it
            return _call_with_global_hooks(self, args, kwargs)
        out = self.forward(*args, **kwargs)
        if not self._forward_hooks:  # the common case: one dict check, nothing else
            return out
        for hook in list(self._forward_hooks.values()):
            result = hook(self, args, out)
            if result is not None:
                out = result
        return out

    def _as_input(self, value):
        """A positional input as ``forward`` gets it: a NumPy or CuPy array becomes a constant Tensor.

        The Tensor holds a copy, as ``mdl.tensor(array)`` makes (same dtype, same device), so
        ``layer(array)`` is ``layer(mdl.tensor(array))``. Tensors, None, Python numbers, strings
        and containers (an RNN's state tuple, a list of indices) pass unchanged; another
        library's array (a torch tensor, say) is a TypeError.
        """
        if isinstance(value, np.ndarray) or backend.xp_of(value) is not np:
            return tensor(value)
        if not isinstance(value, np.generic) and any(
                hasattr(value, name) for name in ("__array__", "__dlpack__", "__cuda_array_interface__")):
            kind = type(value)
            raise TypeError(f"{type(self).__name__}: got a {kind.__module__}.{kind.__qualname__} as input; "
                            "minidl layers take minidl Tensors or NumPy/CuPy arrays: convert it first, "
                            "e.g. mdl.tensor(np.asarray(x)) (for a torch tensor: mdl.tensor(x.numpy()))")
        return value

    def register_forward_hook(self, hook) -> RemovableHandle:
        """Call ``hook(module, inputs, output)`` after every forward (for activation statistics).

        A hook that returns a value replaces the output. Returns a handle with ``remove()``.
        """
        key = next(_hook_ids)
        self._forward_hooks[key] = hook
        return RemovableHandle(self._forward_hooks, key)

    # ------------------------------------------------------------ registration
    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning "
                                 f"attribute {name!r}")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        if isinstance(value, Parameter):
            _forget(self, name)
            params[name] = value
        elif isinstance(value, Module):
            _forget(self, name)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name} is a parameter: assign an nn.Parameter "
                                f"or None, not {type(value).__name__} (wrap it: nn.Parameter(value))")
            params[name] = None  # the name stays registered (e.g. a layer built with bias=False)
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer: assign a Tensor or None, "
                                f"not {type(value).__name__}")
            buffers[name] = value
        elif name in modules:
            if value is not None:
                raise TypeError(f"{type(self).__name__}.{name} is a submodule: assign a Module or None, "
                                f"not {type(value).__name__}")
            modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only called when normal lookup fails: look in the registries.
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                self._non_persistent.discard(name)
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter({name!r}): expected a Parameter or None, "
                            f"got {type(param).__name__}; wrap it: nn.Parameter(tensor)")
        _forget(self, name)
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """Register state that is saved and moved with the module but not trained (no gradient).

        ``persistent=False`` keeps it out of ``state_dict()``.
        """
        if tensor is not None and not isinstance(tensor, Tensor):
            if not hasattr(tensor, "dtype"):
                raise TypeError(f"register_buffer({name!r}): expected a Tensor or an array, "
                                f"got {type(tensor).__name__}")
            tensor = Tensor(tensor)
        _forget(self, name)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}): expected a Module, got {type(module).__name__}")
        _forget(self, name)
        self._modules[name] = module

    # ------------------------------------------------------------ traversal
    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """Yield (dotted name, module) for this module and every descendant, depth first."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            if child is None:
                continue
            yield from child.named_modules(memo, f"{prefix}.{name}" if prefix else name, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_children(self):
        seen = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self):
        for _, child in self.named_children():
            yield child

    def _named_members(self, table: str, prefix: str, recurse: bool):
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in getattr(module, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))  # a parameter shared by two layers is listed once
                yield (f"{module_prefix}.{name}" if module_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """Yield (dotted name, Parameter), in definition order; shared parameters once."""
        yield from self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True):
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        yield from self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Total number of scalar parameters (only those with requires_grad when asked)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def apply(self, fn):
        """Call ``fn(module)`` on every descendant, then on self (as PyTorch); returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------ modes and gradients
    def train(self, mode: bool = True):
        """Training mode (Dropout drops, BatchNorm uses batch statistics) for self and descendants."""
        if not isinstance(mode, bool):
            raise TypeError(f"train(mode): mode must be True or False, got {mode!r}")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self):
        """Evaluation mode: Dropout is the identity, BatchNorm uses its running statistics."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True):
        """Forget every parameter's gradient (``p.grad = None``; with set_to_none=False, zeros)."""
        for p in self.parameters():
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad = Tensor(p.xp.zeros_like(p.array))

    def requires_grad_(self, requires_grad: bool = True):
        """Freeze (False) or unfreeze (True) every parameter, e.g. for fine-tuning."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    # ------------------------------------------------------------ state
    def _state_items(self, prefix: str = ""):
        """(name, tensor) of every parameter and persistent buffer, duplicates included."""
        for module_prefix, module in self.named_modules(prefix=prefix, remove_duplicate=False):
            dot = f"{module_prefix}." if module_prefix else ""
            for name, p in module._parameters.items():
                if p is not None:
                    yield dot + name, p
            for name, b in module._buffers.items():
                if b is not None and name not in module._non_persistent:
                    yield dot + name, b

    def state_dict(self, prefix: str = "") -> OrderedDict:
        """OrderedDict of dotted name → a copy of the array (NumPy or CuPy, on its own device).

        Parameters come first within each module, then its persistent buffers,
        in definition order. The arrays are copies: training on does not change them.
        """
        return OrderedDict((name, t.xp.array(t.array, copy=True)) for name, t in self._state_items(prefix))

    def check_state_dict(self, state, strict: bool = True) -> IncompatibleKeys:
        """The StateDictError ``load_state_dict(state, strict)`` would raise, or what it would return; no change."""
        return self._checked_state(state, strict)[0]

    def load_state_dict(self, state, strict: bool = True) -> IncompatibleKeys:
        """Copy values from ``state`` (name → NumPy/CuPy array or Tensor) into this module in place.

        Every check is made before anything is copied, so a failed load leaves the
        module unchanged, buffers included. Mis-shaped keys and values that do not
        convert to the tensor's dtype (text, a NaN for an integer counter) always
        raise StateDictError; missing and unexpected keys raise it when ``strict``
        (the message lists every problem), and are returned as
        ``(missing_keys, unexpected_keys)`` otherwise.
        Values are cast to each parameter's dtype and moved to its device.
        """
        result, values = self._checked_state(state, strict)
        for target, value in values:
            value = backend.to_device(value, target.device)
            with backend.using(target.device):  # the cast and the copy run on the target's GPU
                target.array[...] = value.astype(target.dtype, copy=False)
            mark_changed(target)  # a graph recorded before the load must not see the new values
        return result

    def _checked_state(self, state, strict: bool):
        """(IncompatibleKeys, [(tensor, value to copy into it)]) once every key of ``state`` is checked."""
        if not hasattr(state, "keys"):
            raise TypeError(f"load_state_dict: expected a mapping of name -> array, got {type(state).__name__}")
        own = OrderedDict(self._state_items())
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        mis_shaped, unusable, values = [], [], []
        for name, target in own.items():
            if name not in state:
                continue
            value, problem = _as_array(state[name])
            if problem is None:
                got = tuple(value.shape)
                if got != tuple(target.shape):
                    mis_shaped.append((name, tuple(target.shape), got))
                    continue
                problem = _cast_problem(value, np.dtype(target.dtype))
            if problem is not None:
                unusable.append((name, problem))
                continue
            values.append((target, value))
        unusable += self._layer_problems(values)
        if mis_shaped or unusable or (strict and (missing or unexpected)):
            raise StateDictError(_load_error(type(self).__name__, missing, unexpected, mis_shaped, strict, unusable))
        return IncompatibleKeys(missing, unexpected), values

    def check_loaded_state(self, state: dict) -> list:
        """What is wrong with values about to be loaded into this module: ``[(local name, problem)]``.

        The hook for layers whose values must satisfy more than a shape and a dtype (a quantized
        layer's scales must be finite and positive). ``load_state_dict`` and ``check_state_dict``
        call it on every submodule that overrides it, before anything is copied, with ``state``
        mapping each of the module's own parameter and buffer names (``"weight"``, not
        ``"0.weight"``) to the array about to be loaded, or to the current one where the state
        has none. A problem raises StateDictError naming the key, the layer and the problem.
        The default finds none.
        """
        return []

    def _layer_problems(self, values) -> list:
        """[(dotted key, problem)] from every submodule's :meth:`check_loaded_state`."""
        incoming = {id(target): value for target, value in values}
        problems = []
        for module_prefix, module in self.named_modules():
            if type(module).check_loaded_state is Module.check_loaded_state:
                continue
            local = {name: incoming.get(id(t), t.array) for table in (module._parameters, module._buffers)
                     for name, t in table.items() if t is not None}
            dot = f"{module_prefix}." if module_prefix else ""
            where = f"{type(module).__name__} {module_prefix!r}" if module_prefix else type(module).__name__
            problems += [(dot + name, f"{where}: {problem}") for name, problem in module.check_loaded_state(local)]
        return problems

    # ------------------------------------------------------------ devices and dtypes
    def to(self, device=None, dtype=None):
        """Move (and/or cast) every parameter and buffer in place; the Parameter objects stay the same.

        ``to("cuda")``, ``to(np.float64)``, ``to("cpu", dtype="float32")``. Only
        floating-point tensors are cast (an integer step counter stays integer).
        Gradients move along. Returns self.
        """
        if device is not None and dtype is None and not _looks_like_device(device):
            device, dtype = None, device  # to(np.float64): the one argument is a dtype
        if dtype is not None:
            try:
                dtype = np.dtype(dtype)
            except TypeError:
                raise ValueError(f"Module.to: {dtype!r} is neither a device ('cpu', 'cuda', 'cuda:N') "
                                 "nor a dtype") from None
            if dtype.kind != "f" and not backend.is_bfloat16(dtype):  # bfloat16 (ml_dtypes) included
                raise TypeError(f"Module.to: dtype must be floating point, got {dtype}")
        if device is not None:
            backend.parse_device(device)  # a clear error for a bad device string, before any change

        def convert(array):
            if device is not None:
                array = backend.to_device(array, device)
            floating = array.dtype.kind == "f" or backend.is_bfloat16(array.dtype)  # bfloat16's kind is 'V'
            if dtype is not None and floating and array.dtype != dtype:
                array = array.astype(dtype)
            return array

        for module in self.modules():
            for table in (module._parameters, module._buffers):
                for t in table.values():
                    if t is None:
                        continue
                    t.array = convert(t.array)
                    if t.grad is not None:
                        t.grad = Tensor(convert(t.grad.array))
        return self

    def cpu(self):
        return self.to("cpu")

    def cuda(self, index: int = 0):
        return self.to(f"cuda:{index}")

    def double(self):
        """Cast floating parameters and buffers to float64 in place (for gradient checks)."""
        return self.to(dtype=np.float64)

    def float(self):
        return self.to(dtype=np.float32)

    def half(self):
        return self.to(dtype=np.float16)

    # ------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's repr line (override in layers)."""
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _indent(repr(child), 2) for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        text = type(self).__name__ + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))


class WrapsModule(Module):
    """Base of the modules built around another one (``self.module``) that are seen as it: the data-,
    tensor- and sharded-parallel wrappers. Their parameters, buffers and state-dict keys are the wrapped
    module's, without a ``module.`` prefix, so a state dict moves between the wrapped and the plain
    model unchanged (PyTorch's DDP adds the prefix; minidl does not)."""

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        return self.module.named_parameters(prefix, recurse)

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        return self.module.named_buffers(prefix, recurse)

    def _state_items(self, prefix: str = ""):
        return self.module._state_items(prefix)


def _forget(module: Module, name: str) -> None:
    """Drop ``name`` from every registry and the instance dict before it is registered anew."""
    for table in (module._parameters, module._buffers, module._modules):
        table.pop(name, None)
    module._non_persistent.discard(name)
    module.__dict__.pop(name, None)


def _indent(text: str, spaces: int) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0]] + [" " * spaces + line for line in lines[1:]])


def _looks_like_device(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        backend.parse_device(value)
    except ValueError:
        return False
    return True


def _as_array(value):
    """(an array with a NumPy dtype, None) for a state value, or (None, what is wrong with it)."""
    value = value.array if isinstance(value, Tensor) else value
    try:
        if hasattr(value, "dtype") and hasattr(value, "shape"):
            np.dtype(value.dtype)  # a torch tensor's dtype is not one: convert it below
            return value, None
    except TypeError:
        pass
    try:
        return np.asarray(value), None  # e.g. a torch tensor or a list
    except (TypeError, ValueError, OverflowError) as exc:
        return None, f"not an array ({exc})"


def _cast_problem(value, dtype: np.dtype):
    """Why ``value`` cannot be copied into a tensor of ``dtype`` without losing what it means, or None."""
    kind = np.dtype(value.dtype).kind
    allowed = {"f": "biuf", "c": "biufc", "i": "biuf", "u": "biuf", "b": "biu"}.get(dtype.kind)
    if allowed is None:
        ok = np.dtype(value.dtype) == dtype
    else:
        ok = kind in allowed
    if not ok:
        return f"holds {value.dtype} values, which do not convert to {dtype}"
    if dtype.kind in "iub" and kind in "iuf" and value.size:
        host = backend.to_numpy(value)
        low, high = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if kind == "f" and not (np.isfinite(host).all() and (host == np.round(host)).all()):
            return f"holds non-integer values (NaN, infinity or fractions), which {dtype} cannot hold"
        if host.min() < low or host.max() > high:
            return f"holds values outside the range of {dtype}"
    return None


def _load_error(owner, missing, unexpected, mis_shaped, strict, unusable=()) -> str:
    lines = [f"load_state_dict for {owner}: the state does not fit the module:"]
    if strict and missing:
        lines.append(f"  missing keys ({len(missing)}): " + ", ".join(missing))
    if strict and unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): " + ", ".join(unexpected))
    for name, expected, got in mis_shaped:
        lines.append(f"  mis-shaped key {name}: the module expects shape {expected}, the state has {got}")
    for name, problem in unusable:
        lines.append(f"  unusable key {name}: {problem}")
    lines.append("  Was the state saved from a model built with the same layer sizes? "
                 "Use strict=False to load the matching keys only (shapes must still agree).")
    return "\n".join(lines)
