"""The functional API, ``import minidl.functional as F``: every op as a function.

    y = F.relu(F.linear(x, w, b));  loss = F.cross_entropy(y, targets)

Each name here is a thin call of one Function in :mod:`minidl.ops`; the
docstrings there give the forward and backward math.
"""
from minidl.ops.activation import (
    celu,
    elu,
    gelu,
    glu,
    hardsigmoid,
    hardswish,
    hardtanh,
    leaky_relu,
    log_softmax,
    logsigmoid,
    logsumexp,
    mish,
    prelu,
    relu,
    relu6,
    selu,
    sigmoid,
    silu,
    softmax,
    softmin,
    softplus,
    softsign,
    tanh,
)
from minidl.ops.attention import scaled_dot_product_attention
from minidl.ops.conv import conv1d, conv2d, conv_transpose1d, conv_transpose2d, im2col
from minidl.ops.distance import cosine_similarity, normalize, pairwise_distance
from minidl.ops.einsum import einsum
from minidl.ops.elementwise import (
    abs,
    add,
    clamp,
    clip,
    div,
    exp,
    floor_divide,
    log,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    sqrt,
    sub,
    where,
)
from minidl.ops.indexing import (
    argsort,
    gather,
    index_select,
    masked_fill,
    masked_select,
    nonzero,
    scatter_add,
    sort,
    topk,
)
from minidl.ops.linalg import linear, matmul, norm
from minidl.ops.loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    nll_loss,
    one_hot,
    smooth_l1_loss,
)
from minidl.ops.math import (
    acos,
    acosh,
    allclose,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    ceil,
    copysign,
    cos,
    cosh,
    erf,
    erfc,
    exp2,
    expm1,
    floor,
    fmod,
    isclose,
    isfinite,
    isinf,
    isnan,
    lerp,
    log1p,
    log2,
    log10,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    reciprocal,
    remainder,
    round,
    rsqrt,
    sign,
    sin,
    sinh,
    tan,
    trunc,
)
from minidl.ops.norm import batch_norm, group_norm, instance_norm, layer_norm, rms_norm
from minidl.ops.pool import (
    adaptive_avg_pool1d,
    adaptive_avg_pool2d,
    adaptive_max_pool1d,
    adaptive_max_pool2d,
    avg_pool1d,
    avg_pool2d,
    max_pool1d,
    max_pool2d,
    max_unpool1d,
    max_unpool2d,
)
from minidl.ops.quantize import fake_quantize
from minidl.ops.rearrange import diag, diagonal, flip, repeat, repeat_interleave, roll, tril, triu
from minidl.ops.reduction import all, any, argmax, argmin, max, mean, min, prod, std, std_mean, sum, var, var_mean
from minidl.ops.regularization import dropout, dropout1d, dropout2d, embedding
from minidl.ops.resample import interpolate, pixel_shuffle, pixel_unshuffle
from minidl.ops.scan import cummax, cummin, cumprod, cumsum, logcumsumexp
from minidl.ops.scatter_reduce import scatter, scatter_reduce
from minidl.ops.shape import (
    broadcast_to,
    cat,
    chunk,
    concatenate,
    expand,
    flatten,
    getitem,
    movedim,
    narrow,
    pad,
    permute,
    reshape,
    split,
    squeeze,
    stack,
    transpose,
    unflatten,
    unsqueeze,
)
from minidl.ops.volume import avg_pool3d, conv3d, conv_transpose3d, max_pool3d

__all__ = [
    "abs", "add", "broadcast_to", "clip", "concatenate", "div", "elu", "exp", "flatten", "gelu", "getitem",
    "leaky_relu", "linear", "log", "log_softmax", "logsumexp", "matmul", "max", "maximum", "mean", "min", "minimum",
    "mul", "neg", "pad", "pow", "relu", "reshape", "sigmoid", "softmax", "softplus", "sqrt", "stack", "sub", "sum",
    "tanh", "transpose", "var", "where", "avg_pool2d", "batch_norm", "binary_cross_entropy_with_logits", "conv1d",
    "conv2d", "cross_entropy", "dropout", "embedding", "group_norm", "im2col", "l1_loss", "layer_norm",
    "max_pool2d", "mse_loss", "nll_loss", "celu", "glu", "hardsigmoid", "hardswish", "hardtanh", "logsigmoid",
    "mish", "prelu", "relu6", "selu", "silu", "softmin", "softsign", "cat", "chunk", "diagonal", "expand", "flip",
    "movedim", "narrow", "permute", "repeat", "repeat_interleave", "roll", "split", "squeeze", "tril", "triu",
    "unflatten", "unsqueeze", "binary_cross_entropy", "cosine_similarity", "huber_loss", "kl_div", "normalize",
    "one_hot", "pairwise_distance", "scaled_dot_product_attention", "smooth_l1_loss", "clamp", "floor_divide",
    "acos", "acosh", "allclose", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "copysign", "cos", "cosh",
    "erf", "erfc", "exp2", "expm1", "floor", "fmod", "isclose", "isfinite", "isinf", "isnan", "lerp", "log1p",
    "log2", "log10", "logaddexp", "logical_and", "logical_not", "logical_or", "logical_xor", "reciprocal",
    "remainder", "round", "rsqrt", "sign", "sin", "sinh", "tan", "trunc", "adaptive_avg_pool1d",
    "adaptive_avg_pool2d", "adaptive_max_pool1d", "adaptive_max_pool2d", "avg_pool1d", "conv_transpose1d",
    "conv_transpose2d", "interpolate", "max_pool1d", "max_unpool1d", "max_unpool2d", "pixel_shuffle",
    "pixel_unshuffle", "dropout1d", "dropout2d", "instance_norm", "rms_norm", "all", "any", "argmax", "argmin",
    "argsort", "cumprod", "cumsum", "gather", "index_select", "logcumsumexp", "masked_fill", "masked_select",
    "nonzero", "prod", "einsum", "norm", "scatter", "scatter_add", "sort", "std", "topk", "fake_quantize",
    "scatter_reduce", "cummax", "cummin", "std_mean", "var_mean", "diag",
    "conv3d", "conv_transpose3d", "max_pool3d", "avg_pool3d",
]
