"""The backward walk: from the outputs back to the leaves, each node's backward run once.

The nodes are sorted once in topological order (iteratively: a 10,000-op chain
needs no recursion) and visited from the outputs back; a node's output
gradients are summed over every use before its backward runs, and what it
returns goes on to the nodes that made its inputs or, at a leaf, to ``.grad``.
"""
from __future__ import annotations

from minidl import backend
from minidl.autograd import function_hooks, modes, saved
from minidl.tensor import Tensor, _clock


def backward(outputs, grad_outputs=None, retain_graph=False, create_graph=False, inputs=None):
    """Backpropagate from ``outputs``; return gradients for ``inputs`` if given.

    With ``inputs=None`` gradients accumulate into every leaf's ``.grad``. With a list of
    ``inputs`` nothing's ``.grad`` changes and the gradient with respect to each input (None
    where it does not depend on it) is returned. Active FunctionHooks see the walk start and
    end (``walk_preprocess``, ``walk_postprocess``); with none active this costs one check.
    """
    if function_hooks.active:
        with function_hooks.announcing_walk(outputs):
            return _walk(outputs, grad_outputs, retain_graph, create_graph, inputs)
    return _walk(outputs, grad_outputs, retain_graph, create_graph, inputs)


def _walk(outputs, grad_outputs, retain_graph, create_graph, inputs):
    """The walk itself (:func:`backward`, without the hooks' announcement)."""
    for out in outputs:
        if not out.requires_grad:
            raise RuntimeError("backward(): the tensor does not require grad and has no creator; "
                               "did you compute it under no_grad or from tensors without requires_grad=True?")
    sink = _Destinations(inputs, create_graph)  # where finished gradients go: .grad, or grad()'s caller
    # Function -> (gradients of its outputs summed over uses, those output Tensors). Holding the
    # outputs keeps them alive until their creator's backward, which may read them (exp, tanh)
    # after every consumer has been released.
    pending = {}
    # roots in the outputs' order (a dict, not a set): the walk, and so the order in which a node's
    # gradients are summed, must not depend on where the Functions happen to lie in memory
    order = topological_order(dict.fromkeys(out.creator for out in outputs if out.creator is not None))
    now = _clock[0]  # a node stamped with this value saw no in-place change since it was recorded
    with modes.set_grad_enabled(create_graph), backend.using_array(outputs[0]._data):  # seeds, sums on outputs' GPU
        for out, g in zip(outputs, grad_outputs or [None] * len(outputs)):
            g = _as_grad(g, out)
            if out.creator is None:
                sink.to_leaf(out, g)
            else:
                _add_pending(pending, out, g)
        for fn in order:
            entry = pending.pop(fn, None)
            if entry is None:
                continue
            slots, reached = entry
            for out in reached:  # each output's gradient is complete now: hooks and .grad see the total
                if out._hooks is not None or out.retains_grad or sink.captured is not None:
                    slots[out.output_index] = sink.settle(out, slots[out.output_index])
            gys = slots if len(slots) == 1 else _fill_missing(fn, slots)
            if fn.recorded_at != now:
                fn.check_unchanged()
            if fn.packed is not None:  # recorded under saved_tensors_hooks: backward on the unpacked values
                gxs = saved.unpacked_backward(fn, gys)
            else:
                gxs = fn.backward(*gys) if not function_hooks.active else function_hooks.backward_with_hooks(fn, gys)
            if type(gxs) is not tuple:
                gxs = (gxs,)
            if fn.checked_by_walk:
                gxs = _checked_gradients(fn, gxs)
            for x, gx in zip(fn.inputs, gxs):
                if gx is None or not x.requires_grad:
                    continue
                if x.creator is not None:
                    _add_pending(pending, x, gx)
                elif x._hooks is None:  # a leaf: its gradient is final for this use
                    sink.deliver(x, gx)
                else:
                    sink.to_leaf(x, gx)
            if not retain_graph:
                fn.release()
        sink.finish()
    return sink.result()


def grad(outputs, inputs, grad_outputs=None, create_graph=False, retain_graph=None, allow_unused=False):
    """Gradients of ``outputs`` with respect to ``inputs``, without touching ``.grad``.

    ``outputs`` and ``inputs`` are Tensors or sequences of Tensors. Returns a
    list with one Tensor per input. An input the outputs do not depend on is an
    error (often a sign that the wrong tensor was passed), as in PyTorch; with
    ``allow_unused=True`` its gradient is None instead. With
    ``create_graph=True`` the returned gradients are themselves differentiable.
    """
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is not None and isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    retain_graph = create_graph if retain_graph is None else retain_graph
    result = backward(outputs, grad_outputs, retain_graph, create_graph, inputs=inputs)
    if not allow_unused and any(g is None for g in result):
        raise RuntimeError(_unused_message(inputs, result))
    return result


def topological_order(roots) -> list:
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


# ---------------------------------------------------------------- summing and delivering gradients
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


class _Destinations:
    """Where the walk hands each finished gradient: ``.grad`` (leaves, and tensors that retain
    their gradient), or, for :func:`grad`, the list it returns; with tensor hooks run on the way."""

    def __init__(self, inputs, create_graph: bool):
        self.inputs, self.create_graph = inputs, create_graph
        self.captured = None if inputs is None else {id(x): None for x in inputs}
        self.leaf_totals = {}  # id -> (leaf, gradient summed over its uses), for leaves with hooks

    def deliver(self, x: Tensor, g: Tensor):
        """Hand g to whoever wants x's gradient: the caller of grad(), or x.grad."""
        captured = self.captured
        if captured is not None:
            if id(x) in captured:
                old = captured[id(x)]
                captured[id(x)] = g if old is None else old + g
        elif x.creator is None or x.retains_grad:
            if function_hooks.active:  # a traced step records each accumulation (minidl.tracing)
                function_hooks.announce("accumulate_preprocess", x, g)
            _accumulate_leaf(x, g, self.create_graph)

    def to_leaf(self, x: Tensor, g: Tensor):
        """A leaf's gradient for one use: delivered now, or summed first when the leaf has hooks."""
        if x._hooks is None:
            self.deliver(x, g)
        else:
            held = self.leaf_totals.get(id(x))
            self.leaf_totals[id(x)] = (x, g if held is None else held[1] + g)

    def settle(self, out: Tensor, g: Tensor) -> Tensor:
        """A non-leaf's total gradient: through its hooks, then to .grad (retain_grad) or to grad()'s caller."""
        if out._hooks is not None:
            g = _run_tensor_hooks(out, g)
        self.deliver(out, g)
        return g

    def finish(self):
        """The leaves with hooks, once each, on their total gradient (their hooks run at the end)."""
        for x, g in self.leaf_totals.values():
            self.deliver(x, _run_tensor_hooks(x, g))

    def result(self):
        """What :func:`backward` returns: the gradients of ``inputs``, or None."""
        return None if self.captured is None else [self.captured[id(x)] for x in self.inputs]


def _accumulate_leaf(x: Tensor, g: Tensor, create_graph: bool):
    """x.grad += g; in place when the buffer is ours and no graph is being built."""
    if x._grad is None:
        x._grad, x._grad_owned = g, False  # g may be shared with other tensors: do not write into it
    elif create_graph:
        x._grad, x._grad_owned = x._grad + g, False
    elif x._grad_owned:
        x._grad._data += g._data
    else:
        x._grad, x._grad_owned = Tensor(x._grad._data + g._data), True


def _run_tensor_hooks(x: Tensor, g: Tensor) -> Tensor:
    """x's hooks in the order they were registered, each given the gradient and free to replace it."""
    for hook in x._hooks:
        replaced = hook(g)
        if replaced is not None:
            replaced = replaced if isinstance(replaced, Tensor) else Tensor(x.xp.asarray(replaced))
            if replaced.shape != g.shape:
                raise RuntimeError(f"a hook registered on a tensor of shape {tuple(x.shape)} returned a gradient "
                                   f"of shape {tuple(replaced.shape)}; return one of the gradient's shape, or None")
            g = replaced
    return g


# ---------------------------------------------------------------- seeds, missing gradients, errors
def _as_grad(grad, like: Tensor) -> Tensor:
    if grad is None:
        if like._data.size != 1:
            raise RuntimeError(
                f"backward() on a tensor of shape {like.shape} needs grad=: an upstream gradient "
                "of the same shape (only a one-element tensor, like a loss, can omit it)")
        return Tensor(like.xp.ones(like.shape, like.dtype))
    grad = grad if isinstance(grad, Tensor) else Tensor(like.xp.asarray(grad, dtype=like.dtype))
    if grad.shape != like.shape:
        raise ValueError(f"backward(): grad has shape {grad.shape} but the tensor has shape {like.shape}")
    return grad


def _fill_missing(fn, gys):
    """A multi-output op whose outputs did not all get a gradient: zeros stand in for the rest."""
    if all(g is not None for g in gys):
        return gys
    xp = backend.xp_of(fn.inputs[0].array)
    return [Tensor(xp.zeros(shape, dtype)) if g is None else g
            for g, (shape, dtype) in zip(gys, fn.output_meta)]


def _checked_gradients(fn, gxs):
    """A user-defined Function's backward results, checked as PyTorch checks them: one per input,
    each None or a floating Tensor (a NumPy/CuPy array is wrapped) of its input's shape."""
    op = type(fn).__name__
    if len(gxs) != len(fn.inputs):
        raise RuntimeError(f"{op}.backward returned {len(gxs)} gradient{'s' if len(gxs) != 1 else ''} for "
                           f"{len(fn.inputs)} input{'s' if len(fn.inputs) != 1 else ''}: return one per "
                           "input of forward, None for an input that gets no gradient")
    checked = []
    for i, (x, gx) in enumerate(zip(fn.inputs, gxs)):
        if gx is not None and not isinstance(gx, Tensor):
            if not (hasattr(gx, "shape") and hasattr(gx, "dtype")):
                raise TypeError(f"{op}.backward returned an invalid gradient at input {i}: expected a Tensor "
                                f"of shape {tuple(x.shape)} or None, got {type(gx).__name__}")
            gx = Tensor(backend.to_device(gx, x.device))
        if gx is not None and x.requires_grad:
            if gx.shape != x.shape:
                raise RuntimeError(f"{op}.backward returned an invalid gradient at input {i}: got shape "
                                   f"{tuple(gx.shape)}, expected shape {tuple(x.shape)} (the input's); "
                                   "sum a broadcast gradient back to the input's shape")
            if not backend.is_floating(gx.dtype):
                raise TypeError(f"{op}.backward returned an invalid gradient at input {i}: dtype {gx.dtype} "
                                f"is not floating (the input is {x.dtype})")
        checked.append(gx)
    return tuple(checked)


def _unused_message(inputs, result):
    unused = [(i, x) for i, (x, g) in enumerate(zip(inputs, result)) if g is None]
    shown = ", ".join(f"{i} (shape {tuple(x.shape)}" + ("" if x.requires_grad else ", requires_grad=False")
                      + ")" for i, x in unused)
    many = len(unused) > 1
    return (f"grad(): input{'s' if many else ''} {shown} (counting from 0, of {len(inputs)}) "
            f"{'were' if many else 'was'} not used to compute the outputs, so no gradient reaches "
            f"{'them' if many else 'it'}; pass allow_unused=True to get None for an unused input")
