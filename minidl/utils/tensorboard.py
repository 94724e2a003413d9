"""``torch.utils.tensorboard.SummaryWriter``: tensorboardX's writer, which writes the same event files.

tensorboardX is an optional extra (``pip install minidl[tensorboard]``); without it,
reading ``SummaryWriter`` raises an ImportError that says so.
"""


def __getattr__(name):
    if name == "SummaryWriter":
        try:
            from tensorboardX import SummaryWriter
        except ImportError as exc:
            raise ImportError("minidl.utils.tensorboard.SummaryWriter is tensorboardX's writer, which is not "
                              "installed: pip install minidl[tensorboard] (or pip install tensorboardX)") from exc
        return SummaryWriter
    raise AttributeError(f"module 'minidl.utils.tensorboard' has no attribute {name!r}")
