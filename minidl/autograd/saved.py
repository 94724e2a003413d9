"""Saved-tensor hooks: what a recorded op keeps for its backward goes through ``pack`` and ``unpack``.

PyTorch's ``torch.autograd.graph.saved_tensors_hooks``. A node declares what
it keeps (see :class:`~minidl.autograd.Function`): the inputs its backward
reads (``saved_inputs``), its own output when its backward reads it
(``reads_output``), and the arrays its forward stored on it, by name
(``saved_arrays``). :func:`pack_node` packs exactly those when the op is
recorded; :func:`unpacked_backward` hands them back for the node's backward
only. ``save_on_cpu`` and ``save_as`` (minidl.checkpoint) and ZeRO-3's
weights-as-places (minidl.parallel.sharded) are built on this.
"""
from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from minidl import backend
from minidl.autograd import function_hooks, modes
from minidl.tensor import Tensor, _changed, _owner

active: tuple = ()  # the active (pack, unpack, owner) triples, innermost last; read by the op call


class saved_tensors_hooks:  # noqa: N801 - PyTorch's name: torch.autograd.graph.saved_tensors_hooks
    """Context: every array a recorded op saves for backward goes through ``pack`` when the op is
    recorded and through ``unpack`` when its backward runs (PyTorch's semantics)::

        with mdl.autograd.saved_tensors_hooks(pack, unpack):
            loss = model(x)              # each saved array a: packed = pack(Tensor a)
        loss.backward()                  # each node, just before its backward: unpack(packed)

    What a node saves: the inputs its backward reads (``Function.saved_inputs``), and the arrays
    its forward stored on it and named in ``Function.saved_arrays`` (a dropout mask, a norm's
    statistics). ``pack`` gets a Tensor (an input itself, or an array the node stored, wrapped)
    and may return anything; ``unpack`` must return a Tensor or array of the shape, dtype and
    device that was packed (else RuntimeError).
    Once packed, the node no longer holds the array: an input that an op made is replaced in
    the node by an edge without values (the op that made it and which output), so what
    ``pack`` returns is all the graph keeps of it. Leaves (parameters, a batch) stay in the
    graph, as the edge to their ``.grad`` (their arrays live anyway), and hold the unpacked
    values while that node's backward runs. The hooks of the innermost block are used.

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
        global active
        active = active + ((self.pack_hook, self.unpack_hook, self),)
        return self

    def __exit__(self, *exc):
        global active
        active = tuple(entry for entry in active if entry[2] is not self)
        _drop_stored_arrays()
        return False


class SavedValue(NamedTuple):
    """One value a node packed: where it goes back, what ``pack`` returned, and what it must unpack to."""

    key: object  # an input's position (int), ("output", i), or the name of a saved array (str)
    packed: object  # what pack returned
    shape: tuple
    dtype: object
    device: str
    owner: object  # a weak reference to the array owning an input's buffer (for the in-place check), or None
    edge: object  # the SavedEdge standing for an input made by an op, or None


class PackedNode(NamedTuple):
    """What a node recorded under the hooks holds instead of its saved values (``Function.packed``)."""

    unpack: object  # the unpack hook of the pair that packed them
    values: list  # SavedValue, one per packed value


class SavedEdge(Tensor):
    """In the inputs of a node recorded under saved-tensor hooks, an input made by an op: the
    graph's edge (the op that made it, which output) without its values; when the node saved
    that input, the edge gets the unpacked array before the node's backward."""

    __slots__ = ("original", "ready")

    def __init__(self, x: Tensor):
        super().__init__(_placeholder(x._data), x.requires_grad)
        self.creator, self.output_index, self.ready = x.creator, x.output_index, False
        self.original = weakref.ref(x)  # the tensor itself, while someone else keeps it


def pack_node(fn):
    """At record time: pack what fn's backward reads; fn then holds the packed values only.

    Inputs made by an op become edges without values (what the graph needs to reach their
    maker), saved or not, unless their maker reads its output and did not pack it itself.
    """
    _drop_stored_arrays()
    pack, unpack, _ = active[-1]
    inputs, values, saved = list(fn.inputs), [], set(fn.saved_positions())
    for i, x in enumerate(inputs):
        maker, edge = x.creator, None
        if maker is not None and (i in saved or maker.packed is not None or not maker.reads_output):
            edge = inputs[i] = SavedEdge(x)
            refs = list(maker.outputs)  # a maker recorded without hooks may read x through this edge
            refs[x.output_index] = _OutputRef(refs[x.output_index], edge)
            maker.outputs = tuple(refs)
        if i in saved:
            values.append(SavedValue(i, pack(x), x.shape, x.dtype, backend.device_of(x._data),
                                     _owner_ref(x._data), edge))
    if fn.reads_output:  # tanh, exp...: backward reads y, which the graph holds only weakly
        for i, ref in enumerate(fn.outputs):
            y = ref()
            values.append(SavedValue(("output", i), pack(y), y.shape, y.dtype, backend.device_of(y._data),
                                     None, None))
    stored = fn.saved_array_values()
    for name, array in stored.items():
        values.append(SavedValue(name, pack(Tensor(array)), array.shape, array.dtype, backend.device_of(array),
                                 None, None))
    fn.inputs, fn.packed = tuple(inputs), PackedNode(unpack, values)  # unpacked by the pair that packed
    if stored:  # dropped at the next recorded op: the function that called fn may read them first
        _stored_to_drop.append((weakref.ref(fn), tuple(stored)))  # (instance_norm reads the batch statistics)


def unpacked_backward(fn, gys):
    """fn's backward on its unpacked saved values; the graph's edges are put back afterwards."""
    if modes.grad_enabled:
        raise RuntimeError(f"backward through {type(fn).__name__} with create_graph=True: its saved tensors "
                           "were packed by saved_tensors_hooks, and the unpacked values carry no graph back to "
                           "the leaves; record without the hooks to take higher-order gradients")
    unpack, values = fn.packed
    edges, view, refs = fn.inputs, list(fn.inputs), fn.outputs
    outputs, lent, arrays = list(refs), [], {}  # lent: (leaf, its own array) while it holds the unpacked one
    try:
        for key, packed, shape, dtype, device, owner, edge in values:
            buffer = owner() if owner is not None else None
            if buffer is not None and fn.recorded_at is not None and _changed.get(id(buffer), 0) > fn.recorded_at:
                raise fn.changed_in_place_error(f"input {key}", _graph_edge(edges[key]))
            array = _restored(fn, key, unpack(packed), shape, dtype, device)
            if type(key) is str:
                arrays[key] = array
            elif type(key) is tuple:  # an output the backward reads through self.output()
                outputs[key[1]] = _Held(Tensor(array))
            elif edge is not None:
                edge._data, edge.ready = array, True
                view[key] = edge
            else:
                # A leaf stays itself (a backward may need the very tensor: a checkpoint finds its
                # parameters by identity) and holds the unpacked values while this backward runs;
                # the slot is set, not .array, so no in-place change is recorded.
                leaf = edges[key]
                lent.append((leaf, leaf._data))
                leaf._data = array
        fn.set_saved_arrays(arrays)
        fn.inputs, fn.outputs = tuple(view), tuple(outputs)
        return fn.backward(*gys) if not function_hooks.active else function_hooks.backward_with_hooks(fn, gys)
    finally:
        fn.inputs, fn.outputs = tuple(_graph_edge(x) for x in edges), refs
        for leaf, array in reversed(lent):
            leaf._data = array
        fn.set_saved_arrays({value.key: None for value in values if type(value.key) is str})


# ---------------------------------------------------------------- what packing needs
_placeholders: dict = {}  # (array type, dtype, device) -> one never-freed 0-d zero (its version is always 0)


def _placeholder(array):
    """A read-only zero of ``array``'s shape and dtype, one element in memory (for shapes, dtypes, xp), on
    ``array``'s device (one zero per GPU: a view of GPU 0's would put cuda:1's placeholder on GPU 0)."""
    key = (type(array), array.dtype, backend.device_of(array))
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


_stored_to_drop: list = []  # (node, names of its packed saved arrays) still set on it


def _drop_stored_arrays():
    """Drop from their nodes the saved arrays packed since the last call (the node keeps them packed)."""
    while _stored_to_drop:
        ref, names = _stored_to_drop.pop()
        fn = ref()
        if fn is not None and fn.packed is not None:
            fn.set_saved_arrays(dict.fromkeys(names))


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
