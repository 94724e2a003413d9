"""Assignment 8 (forward mode): wrong tangent rules as students write them."""
from tests.course.mistakes import Mistake

MUL, DIV = "minidl.ops.elementwise.Mul.jvp", "minidl.ops.elementwise.Div.jvp"
EXP, LOG, TANH = "minidl.ops.elementwise.Exp.jvp", "minidl.ops.elementwise.Log.jvp", "minidl.ops.activation.Tanh.jvp"
MATMUL, SOFTMAX = "minidl.ops.linalg.MatMul.jvp", "minidl.ops.activation.Softmax.jvp"

MISTAKES = [
    Mistake("8.1", "the product rule with one term", {MUL: """
a, b = self.inputs
return _spread(None if da is None else da * b, self.output().shape)
"""}, ("missing term",)),
    Mistake("8.1", "each tangent times its own factor", {MUL: """
a, b = self.inputs
return _spread(tangent_sum(None if da is None else da * a, None if db is None else db * b), self.output().shape)
"""}, ("wrong factor",)),
    Mistake("8.1", "no constant operand foreseen (a tangent of None)", {MUL: """
a, b = self.inputs
return da * b + a * db
"""}, (), public_passes=True),
    Mistake("8.1", "the quotient rule's minus sign lost", {DIV: """
b = self.inputs[1]
top = tangent_sum(da, None if db is None else self.output() * db)
return _spread(top / b, self.output().shape)
"""}, ("sign",)),
    Mistake("8.1", "the quotient rule without its square", {DIV: """
a, b = self.inputs
top = tangent_sum(None if da is None else da * b, None if db is None else -(a * db))
return _spread(top / b, self.output().shape)
"""}, ("missing square",)),
    Mistake("8.2", "exp's tangent times x", {EXP: "return dx * self.inputs[0]\n"}, ("input used for output",)),
    Mistake("8.2", "log's tangent divided by the output", {LOG: "return dx / self.output()\n"},
            ("input used for output",)),
    Mistake("8.2", "tanh's tangent as dx · (1 − y)", {TANH: """
y = self.output()
return dx * (1 - y)
"""}, ("missing square",)),
    Mistake("8.3", "only a's tangent", {MATMUL: """
a, b = self.inputs
return None if da is None else MatMul()(da, b)
"""}, ("missing term",)),
    Mistake("8.3", "b transposed as in the backward", {MATMUL: """
a, b = self.inputs
return tangent_sum(None if da is None else MatMul()(da, swap_last_axes(b)), None if db is None else MatMul()(a, db))
"""}, ("transposed operand",)),
    Mistake("8.3", "no constant operand foreseen", {MATMUL: """
a, b = self.inputs
return MatMul()(da, b) + MatMul()(a, db)
"""}, (), public_passes=True),
    Mistake("8.4", "only the diagonal of the Jacobian", {SOFTMAX: "return self.output() * dx\n"}, ("missing term",)),
    Mistake("8.4", "always the last axis", {SOFTMAX: "return SoftmaxGrad(-1)(self.output(), dx)\n"}, ("wrong axis",),
            public_passes=True),
    Mistake("8.4", "the two terms the wrong way round", {SOFTMAX: """
y = self.output()
return y * (reduce_sum(dx * y, axis=self.axis, keepdims=True) - dx)
"""}, ("sign",)),
]
