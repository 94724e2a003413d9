"""PyTorch's ``torch.utils`` paths, so that ported imports work unchanged.

``minidl.utils.data`` is :mod:`minidl.data` (datasets, loaders, samplers);
``minidl.utils.checkpoint`` is :mod:`minidl.checkpoint`;
``minidl.utils.tensorboard.SummaryWriter`` is tensorboardX's writer.
"""
from minidl.utils import checkpoint, data, tensorboard

__all__ = ["checkpoint", "data", "tensorboard"]
