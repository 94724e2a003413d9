"""Gradient checkpointing: keep a few activations, recompute the rest during backward.

The textbook's "training with limited memory": backpropagation needs every
activation of the forward pass, so memory grows with depth. Rematerialization
stores only the inputs of a few *segments* and recomputes each segment's
activations when the backward pass reaches it, at the price of one extra
forward pass. With L layers cut into k segments the activations held at
once are about k segment inputs plus one segment's L/k layers, smallest near
k = √L (the book: 100 layers, 10 segments, about 20% of the activations;
measured with ``minidl.memory.track``: 15% of the plain run's bytes)::

    y = checkpoint(block, x)                         # one block
    y = checkpoint_sequential(model, 10, x)          # a Sequential, PyTorch's semantics
    plan = balanced_segments(model, x, 10)           # boundaries by measured memory
    y = checkpoint_sequential(model, plan, x, storage_dtype="float16")

How it works. ``checkpoint`` runs ``fn`` under ``no_grad`` and records one
node, :class:`CheckpointFunction`, whose inputs are the tensors given to
``fn`` *and* every tensor requiring gradients that ``fn`` used from outside
(its parameters, seen as op inputs during that run). Gradients therefore
reach the parameters even when no input requires one (the pitfall of
PyTorch's reentrant checkpoint), ``mdl.grad(loss, params)`` works, and the
engine accumulates ``.grad`` itself, in the same order as without
checkpointing. Its backward restores the random state ``fn`` drew from
(recorded just before its first draw: dropout draws the same masks; a
function without randomness records nothing), recomputes ``fn`` with
recording on while BatchNorm running statistics are protected from a second
update, and backpropagates through the recomputed graph only: the tensors at
its border are cut from their creators for that inner walk. The recomputed
graph is built on the original input tensors, so with ``create_graph=True``
the gradients stay connected to the rest of the graph and higher-order
gradients (Hessian-vector products) through a checkpoint work; with 16-bit
storage they raise an error, the stored inputs being rounded copies.

``fn`` must compute the same thing when run again: the same tensors, no
side effects but BatchNorm statistics (restored) and random draws (replayed).
The planning helpers (``balanced_segments``, ``choose_segments``,
``flatten_layers``, ``storage_report``) live in :mod:`minidl.checkpoint_plan`;
they can be imported from here too.
"""
from __future__ import annotations

import contextlib

import numpy as np

from minidl import autograd, backend
from minidl.autograd import Function, enable_grad, is_grad_enabled, no_grad
from minidl.nn.containers import Sequential
from minidl.nn.module import Module
from minidl.tensor import Tensor

# The planning names come from checkpoint_plan through __getattr__ (at the end of this file).
__all__ = ["CheckpointFunction", "checkpoint", "checkpoint_sequential", "uniform_boundaries",  # noqa: F822
           "resolve_storage_dtype", "SegmentPlan", "balanced_segments", "choose_segments", "flatten_layers",
           "profile_layers", "sqrt_segments", "storage_report"]


# ---------------------------------------------------------------- which tensors fn uses
@contextlib.contextmanager
def _grad_tensors_used():
    """Collect every tensor requiring gradients that an op receives inside the block.

    Under no_grad nothing made inside the block requires gradients, so these
    are exactly the tensors fn takes from outside: parameters, inputs, captured tensors.
    """
    seen = {}
    inner = Function.__call__

    def observing_call(fn, *inputs):
        for x in inputs:
            if x.requires_grad:
                seen[id(x)] = x
        return inner(fn, *inputs)

    Function.__call__ = observing_call
    try:
        yield seen
    finally:
        Function.__call__ = inner


# ---------------------------------------------------------------- random state
def _gpu_state(generator):
    """The device array holding a CuPy generator's state (its cuRAND states), or None if not reachable."""
    state = getattr(getattr(generator, "bit_generator", None), "_state", None)
    return state if state is not None and hasattr(state, "copy") else None


class _RngState:
    """Snapshots of the random generators of some devices, to draw the same numbers again.

    A checkpoint records them lazily (:func:`_first_draws_recorded`): only the
    generators fn draws from, just before its first draw. A function without
    randomness costs nothing, and no GPU state (megabytes of cuRAND states) is copied.
    """

    def __init__(self):
        self.cpu, self.gpu = None, {}

    @classmethod
    def of(cls, devices) -> "_RngState":
        """The generators of ``devices`` (and the CPU's) as they are now."""
        state = cls()
        for device in set(devices) | {"cpu"}:
            state.take(device, backend.rng(device))
        return state

    def take(self, device, generator):
        kind, index = backend.parse_device(device)
        if kind == "cpu":
            if self.cpu is None:
                self.cpu = backend.get_rng_state()
        elif index not in self.gpu:
            state = _gpu_state(generator)
            if state is None:  # replaying other masks would give silently wrong gradients: refuse
                raise RuntimeError(f"checkpoint: cannot save the state of the random generator of {device} "
                                   f"({type(generator).__name__} exposes no bit_generator._state); use "
                                   "preserve_rng_state=False only if fn draws no random numbers there")
            self.gpu[index] = state.copy()

    def now(self) -> "_RngState":
        """The current state of the same generators."""
        return _RngState.of(["cpu"] * (self.cpu is not None) + [f"cuda:{i}" for i in self.gpu])

    def restore(self):
        if self.cpu is not None:
            backend.set_rng_state(self.cpu)
        for index, saved in self.gpu.items():
            _gpu_state(backend.rng(f"cuda:{index}"))[...] = saved

    def __bool__(self):
        return self.cpu is not None or bool(self.gpu)


@contextlib.contextmanager
def _first_draws_recorded(state: _RngState):
    """Inside: the first time a device's generator is asked for, its state is recorded first."""
    inner = backend.rng

    def recording_rng(device="cpu"):
        generator = inner(device)
        state.take(device, generator)
        return generator

    backend.rng = recording_rng
    try:
        yield state
    finally:
        backend.rng = inner


# ---------------------------------------------------------------- stateful layers
_guards: list = []  # buffer guards open now (recomputations in progress)
_unguarded_call = Module.__call__  # the method the guard wraps, taken when the first guard opens


def _guarded_module_call(module, *args, **kwargs):
    for guard in _guards:
        guard.remember(module)
    return _unguarded_call(module, *args, **kwargs)


class _BufferGuard:
    """Inside: each module called has its buffers copied first; on exit they are put back.

    Recomputing a BatchNorm in training mode would update its running
    statistics a second time; this undoes that (the recomputed output uses the
    batch statistics, so it does not depend on them).
    """

    def __enter__(self):
        global _unguarded_call
        self.saved = {}
        if not _guards:
            _unguarded_call, Module.__call__ = Module.__call__, _guarded_module_call
        _guards.append(self)
        return self

    def remember(self, module):
        if id(module) in self.saved:
            return
        self.saved[id(module)] = [(module, name, t, t.data, t.data.copy())
                                  for name, t in module._buffers.items() if t is not None]

    def __exit__(self, *exc):
        _guards.remove(self)
        if not _guards:
            Module.__call__ = _unguarded_call
        for entries in self.saved.values():
            for module, name, tensor, array, copy in entries:
                module._buffers[name] = tensor
                tensor.data = array
                array[...] = copy  # in place: anyone holding the array sees the restored values
        return False


@contextlib.contextmanager
def _as_leaves(tensors):
    """Cut the tensors from their creators for the inner backward walk, so it stops at them."""
    creators = [(t, t.creator) for t in tensors]
    for t, _ in creators:
        t.creator = None
    try:
        yield
    finally:
        for t, creator in creators:
            t.creator = creator


# ---------------------------------------------------------------- 16-bit storage
def resolve_storage_dtype(name, xp=np):
    """The NumPy dtype for storing activations in 16 bits: 'float16', or 'bfloat16' where available.

    NumPy has no bfloat16: it is used through the ml_dtypes package when that
    is installed (and on CuPy only if CuPy accepts that dtype); otherwise a
    ValueError says so.
    """
    if name is None:
        return None
    if str(name) in ("float16", "half") or name is np.float16:
        return np.dtype(np.float16)
    if str(name) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise ValueError("storage_dtype='bfloat16': NumPy has no bfloat16 type; install the ml_dtypes "
                             "package (pip install ml_dtypes) or use storage_dtype='float16'") from None
        dtype = np.dtype(ml_dtypes.bfloat16)
        if xp is not np:
            try:
                xp.zeros(1, dtype=dtype)
            except Exception:
                raise ValueError("storage_dtype='bfloat16': this CuPy cannot hold bfloat16 arrays; "
                                 "use storage_dtype='float16' on the GPU") from None
        return dtype
    raise ValueError(f"storage_dtype must be None, 'float16' or 'bfloat16', got {name!r}")


def _compress(tensor: Tensor, dtype):
    """Replace tensor.data by a 16-bit copy (the full-precision buffer can then be freed)."""
    xp = tensor.xp
    with np.errstate(over="ignore"):  # an overflow is reported below, with its fix
        small = tensor.data.astype(dtype)
    if not bool(xp.isfinite(small).all()) and bool(xp.isfinite(tensor.data).all()):
        raise ValueError(f"checkpoint: an activation of shape {tensor.shape} exceeds the range of {dtype} "
                         f"(largest magnitude {float(xp.abs(tensor.data).max()):.4g}); store it in bfloat16 "
                         "or without storage_dtype")
    tensor.data = small


# ---------------------------------------------------------------- the checkpoint node
class CheckpointFunction(Function):
    """y = fn(x₁, …) computed without a graph;  dx = (∂fn/∂x)ᵀ dy by recomputing fn with one.

    ``inputs``: the tensors passed to fn (the first ``explicit`` ones), then the
    tensors fn used from outside (parameters). Only these are kept between
    forward and backward; the activations inside fn are rematerialized.
    """

    def __init__(self, fn, template, explicit, results, multiple, rng, stored_dtypes):
        self.fn, self.template, self.explicit = fn, template, explicit
        self._results, self.multiple = results, multiple
        self.rng, self.stored_dtypes = rng, stored_dtypes  # rng: the generators fn drew from, or None

    def forward(self, *arrays):
        results, self._results = self._results, None  # fn already ran; do not keep its outputs
        return tuple(results) if self.multiple else results[0]

    def backward(self, *gys):
        create_graph = is_grad_enabled()
        inputs, n = self.inputs, self.explicit
        if create_graph and any(d is not None for d in self.stored_dtypes):
            raise RuntimeError("checkpoint: higher-order gradients (create_graph=True) cannot go through a "
                               "segment whose input is stored in 16 bits; use storage_dtype=None")
        feeds = [x if d is None else Tensor(x.data.astype(d), requires_grad=x.requires_grad)
                 for x, d in zip(inputs[:n], self.stored_dtypes)]
        args, feed_iter = list(self.template), iter(feeds)
        args = [next(feed_iter) if a is _TENSOR else a for a in args]
        now = self.rng.now() if self.rng else None
        try:
            if now is not None:
                self.rng.restore()
            with _BufferGuard(), enable_grad():
                outs = self.fn(*args)
        finally:
            if now is not None:
                now.restore()  # the random stream goes on as if nothing had been recomputed
        outs = _as_tuple(outs, "checkpoint (recomputation)") if self.multiple else (outs,)
        if len(outs) != len(gys):
            raise RuntimeError(f"checkpoint: fn returned {len(outs)} outputs on recomputation, {len(gys)} "
                               "in forward; fn must compute the same thing every time it runs")
        pairs = [(o, g) for o, g in zip(outs, gys) if isinstance(o, Tensor) and o.requires_grad]
        boundary = feeds + list(inputs[n:])
        targets, first = [], {}  # each tensor once: a repeated input gets its gradient in one place
        for position, t in enumerate(boundary):
            if t.requires_grad and id(t) not in first:
                first[id(t)] = position
                targets.append(t)
        if not pairs or not targets:
            return (None,) * len(inputs)
        with _as_leaves([t for t in targets if t.creator is not None]):
            grads = autograd.backward([o for o, _ in pairs], [g for _, g in pairs], retain_graph=create_graph,
                                      create_graph=create_graph, inputs=targets)
        by_position = {first[id(t)]: g for t, g in zip(targets, grads)}
        return tuple(by_position.get(i) for i in range(len(inputs)))


_TENSOR = object()  # marks where the template of fn's arguments takes a tensor


def _as_tuple(outputs, where):
    if isinstance(outputs, Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)) and all(isinstance(o, Tensor) for o in outputs):
        return tuple(outputs)
    raise TypeError(f"{where}: fn must return a Tensor or a tuple of Tensors, got {type(outputs).__name__}")


def checkpoint(fn, *inputs, preserve_rng_state: bool = True):
    """``fn(*inputs)`` without keeping its activations: they are recomputed during backward.

    Tensors among ``inputs`` are kept; other arguments are passed through as
    they are. ``fn`` returns a Tensor or a tuple of Tensors. Gradients reach
    the inputs and every parameter ``fn`` uses, even when no input requires a
    gradient. With ``preserve_rng_state`` (default) the recomputation draws
    the same random numbers (dropout masks) as the forward pass. Under
    ``no_grad`` this is just ``fn(*inputs)``.
    """
    return _checkpoint(fn, inputs, preserve_rng_state, None)


def _checkpoint(fn, inputs, preserve_rng_state, store_first_as):
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable (a Module or a function), got {type(fn).__name__}")
    if not is_grad_enabled():
        return fn(*inputs)
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    template = [_TENSOR if isinstance(x, Tensor) else x for x in inputs]
    rng = _RngState()
    recording = _first_draws_recorded(rng) if preserve_rng_state else contextlib.nullcontext()
    with no_grad(), _grad_tensors_used() as used, recording:
        outputs = fn(*inputs)
    multiple = not isinstance(outputs, Tensor)
    results = [o.data for o in _as_tuple(outputs, "checkpoint")]
    explicit = {id(x) for x in tensors}
    captured = [t for key, t in used.items() if key not in explicit]
    stored = [None] * len(tensors)
    if store_first_as is not None and isinstance(tensors[0].creator, CheckpointFunction):
        stored[0] = tensors[0].dtype  # recomputation starts from the 16-bit copy cast back to this
        _compress(tensors[0], store_first_as)  # a boundary made by the previous segment: nobody else holds it
    node = CheckpointFunction(fn, template, len(tensors), results, multiple, rng if rng else None, stored)
    return node(*tensors, *captured)


# ---------------------------------------------------------------- sequential models
def _layer_list(functions, where: str) -> list:
    if isinstance(functions, Sequential):
        layers = list(functions)
    elif isinstance(functions, (list, tuple)):
        layers = list(functions)
        for index, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"{where}: element {index} of the list is a {type(layer).__name__}, not a "
                                "Module; wrap functions as layers (e.g. nn.ReLU() for F.relu)")
    else:
        raise TypeError(f"{where}: expected an nn.Sequential or a list of Modules, got {type(functions).__name__}")
    if not layers:
        raise ValueError(f"{where}: the model has no layers")
    return layers


def uniform_boundaries(num_layers: int, segments: int) -> list:
    """PyTorch's segments: the first k − 1 of ⌊L/k⌋ layers each, the last one takes the rest."""
    size = num_layers // segments
    return [i * size for i in range(segments)]


def _segment_starts(segments, num_layers: int) -> list:
    if hasattr(segments, "boundaries"):  # a SegmentPlan
        if segments.num_layers != num_layers:
            raise ValueError(f"checkpoint_sequential: the plan is for {segments.num_layers} layers, the model "
                             f"has {num_layers}")
        segments = segments.boundaries
    if isinstance(segments, (int, np.integer)) and not isinstance(segments, bool):
        if not 1 <= segments <= num_layers:
            raise ValueError(f"checkpoint_sequential: segments must be between 1 and the number of layers "
                             f"({num_layers}), got {segments}")
        return uniform_boundaries(num_layers, int(segments))
    if isinstance(segments, (list, tuple)) and segments and all(isinstance(s, (int, np.integer)) for s in segments):
        starts = [int(s) for s in segments]
        if starts[0] == 0 and all(a < b for a, b in zip(starts, starts[1:])) and starts[-1] < num_layers:
            return starts
    raise ValueError(f"checkpoint_sequential: segments must be a count, a SegmentPlan or a list of increasing "
                     f"segment starts beginning at 0 and below {num_layers}, got {segments!r}")


def _run(layers):
    def run_segment(x):
        for layer in layers:
            x = layer(x)
        return x
    return run_segment


def checkpoint_sequential(functions, segments, input, preserve_rng_state: bool = True, storage_dtype=None):
    """Run a chain of layers in segments, checkpointing all but the last (PyTorch's semantics).

    ``functions``: an ``nn.Sequential`` or a list of Modules. ``segments``: a
    count k (uniform: k − 1 segments of ⌊L/k⌋ layers, the last takes the
    rest), a :class:`~minidl.checkpoint_plan.SegmentPlan` from
    ``balanced_segments``, or a list of segment starts. The last segment runs
    normally: its activations would be needed at once anyway.

    ``storage_dtype='float16'`` (or 'bfloat16', see :func:`resolve_storage_dtype`)
    stores the segment inputs made inside the chain in 16 bits: half the
    checkpoint memory; the forward pass itself is unchanged and exact, the
    recomputation starts from the rounded values (see ``storage_report``).
    """
    layers = _layer_list(functions, "checkpoint_sequential")
    if not isinstance(input, Tensor):
        raise TypeError(f"checkpoint_sequential: input must be a Tensor, got {type(input).__name__}")
    starts = _segment_starts(segments, len(layers))
    dtype = resolve_storage_dtype(storage_dtype, input.xp)
    x = input
    for a, b in zip(starts, starts[1:]):
        x = _checkpoint(_run(layers[a:b]), (x,), preserve_rng_state, dtype)
    return _run(layers[starts[-1]:])(x)


_PLAN_NAMES = ("SegmentPlan", "balanced_segments", "choose_segments", "flatten_layers", "profile_layers",
               "sqrt_segments", "storage_report")


def __getattr__(name):
    # The planning helpers live in checkpoint_plan (which imports this module): loaded on first use.
    if name in _PLAN_NAMES:
        from minidl import checkpoint_plan
        return getattr(checkpoint_plan, name)
    raise AttributeError(f"module 'minidl.checkpoint' has no attribute {name!r}")
