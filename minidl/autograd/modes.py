"""Grad modes: whether the ops called now record the graph (``no_grad``, ``enable_grad``...).

One switch, :data:`grad_enabled`, read by every op call (``Function.__call__``)
and changed only by the context managers below. Read it as
``modes.grad_enabled`` (a module attribute, so the current value) or through
:func:`is_grad_enabled`.
"""
import contextlib

grad_enabled = True  # is the graph being recorded?


@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    """Record the graph inside the block when ``mode`` is True, not otherwise."""
    global grad_enabled
    previous, grad_enabled = grad_enabled, bool(mode)
    try:
        yield
    finally:
        grad_enabled = previous


def no_grad():
    """Context: ops inside build no graph (inference, optimizer updates)."""
    return set_grad_enabled(False)


def inference_mode(mode: bool = True):
    """PyTorch's ``inference_mode``: ``no_grad`` (with ``mode=False``, recording stays as it is).

    PyTorch also marks the tensors made inside as inference tensors, which it then refuses
    in a recorded graph; minidl's are ordinary tensors, with no such check.
    """
    return set_grad_enabled(False) if mode else set_grad_enabled(grad_enabled)


def enable_grad():
    """Context: record the graph even inside ``no_grad``."""
    return set_grad_enabled(True)


def is_grad_enabled() -> bool:
    return grad_enabled
