"""minidl: a deep-learning engine on NumPy and CuPy, written to be read.

    import minidl as mdl
    x = mdl.tensor([[1.0, 2.0]], requires_grad=True)
    y = (x * x).sum();  y.backward();  x.grad   # tensor([[2., 4.]])
"""
import numpy as _np

from minidl import ops as _ops  # noqa: F401 - attaches Tensor's operators and methods
from minidl.autograd import (
    AnomalyError,
    Function,
    FunctionHook,
    detect_anomaly,
    enable_grad,
    grad,
    inference_mode,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from minidl.backend import device, get_num_threads, gpu_available, manual_seed, set_num_threads
from minidl.functional import (  # the functional ops PyTorch also offers at torch.* (torch.relu, torch.softmax...)
    adaptive_avg_pool1d,
    adaptive_max_pool1d,
    avg_pool1d,
    broadcast_to,
    celu,
    conv1d,
    conv2d,
    conv3d,
    conv_transpose1d,
    conv_transpose2d,
    conv_transpose3d,
    cosine_similarity,
    cummax,
    cummin,
    diag,
    diagonal,
    dropout,
    group_norm,
    layer_norm,
    log_softmax,
    logcumsumexp,
    logsumexp,
    masked_select,
    max_pool1d,
    max_pool2d,
    max_pool3d,
    movedim,
    narrow,
    pairwise_distance,
    pixel_shuffle,
    pixel_unshuffle,
    prelu,
    relu,
    repeat_interleave,
    rms_norm,
    scatter,
    scatter_add,
    scatter_reduce,
    selu,
    sigmoid,
    softmax,
    std_mean,
    tanh,
    transpose,
    unflatten,
    var_mean,
)
from minidl.functional import all as all  # noqa: A004 - torch.all (not in __all__: builtins stay builtins)
from minidl.functional import any as any  # noqa: A004
from minidl.functional import max as max  # noqa: A004
from minidl.functional import min as min  # noqa: A004
from minidl.functional import sum as sum  # noqa: A004
from minidl.gradcheck import GradcheckError, gradcheck, gradgradcheck
from minidl.graphdraw import draw_graph
from minidl.ops.einsum import einsum
from minidl.ops.elementwise import abs as abs  # noqa: A004 - mdl.abs, as torch.abs (not in __all__)
from minidl.ops.elementwise import (
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
    sqrt,
    sub,
    where,
)
from minidl.ops.elementwise import pow as pow  # noqa: A004
from minidl.ops.indexing import argsort, gather, index_select, masked_fill, nonzero, sort, topk
from minidl.ops.linalg import bmm, dot, matmul, mm, norm, outer
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
    rsqrt,
    sign,
    sin,
    sinh,
    tan,
    trunc,
)
from minidl.ops.math import (
    round as round,  # not in __all__: a star import must not replace the builtin
)
from minidl.ops.rearrange import flip, roll, tril, triu
from minidl.ops.reduction import argmax, argmin, mean, prod, std, var
from minidl.ops.sampling import multinomial, randperm
from minidl.ops.scan import cumprod, cumsum
from minidl.ops.shape import cat, chunk, concatenate, flatten, permute, reshape, split, squeeze, stack, t, unsqueeze
from minidl.serialization import load, save
from minidl.tensor import (
    Tensor,
    arange,
    as_tensor,
    clone,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    is_floating_point,
    is_tensor,
    linspace,
    logspace,
    numel,
    ones,
    ones_like,
    rand,
    rand_like,
    randint,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)
from minidl.tracing import compile as compile  # noqa: A004 - torch.compile's name (not in __all__)

__version__ = "0.1.0"

# dtype names, as torch.float32: NumPy dtypes, equal to a tensor's .dtype (x.dtype == mdl.float32).
#: 32-bit float, the default (``torch.float32``; also ``mdl.float``).
float32 = _np.dtype("float32")
#: 64-bit float, for gradient checks (``torch.float64``; also ``mdl.double``).
float64 = _np.dtype("float64")
#: 16-bit float, for mixed precision (``torch.float16``; also ``mdl.half``).
float16 = _np.dtype("float16")
#: 64-bit integer, the dtype of indices and labels (``torch.int64``; also ``mdl.long``).
int64 = _np.dtype("int64")
#: 32-bit integer (``torch.int32``; also ``mdl.int``).
int32 = _np.dtype("int32")
#: 16-bit integer (``torch.int16``).
int16 = _np.dtype("int16")
#: 8-bit integer (``torch.int8``).
int8 = _np.dtype("int8")
#: 8-bit unsigned integer, as images are stored (``torch.uint8``).
uint8 = _np.dtype("uint8")
bool = _np.dtype("bool")  # noqa: A001 - torch.bool (not in __all__: a star import must not replace the builtin)
float, double, half, long, int = float32, float64, float16, int64, int32  # noqa: A001 - PyTorch's aliases

__all__ = [
    "AnomalyError", "Function", "FunctionHook", "GradcheckError", "Tensor", "arange", "as_tensor", "concatenate",
    "detect_anomaly", "enable_grad", "full", "gpu_available", "grad", "gradcheck", "gradgradcheck",
    "is_grad_enabled", "load", "manual_seed", "maximum", "minimum", "no_grad", "ones", "ones_like", "rand",
    "rand_like", "randn", "randn_like", "save", "set_grad_enabled", "stack", "tensor", "where", "zeros",
    "zeros_like", "__version__",
    "draw_graph",
    "empty", "empty_like", "eye", "from_numpy", "full_like", "linspace", "logspace", "randint",
    "float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8",
    # the math ops (abs, pow and round too are here, as mdl.abs..., but not in __all__: a star import
    # must not replace Python's builtins)
    "add", "clamp", "clip", "div", "exp", "floor_divide", "log", "mul", "neg", "sqrt", "sub",
    "acos", "acosh", "allclose", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "copysign", "cos", "cosh",
    "erf", "erfc", "exp2", "expm1", "floor", "fmod", "isclose", "isfinite", "isinf", "isnan", "lerp", "log1p",
    "log2", "log10", "logaddexp", "logical_and", "logical_not", "logical_or", "logical_xor", "reciprocal",
    "remainder", "rsqrt", "sign", "sin", "sinh", "tan", "trunc",
    # the shape, reduction and indexing ops PyTorch also offers at its top level (torch.cat...)
    "argmax", "argmin", "argsort", "cat", "chunk", "cumprod", "cumsum", "einsum", "flatten", "flip", "gather",
    "index_select", "masked_fill", "matmul", "mean", "nonzero", "norm", "permute", "prod", "reshape", "roll",
    "sort", "split", "squeeze", "std", "topk", "tril", "triu", "unsqueeze", "var",
    # the functional ops PyTorch also offers at torch.* (max, min, sum, all and any are here too, not in
    # __all__); torch.batch_norm, instance_norm, embedding, kl_div and binary_cross_entropy_with_logits are
    # ATen's own signatures, which differ from F's: left out (docs/pytorch.md), use minidl.functional
    "adaptive_avg_pool1d", "adaptive_max_pool1d", "avg_pool1d", "broadcast_to", "celu", "conv1d", "conv2d",
    "conv_transpose1d", "conv_transpose2d", "cosine_similarity", "diagonal", "dropout", "group_norm", "layer_norm",
    "log_softmax", "logcumsumexp", "logsumexp", "masked_select", "max_pool1d", "max_pool2d", "movedim", "narrow",
    "pairwise_distance", "pixel_shuffle", "pixel_unshuffle", "prelu", "relu", "repeat_interleave", "rms_norm",
    "scatter", "scatter_add", "selu", "sigmoid", "softmax", "tanh", "transpose", "unflatten",
    "conv3d", "conv_transpose3d", "cummax", "cummin", "diag", "max_pool3d", "scatter_reduce", "std_mean", "var_mean",
    "multinomial", "randperm",
    "device", "inference_mode", "set_num_threads", "get_num_threads",
    # PyTorch's top-level matrix products and tensor facts
    "bmm", "clone", "dot", "is_floating_point", "is_tensor", "mm", "numel", "outer", "t",
]

# PyTorch's import torch makes torch.nn, torch.optim... attributes; here they load on first use
# (import minidl stays light, and no package below has to import the ones above it).
_SUBPACKAGES = ("accelerator", "amp", "backends", "checkpoint", "cuda", "data", "distributed", "func", "functional",
                "memory", "nn", "optim", "parallel", "profiler", "utils")


def __getattr__(name):
    """``mdl.nn``, ``mdl.optim``, ``mdl.data``, ``mdl.utils``... imported on first use, as attributes of the
    package (PyTorch's ``torch.nn``); and ``mdl.bfloat16``: NumPy has no bfloat16, the ml_dtypes package
    provides it when installed."""
    if name in _SUBPACKAGES:
        import importlib
        return importlib.import_module(f"minidl.{name}")
    if name == "bfloat16":
        from minidl import backend
        return backend.bfloat16("minidl.bfloat16", AttributeError, ", or use mdl.float16")
    raise AttributeError(f"module 'minidl' has no attribute {name!r}")
