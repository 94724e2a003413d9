"""The functional API, ``import minidl.functional as F``: every op as a function.

    y = F.relu(F.linear(x, w, b));  loss = F.cross_entropy(y, targets)

Each name here is a thin call of one Function in :mod:`minidl.ops`; the
docstrings there give the forward and backward math.
"""
from minidl.ops.activation import elu, gelu, leaky_relu, log_softmax, logsumexp, relu, sigmoid, softmax, softplus, tanh
from minidl.ops.conv import conv1d, conv2d, im2col
from minidl.ops.einsum import einsum
from minidl.ops.elementwise import abs, add, clip, div, exp, log, maximum, minimum, mul, neg, pow, sqrt, sub, where
from minidl.ops.indexing import (
    argsort,
    gather,
    index_select,
    masked_fill,
    masked_select,
    nonzero,
    scatter,
    scatter_add,
    sort,
    topk,
)
from minidl.ops.linalg import linear, matmul, norm
from minidl.ops.loss import binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss
from minidl.ops.norm import batch_norm, group_norm, layer_norm
from minidl.ops.pool import avg_pool2d, max_pool2d
from minidl.ops.reduction import all, any, argmax, argmin, max, mean, min, prod, std, sum, var
from minidl.ops.regularization import dropout, embedding
from minidl.ops.scan import cumprod, cumsum, logcumsumexp
from minidl.ops.shape import broadcast_to, concatenate, flatten, getitem, pad, reshape, stack, transpose

__all__ = [
    "abs", "add", "broadcast_to", "clip", "concatenate", "div", "elu", "exp", "flatten", "gelu",
    "getitem", "leaky_relu", "linear", "log", "log_softmax", "logsumexp", "matmul", "max",
    "maximum", "mean", "min", "minimum", "mul", "neg", "pad", "pow", "relu", "reshape", "sigmoid",
    "softmax", "softplus", "sqrt", "stack", "sub", "sum", "tanh", "transpose", "var", "where",
    "avg_pool2d", "batch_norm", "binary_cross_entropy_with_logits", "conv1d", "conv2d",
    "cross_entropy", "dropout", "embedding", "group_norm", "im2col", "l1_loss", "layer_norm",
    "max_pool2d", "mse_loss", "nll_loss",
    "all", "any", "argmax", "argmin", "argsort", "cumprod", "cumsum", "gather", "index_select", "logcumsumexp",
    "masked_fill", "masked_select", "nonzero", "prod", "einsum", "norm", "scatter", "scatter_add", "sort", "std",
    "topk",
]
