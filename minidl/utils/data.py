"""``torch.utils.data``'s path to :mod:`minidl.data`: the same objects under PyTorch's import line."""
from minidl.data import *  # noqa: F401,F403 - the module's whole face, under a second name
from minidl.data import __all__  # noqa: F401
