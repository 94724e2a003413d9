"""Containers: Sequential (a chain of layers), ModuleList (a list of layers), Identity.

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    model[0]            # the first Linear;  model[1:] is a Sequential of the rest
    model.state_dict()  # keys "0.weight", "0.bias", "2.weight", "2.bias"
"""
from __future__ import annotations

from collections import OrderedDict

from minidl.nn.module import Module


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
        self.add_module(key, _checked(module, "Sequential"))

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
        self.add_module(str(_index(index, len(self), "ModuleList")), _checked(module, "ModuleList"))

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
