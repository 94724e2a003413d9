"""Gradient checkpointing: keep a few activations, recompute the rest during backward.

``checkpoint(fn, *inputs)`` runs ``fn`` under ``no_grad`` and records one
node, :class:`CheckpointFunction`, whose inputs are the tensors given to
``fn`` *and* every tensor requiring gradients that ``fn`` used from outside
(its parameters, seen as op inputs by a :class:`~minidl.autograd.FunctionHook`
during that run). Gradients therefore reach the parameters even when no
input requires one (the pitfall of PyTorch's reentrant checkpoint),
``mdl.grad(loss, params)`` works, and the engine accumulates ``.grad``
itself, in the same order as without checkpointing. Its backward restores
the random state ``fn`` drew from, recomputes ``fn`` with recording on
while BatchNorm running statistics are protected from a second update (both
from :mod:`minidl.checkpoint.replay`), and backpropagates through the
recomputed graph only: the tensors at its border are cut from their
creators for that inner walk. The recomputed graph is built on the original
input tensors, so with ``create_graph=True`` the gradients stay connected to
the rest of the graph and higher-order gradients (Hessian-vector products)
through a checkpoint work; with 16-bit storage they raise an error, the
stored inputs being rounded copies. A checkpoint nested in ``fn`` whose inputs
the enclosing one keeps (a recursive schedule) is recomputed after the inner
walk has ended, not inside it, so that nothing of one level stays alive while
the next is recomputed.

``checkpoint_sequential`` cuts a chain of layers into segments (a count, a
list of starts, or a :class:`~minidl.checkpoint.SegmentPlan`) and
checkpoints all but the last.
"""
from __future__ import annotations

import contextlib
import itertools

import numpy as np

from minidl import autograd, backend
from minidl.autograd import Function, FunctionHook, enable_grad, is_grad_enabled, no_grad
from minidl.checkpoint.nonreentrant import checkpoint_nonreentrant
from minidl.checkpoint.policy import KeptOutputs, ReplayKept, resolve_policy
from minidl.checkpoint.replay import BufferGuard, RngState, first_draws_recorded
from minidl.nn.containers import Sequential
from minidl.nn.module import Module
from minidl.tensor import Tensor

__all__ = ["CheckpointFunction", "checkpoint", "checkpoint_sequential", "uniform_boundaries",
           "resolve_storage_dtype", "layer_list"]


# ---------------------------------------------------------------- which tensors fn uses
class _TensorsUsed(FunctionHook):
    """Every tensor requiring gradients that an op receives while the hook is active.

    Under no_grad nothing made inside the block requires gradients, so these
    are exactly the tensors fn takes from outside: parameters, inputs, captured tensors.
    """

    def __init__(self):
        self.seen = {}  # id -> tensor, in the order of first use

    def forward_preprocess(self, function, inputs):
        for x in inputs:
            if x.requires_grad:
                self.seen[id(x)] = x


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
    kind = backend.sixteen_bit_name(name)
    if kind == "float16":
        return np.dtype(np.float16)
    if kind == "bfloat16":
        dtype = backend.bfloat16("storage_dtype='bfloat16'", ValueError, ", or use storage_dtype='float16'")
        if xp is not np:
            try:
                xp.zeros(1, dtype=dtype)
            except Exception:
                raise ValueError("storage_dtype='bfloat16': this CuPy cannot hold bfloat16 arrays; "
                                 "use storage_dtype='float16' on the GPU") from None
        return dtype
    raise ValueError(f"storage_dtype must be None, 'float16' or 'bfloat16', got {name!r}")


def _compress(tensor: Tensor, dtype):
    """Replace tensor.array by a 16-bit copy (the full-precision buffer can then be freed)."""
    xp = tensor.xp
    with np.errstate(over="ignore"):  # an overflow is reported below, with its fix
        small = tensor.array.astype(dtype)
    if not bool(xp.isfinite(small).all()) and bool(xp.isfinite(tensor.array).all()):
        raise ValueError(f"checkpoint: an activation of shape {tensor.shape} exceeds the range of {dtype} "
                         f"(largest magnitude {float(xp.abs(tensor.array).max()):.4g}); store it in bfloat16 "
                         "or without storage_dtype")
    tensor.array = small


# ---------------------------------------------------------------- the checkpoint node
_TENSOR = object()  # marks where the template of fn's arguments takes a tensor


def _as_tuple(outputs, where):
    if isinstance(outputs, Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)) and all(isinstance(o, Tensor) for o in outputs):
        return tuple(outputs)
    raise TypeError(f"{where}: fn must return a Tensor or a tuple of Tensors, got {type(outputs).__name__}")


class CheckpointFunction(Function):
    """y = fn(x₁, …) computed without a graph;  dx = (∂fn/∂x)ᵀ dy by recomputing fn with one.

    ``inputs``: the tensors passed to fn (the first ``explicit`` ones), then the
    tensors fn used from outside (parameters). Only these are kept between
    forward and backward; the activations inside fn are rematerialized.

    Tangent: ẏ = (∂fn/∂x) ẋ, from the backward itself. ⟨(∂fn/∂x)ᵀ u, ẋ⟩ is linear in the
    cotangent u and its gradient with respect to u is (∂fn/∂x) ẋ: the backward is run at
    u = 0 with its graph recorded, then that product is differentiated with respect to u.
    One recomputation of fn and two backward walks, as a Hessian-vector product costs; a
    segment whose input is stored in 16 bits refuses it, as it refuses create_graph.
    """

    recomputes = True  # its backward runs fn again (mdl.draw_graph marks such a node)

    def __init__(self, fn, template, explicit, results, multiple, rng, stored_dtypes, kept=None):
        self.order = next(_recorded)  # nodes recorded later are recomputed first (see _backpropagate)
        self.fn, self.template, self.explicit = fn, template, explicit
        self._results, self.multiple = results, multiple
        self.rng, self.stored_dtypes = rng, stored_dtypes  # rng: the generators fn drew from, or None
        # A policy's kept ops (see minidl.checkpoint.policy): call index -> (op class, outputs, stored
        # arrays), and the same arrays as a list, which the memory tracker counts.
        self.kept = None if kept is None else kept.kept
        self.kept_arrays = None if kept is None else kept.arrays()

    def forward(self, *arrays):
        results, self._results = self._results, None  # fn already ran; do not keep its outputs
        self.result_meta = [(r.shape, r.dtype) for r in results]
        return tuple(results) if self.multiple else results[0]

    def backward(self, *gys):
        create_graph = is_grad_enabled()
        inputs = self.inputs
        if create_graph and any(d is not None for d in self.stored_dtypes):
            raise RuntimeError("checkpoint: higher-order gradients (create_graph=True) cannot go through a "
                               "segment whose input is stored in 16 bits; use storage_dtype=None")
        feeds = self.feeds()
        border = feeds + list(inputs[self.explicit:])
        targets, first = [], {}  # each tensor once: a repeated input gets its gradient in one place
        for position, t in enumerate(border):
            if t.requires_grad and id(t) not in first:
                first[id(t)] = position
                targets.append(t)
        if not targets:
            return (None,) * len(inputs)
        grads = _backpropagate(self, feeds, gys, border, targets, create_graph)
        by_position = {first[id(t)]: g for t, g in zip(targets, grads)}
        return tuple(by_position.get(i) for i in range(len(inputs)))

    def feeds(self) -> list:
        """The tensors fn is given again: its kept inputs, or a 16-bit input cast back to its dtype."""
        return [x if d is None else Tensor(x.array.astype(d), requires_grad=x.requires_grad)
                for x, d in zip(self.inputs[:self.explicit], self.stored_dtypes)]

    def recompute(self, feeds) -> tuple:
        """fn run again with recording on, on ``feeds`` (see :meth:`feeds`): its outputs, as a tuple.

        The random state fn drew from is replayed and the stateful layers' buffers are protected
        (:mod:`minidl.checkpoint.replay`); a policy's kept outputs are handed back instead of recomputed.
        """
        args, feed_iter = list(self.template), iter(feeds)
        args = [next(feed_iter) if a is _TENSOR else a for a in args]
        now = self.rng.now() if self.rng else None
        try:
            if now is not None:
                self.rng.restore()
            with BufferGuard(), enable_grad(), ReplayKept(self.kept) if self.kept else contextlib.nullcontext():
                outs = self.fn(*args)
        finally:
            if now is not None:
                now.restore()  # the random stream goes on as if nothing had been recomputed
        return _as_tuple(outs, "checkpoint (recomputation)") if self.multiple else (outs,)

    def jvp(self, *dxs):
        create_graph = is_grad_enabled()
        xp = self.inputs[0].xp
        us = [Tensor(xp.zeros(shape, dtype), requires_grad=True) for shape, dtype in self.result_meta]
        with enable_grad():
            gxs = self.backward(*us)  # recorded: grad mode is on
            products = [(g * dx).sum() for g, dx in zip(gxs, dxs) if g is not None and dx is not None]
            total = products[0] if products else None
            for p in products[1:]:
                total = total + p
            dys = [None] * len(us)
            if total is not None and total.requires_grad:  # else fn's outputs do not depend on these inputs
                dys = autograd.grad(total, us, create_graph=create_graph, allow_unused=True)
        dys = tuple(Tensor(xp.zeros(u.shape, u.dtype)) if dy is None else dy for dy, u in zip(dys, us))
        return dys if self.multiple else dys[0]


_recorded = itertools.count()  # the order in which checkpoint nodes are recorded


def _backpropagate(root, feeds, gys, border, targets, create_graph) -> list:
    """The gradients of ``targets`` from ``gys``, the gradients of checkpoint node ``root``'s outputs.

    ``root``'s fn is recomputed on ``feeds``; ``border`` lists the tensors the recomputed graph
    starts from (the feeds and the tensors fn uses from outside), ``targets`` those of them
    that require a gradient.

    A checkpoint nested inside the segment (a recursive schedule's left part) is not entered
    by the walk when everything it needs lies on the border or comes out of another such
    checkpoint: the walk stops at its output, and it is recomputed here afterwards, one after
    another, the one recorded last first (whatever uses a node's output was recorded after it).
    Entered from inside the walk, it would run while the walk still holds this level's
    recomputed outputs, the gradient given to it and the nested node's own output: three
    activations that stay alive at every level of nesting, which no memory model of the
    schedule counts. With ``create_graph`` every gradient stays connected, and the walk enters
    nested checkpoints as it does any node.
    """
    outs = root.recompute(feeds)
    if len(outs) != len(gys):
        raise RuntimeError(f"checkpoint: fn returned {len(outs)} outputs on recomputation, {len(gys)} "
                           "in forward; fn must compute the same thing every time it runs")
    root = feeds = None  # the caller keeps root; the walk below holds the recomputed graph
    totals = [None] * len(targets)
    waiting = {}  # nested checkpoint node -> the gradient of its output, summed over the walks so far
    on_border = {id(t) for t in border}
    while True:
        if not create_graph:
            for node in _nested_checkpoints(outs, on_border, waiting):
                waiting[node] = None
        ends = [(node, node.outputs[0]()) for node in waiting]
        ends = [(node, end) for node, end in ends if end is not None]
        pairs = [(o, g) for o, g in zip(outs, gys) if isinstance(o, Tensor) and o.requires_grad]
        outs = gys = None  # from here on, the walk holds them only as long as it needs them
        if pairs:
            stops = [t for t in targets if t.creator is not None] + [end for _, end in ends]
            with _as_leaves(stops):
                grads = autograd.backward([o for o, _ in pairs], [g for _, g in pairs], retain_graph=create_graph,
                                          create_graph=create_graph, inputs=targets + [end for _, end in ends])
            for i, g in enumerate(grads[:len(targets)]):
                if g is not None:
                    totals[i] = g if totals[i] is None else totals[i] + g
            for (node, _), g in zip(ends, grads[len(targets):]):
                if g is not None:
                    waiting[node] = g if waiting[node] is None else waiting[node] + g
        pairs = ends = stops = grads = g = None
        while waiting and outs is None:
            node = max(waiting, key=lambda n: n.order)
            g = waiting.pop(node)
            if g is not None:
                outs, gys = node.recompute(node.feeds()), (g,)
            node.release()  # what it kept lies on the border or in the recomputed graph
            node = g = None
        if outs is None:
            return totals


def _nested_checkpoints(outs, on_border, waiting) -> list:
    """The checkpoint nodes recorded back from ``outs`` that can be recomputed after the walk.

    Such a node has one output and full-precision inputs, each on the border or the output of
    another such node (one found here or already ``waiting``). The search stops at the border.
    """
    candidates, seen = [], set()
    stack = [o.creator for o in outs if isinstance(o, Tensor) and o.creator is not None]
    while stack:
        fn = stack.pop()
        if id(fn) in seen or fn in waiting or fn.inputs is None:
            continue
        seen.add(id(fn))
        if type(fn) is CheckpointFunction and not fn.multiple and all(d is None for d in fn.stored_dtypes):
            candidates.append(fn)
        stack.extend(x.creator for x in fn.inputs if x.creator is not None and id(x) not in on_border)
    made = {id(node.outputs[0]()) for node in waiting}
    found = []
    for fn in sorted(candidates, key=lambda n: n.order):  # a node's inputs were made before it
        out = fn.outputs[0]()
        if out is not None and all(id(x) in on_border or id(x) in made for x in fn.inputs):
            found.append(fn)
            made.add(id(out))
    return found


def checkpoint(fn, *inputs, preserve_rng_state: bool = True, policy=None, use_reentrant: bool = True):
    """``fn(*inputs)`` without keeping its activations: they are recomputed during backward.

    Tensors among ``inputs`` are kept; other arguments are passed through as
    they are. ``fn`` returns a Tensor or a tuple of Tensors. Gradients reach
    the inputs and every parameter ``fn`` uses, even when no input requires a
    gradient. With ``preserve_rng_state`` (default) the recomputation draws
    the same random numbers (dropout masks) as the forward pass. Under
    ``no_grad`` this is just ``fn(*inputs)``.

    ``policy`` (selective checkpointing, :mod:`minidl.checkpoint.policy`): the ops
    whose outputs are kept instead of recomputed, as op families
    (``"matmul,conv,attention"``), Function class names, or a callable
    ``op -> bool``; the rest of ``fn`` is recomputed during backward.

    ``use_reentrant=False``: fn's graph is recorded with its saved tensors as placeholders,
    recomputed on their first unpack (:mod:`minidl.checkpoint.nonreentrant`).
    """
    if not use_reentrant:
        if policy is not None:
            raise ValueError("checkpoint: policy= selects ops of the reentrant checkpoint; pass use_reentrant=True "
                             "with it, or drop the policy")
        return checkpoint_nonreentrant(fn, *inputs, preserve_rng_state=preserve_rng_state)
    return _checkpoint(fn, inputs, preserve_rng_state, None, policy)


def _checkpoint(fn, inputs, preserve_rng_state, store_first_as, policy=None):
    if not callable(fn):
        raise TypeError(f"checkpoint: fn must be callable (a Module or a function), got {type(fn).__name__}")
    keep = resolve_policy(policy)
    if not is_grad_enabled():
        return fn(*inputs)
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    template = [_TENSOR if isinstance(x, Tensor) else x for x in inputs]
    rng = RngState()
    recording = first_draws_recorded(rng) if preserve_rng_state else contextlib.nullcontext()
    kept = KeptOutputs(keep) if keep is not None else None
    with no_grad(), _TensorsUsed() as used, recording, kept if kept is not None else contextlib.nullcontext():
        outputs = fn(*inputs)
    multiple = not isinstance(outputs, Tensor)
    results = [o.array for o in _as_tuple(outputs, "checkpoint")]
    explicit = {id(x) for x in tensors}
    captured = [t for key, t in used.seen.items() if key not in explicit]
    stored = [None] * len(tensors)
    if store_first_as is not None and isinstance(tensors[0].creator, CheckpointFunction):
        stored[0] = tensors[0].dtype  # recomputation starts from the 16-bit copy cast back to this
        _compress(tensors[0], store_first_as)  # a boundary made by the previous segment: nobody else holds it
    node = CheckpointFunction(fn, template, len(tensors), results, multiple, rng if rng else None, stored, kept)
    return node(*tensors, *captured)


# ---------------------------------------------------------------- sequential models
def layer_list(functions, where: str) -> list:
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
    rest), a :class:`~minidl.checkpoint.SegmentPlan` from
    ``balanced_segments``, or a list of segment starts. The last segment runs
    normally: its activations would be needed at once anyway.

    ``storage_dtype='float16'`` (or 'bfloat16', see :func:`resolve_storage_dtype`)
    stores the segment inputs made inside the chain in 16 bits: half the
    checkpoint memory; the forward pass itself is unchanged and exact, the
    recomputation starts from the rounded values (see ``storage_report``).
    """
    layers = layer_list(functions, "checkpoint_sequential")
    if not isinstance(input, Tensor):
        raise TypeError(f"checkpoint_sequential: input must be a Tensor, got {type(input).__name__}")
    starts = _segment_starts(segments, len(layers))
    dtype = resolve_storage_dtype(storage_dtype, input.xp)
    x = input
    for a, b in zip(starts, starts[1:]):
        x = _checkpoint(_run(layers[a:b]), (x,), preserve_rng_state, dtype)
    return _run(layers[starts[-1]:])(x)
