"""``torch.utils.checkpoint``'s path to :mod:`minidl.checkpoint` (``checkpoint``, ``checkpoint_sequential``)."""
from minidl.checkpoint import *  # noqa: F401,F403 - the package's whole face, under a second name
from minidl.checkpoint import __all__  # noqa: F401
