"""``minidl.nn.functional``: the same module of functions as :mod:`minidl.functional`, under PyTorch's path.

    import minidl.nn.functional as F      # as ``import torch.nn.functional as F``
    F.relu(x) is minidl.functional.relu(x)

Every name of :mod:`minidl.functional` is re-exported here (the very same objects).
"""
from minidl import functional as _functional
from minidl.functional import *  # noqa: F401,F403 - the alias re-exports every public name

__all__ = list(_functional.__all__)
