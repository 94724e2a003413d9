"""Containers: Sequential (a chain of layers), ModuleList and ModuleDict (layers by position or
by name), ParameterList and ParameterDict (parameters by position or by name), Identity.

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    model[0]            # the first Linear;  model[1:] is a Sequential of the rest
    model.state_dict()  # keys "0.weight", "0.bias", "2.weight", "2.bias"

A container registers what it holds, so the parent's ``parameters()`` and
``state_dict()`` see it under the position or key: ``heads.cls.weight``,
``scales.0``. None has a forward of its own (except Sequential).
"""
from __future__ import annotations

from collections import OrderedDict

from minidl.nn.module import Module, Parameter
from minidl.tensor import Tensor


class Identity(Module):
    """y = x (a placeholder, e.g. a shortcut with nothing to do). Extra arguments are ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


class Sequential(Module):
    """Calls its layers in order, each on the previous one's output.

    ``Sequential(a, b, c)`` names the layers "0", "1", "2";
    ``Sequential(OrderedDict(name=layer, ...))`` keeps the given names.
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (OrderedDict, dict)):
            for name, module in modules[0].items():
                self.add_module(str(name), _checked(module, "Sequential"))
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), _checked(module, "Sequential"))

    def forward(self, x):
        for module in self._modules.values():
            x = module(x)
        return x

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[_index(index, len(self), "Sequential")]

    def __setitem__(self, index, module):
        key = list(self._modules)[_index(index, len(self), "Sequential")]
        self._modules[key] = _checked(module, "Sequential")  # in place: the order of the chain stays

    def __delitem__(self, index):
        keys = list(self._modules)
        for key in (keys[index] if isinstance(index, slice) else [keys[_index(index, len(self), "Sequential")]]):
            del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module: Module) -> "Sequential":
        self.add_module(str(len(self)), _checked(module, "Sequential"))
        return self


class ModuleList(Module):
    """A list of modules whose parameters the parent sees (names "0", "1", ...); it has no forward."""

    def __init__(self, modules=()):
        super().__init__()
        self.extend(modules)

    def __getitem__(self, index):
        values = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(values[index])
        return values[_index(index, len(self), "ModuleList")]

    def __setitem__(self, index, module):
        self._modules[str(_index(index, len(self), "ModuleList"))] = _checked(module, "ModuleList")  # in place

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module: Module) -> "ModuleList":
        self.add_module(str(len(self)), _checked(module, "ModuleList"))
        return self

    def extend(self, modules) -> "ModuleList":
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        values = list(self._modules.values())
        values.insert(index, _checked(module, "ModuleList"))
        self._modules.clear()
        for i, m in enumerate(values):
            self.add_module(str(i), m)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward: iterate over it in your model's forward")


class ModuleDict(Module):
    """A dict of modules whose parameters the parent sees under their keys ("encoder.weight").

    Insertion order is kept (``state_dict()`` lists in that order); ``update`` takes a mapping
    or (key, module) pairs. It has no forward.
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        if key not in self._modules:
            raise KeyError(f"ModuleDict has no module {key!r}; its keys are {list(self._modules)}")
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        key, module = _key(self, key, self._modules), _checked(module, "ModuleDict")
        if key in self._modules:
            self._modules[key] = module  # a replaced entry keeps its place, as in a dict
        else:
            self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def pop(self, key: str) -> Module:
        module = self[key]
        del self._modules[key]
        return module

    def clear(self) -> None:
        self._modules.clear()

    def update(self, modules) -> None:
        pairs = modules.items() if hasattr(modules, "items") else modules
        for pair in pairs:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"ModuleDict.update: expected a mapping or (key, module) pairs, got {pair!r}")
            self[pair[0]] = pair[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward: look the module up by key in your model's forward")


class ParameterList(Module):
    """A list of Parameters the parent sees (names "0", "1", ...); Tensors given are wrapped as Parameters.

    For a variable number of weights (one scale per layer, say) where a fixed attribute each
    would not do. It has no forward.
    """

    def __init__(self, values=None):
        super().__init__()
        if values is not None:
            self.extend(values)

    def __getitem__(self, index):
        values = list(self._parameters.values())
        if isinstance(index, slice):
            return ParameterList(values[index])
        return values[_index(index, len(self), "ParameterList")]

    def __setitem__(self, index, value):
        self._parameters[str(_index(index, len(self), "ParameterList"))] = _parameter(value, "ParameterList")

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters.values())

    def append(self, value) -> "ParameterList":
        self.register_parameter(str(len(self)), _parameter(value, "ParameterList"))
        return self

    def extend(self, values) -> "ParameterList":
        for value in values:
            self.append(value)
        return self

    def extra_repr(self):
        return "\n".join(f"({i}): Parameter of shape {tuple(p.shape)} ({p.dtype})" for i, p in enumerate(self))

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterList has no forward: iterate over it in your model's forward")


class ParameterDict(Module):
    """A dict of Parameters the parent sees under their keys; Tensors given are wrapped as Parameters.

    Insertion order is kept; ``update`` takes a mapping or (key, value) pairs. It has no forward.
    """

    def __init__(self, parameters=None):
        super().__init__()
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str) -> Parameter:
        if key not in self._parameters:
            raise KeyError(f"ParameterDict has no parameter {key!r}; its keys are {list(self._parameters)}")
        return self._parameters[key]

    def __setitem__(self, key: str, value) -> None:
        key, value = _key(self, key, self._parameters), _parameter(value, "ParameterDict")
        if key in self._parameters:
            self._parameters[key] = value  # a replaced entry keeps its place, as in a dict
        else:
            self.register_parameter(key, value)

    def __delitem__(self, key: str) -> None:
        del self._parameters[key]

    def __len__(self):
        return len(self._parameters)

    def __iter__(self):
        return iter(self._parameters)

    def __contains__(self, key) -> bool:
        return key in self._parameters

    def keys(self):
        return self._parameters.keys()

    def items(self):
        return self._parameters.items()

    def values(self):
        return self._parameters.values()

    def pop(self, key: str) -> Parameter:
        value = self[key]
        del self._parameters[key]
        return value

    def update(self, parameters) -> None:
        pairs = parameters.items() if hasattr(parameters, "items") else parameters
        for pair in pairs:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"ParameterDict.update: expected a mapping or (key, value) pairs, got {pair!r}")
            self[pair[0]] = pair[1]

    def extra_repr(self):
        return "\n".join(f"({k}): Parameter of shape {tuple(p.shape)} ({p.dtype})" for k, p in self.items())

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ParameterDict has no forward: look the parameter up by key in your model's forward")


def _parameter(value, owner):
    """``value`` as a Parameter: a Parameter as it is, a Tensor or array wrapped (sharing its data)."""
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor) or hasattr(value, "dtype"):
        return Parameter(value)
    raise TypeError(f"{owner}: every element must be a Parameter or a Tensor, got {type(value).__name__}")


def _key(container, key, table):
    owner = type(container).__name__
    if not isinstance(key, str) or not key or "." in key:
        raise KeyError(f"{owner} keys must be non-empty strings without '.', got {key!r}")
    if key not in table and (hasattr(type(container), key) or key in container.__dict__):
        raise KeyError(f"{owner}: the key {key!r} is the name of an attribute or method of {owner}; "
                       "choose another key")
    return key


def _checked(module, owner):
    if not isinstance(module, Module):
        raise TypeError(f"{owner}: every element must be a Module, got {type(module).__name__}; "
                        "functions can be wrapped as layers (e.g. nn.ReLU() for F.relu)")
    return module


def _index(index, length, owner):
    if not isinstance(index, int):
        raise TypeError(f"{owner} indices must be integers or slices, got {type(index).__name__}")
    if not -length <= index < length:
        raise IndexError(f"{owner} index {index} is out of range for {length} modules")
    return index % length
