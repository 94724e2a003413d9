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

Forward mode (:class:`ForwardMode`, used by :mod:`minidl.func`) runs the
other way: each op's ``jvp`` turns its inputs' tangents into its outputs'
tangents as the forward pass goes, so one sweep gives J v.
"""
from __future__ import annotations

import contextlib
import os
import traceback
import weakref

import numpy as np

from minidl import backend
from minidl.tensor import Tensor, _changed, _clock, _owner, version_of

_grad_enabled = True  # is the graph being recorded?
_hooks: tuple = ()  # the active FunctionHooks, outermost first (see FunctionHook)
_saved_hooks: tuple = ()  # the active (pack, unpack) pairs, innermost last (see saved_tensors_hooks)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class Function:
    """One differentiable op. Subclasses define ``forward`` and ``backward``.

    ``forward(*arrays)`` gets raw NumPy/CuPy arrays and returns an array (or a
    tuple of arrays). ``backward(*grads)`` gets one Tensor gradient per output
    and returns one Tensor gradient (or None) per input. Whatever forward
    must hand to backward is stored on ``self``; ``self.inputs`` holds the
    input Tensors. Parameters of the op (an axis, a stride) go to ``__init__``.

    ``jvp(*dxs)`` is the tangent rule (forward mode): one tangent per input,
    in input order (a Tensor, or None for a zero tangent), in, one tangent
    per output (a Tensor, a tuple for several, None for zero) out, written
    with Tensor ops like ``backward`` so that it composes. When it runs,
    ``forward`` has run on this instance and ``self.inputs`` and
    ``self.outputs`` are set exactly as for ``backward``.
    """

    inputs: tuple = ()
    # Positions of the inputs whose values backward reads (directly, or through an array
    # forward kept a view of); None means all; "each other": inputs 0 and 1 are each read
    # only for the other's gradient (a·b, a @ b, x Wᵀ). An input not read may change in
    # place between forward and backward without making the gradient wrong.
    saved_inputs: tuple | str | None = None
    # Integer and boolean Tensors that backward reads but that get no gradient (an index, a mask,
    # a condition, class targets): not inputs of the graph, yet an in-place change to one after
    # the op was recorded would move the gradient, so backward checks their versions as it
    # checks the saved inputs'. An op keeping such a Tensor sets this in its __init__.
    saved_indices: tuple = ()
    _check_gradients = False  # set per subclass: see __init_subclass__
    _stamp = None  # the mutation clock when the op was recorded (see _check_inputs_unchanged)

    _node_class = None  # a PyTorch-style subclass's node class (see apply)
    _packed = None  # what forward saved, packed by saved_tensors_hooks (see _pack_saved)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # A Function written outside minidl has its backward's results checked by the walk
        # (count, type, shape, dtype: see _checked_gradients); minidl's own ops are checked
        # once by their op cases instead, so the hot path pays one attribute read for them.
        cls._check_gradients = not cls.__module__.startswith("minidl.")
        if isinstance(cls.__dict__.get("forward"), staticmethod):  # PyTorch's style: forward(ctx, ...)
            # As PyTorch does, each such Function gets a node class of its own, <Name>Backward,
            # whose instances are both the graph's node and the ctx its methods receive.
            cls._node_class = type(f"{cls.__name__}Backward", (FunctionCtx,),
                                   {"function": cls, "__module__": cls.__module__,
                                    "__qualname__": f"{cls.__qualname__}Backward"})

    @classmethod
    def apply(cls, *args):
        """Call a Function written in PyTorch's style: ``y = MyFunction.apply(x, 2.0)``.

        Such a Function defines ``@staticmethod forward(ctx, *args)`` on Tensors (run without
        recording) and ``@staticmethod backward(ctx, *grads)`` returning one gradient per
        argument of forward (None for a non-Tensor argument); ``ctx`` offers
        ``save_for_backward``, ``saved_tensors``, ``needs_input_grad`` and
        ``mark_non_differentiable``. minidl's own style (forward on arrays, ``Fn()(x)``) is
        the one its ops use; both record the same kind of node.
        """
        if cls._node_class is None:
            raise TypeError(f"{cls.__name__}.apply calls Functions written in PyTorch's style "
                            "(@staticmethod forward(ctx, ...)); call a minidl-style Function as "
                            f"{cls.__name__}(...)(*inputs)")
        node = cls._node_class(args)
        return node.returned_as(node(*[a for a in args if isinstance(a, Tensor)]))

    @property
    def next_functions(self) -> tuple:
        """``((node, output index), ...)``, one per input, as PyTorch's: the input's creator, an
        :class:`AccumulateGrad` for a leaf that requires grad, ``(None, 0)`` for the rest."""
        return tuple((x.creator, x.output_index) if x.creator is not None else
                     ((AccumulateGrad(x), 0) if x.requires_grad else (None, 0)) for x in self.inputs)

    def forward(self, *xs):
        raise NotImplementedError(f"{type(self).__name__} must define forward")

    def backward(self, *gys):
        raise NotImplementedError(f"{type(self).__name__} has no backward")

    def jvp(self, *dxs):
        raise MissingTangentRule(type(self).__name__)

    def __call__(self, *inputs: Tensor):
        # The hot path of the whole engine: keep it a handful of Python operations.
        if backend._cupy is not None:
            gpu = _check_same_device(self, inputs)
            if gpu is not None:  # the inputs live on a GPU other than the current one: run there
                with backend._cupy.cuda.Device(gpu):
                    return self(*inputs)
        if _hooks:  # a FunctionHook is active: the same call, announced to it
            return _call_with_hooks(self, inputs)
        ys = self.forward(*[x._data for x in inputs])
        record = _grad_enabled and any([x.requires_grad for x in inputs])
        if type(ys) is not tuple:  # one output: the common case
            out = Tensor(ys, record)
            if record:
                self.inputs = inputs
                self._stamp = _clock[0]
                self.outputs = (weakref.ref(out),)
                out.creator = self
                if _saved_hooks:
                    _pack_saved(self)
            return out
        outputs = tuple(Tensor(y, record) for y in ys)
        if record:
            self.inputs = inputs
            self._stamp = _clock[0]
            self.outputs = tuple(weakref.ref(out) for out in outputs)
            for index, out in enumerate(outputs):
                out.creator = self
                out.output_index = index
            self.output_meta = [(y.shape, y.dtype) for y in ys]  # to fill missing output grads with zeros
            if _saved_hooks:
                _pack_saved(self)
        return outputs

    def output(self, index: int = 0) -> Tensor:
        """The output Tensor itself, for a backward written in terms of y (exp, tanh...)."""
        y = self.outputs[index]()
        stamp = self._stamp
        if stamp != _clock[0] and stamp is not None and y is not None and version_of(y) > stamp:
            raise _changed_in_place(self, f"output {index}", y)  # changed in place since forward
        return y

    def release(self):
        """Drop everything saved for backward (the graph is freed after use)."""
        vars(self).clear()
        self.inputs = None

    def __repr__(self):
        return f"<{type(self).__name__}>"


class AccumulateGrad:
    """The end of a path in ``next_functions``: a leaf whose ``.grad`` receives the gradient."""

    def __init__(self, variable: Tensor):
        self.variable = variable
        self.next_functions = ()

    def __repr__(self):
        return f"<AccumulateGrad of a leaf of shape {tuple(self.variable.shape)}>"


class FunctionCtx(Function):
    """The node of a PyTorch-style Function (see :meth:`Function.apply`), and the ``ctx`` it receives.

    Forward runs on the caller's own Tensors without recording; the node is recorded
    around it as for any op. Saved tensors are checked for in-place changes when read.
    """
    function = None  # the user's Function class
    saved_inputs = ()  # backward reads what was saved, checked by saved_tensors itself

    def __init__(self, args):
        self.args = args
        self.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad and _grad_enabled for a in args)
        self.to_save, self.non_differentiable, self.returned = (), (), ()

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    @property
    def saved_tensors(self) -> tuple:
        """What forward saved: the inputs themselves, and this node's outputs for a saved result."""
        returned = {id(t): i for i, t in enumerate(self.returned)}
        saved = []
        for t in self.to_save:
            if id(t) in returned:
                saved.append(self.output(returned[id(t)]))  # the recorded output, its version checked
                continue
            if self._stamp is not None and version_of(t) > self._stamp:
                raise _changed_in_place(self, "saved tensor", t)
            saved.append(t)
        return tuple(saved)

    def forward(self, *arrays):
        with set_grad_enabled(False):
            out = self.function.forward(self, *self.args)
        self.single = not isinstance(out, tuple)
        self.returned = (out,) if self.single else out
        name = self.function.__name__
        for y in self.returned:
            if not isinstance(y, Tensor):
                raise TypeError(f"{name}.forward must return Tensors, got {type(y).__name__}")
        return self.returned[0].data if self.single else tuple(y.data for y in self.returned)

    def returned_as(self, outputs):
        """The outputs as forward returned them (one or a tuple), non-differentiable ones cut off."""
        outputs = (outputs,) if self.single else outputs
        for y, out in zip(self.returned, outputs):
            if any(y is t for t in self.non_differentiable):
                out.creator, out.requires_grad = None, False
        return outputs[0] if self.single else outputs

    def backward(self, *gys):
        grads = self.function.backward(self, *gys)
        grads = grads if isinstance(grads, tuple) else (grads,)
        name = type(self).__name__
        if len(grads) != len(self.args):
            raise RuntimeError(f"{name}: backward returned {len(grads)} gradients for the {len(self.args)} "
                               "arguments of forward: return one per argument, None where there is none")
        for a, g in zip(self.args, grads):
            if not isinstance(a, Tensor) and g is not None:
                raise RuntimeError(f"{name}: backward returned a gradient for the non-Tensor argument {a!r}; "
                                   "return None there")
        return tuple(g for a, g in zip(self.args, grads) if isinstance(a, Tensor))

    def jvp(self, *dxs):
        """The user's ``jvp(ctx, *tangents)`` (PyTorch's): one tangent per argument of forward, None for
        a non-Tensor; returns one tangent per output."""
        if self.function.jvp is Function.jvp:
            raise MissingTangentRule(self.function.__name__)
        given = iter(dxs)
        return self.function.jvp(self, *[next(given) if isinstance(a, Tensor) else None for a in self.args])


def _check_same_device(fn, inputs):
    """Raise ValueError unless every input is on one device; return that GPU's index when it is
    not the current GPU (the op must run there), else None."""
    devices = {backend.device_of(x.data) for x in inputs}
    if len(devices) > 1:
        shown = ", ".join(f"{tuple(x.shape)} on {x.device}" for x in inputs)
        raise ValueError(f"{type(fn).__name__}: inputs are on different devices ({shown}); "
                         "move them to one device first with .to(device)")
    device = devices.pop() if devices else "cpu"
    if device == "cpu":
        return None
    index = int(device[5:])
    return index if index != backend._cupy.cuda.get_device_id() else None


# ---------------------------------------------------------------- hooks
class FunctionHook:
    """Code run around every op's forward and every node's backward while the hook is active.

    Subclass it, override any of the four methods (each does nothing by
    default) and activate it with ``with MyHook(): ...``; it is removed when
    the block ends, also when the block raises. Modeled on Chainer's
    ``FunctionHook``. The profiler, the memory tracker, gradient checkpointing
    and :func:`detect_anomaly` are built on it.

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
      :func:`grad`) starts from ``outputs`` (a list of Tensors); the node
      backwards it runs come next.
    - ``walk_postprocess(outputs)``: that walk has ended.

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

    def __enter__(self):
        global _hooks
        if any(hook is self for hook in _hooks):
            raise RuntimeError(f"{type(self).__name__} is already active; enter a hook once at a time")
        _hooks = _hooks + (self,)
        return self

    def __exit__(self, *exc):
        global _hooks
        _hooks = tuple(hook for hook in _hooks if hook is not self)
        return False


def _call_with_hooks(fn, inputs):
    """Function.__call__ while hooks are active: the plain call, between the hooks' methods."""
    global _hooks
    hooks, entered, outputs = _hooks, 0, None
    try:
        for hook in hooks:
            hook.forward_preprocess(fn, inputs)
            entered += 1
        _hooks = ()  # the call itself takes the plain path (it sees no hooks, so it cannot recurse here)
        outputs = fn(*inputs)
    finally:
        _hooks = hooks
        _each_hook(hooks[:entered], "forward_postprocess", fn, inputs, outputs)
    return outputs


def _backward_with_hooks(fn, gys):
    """fn.backward(*gys) between the active hooks' backward methods; returns a tuple."""
    hooks, entered, gxs, gys = _hooks, 0, None, tuple(gys)
    try:
        for hook in hooks:
            hook.backward_preprocess(fn, gys)
            entered += 1
        gxs = fn.backward(*gys)
        gxs = gxs if type(gxs) is tuple else (gxs,)
    finally:
        _each_hook(hooks[:entered], "backward_postprocess", fn, gys, gxs)
    return gxs


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


# ---------------------------------------------------------------- saved-tensor hooks
class saved_tensors_hooks:  # noqa: N801 - PyTorch's name: torch.autograd.graph.saved_tensors_hooks
    """Context: every array a recorded op saves for backward goes through ``pack`` when the op is
    recorded and through ``unpack`` when its backward runs (PyTorch's semantics)::

        with mdl.autograd.saved_tensors_hooks(pack, unpack):
            loss = model(x)              # each saved array a: packed = pack(Tensor a)
        loss.backward()                  # each node, just before its backward: unpack(packed)

    What a node saves: the inputs its backward reads (``Function.saved_inputs``), and the arrays
    its forward stored on it (a dropout mask, a norm's statistics). ``pack`` gets a Tensor (an
    input itself, or an array the node stored, wrapped) and may return anything; ``unpack`` must
    return a Tensor or array of the shape, dtype and device that was packed (else RuntimeError).
    Once packed, the node no longer holds the array: an input that an op made is replaced in
    the node by an edge without values (the op that made it and which output), so what
    ``pack`` returns is all the graph keeps of it. Leaves (parameters, a batch) stay in the
    graph, as the edge to their ``.grad`` (their arrays live anyway), and hold the unpacked
    values while that node's backward runs. The hooks of the innermost block are used;
    ``save_on_cpu`` and ``save_as`` (minidl.checkpoint) are built on this.

    An op whose backward reads its own output (exp, tanh, sigmoid) packs the output, as PyTorch
    does; so does a Function written in PyTorch's style (its saved result comes back through
    ``saved_tensors``), whose other ``save_for_backward`` Tensors are held as they are. A backward
    with ``create_graph=True`` through a packed node raises (the unpacked values carry no graph
    to the leaves). With no hook active the engine pays one check per recorded op and one per
    node backward.
    """

    def __init__(self, pack_hook, unpack_hook):
        for name, hook in (("pack_hook", pack_hook), ("unpack_hook", unpack_hook)):
            if not callable(hook):
                raise TypeError(f"saved_tensors_hooks: {name} must be callable, got {type(hook).__name__}")
        self.pack_hook, self.unpack_hook = pack_hook, unpack_hook

    def __enter__(self):
        global _saved_hooks
        _saved_hooks = _saved_hooks + ((self.pack_hook, self.unpack_hook, self),)
        return self

    def __exit__(self, *exc):
        global _saved_hooks
        _saved_hooks = tuple(entry for entry in _saved_hooks if entry[2] is not self)
        _drop_stored_arrays()
        return False


class SavedEdge(Tensor):
    """In the inputs of a node recorded under saved-tensor hooks, an input made by an op: the
    graph's edge (the op that made it, which output) without its values; when the node saved
    that input, the edge gets the unpacked array before the node's backward."""

    __slots__ = ("original", "ready")

    def __init__(self, x: Tensor):
        super().__init__(_placeholder(x._data), x.requires_grad)
        self.creator, self.output_index, self.ready = x.creator, x.output_index, False
        self.original = weakref.ref(x)  # the tensor itself, while someone else keeps it


_placeholders: dict = {}  # (array type, dtype) -> one never-freed 0-d zero (its version is always 0)


def _placeholder(array):
    """A read-only zero of ``array``'s shape and dtype, one element in memory (for shapes, dtypes, xp)."""
    key = (type(array), array.dtype)
    zero = _placeholders.get(key)
    if zero is None:
        with backend.using_array(array):
            zero = _placeholders[key] = backend.xp_of(array).zeros((), array.dtype)
    return backend.xp_of(array).broadcast_to(zero, array.shape)


class _OutputRef:
    """A node's weak reference to one of its outputs that also finds a packed stand-in of it once
    the output itself is gone (for a backward that reads its output: exp, tanh)."""

    __slots__ = ("refs",)

    def __init__(self, ref, edge):
        self.refs = (ref.refs if isinstance(ref, _OutputRef) else (ref,)) + (weakref.ref(edge),)

    def __call__(self):
        y = self.refs[0]()
        if y is not None:
            return y
        for ref in self.refs[1:]:
            edge = ref()
            if edge is not None and edge.ready:
                return edge
        return None


def _pack_saved(fn):
    """At record time: pack what fn's backward reads; fn then holds the packed values only.

    Inputs made by an op become edges without values (what the graph needs to reach their
    maker), saved or not, unless their maker reads its output and did not pack it itself.
    """
    _drop_stored_arrays()
    pack = _saved_hooks[-1][0]
    inputs, entries, saved = list(fn.inputs), [], set(_saved_positions(fn))
    for i, x in enumerate(inputs):
        maker, edge = x.creator, None
        if maker is not None and (i in saved or maker._packed is not None or not _reads_output(maker)):
            edge = inputs[i] = SavedEdge(x)
            refs = list(maker.outputs)  # a maker recorded without hooks may read x through this edge
            refs[x.output_index] = _OutputRef(refs[x.output_index], edge)
            maker.outputs = tuple(refs)
        if i in saved:
            entries.append((i, pack(x), x.shape, x.dtype, backend.device_of(x._data), _owner_ref(x._data), edge))
    if _reads_output(fn):  # tanh, exp...: backward reads y, which the graph holds only weakly
        for i, ref in enumerate(fn.outputs):
            y = ref()
            entries.append((("output", i), pack(y), y.shape, y.dtype, backend.device_of(y._data), None, None))
    stored = []
    for name, value in list(vars(fn).items()):
        if isinstance(value, np.ndarray) or backend.is_device_array(value):
            entries.append((name, pack(Tensor(value)), value.shape, value.dtype, backend.device_of(value),
                            None, None))
            stored.append(name)
    fn.inputs, fn._packed = tuple(inputs), (_saved_hooks[-1][1], entries)  # unpacked by the pair that packed
    if stored:  # dropped at the next recorded op: the function that called fn may read them first
        _stored_to_drop.append((weakref.ref(fn), stored))  # (instance_norm reads the batch statistics)


_stored_to_drop: list = []  # (node, names of its packed stored arrays) still set on it


def _drop_stored_arrays():
    """Drop from their nodes the stored arrays packed since the last call (the node keeps them packed)."""
    while _stored_to_drop:
        ref, names = _stored_to_drop.pop()
        fn = ref()
        if fn is not None and fn._packed is not None:
            for name in names:
                setattr(fn, name, None)


_reads_output_by_class: dict = {}


def _reads_output(fn) -> bool:
    """Does fn's backward read its own output (``self.output()``)? Asked once per class."""
    cls = type(fn)
    reads = _reads_output_by_class.get(cls)
    if reads is None:  # a PyTorch-style Function may save its output: its saved_tensors reads it
        code = getattr(cls.backward, "__code__", None)
        reads = code is None or "output" in code.co_names or issubclass(cls, FunctionCtx)
        _reads_output_by_class[cls] = reads
    return reads


class _Held:
    """A strong reference with a weak reference's call: a node's unpacked output during its backward."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor

    def __call__(self):
        return self.tensor


def _owner_ref(array):
    """A weak reference to the array owning ``array``'s buffer (for the in-place check), or None."""
    try:
        return weakref.ref(_owner(array))
    except TypeError:  # an array type without weak references: the check is skipped
        return None


def _backward_unpacked(fn, gys):
    """fn's backward on its unpacked saved values; the graph's edges are put back afterwards."""
    if _grad_enabled:
        raise RuntimeError(f"backward through {type(fn).__name__} with create_graph=True: its saved tensors "
                           "were packed by saved_tensors_hooks, and the unpacked values carry no graph back to "
                           "the leaves; record without the hooks to take higher-order gradients")
    unpack, entries = fn._packed
    edges, view, refs = fn.inputs, list(fn.inputs), fn.outputs
    outputs, lent = list(refs), []  # lent: (leaf, its own array) while it holds the unpacked one
    try:
        for key, packed, shape, dtype, device, owner, edge in entries:
            buffer = owner() if owner is not None else None
            if buffer is not None and fn._stamp is not None and _changed.get(id(buffer), 0) > fn._stamp:
                raise _changed_in_place(fn, f"input {key}", _graph_edge(edges[key]))
            array = _restored(fn, key, unpack(packed), shape, dtype, device)
            if type(key) is str:
                setattr(fn, key, array)
            elif type(key) is tuple:  # an output the backward reads through self.output()
                outputs[key[1]] = _Held(Tensor(array))
            elif edge is not None:
                edge._data, edge.ready = array, True
                view[key] = edge
            else:
                # A leaf stays itself (a backward may need the very tensor: a checkpoint finds its
                # parameters by identity) and holds the unpacked values while this backward runs;
                # the slot is set, not .data, so no in-place change is recorded.
                leaf = edges[key]
                lent.append((leaf, leaf._data))
                leaf._data = array
        fn.inputs, fn.outputs = tuple(view), tuple(outputs)
        return fn.backward(*gys) if not _hooks else _backward_with_hooks(fn, gys)
    finally:
        fn.inputs, fn.outputs = tuple(_graph_edge(x) for x in edges), refs
        for leaf, array in reversed(lent):
            leaf._data = array
        for key, *_ in entries:
            if type(key) is str:
                setattr(fn, key, None)


def _graph_edge(x):
    """The tensor a gradient is delivered to: the original of a packed input while it lives."""
    if type(x) is SavedEdge:
        original = x.original()
        if original is not None:
            return original
    return x


def _restored(fn, key, value, shape, dtype, device):
    """``unpack``'s result as an array, checked against what was packed."""
    array = value._data if isinstance(value, Tensor) else value
    is_array = isinstance(array, (np.ndarray, np.generic)) or backend.is_device_array(array)
    if is_array and array.shape == shape and array.dtype == dtype and backend.device_of(array) == device:
        return array
    what = (f"input {key}" if type(key) is int else f"output {key[1]}" if type(key) is tuple
            else f"saved array '{key}'")
    got = (f"shape {tuple(array.shape)}, {array.dtype} on {backend.device_of(array)}" if is_array
           else f"a {type(value).__name__}")
    raise RuntimeError(f"saved_tensors_hooks: unpack returned {got} for {type(fn).__name__}'s {what}, "
                       f"which was packed as shape {tuple(shape)}, {dtype} on {device}; unpack must "
                       "restore a Tensor (or array) of the packed shape, dtype and device")


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


def inference_mode(mode: bool = True):
    """PyTorch's ``inference_mode``: ``no_grad`` (with ``mode=False``, recording stays as it is).

    PyTorch also marks the tensors made inside as inference tensors, which it then refuses
    in a recorded graph; minidl's are ordinary tensors, with no such check.
    """
    return set_grad_enabled(False) if mode else set_grad_enabled(_grad_enabled)


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

    The error names the op and the line of user code that created it. Wrap
    the forward pass as well as the backward: an op created outside the block
    is still checked in backward, but its creation was not seen, and the
    error says so. It costs a full scan of every output, so use it to debug,
    not to train. Nested blocks check once.
    """
    if any(isinstance(hook, _AnomalyCheck) for hook in _hooks):
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
            fn.created_at = _user_frame()
        if not _all_finite(outputs):
            where = getattr(fn, "created_at", None) or _user_frame()
            raise AnomalyError(f"{type(fn).__name__} produced NaN or Inf in its forward pass; "
                               f"the op was created at {where}")

    def backward_preprocess(self, fn, grad_outputs):
        self.backward_depth += 1

    def backward_postprocess(self, fn, grad_outputs, grad_inputs):
        self.backward_depth -= 1
        if grad_inputs is None or self.backward_depth or _all_finite(grad_inputs):
            return
        where = getattr(fn, "created_at", None)
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
        if t is not None and t.dtype.kind in "fc" and not bool(t.xp.isfinite(t.data).all()):
            return False
    return True


# ---------------------------------------------------------------- forward mode
class MissingTangentRule(NotImplementedError):
    """Forward mode reached an op that has no tangent rule (``jvp``); ``op`` is its class name."""

    def __init__(self, op: str):
        self.op = op
        super().__init__(f"{op} has no tangent rule (jvp), so forward mode cannot go through it; define "
                         f"{op}.jvp(*dxs) (see minidl.autograd.Function), or use reverse mode "
                         "(mdl.func.jacrev, mdl.grad)")


class ForwardMode(FunctionHook):
    """One level of forward-mode differentiation: tangents ride along the forward pass.

    Inside ``with ForwardMode() as level:``, ``level.attach(x, dx)`` gives the
    Tensor ``x`` the tangent ``dx`` (the dual number x + dx·ε). Every op then
    called on a Tensor that carries a tangent runs its ``forward`` as usual,
    then its tangent rule ``jvp`` on its inputs' tangents, and its outputs
    carry the result: ``level.tangent(y)`` is J v for the whole computation
    so far (None means zero). Nothing is kept for a backward pass: a tangent
    lives as long as its Tensor, so one sweep costs about two forward passes
    and the memory of one.

    It is a :class:`FunctionHook`, so with no level active the op call's hot
    path pays nothing beyond its one check for hooks. Levels nest
    (``jacfwd(jacfwd(f))``, ``jacfwd(jacrev(f))``), each with its own
    tangents: a level runs an op's tangent rule with itself and every level
    inside it switched off, and the levels outside it on, so they see the
    rule's ops and differentiate them in turn. Other hooks entered inside a
    level do not see its rules' ops.
    """

    def __init__(self):
        self.tangents = {}  # id(x) -> (weak reference to x, x's version when attached, tangent)

    def attach(self, x: Tensor, dx):
        """Give ``x`` the tangent ``dx`` (a Tensor of x's shape) at this level; None removes it."""
        key, table = id(x), self.tangents
        if dx is None:
            table.pop(key, None)
            return
        if tuple(dx.shape) != tuple(x.shape):
            raise ValueError(f"forward mode: a tangent of shape {tuple(dx.shape)} for a tensor of shape "
                             f"{tuple(x.shape)}; a tangent must have its primal's shape")

        def forget(ref):  # x was freed: its id may go to another tensor
            if table.get(key, (None,))[0] is ref:
                del table[key]
        table[key] = (weakref.ref(x, forget), version_of(x), dx)

    def tangent(self, x: Tensor):
        """``x``'s tangent at this level; None when it has none (a zero tangent)."""
        entry = self.tangents.get(id(x))
        if entry is None or entry[0]() is not x:
            return None
        if version_of(x) > entry[1]:
            raise RuntimeError(f"forward mode: a tensor of shape {tuple(x.shape)} that carries a tangent was "
                               "changed in place, so its tangent no longer describes it; change a copy "
                               "(t.clone()) instead")
        return entry[2]

    def forward_postprocess(self, fn, inputs, outputs):
        # Hooks close innermost first, but an inner level's rule must see the outer levels' tangents of
        # the outputs (the y in exp's ẏ = ẋ·y is differentiated by the outer level): so the outermost
        # level, which closes last, runs every level's rule, outermost first.
        levels = forward_levels()
        if levels and levels[0] is self:
            for level in levels:
                level._propagate(fn, inputs, outputs)

    def _propagate(self, fn, inputs, outputs):
        """Run ``fn``'s tangent rule on this level's tangents of ``inputs``; attach the results to ``outputs``."""
        if outputs is None or not self.tangents:
            return
        dxs = [self.tangent(x) for x in inputs]
        if all(dx is None for dx in dxs):
            return
        outs = outputs if type(outputs) is tuple else (outputs,)
        if vars(fn).get("outputs") is None:  # not recorded: set what the rule reads, as the record would
            fn.inputs, fn._stamp = inputs, _clock[0]
            fn.outputs = tuple(weakref.ref(y) for y in outs)
            if len(outs) > 1:
                fn.output_meta = [(y.shape, y.dtype) for y in outs]
        global _hooks
        hooks = _hooks
        _hooks = hooks[:next(i for i, hook in enumerate(hooks) if hook is self)]  # the levels outside this one
        try:
            dys = fn.jvp(*dxs)
        finally:
            _hooks = hooks
        dys = dys if type(dys) is tuple else (dys,)
        op = type(fn).__name__
        if len(dys) != len(outs):
            raise RuntimeError(f"{op}.jvp returned {len(dys)} tangents for {len(outs)} outputs: "
                               "return one per output (None for a zero tangent)")
        for y, dy in zip(outs, dys):
            if dy is not None and tuple(dy.shape) != tuple(y.shape):
                raise RuntimeError(f"{op}.jvp returned a tangent of shape {tuple(dy.shape)} for an output of "
                                   f"shape {tuple(y.shape)}; a tangent has its output's shape (broadcast it)")
            self.attach(y, dy)


def forward_levels() -> list:
    """The active forward-mode levels, outermost first."""
    return [hook for hook in _hooks if isinstance(hook, ForwardMode)]


def share_tangents(source: Tensor, target: Tensor):
    """Give ``target`` (a new Tensor holding ``source``'s values) ``source``'s tangent at every active level."""
    for level in forward_levels():
        level.attach(target, level.tangent(source))


def tangent_sum(*terms):
    """The sum of the tangent terms that are not None; None (a zero tangent) when every one is."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else total + term
    return total


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
        if like._data.size != 1:
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
        x._grad._data += g._data
    else:
        x._grad, x._grad_owned = Tensor(x._grad._data + g._data), True


def backward(outputs, grad_outputs=None, retain_graph=False, create_graph=False, inputs=None):
    """Backpropagate from ``outputs``; return gradients for ``inputs`` if given.

    With ``inputs=None`` gradients accumulate into every leaf's ``.grad``.
    With a list of ``inputs`` nothing's ``.grad`` changes and the gradient with
    respect to each input (None where it does not depend on it) is returned.
    Active FunctionHooks see the walk start and end (``walk_preprocess``,
    ``walk_postprocess``); with none active this costs one check.
    """
    if not _hooks:
        return _walk(outputs, grad_outputs, retain_graph, create_graph, inputs)
    hooks, entered = _hooks, 0
    try:
        for hook in hooks:
            hook.walk_preprocess(outputs)
            entered += 1
        return _walk(outputs, grad_outputs, retain_graph, create_graph, inputs)
    finally:
        _each_hook(hooks[:entered], "walk_postprocess", outputs)


def _walk(outputs, grad_outputs, retain_graph, create_graph, inputs):
    """The backward walk itself (see :func:`backward`)."""
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

    leaf_totals = {}  # id -> (leaf, gradient summed over its uses), for leaves with hooks (run once, at the end)

    def to_leaf(x: Tensor, g: Tensor):
        if x._hooks is None:
            deliver(x, g)
        else:
            held = leaf_totals.get(id(x))
            leaf_totals[id(x)] = (x, g if held is None else held[1] + g)

    def settle(out: Tensor, g: Tensor) -> Tensor:
        """A non-leaf's total gradient: through its hooks, then to .grad (retain_grad) or to grad()'s caller."""
        if out._hooks is not None:
            g = _run_tensor_hooks(out, g)
        deliver(out, g)
        return g

    # Function -> (gradients of its outputs summed over uses, those output Tensors). Holding the
    # outputs keeps them alive until their creator's backward, which may read them (exp, tanh)
    # after every consumer has been released.
    pending = {}
    # roots in the outputs' order (a dict, not a set): the walk, and so the order in which a node's
    # gradients are summed, must not depend on where the Functions happen to lie in memory
    order = _topological_order(dict.fromkeys(out.creator for out in outputs if out.creator is not None))
    now = _clock[0]  # a node stamped with this value saw no in-place change since it was recorded
    with set_grad_enabled(create_graph), backend.using_array(outputs[0]._data):  # seeds and sums on outputs' GPU
        for out, g in zip(outputs, grad_outputs):
            g = _as_grad(g, out)
            if out.creator is None:
                to_leaf(out, g)
            else:
                _add_pending(pending, out, g)
        for fn in order:
            entry = pending.pop(fn, None)
            if entry is None:
                continue
            slots, reached = entry
            for out in reached:  # each output's gradient is complete now: hooks and .grad see the total
                if out._hooks is not None or out.retains_grad or captured is not None:
                    slots[out.output_index] = settle(out, slots[out.output_index])
            gys = slots if len(slots) == 1 else _fill_missing(fn, slots)
            if fn._stamp != now:
                _check_inputs_unchanged(fn)
            if fn._packed is None:
                gxs = fn.backward(*gys) if not _hooks else _backward_with_hooks(fn, gys)
            else:
                gxs = _backward_unpacked(fn, gys)
            if type(gxs) is not tuple:
                gxs = (gxs,)
            if fn._check_gradients:
                gxs = _checked_gradients(fn, gxs)
            for x, gx in zip(fn.inputs, gxs):
                if gx is None or not x.requires_grad:
                    continue
                if x.creator is not None:
                    _add_pending(pending, x, gx)
                elif x._hooks is None:  # a leaf: its gradient is final for this use
                    deliver(x, gx)
                else:
                    to_leaf(x, gx)
            if not retain_graph:
                fn.release()
        for x, g in leaf_totals.values():
            deliver(x, _run_tensor_hooks(x, g))
    if captured is not None:
        return [captured[id(x)] for x in inputs]
    return None


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


def _check_inputs_unchanged(fn):
    """Raise if an input that fn's backward reads was changed in place after fn was recorded."""
    if fn._stamp is None:
        return
    inputs = fn.inputs
    for i in _saved_positions(fn):
        if version_of(inputs[i]) > fn._stamp:
            raise _changed_in_place(fn, f"input {i}", inputs[i])
    for t in fn.saved_indices:
        if version_of(t) > fn._stamp:
            raise _changed_in_place(fn, "index, mask or condition", t)


def _saved_positions(fn):
    """The positions of the inputs whose values fn's backward reads (see Function.saved_inputs)."""
    inputs, saved = fn.inputs, fn.saved_inputs
    if saved is None:
        return range(len(inputs))
    if saved == "each other":
        return [i for i in (0, 1) if inputs[1 - i].requires_grad]
    return saved


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


def _changed_in_place(fn, role, t):
    op = type(fn).__name__
    named = f" '{t.name}'" if t.name else ""
    return RuntimeError(
        f"backward through {op}: a tensor it saved for backward (its {role}{named} of shape "
        f"{tuple(t.shape)}, {t.dtype}) was changed in place after {op} was recorded (by an "
        "optimizer step, load_state_dict, an assignment to .data, +=, an item assignment or an in-place "
        "method), so "
        "the gradient would be computed from the new values; change a copy (t.clone()) instead, "
        "or change it after backward (after an optimizer step, run the forward again)")


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


def _unused_message(inputs, result):
    unused = [(i, x) for i, (x, g) in enumerate(zip(inputs, result)) if g is None]
    shown = ", ".join(f"{i} (shape {tuple(x.shape)}" + ("" if x.requires_grad else ", requires_grad=False")
                      + ")" for i, x in unused)
    many = len(unused) > 1
    return (f"grad(): input{'s' if many else ''} {shown} (counting from 0, of {len(inputs)}) "
            f"{'were' if many else 'was'} not used to compute the outputs, so no gradient reaches "
            f"{'them' if many else 'it'}; pass allow_unused=True to get None for an unused input")


# ---------------------------------------------------------------- ops the Tensor class itself needs
class ToDevice(Function):
    """y = x on another device;  dx = dy moved back to x's device."""
    saved_inputs = ()

    def __init__(self, device):
        self.device = device

    def forward(self, x):
        self.source = backend.device_of(x)
        return backend.to_device(x, self.device)

    def backward(self, gy):
        return ToDevice(self.source)(gy)

    def jvp(self, dx):
        """dy = dx on the other device."""
        return ToDevice(self.device)(dx)


class Cast(Function):
    """y = x converted to ``dtype``;  dx = dy converted back to x's dtype.

    Any floating dtype, bfloat16 (from ml_dtypes) included: mixed precision's casts are
    this op, so a gradient always arrives in its tensor's own dtype.
    """
    saved_inputs = ()

    def __init__(self, dtype):
        self.dtype = dtype

    def forward(self, x):
        self.source = x.dtype
        try:
            return x.astype(self.dtype)
        except (TypeError, ValueError) as exc:  # CuPy has no bfloat16: say so, not CuPy's words
            device = backend.device_of(x)
            raise TypeError(f"Cast: cannot convert a {x.dtype} tensor on {device} to {self.dtype} ({exc})"
                            + ("; CuPy has no bfloat16 arrays: use float16 on the GPU"
                               if device != "cpu" and "bfloat16" in str(self.dtype) else "")) from None

    def backward(self, gy):
        return Cast(self.source)(gy)

    def jvp(self, dx):
        """dy = dx converted to ``dtype``."""
        return Cast(self.dtype)(dx)
