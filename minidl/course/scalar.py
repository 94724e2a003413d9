"""A scalar autograd engine you can hold in your head: assignment 1's module.

A :class:`Value` is one number, the gradient of the final result with respect
to it (``grad``), the Values it was computed from (``children``) and a
function ``_backward`` that, once ``out.grad`` is known, adds each child's
share to the child's ``grad``: the chain rule for that one op,

    ∂L/∂child += ∂L/∂out · ∂out/∂child.

:meth:`Value.backward` orders the graph so that every node comes after all
the nodes that use it (a topological order, reversed) and calls each node's
``_backward`` once. A Value used twice receives two contributions, which is
why every ``_backward`` *adds* to ``grad``. This is minidl's own engine in
miniature: :mod:`minidl.autograd` does the same with arrays instead of
numbers, each op a Function and the walk iterative.

:class:`Neuron`, :class:`Layer` and :class:`MLP` build a small network of
Values, enough to learn XOR.
"""
from __future__ import annotations

import math
import random

__all__ = ["Layer", "MLP", "Neuron", "Value"]


class Value:
    """A scalar that remembers how it was made: ``data``, ``grad``, its ``children`` and its ``_backward``."""

    def __init__(self, data: float, children=(), op: str = ""):
        self.data = float(data)
        self.grad = 0.0
        self.children = tuple(children)
        self.op = op
        self._backward = lambda: None  # a leaf has nothing to pass on

    def __add__(self, other):
        """out = self + other;  ∂out/∂self = 1 and ∂out/∂other = 1, so each child gets out.grad."""
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data + other.data, (self, other), "+")

        def _backward():
            self.grad += out.grad
            other.grad += out.grad
        out._backward = _backward
        return out

    def __mul__(self, other):
        """out = self · other;  ∂out/∂self = other and ∂out/∂other = self (each child gets the *other* factor)."""
        other = other if isinstance(other, Value) else Value(other)
        out = Value(self.data * other.data, (self, other), "*")

        def _backward():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad
        out._backward = _backward
        return out

    def __pow__(self, exponent):
        """out = selfⁿ for a constant number n;  ∂out/∂self = n · selfⁿ⁻¹."""
        if not isinstance(exponent, (int, float)):
            raise TypeError(f"Value ** exponent: the exponent must be a number, got {type(exponent).__name__}")
        out = Value(self.data ** exponent, (self,), f"**{exponent}")

        def _backward():
            self.grad += exponent * self.data ** (exponent - 1) * out.grad
        out._backward = _backward
        return out

    def exp(self):
        """out = eˣ;  ∂out/∂x = eˣ = out (the output itself)."""
        out = Value(math.exp(self.data), (self,), "exp")

        def _backward():
            self.grad += out.data * out.grad
        out._backward = _backward
        return out

    def tanh(self):
        """out = tanh x;  ∂out/∂x = 1 − tanh² x = 1 − out²."""
        out = Value(math.tanh(self.data), (self,), "tanh")

        def _backward():
            self.grad += (1 - out.data ** 2) * out.grad
        out._backward = _backward
        return out

    def relu(self):
        """out = max(0, x);  ∂out/∂x = 1 where x > 0, else 0 (0 at x = 0, as minidl and PyTorch)."""
        out = Value(self.data if self.data > 0 else 0.0, (self,), "relu")

        def _backward():
            self.grad += (1.0 if self.data > 0 else 0.0) * out.grad
        out._backward = _backward
        return out

    def backward(self):
        """Fill ``grad`` of every Value this one depends on: ∂self/∂v.

        1. A topological order: a depth-first walk that appends a node after all
           of its children, so every node comes after the nodes it was made from.
        2. ``self.grad = 1`` (∂self/∂self), then each node's ``_backward`` in the
           reverse of that order: a node passes its gradient on only when every
           node that used it has already added its share.

        The walk is iterative, so a chain of thousands of Values needs no recursion.
        """
        order, seen = [], set()
        stack = [(self, False)]
        while stack:
            node, children_done = stack.pop()
            if children_done:
                order.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((child, False) for child in node.children)
        self.grad = 1.0
        for node in reversed(order):
            node._backward()

    # the rest is written with the ops above
    def __neg__(self):
        return self * -1

    def __radd__(self, other):
        return self + other

    def __sub__(self, other):
        return self + (-other)

    def __rsub__(self, other):
        return other + (-self)

    def __rmul__(self, other):
        return self * other

    def __truediv__(self, other):
        return self * other ** -1

    def __rtruediv__(self, other):
        return other * self ** -1

    def sigmoid(self):
        """σ(x) = 1 / (1 + e⁻ˣ), composed of the ops above."""
        return 1 / (1 + (-self).exp())

    def __repr__(self):
        return f"Value(data={self.data:.6g}, grad={self.grad:.6g})"


class Neuron:
    """y = φ(Σ wᵢxᵢ + b) with φ = tanh (or none, for an output neuron)."""

    def __init__(self, inputs: int, nonlinear: bool = True, rng: random.Random | None = None):
        rng = rng or random.Random(0)
        self.w = [Value(rng.uniform(-1, 1)) for _ in range(inputs)]
        self.b = Value(0.0)
        self.nonlinear = nonlinear

    def __call__(self, x):
        total = self.b
        for wi, xi in zip(self.w, x):
            total = total + wi * xi
        return total.tanh() if self.nonlinear else total

    def parameters(self):
        return self.w + [self.b]


class Layer:
    """``outputs`` neurons that each see every input."""

    def __init__(self, inputs: int, outputs: int, nonlinear: bool = True, rng: random.Random | None = None):
        self.neurons = [Neuron(inputs, nonlinear, rng) for _ in range(outputs)]

    def __call__(self, x):
        out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def parameters(self):
        return [p for n in self.neurons for p in n.parameters()]


class MLP:
    """Layers of tanh neurons, the last one linear: ``MLP(2, [4, 1])`` maps 2 inputs to 1 output."""

    def __init__(self, inputs: int, sizes, seed: int = 0):
        rng = random.Random(seed)
        widths = [inputs] + list(sizes)
        self.layers = [Layer(widths[i], widths[i + 1], nonlinear=i + 2 < len(widths), rng=rng)
                       for i in range(len(sizes))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x if isinstance(x, list) else [x])
        return x

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0.0
