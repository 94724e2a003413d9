"""Anomaly detection: raise at the first op whose forward or backward makes a NaN or an Inf.

A :class:`~minidl.autograd.FunctionHook` that scans every output and keeps, for each recorded
op, the line of user code that created it, so that a NaN found in the backward pass is named
by where its op was written.
"""
import contextlib
import os
import traceback
import weakref

from minidl.autograd import function_hooks
from minidl.autograd.function_hooks import FunctionHook

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # minidl/
# node -> the user's line that created it, for every op recorded under detect_anomaly (kept here,
# not on the node, and for as long as the node lives: a later block's backward can still name it)
_created_at = weakref.WeakKeyDictionary()


class AnomalyError(FloatingPointError):
    """An op produced NaN or Inf while anomaly detection was on."""


@contextlib.contextmanager
def detect_anomaly():
    """Raise at the first op whose forward or backward output is NaN or Inf.

    The error names the op and the line of user code that created it. Wrap
    the forward pass as well as the backward: an op created outside the block
    is still checked in backward, but its creation was not seen, and the
    error says so. It costs a full scan of every output, so use it to debug,
    not to train. Nested blocks check once.
    """
    if any(isinstance(hook, _AnomalyCheck) for hook in function_hooks.active):
        yield
        return
    with _AnomalyCheck():
        yield


class _AnomalyCheck(FunctionHook):
    """detect_anomaly's hook: every output scanned, every recorded op's creation line kept."""

    def __init__(self):
        # > 0 while a node's backward runs: a NaN made by the ops inside it is reported
        # as that node's (with the user's line that created it), not as a Div's.
        self.backward_depth = 0

    def forward_postprocess(self, fn, inputs, outputs):
        if outputs is None or self.backward_depth:
            return
        outputs = outputs if type(outputs) is tuple else (outputs,)
        if outputs[0].creator is fn:  # recorded: a NaN in its backward will name this line
            _created_at[fn] = _user_frame()
        if not _all_finite(outputs):
            where = _created_at.get(fn) or _user_frame()
            raise AnomalyError(f"{type(fn).__name__} produced NaN or Inf in its forward pass; "
                               f"the op was created at {where}")

    def backward_preprocess(self, fn, grad_outputs):
        self.backward_depth += 1

    def backward_postprocess(self, fn, grad_outputs, grad_inputs):
        self.backward_depth -= 1
        if grad_inputs is None or self.backward_depth or _all_finite(grad_inputs):
            return
        where = _created_at.get(fn)
        origin = (f"the op was created at {where}" if where else
                  "the op was created outside detect_anomaly(); wrap the forward pass too to see where")
        raise AnomalyError(f"{type(fn).__name__} produced NaN or Inf in its backward pass; {origin}")


def _user_frame() -> str:
    """'file:line in function: code' of the innermost frame outside minidl."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {frame.line}"
    return "<unknown>"


def _all_finite(tensors) -> bool:
    """No NaN or Inf in any floating or complex Tensor of ``tensors`` (None entries skipped)."""
    for t in tensors:
        if t is not None and t.dtype.kind in "fc" and not bool(t.xp.isfinite(t.array).all()):
            return False
    return True
