"""The functional API, ``import minidl.functional as F``: every op as a function.

    y = F.relu(F.linear(x, w, b));  loss = F.cross_entropy(y, targets)

Each name here is a thin call of one Function in :mod:`minidl.ops`; the
docstrings there give the forward and backward math.
"""
from minidl.ops.activation import (elu, gelu, leaky_relu, log_softmax, logsumexp, relu, sigmoid,
                                   softmax, softplus, tanh)
from minidl.ops.elementwise import (abs, add, clip, div, exp, log, maximum, minimum, mul, neg, pow,
                                    sqrt, sub, where)
from minidl.ops.linalg import linear, matmul
from minidl.ops.reduction import max, mean, min, sum, var
from minidl.ops.shape import (broadcast_to, concatenate, flatten, getitem, pad, reshape, stack,
                              transpose)

__all__ = [
    "abs", "add", "broadcast_to", "clip", "concatenate", "div", "elu", "exp", "flatten", "gelu",
    "getitem", "leaky_relu", "linear", "log", "log_softmax", "logsumexp", "matmul", "max",
    "maximum", "mean", "min", "minimum", "mul", "neg", "pad", "pow", "relu", "reshape", "sigmoid",
    "softmax", "softplus", "sqrt", "stack", "sub", "sum", "tanh", "transpose", "var", "where",
]
