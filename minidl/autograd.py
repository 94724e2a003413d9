"""Reverse-mode automatic differentiation: Function, the backward walk, grad modes.

A :class:`Function` is one op: ``forward`` computes outputs from raw arrays,
``backward`` turns the gradient of the loss with respect to the outputs into
the gradient with respect to the inputs. Calling a Function on Tensors runs
``forward`` and, when some input needs a gradient and recording is on, makes
the Function the ``creator`` of its outputs: that link is the graph.

``backward`` is written with Tensor ops, so the backward pass is itself a
computation that can be recorded (``create_graph=True``) and differentiated
again: Hessian-vector products come from the same code. When it is not
recorded (the usual case) the engine runs it under ``no_grad`` and those ops
are plain array arithmetic.

The walk (:func:`backward`) is iterative: the nodes are sorted once in
topological order and visited from the loss back to the leaves, each
node's gradients summed over every use before its backward runs.
"""
from __future__ import annotations

import contextlib
import os
import traceback
import weakref

from minidl import backend
from minidl.tensor import Tensor

_grad_enabled = True  # is the graph being recorded?
_anomaly = False  # check every forward and backward output for NaN/Inf?
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class Function:
    """One differentiable op. Subclasses define ``forward`` and ``backward``.

    ``forward(*arrays)`` gets raw NumPy/CuPy arrays and returns an array (or a
    tuple of arrays). ``backward(*grads)`` gets one Tensor gradient per output
    and returns one Tensor gradient (or None) per input. Whatever forward
    must hand to backward is stored on ``self``; ``self.inputs`` holds the
    input Tensors. Parameters of the op (an axis, a stride) go to ``__init__``.
    """

    inputs: tuple = ()

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must define forward")

    def backward(self, *gys):
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def __call__(self, *inputs: Tensor):
        # The hot path of the whole engine: keep it a handful of Python operations.
        if backend._cupy is not None:
            _check_same_device(self, inputs)
        ys = self.forward(*[x.data for x in inputs])
        record = _grad_enabled and any([x.requires_grad for x in inputs])
        if type(ys) is not tuple:  # one output: the common case
            out = Tensor(ys, record)
            if _anomaly:
                _check_finite(self, (ys,), "forward")
            if record:
                self.inputs = inputs
                self.outputs = (weakref.ref(out),)
                out.creator = self
                if _anomaly:
                    self.created_at = _user_frame()
            return out
        outputs = tuple(Tensor(y, record) for y in ys)
        if _anomaly:
            _check_finite(self, ys, "forward")
        if record:
            self.inputs = inputs
            self.outputs = tuple(weakref.ref(out) for out in outputs)
            for index, out in enumerate(outputs):
                out.creator = self
                out.output_index = index
            self.output_meta = [(y.shape, y.dtype) for y in ys]  # to fill missing output grads with zeros
            if _anomaly:
                self.created_at = _user_frame()
        return outputs

    def output(self, index: int = 0) -> Tensor:
        """The output Tensor itself, for a backward written in terms of y (exp, tanh...)."""
        return self.outputs[index]()

    def release(self):
        """Drop everything saved for backward (the graph is freed after use)."""
        vars(self).clear()
        self.inputs = None

    def __repr__(self):
        return f"<{type(self).__name__}>"


def _check_same_device(fn, inputs):
    devices = {backend.device_of(x.data) for x in inputs}
    if len(devices) > 1:
        shown = ", ".join(f"{tuple(x.shape)} on {x.device}" for x in inputs)
        raise ValueError(f"{type(fn).__name__}: inputs are on different devices ({shown}); "
                         "move them to one device first with .to(device)")


# ---------------------------------------------------------------- grad modes
@contextlib.contextmanager
def set_grad_enabled(mode: bool):
    """Record the graph inside the block when ``mode`` is True, not otherwise."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, bool(mode)
    try:
        yield
    finally:
        _grad_enabled = previous


def no_grad():
    """Context: ops inside build no graph (inference, optimizer updates)."""
    return set_grad_enabled(False)


def enable_grad():
    """Context: record the graph even inside ``no_grad``."""
    return set_grad_enabled(True)


def is_grad_enabled() -> bool:
    return _grad_enabled


# ---------------------------------------------------------------- anomaly detection
class AnomalyError(FloatingPointError):
    """An op produced NaN or Inf while anomaly detection was on."""


@contextlib.contextmanager
def detect_anomaly():
    """Raise at the first op whose forward or backward output is NaN or Inf.

    The error names the op and the line of user code that created it. It
    costs a full scan of every output, so use it to debug, not to train.
    """
    global _anomaly
    previous, _anomaly = _anomaly, True
    try:
        yield
    finally:
        _anomaly = previous


def _user_frame() -> str:
    """'file:line in function: code' of the innermost frame outside minidl."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {frame.line}"
    return "<unknown>"


def _check_finite(fn, arrays, phase):
    for array in arrays:
        if array is None:
            continue
        array = array.data if isinstance(array, Tensor) else array
        if array.dtype.kind in "fc" and not bool(backend.xp_of(array).isfinite(array).all()):
            where = getattr(fn, "created_at", None) or _user_frame()
            raise AnomalyError(f"{type(fn).__name__} produced NaN or Inf in its {phase} pass; "
                               f"the op was created at {where}")


# ---------------------------------------------------------------- the backward walk
def _topological_order(roots):
    """Functions reachable from ``roots``, each before every Function it consumes."""
    order, seen = [], set()
    stack = [(fn, False) for fn in roots]
    while stack:  # iterative depth-first search: a 10,000-op chain needs no recursion
        fn, children_done = stack.pop()
        if children_done:
            order.append(fn)
            continue
        if fn in seen:
            continue
        if fn.inputs is None:
            raise RuntimeError(
                f"backward through {type(fn).__name__} a second time: its saved values were freed "
                "after the first backward; pass retain_graph=True to the first backward")
        seen.add(fn)
        stack.append((fn, True))
        stack.extend((x.creator, False) for x in fn.inputs
                     if x.creator is not None and x.creator not in seen)
    order.reverse()
    return order


def _as_grad(grad, like: Tensor) -> Tensor:
    if grad is None:
        if like.data.size != 1:
            raise RuntimeError(
                f"backward() on a tensor of shape {like.shape} needs grad=: an upstream gradient "
                "of the same shape (only a one-element tensor, like a loss, can omit it)")
        return Tensor(like.xp.ones(like.shape, like.dtype))
    grad = grad if isinstance(grad, Tensor) else Tensor(like.xp.asarray(grad, dtype=like.dtype))
    if grad.shape != like.shape:
        raise ValueError(f"backward(): grad has shape {grad.shape} but the tensor has shape {like.shape}")
    return grad


def _accumulate_leaf(x: Tensor, g: Tensor, create_graph: bool):
    """x.grad += g; in place when the buffer is ours and no graph is being built."""
    if x._grad is None:
        x._grad, x._grad_owned = g, False  # g may be shared with other tensors: do not write into it
    elif create_graph:
        x._grad, x._grad_owned = x._grad + g, False
    elif x._grad_owned:
        x._grad.data += g.data
    else:
        x._grad, x._grad_owned = Tensor(x._grad.data + g.data), True


def backward(outputs, grad_outputs=None, retain_graph=False, create_graph=False, inputs=None):
    """Backpropagate from ``outputs``; return gradients for ``inputs`` if given.

    With ``inputs=None`` gradients accumulate into every leaf's ``.grad``.
    With a list of ``inputs`` nothing's ``.grad`` changes and the gradient with
    respect to each input (None where it does not depend on it) is returned.
    """
    grad_outputs = grad_outputs or [None] * len(outputs)
    for out in outputs:
        if not out.requires_grad:
            raise RuntimeError("backward(): the tensor does not require grad and has no creator; "
                               "did you compute it under no_grad or from tensors without requires_grad=True?")
    captured = None if inputs is None else {id(x): None for x in inputs}

    def deliver(x: Tensor, g: Tensor):
        """Hand g to whoever wants x's gradient: the caller of grad(), or x.grad."""
        if captured is not None:
            if id(x) in captured:
                old = captured[id(x)]
                captured[id(x)] = g if old is None else old + g
        elif x.creator is None or x.retains_grad:
            _accumulate_leaf(x, g, create_graph)

    # Function -> (gradients of its outputs summed over uses, those output Tensors). Holding the
    # outputs keeps them alive until their creator's backward, which may read them (exp, tanh)
    # after every consumer has been released.
    pending = {}
    order = _topological_order({out.creator for out in outputs if out.creator is not None})
    with set_grad_enabled(create_graph):
        for out, g in zip(outputs, grad_outputs):
            g = _as_grad(g, out)
            deliver(out, g)
            if out.creator is not None:
                _add_pending(pending, out, g)
        for fn in order:
            entry = pending.pop(fn, None)
            if entry is None:
                continue
            gys = entry[0] if len(entry[0]) == 1 else _fill_missing(fn, entry[0])
            gxs = _backward_blaming_node(fn, gys) if _anomaly else _run_backward(fn, gys)
            if type(gxs) is not tuple:
                gxs = (gxs,)
            if _anomaly:
                _check_finite(fn, gxs, "backward")
            for x, gx in zip(fn.inputs, gxs):
                if gx is None or not x.requires_grad:
                    continue
                if captured is not None or x.creator is None or x.retains_grad:
                    deliver(x, gx)
                if x.creator is not None:
                    _add_pending(pending, x, gx)
            if not retain_graph:
                fn.release()
    if captured is not None:
        return [captured[id(x)] for x in inputs]
    return None


def _run_backward(fn, gys):
    """fn.backward(*gys): one module-level call that minidl.profiler swaps to time each node."""
    return fn.backward(*gys)


def _backward_blaming_node(fn, gys):
    """fn.backward with the checks of the ops inside it paused, so that a NaN or Inf
    it makes is reported as fn's (with the user's line that created fn), not as a Div's."""
    global _anomaly
    _anomaly = False
    try:
        return _run_backward(fn, gys)
    finally:
        _anomaly = True


def _add_pending(pending, out: Tensor, g: Tensor):
    """Add g to the gradient waiting for ``out``'s creator (first use: store it as is)."""
    creator = out.creator
    entry = pending.get(creator)
    if entry is None:
        slots = [None] * len(creator.outputs)
        slots[out.output_index] = g
        pending[creator] = (slots, [out])
        return
    slots = entry[0]
    old = slots[out.output_index]
    if old is None:
        slots[out.output_index] = g
        entry[1].append(out)
    else:
        slots[out.output_index] = old + g


def _fill_missing(fn, gys):
    """A multi-output op whose outputs did not all get a gradient: zeros stand in for the rest."""
    if all(g is not None for g in gys):
        return gys
    xp = backend.xp_of(fn.inputs[0].data)
    return [Tensor(xp.zeros(shape, dtype)) if g is None else g
            for g, (shape, dtype) in zip(gys, fn.output_meta)]


def grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None, allow_unused=True):
    """Gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``.

    ``outputs`` and ``inputs`` are Tensors or sequences of Tensors. Returns a
    list with one Tensor per input (None for an input the outputs do not
    depend on, unless ``allow_unused=False``). With ``create_graph=True`` the
    returned gradients are themselves differentiable.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is not None and isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    retain_graph = create_graph if retain_graph is None else retain_graph
    result = backward(outputs, grad_outputs, retain_graph, create_graph, inputs=inputs)
    if not allow_unused and any(g is None for g in result):
        missing = [i for i, g in enumerate(result) if g is None]
        raise RuntimeError(f"grad(): inputs {missing} were not used to compute the outputs")
    return result


# ---------------------------------------------------------------- ops the Tensor class itself needs
class ToDevice(Function):
    """y = x on another device;  dx = dy moved back to x's device."""

    def __init__(self, device):
        self.device = device

    def forward(self, x):
        self.source = backend.device_of(x)
        return backend.to_device(x, self.device)

    def backward(self, gy):
        return ToDevice(self.source)(gy)


class Cast(Function):
    """y = x converted to ``dtype``;  dx = dy converted back to x's dtype."""

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        self.source = x.dtype
        return x.astype(self.dtype)

    def backward(self, gy):
        return Cast(self.source)(gy)
