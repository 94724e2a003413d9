"""FunctionHook: code run around every op call, every node's backward and every backward walk.

The seam through which the profiler, the memory tracker, gradient
checkpointing, anomaly detection and forward mode watch the engine, modeled
on Chainer's ``FunctionHook``. :data:`active` holds the hooks entered now; the
op call and the walk read it once per op and once per node, and take the
plain path when it is empty.
"""
import contextlib

active: tuple = ()  # the active FunctionHooks, outermost first


class FunctionHook:
    """Code run around every op's forward and every node's backward while the hook is active.

    Subclass it, override any of the four methods (each does nothing by
    default) and activate it with ``with MyHook(): ...``; it is removed when
    the block ends, also when the block raises. Modeled on Chainer's
    ``FunctionHook``. The profiler, the memory tracker, gradient checkpointing
    and :func:`~minidl.autograd.detect_anomaly` are built on it.

    - ``forward_preprocess(function, inputs)``: the op ``function`` was called
      on ``inputs`` (a tuple of Tensors); nothing is computed yet.
    - ``forward_postprocess(function, inputs, outputs)``: ``outputs`` (a Tensor
      or a tuple of Tensors, as the call returns) are made, and when the
      graph is recorded ``function`` is now their creator.
    - ``backward_preprocess(function, grad_outputs)``: the backward walk is about
      to run ``function.backward`` on ``grad_outputs`` (a tuple of Tensors).
    - ``backward_postprocess(function, grad_outputs, grad_inputs)``: it returned
      ``grad_inputs``, a tuple with one Tensor (or None) per input.

    - ``walk_preprocess(outputs)``: a backward walk (``loss.backward()``,
      :func:`~minidl.autograd.grad`) starts from ``outputs`` (a list of Tensors);
      the node backwards it runs come next.
    - ``walk_postprocess(outputs)``: that walk has ended.
    - ``accumulate_preprocess(tensor, grad)``: the walk is about to add ``grad``
      (a Tensor) into ``tensor.grad`` (a leaf's, or a tensor that retains its
      gradient; ``tensor.grad`` is still the old value, None before the first).
    - ``host_read(tensor, how)``: a tensor's values are read into Python
      (``how``: "item()", "bool()", "numpy()", "tolist()"), so the code that
      follows may depend on them (what a traced step must refuse).

    Each preprocess call is followed by its postprocess even when the op or
    its backward raised (``outputs`` or ``grad_inputs`` is then None), so a hook
    can keep state that opens and closes with each call. Ops that a backward
    calls are seen (they are how it computes, and they may record a graph);
    an op's forward works on arrays, and anything it might call is part of
    that op. Hooks nest: preprocess runs outermost first, postprocess
    innermost first. With no hook active the engine pays one check per op
    call and one per node backward.
    """

    def forward_preprocess(self, function, inputs):
        pass

    def forward_postprocess(self, function, inputs, outputs):
        pass

    def backward_preprocess(self, function, grad_outputs):
        pass

    def backward_postprocess(self, function, grad_outputs, grad_inputs):
        pass

    def walk_preprocess(self, outputs):
        pass

    def walk_postprocess(self, outputs):
        pass

    def accumulate_preprocess(self, tensor, grad):
        pass

    def host_read(self, tensor, how):
        pass

    def __enter__(self):
        global active
        if any(hook is self for hook in active):
            raise RuntimeError(f"{type(self).__name__} is already active; enter a hook once at a time")
        active = active + (self,)
        return self

    def __exit__(self, *exc):
        global active
        active = tuple(hook for hook in active if hook is not self)
        return False


def call_with_hooks(fn, inputs):
    """``fn(*inputs)`` while hooks are active: the plain call, between the hooks' methods."""
    global active
    hooks, entered, outputs = active, 0, None
    try:
        for hook in hooks:
            hook.forward_preprocess(fn, inputs)
            entered += 1
        active = ()  # the call itself takes the plain path (it sees no hooks, so it cannot recurse here)
        outputs = fn(*inputs)
    finally:
        active = hooks
        _each_hook(hooks[:entered], "forward_postprocess", fn, inputs, outputs)
    return outputs


def announce(method: str, *args):
    """Call ``method`` (``accumulate_preprocess``, ``host_read``) of every active hook, outermost first."""
    for hook in active:
        getattr(hook, method)(*args)


def announce_host_read(tensor, how: str) -> None:
    """Tell the active hooks that ``tensor``'s values are read on the host (``how``: ``"item()"``...);
    one check when no hook is active. Tensor's host reads call it."""
    if active:
        announce("host_read", tensor, how)


def backward_with_hooks(fn, gys):
    """``fn.backward(*gys)`` between the active hooks' backward methods; returns a tuple."""
    hooks, entered, gxs, gys = active, 0, None, tuple(gys)
    try:
        for hook in hooks:
            hook.backward_preprocess(fn, gys)
            entered += 1
        gxs = fn.backward(*gys)
        gxs = gxs if type(gxs) is tuple else (gxs,)
    finally:
        _each_hook(hooks[:entered], "backward_postprocess", fn, gys, gxs)
    return gxs


@contextlib.contextmanager
def announcing_walk(outputs):
    """Context: a backward walk from ``outputs``, between the active hooks' walk methods."""
    hooks, entered = active, 0
    try:
        for hook in hooks:
            hook.walk_preprocess(outputs)
            entered += 1
        yield
    finally:
        _each_hook(hooks[:entered], "walk_postprocess", outputs)


@contextlib.contextmanager
def outside(hook):
    """Context: only the hooks entered before ``hook`` are active inside the block (``hook`` and the
    hooks entered after it are off), as forward mode runs a level's tangent rules."""
    global active
    hooks = active
    active = hooks[:next(i for i, entered in enumerate(hooks) if entered is hook)]
    try:
        yield
    finally:
        active = hooks


def _each_hook(hooks, method, *args):
    """Call ``method`` of each hook, innermost first; every one runs even if one raises."""
    error = None
    for hook in reversed(hooks):
        try:
            getattr(hook, method)(*args)
        except BaseException as e:  # re-raised below, once the others have closed their state
            error = error or e
    if error is not None:
        raise error
