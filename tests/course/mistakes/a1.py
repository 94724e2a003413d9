"""Assignment 1 (a scalar autograd engine): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

ADD, MUL = "minidl.course.scalar.Value.__add__", "minidl.course.scalar.Value.__mul__"
POW, EXP = "minidl.course.scalar.Value.__pow__", "minidl.course.scalar.Value.exp"
TANH, RELU = "minidl.course.scalar.Value.tanh", "minidl.course.scalar.Value.relu"
BACKWARD = "minidl.course.scalar.Value.backward"

_MUL = """
other = other if isinstance(other, Value) else Value(other)
out = Value(self.data * other.data, (self, other), "*")

def _backward():
    {lines}
out._backward = _backward
return out
"""

_WALK_HEAD = """
order, seen = [], set()
"""

MISTAKES = [
    Mistake("1.1", "the sum's backward assigns instead of adding", {ADD: """
other = other if isinstance(other, Value) else Value(other)
out = Value(self.data + other.data, (self, other), "+")

def _backward():
    self.grad = out.grad
    other.grad = out.grad
out._backward = _backward
return out
"""}, ("gradient overwritten, not accumulated",)),
    Mistake("1.1", "each factor gets its own value", {MUL: _MUL.format(
        lines="self.grad += self.data * out.grad\n    other.grad += other.data * out.grad")}, ("wrong factor",)),
    Mistake("1.1", "the product's backward assigns instead of adding", {MUL: _MUL.format(
        lines="self.grad = other.data * out.grad\n    other.grad = self.data * out.grad")},
        ("gradient overwritten, not accumulated",)),
    Mistake("1.1", "the product forgets out.grad", {MUL: _MUL.format(
        lines="self.grad += other.data\n    other.grad += self.data")}, (), public_passes=False),
    Mistake("1.2", "tanh's derivative written with x", {TANH: """
out = Value(math.tanh(self.data), (self,), "tanh")

def _backward():
    self.grad += (1 - self.data ** 2) * out.grad
out._backward = _backward
return out
"""}, ("input used for output",)),
    Mistake("1.2", "the power keeps its exponent", {POW: """
out = Value(self.data ** exponent, (self,), f"**{exponent}")

def _backward():
    self.grad += exponent * self.data ** exponent * out.grad
out._backward = _backward
return out
"""}, ("power not lowered",)),
    Mistake("1.2", "exp's derivative written with x", {EXP: """
out = Value(math.exp(self.data), (self,), "exp")

def _backward():
    self.grad += self.data * out.grad
out._backward = _backward
return out
"""}, ("input used for output",)),
    Mistake("1.2", "relu's backward assigns instead of adding", {RELU: """
out = Value(self.data if self.data > 0 else 0.0, (self,), "relu")

def _backward():
    self.grad = (1.0 if self.data > 0 else 0.0) * out.grad
out._backward = _backward
return out
"""}, ("gradient overwritten, not accumulated",), public_passes=True),
    Mistake("1.3", "each node passes its gradient on before the others have added theirs", {BACKWARD: """
self.grad = 1.0
stack = [self]
while stack:
    node = stack.pop()
    node._backward()
    stack.extend(reversed(node.children))
"""}, ("order not topological",)),
    Mistake("1.3", "the walk forgets the seed", {BACKWARD: _WALK_HEAD + """
def visit(node):
    if id(node) not in seen:
        seen.add(id(node))
        for child in node.children:
            visit(child)
        order.append(node)
visit(self)
for node in reversed(order):
    node._backward()
"""}, ("missing seed",)),
    Mistake("1.3", "a recursive topological sort: a long chain passes the recursion limit", {BACKWARD: _WALK_HEAD + """
def visit(node):
    if id(node) not in seen:
        seen.add(id(node))
        for child in node.children:
            visit(child)
        order.append(node)
visit(self)
self.grad = 1.0
for node in reversed(order):
    node._backward()
"""}, (), public_passes=True),
    Mistake("1.3", "no record of the nodes already seen", {BACKWARD: """
order = []
def visit(node):
    for child in node.children:
        visit(child)
    order.append(node)
visit(self)
self.grad = 1.0
for node in reversed(order):
    node._backward()
"""}, ("node visited twice",)),
]
