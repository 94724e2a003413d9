"""PyTorch's ``torch.backends`` switches, kept so that ported scripts run; none changes minidl.

``backends.cudnn.benchmark``, ``backends.cudnn.deterministic``, ``backends.cudnn.allow_tf32``
and ``backends.cuda.matmul.allow_tf32`` tune PyTorch's own kernels. minidl has none of those
kernels: its convolutions are matrix products, its products are cuBLAS's (TF32 is not enabled)
and its CPU runs are deterministic. Setting a flag is accepted and does nothing (docs/pytorch.md).
"""
from types import SimpleNamespace

cudnn = SimpleNamespace(benchmark=False, deterministic=False, enabled=True, allow_tf32=False)
cuda = SimpleNamespace(matmul=SimpleNamespace(allow_tf32=False))
