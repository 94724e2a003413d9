"""minidl: a deep-learning engine on NumPy and CuPy, written to be read.

    import minidl as mdl
    x = mdl.tensor([[1.0, 2.0]], requires_grad=True)
    y = (x * x).sum();  y.backward();  x.grad   # tensor([[2., 4.]])
"""
from minidl import ops as _ops  # noqa: F401 - attaches Tensor's operators and methods
from minidl.autograd import (
    AnomalyError,
    Function,
    FunctionHook,
    detect_anomaly,
    enable_grad,
    grad,
    is_grad_enabled,
    no_grad,
    set_grad_enabled,
)
from minidl.backend import gpu_available, manual_seed
from minidl.gradcheck import GradcheckError, gradcheck, gradgradcheck
from minidl.ops import concatenate, maximum, minimum, stack, where
from minidl.serialization import load, save
from minidl.tensor import (
    Tensor,
    arange,
    as_tensor,
    full,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    tensor,
    zeros,
    zeros_like,
)

__version__ = "0.1.0"

__all__ = [
    "AnomalyError", "Function", "FunctionHook", "GradcheckError", "Tensor", "arange", "as_tensor", "concatenate",
    "detect_anomaly", "enable_grad", "full", "gpu_available", "grad", "gradcheck", "gradgradcheck",
    "is_grad_enabled", "load", "manual_seed", "maximum", "minimum", "no_grad", "ones", "ones_like", "rand",
    "rand_like", "randn", "randn_like", "save", "set_grad_enabled", "stack", "tensor", "where", "zeros",
    "zeros_like", "__version__",
]
