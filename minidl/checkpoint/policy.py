"""Selective checkpointing: a policy decides, op by op, which outputs a checkpoint keeps.

Checkpointing a block recomputes all of it during backward. Most of that
time goes to a few expensive ops (matrix products, convolutions, attention)
whose outputs are a modest part of the memory, while the cheap elementwise
ops (norms, activations, additions) hold as much and cost little to redo.
A policy keeps the first kind and recomputes the second, as PyTorch's
selective activation checkpointing does::

    y = checkpoint(block, x, policy="matmul,attention")   # or ("matmul", "conv"), or a callable
    y = checkpoint(block, x, policy=lambda op: type(op).__name__ == "Linear")

During the forward pass (run without a graph) every op the policy keeps has
its outputs, and the arrays its forward stored for backward, put aside.
During backward the block runs again with a graph; each kept op, met in the
same order, is not computed but hands back what was put aside. Gradients are
those of the plain run. Ops that draw random numbers (dropout, attention
with dropout) are always recomputed: the recomputation replays their draws
in order.
"""
from __future__ import annotations

from minidl.autograd import Function, FunctionHook

__all__ = ["OP_FAMILIES", "resolve_policy"]

# Families a policy can name; a Function's class name (e.g. "MatMul") can be named too.
OP_FAMILIES = {
    "matmul": ("MatMul", "Linear", "Einsum"),
    "conv": ("Conv2dStride1",),  # the im2col route's product is a MatMul: name "matmul" for it
    "attention": ("ScaledDotProductAttention",),
}


def _op_classes() -> dict:
    """Every Function subclass loaded now, by class name."""
    found, stack = {}, [Function]
    while stack:
        for sub in stack.pop().__subclasses__():
            found.setdefault(sub.__name__, sub)
            stack.append(sub)
    return found


def _draws_random(fn) -> bool:
    return type(fn).__name__ == "Dropout" or bool(getattr(fn, "dropout_p", 0))


def resolve_policy(policy):
    """``policy`` as a function of an op (a Function) returning True where its outputs are kept.

    Accepts a callable (called with each op), a string of comma-separated names, or a
    sequence of names: families in ``OP_FAMILIES`` or Function class names. An unknown name,
    or a name of an op that draws random numbers, raises ValueError.
    """
    if policy is None or callable(policy):
        return policy
    names = policy.split(",") if isinstance(policy, str) else policy
    if not isinstance(names, (list, tuple, set, frozenset)) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"checkpoint: policy must be a callable, a string of op names or a sequence of op names, "
                        f"got {type(policy).__name__}")
    classes, kept = _op_classes(), set()
    for name in (n.strip() for n in names):
        if name.lower() in OP_FAMILIES:
            kept.update(OP_FAMILIES[name.lower()])
        elif name in classes and name != "Dropout":
            kept.add(name)
        else:
            why = ("its draws are replayed by recomputing it, so it cannot be kept" if name == "Dropout" else
                   "not an op family or a Function class name")
            raise ValueError(f"checkpoint: the policy names {name!r}: {why}; name families "
                             f"({', '.join(OP_FAMILIES)}) or ops such as MatMul, Linear, GELU, "
                             "LayerNormAffine, or pass a callable op -> bool")
    return lambda fn: type(fn).__name__ in kept


class KeptOutputs(FunctionHook):
    """During the forward run: the outputs (and stored arrays) of the ops ``keep`` selects, by call order."""

    def __init__(self, keep):
        self.keep, self.calls, self.kept = keep, 0, {}

    def forward_postprocess(self, function, inputs, outputs):
        index, self.calls = self.calls, self.calls + 1
        if outputs is None or _draws_random(function) or not self.keep(function):
            return
        ys = outputs.array if not isinstance(outputs, tuple) else tuple(y.array for y in outputs)
        self.kept[index] = (type(function), ys, dict(vars(function)))

    def arrays(self) -> list:
        """Every array put aside (for the memory tracker, which counts a node's lists of arrays)."""
        found = []
        for _, ys, stored in self.kept.values():
            found.extend(ys if isinstance(ys, tuple) else (ys,))
            found.extend(v for v in stored.values() if hasattr(v, "nbytes") and hasattr(v, "dtype"))
        return found


class _Replayed:
    """Stands in for a kept op's forward during the recomputation: what the forward run gave."""

    def __init__(self, function, ys, stored):
        self.function, self.ys, self.stored = function, ys, stored

    def __call__(self, *arrays):
        vars(self.function).update(self.stored)  # what backward reads: a mask, the probabilities
        return self.ys


class ReplayKept(FunctionHook):
    """During the recomputation: each op kept in the forward run returns its kept outputs instead of
    computing them; the ops are matched by call order, and a different op there is an error."""

    def __init__(self, kept: dict):
        self.kept, self.calls = kept, 0

    def forward_preprocess(self, function, inputs):
        index, self.calls = self.calls, self.calls + 1
        entry = self.kept.get(index)
        if entry is None:
            return
        kind, ys, stored = entry
        if type(function) is not kind:
            raise RuntimeError(f"checkpoint: op {index} of the recomputation is {type(function).__name__}, but "
                               f"the forward pass ran {kind.__name__} there; fn must call the same ops in the "
                               "same order every time it runs")
        function.forward = _Replayed(function, ys, stored)  # this one call's forward, on this instance
