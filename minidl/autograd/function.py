"""Function: one differentiable op, and the node of the graph it records when called.

A :class:`Function` is one op: ``forward`` computes outputs from raw arrays,
``backward`` turns the gradient of the loss with respect to the outputs into
the gradient with respect to the inputs, ``jvp`` turns the inputs' tangents
into the outputs' (forward mode). Calling a Function on Tensors runs
``forward`` and, when some input needs a gradient and recording is on, makes
the Function the ``creator`` of its outputs: that link is the graph, and the
backward walk (:mod:`minidl.autograd.walk`) follows it back.

``backward`` is written with Tensor ops, so the backward pass is itself a
computation that can be recorded (``create_graph=True``) and differentiated
again: Hessian-vector products come from the same code. When it is not
recorded (the usual case) the walk runs it under ``no_grad`` and those ops
are plain array arithmetic.
"""
from __future__ import annotations

import weakref

import numpy as np

from minidl import backend
from minidl.autograd import function_hooks, modes, saved
from minidl.autograd.forward_mode import MissingTangentRule
from minidl.tensor import Tensor, _clock, version_of


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

    What backward reads is declared, so that the in-place checks and
    :class:`~minidl.autograd.saved_tensors_hooks` know it without looking:
    ``saved_inputs`` (which inputs), ``saved_indices`` (integer and boolean
    Tensors that get no gradient), ``saved_arrays`` (the arrays kept on
    ``self``, by name). A node recorded under saved-tensor hooks hands its
    declared arrays out and gets them back through :meth:`saved_array_values`
    and :meth:`set_saved_arrays`; nothing else sets them.

    Set when the op is recorded: ``inputs``, ``outputs`` (weak references),
    ``recorded_at`` (the in-place clock then), ``output_meta`` (shapes and
    dtypes of several outputs), and ``packed`` (what saved-tensor hooks
    packed, or None).
    """

    inputs: tuple = ()
    outputs: tuple | None = None  # weak references to the outputs, once recorded (see hold)
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
    # Names of the attributes through which the node holds arrays: set by forward for backward
    # (a dropout mask, a norm's statistics) or given to __init__ (an index array, a condition),
    # e.g. ("mask", "mean"). Each holds an array or None. saved_tensors_hooks packs exactly
    # these, besides the saved inputs; an array kept under a name not listed here stays out of
    # the hooks' reach (tests/autograd/test_saved.py's census runs every op case to find one).
    saved_arrays: tuple = ()
    # Does backward read the op's own output (self.output(): exp, tanh)? Read once per class from
    # backward's code (see __init_subclass__); saved_tensors_hooks then packs the output too.
    reads_output = False
    # A Function written outside minidl has its backward's results checked by the walk (count,
    # type, shape, dtype); minidl's own ops are checked once by their op cases instead, so the
    # hot path pays one attribute read for them. Set per subclass: see __init_subclass__.
    checked_by_walk = False
    recorded_at = None  # the in-place clock when the op was recorded (see check_unchanged)
    packed = None  # what saved_tensors_hooks packed when the op was recorded (minidl.autograd.saved)

    _node_class = None  # a PyTorch-style subclass's node class (see apply)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.checked_by_walk = not cls.__module__.startswith("minidl.")
        if "backward" in cls.__dict__ and "reads_output" not in cls.__dict__:
            code = getattr(cls.backward, "__code__", None)
            cls.reads_output = code is None or "output" in code.co_names
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
        if function_hooks.active:  # a FunctionHook is active: the same call, announced to it
            return function_hooks.call_with_hooks(self, inputs)
        ys = self.forward(*[x._data for x in inputs])
        record = modes.grad_enabled and any([x.requires_grad for x in inputs])
        if type(ys) is not tuple:  # one output: the common case (hold, inline)
            out = Tensor(ys, record)
            if record:
                self.inputs = inputs
                self.recorded_at = _clock[0]
                self.outputs = (weakref.ref(out),)
                out.creator = self
                if saved.active:
                    saved.pack_node(self)
            return out
        outputs = tuple(Tensor(y, record) for y in ys)
        if record:
            self.hold(inputs, outputs)
            for index, out in enumerate(outputs):
                out.creator = self
                out.output_index = index
            if saved.active:
                saved.pack_node(self)
        return outputs

    def hold(self, inputs, outputs):
        """Keep what backward and jvp read: ``inputs``, weak references to ``outputs``, the clock
        (for the in-place checks), and, for several outputs, their shapes and dtypes (to fill a
        missing output gradient with zeros). A recorded call does this (inline for one output);
        forward mode, for a call that recorded no node."""
        self.inputs = inputs
        self.recorded_at = _clock[0]
        self.outputs = tuple(weakref.ref(out) for out in outputs)
        if len(outputs) > 1:
            self.output_meta = [(y.shape, y.dtype) for y in outputs]

    def output(self, index: int = 0) -> Tensor:
        """The output Tensor itself, for a backward written in terms of y (exp, tanh...)."""
        y = self.outputs[index]()
        stamp = self.recorded_at
        if stamp != _clock[0] and stamp is not None and y is not None and version_of(y) > stamp:
            raise self.changed_in_place_error(f"output {index}", y)  # changed in place since forward
        return y

    def release(self):
        """Drop everything saved for backward (the graph is freed after use)."""
        vars(self).clear()
        self.inputs = None

    # ------------------------------------------------------------ what backward reads
    def saved_positions(self):
        """The positions of the inputs whose values backward reads (see ``saved_inputs``)."""
        inputs, saved_inputs = self.inputs, self.saved_inputs
        if saved_inputs is None:
            return range(len(inputs))
        if saved_inputs == "each other":
            return [i for i in (0, 1) if inputs[1 - i].requires_grad]
        return saved_inputs

    def check_unchanged(self):
        """Raise if an input, index, mask or condition that backward reads was changed in place
        since the op was recorded (the gradient would be computed from the new values)."""
        stamp = self.recorded_at
        if stamp is None:
            return
        inputs = self.inputs
        for i in self.saved_positions():
            if version_of(inputs[i]) > stamp:
                x = inputs[i]  # an integer or boolean input that gets no gradient is an index, mask or condition
                role = "index, mask or condition" if x.dtype.kind in "biu" and not x.requires_grad else f"input {i}"
                raise self.changed_in_place_error(role, x)
        for t in self.saved_indices:
            if version_of(t) > stamp:
                raise self.changed_in_place_error("index, mask or condition", t)

    def changed_in_place_error(self, role: str, t: Tensor) -> RuntimeError:
        """The error for a saved tensor (its ``role``: "input 0", "output 0"...) changed in place."""
        op = type(self).__name__
        named = f" '{t.name}'" if t.name else ""
        return RuntimeError(
            f"backward through {op}: a tensor it saved for backward (its {role}{named} of shape "
            f"{tuple(t.shape)}, {t.dtype}) was changed in place after {op} was recorded (by an "
            "optimizer step, load_state_dict, an assignment to .array, +=, an item assignment or an in-place "
            "method), so "
            "the gradient would be computed from the new values; change a copy (t.clone()) instead, "
            "or change it after backward (after an optimizer step, run the forward again)")

    def saved_array_values(self) -> dict:
        """``{name: array}`` for each name of ``saved_arrays`` that holds an array now."""
        found = {}
        for name in self.saved_arrays:
            value = getattr(self, name, None)
            if isinstance(value, np.ndarray) or backend.is_device_array(value):
                found[name] = value
        return found

    def set_saved_arrays(self, arrays: dict):
        """Set the attributes named in ``arrays`` (names of ``saved_arrays``) to its values: None
        lets a packed array go, an array gives it back for backward."""
        for name, value in arrays.items():
            if name not in self.saved_arrays:
                raise ValueError(f"{type(self).__name__}.set_saved_arrays: {name!r} is not one of its "
                                 f"saved_arrays {self.saved_arrays}; declare it there")
            setattr(self, name, value)

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
    reads_output = True  # a saved result comes back through saved_tensors, from this node's output

    def __init__(self, args):
        self.args = args
        self.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad and modes.grad_enabled
                                      for a in args)
        self.to_save, self.non_differentiable, self.returned = (), (), ()

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    @property
    def saved_tensors(self) -> tuple:
        """What forward saved: the inputs themselves, and this node's outputs for a saved result."""
        returned = {id(t): i for i, t in enumerate(self.returned)}
        saved_tensors = []
        for t in self.to_save:
            if id(t) in returned:
                saved_tensors.append(self.output(returned[id(t)]))  # the recorded output, its version checked
                continue
            if self.recorded_at is not None and version_of(t) > self.recorded_at:
                raise self.changed_in_place_error("saved tensor", t)
            saved_tensors.append(t)
        return tuple(saved_tensors)

    def forward(self, *arrays):
        with modes.set_grad_enabled(False):
            out = self.function.forward(self, *self.args)
        self.single = not isinstance(out, tuple)
        self.returned = (out,) if self.single else out
        name = self.function.__name__
        for y in self.returned:
            if not isinstance(y, Tensor):
                raise TypeError(f"{name}.forward must return Tensors, got {type(y).__name__}")
        return self.returned[0].array if self.single else tuple(y.array for y in self.returned)

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
    devices = {backend.device_of(x.array) for x in inputs}
    if len(devices) > 1:
        shown = ", ".join(f"{tuple(x.shape)} on {x.device}" for x in inputs)
        raise ValueError(f"{type(fn).__name__}: inputs are on different devices ({shown}); "
                         "move them to one device first with .to(device)")
    device = devices.pop() if devices else "cpu"
    if device == "cpu":
        return None
    index = int(device[5:])
    return index if index != backend._cupy.cuda.get_device_id() else None
