"""Split ↔ whole state: every way a parallel run cuts a model and its optimizer state, converted both ways.

A checkpoint holds what one process training the unsplit model would save (the *whole* state): every
parameter whole, keyed as the plain model's state dict, and the optimizer's state per parameter at the
positions the plain optimizer gives it. Each rank of a parallel run holds a part of it, cut one of four
ways; this module turns each kind of part into the whole (a collective: every rank of the group calls
it, and gets the whole) and the whole back into this rank's part (no communication), for the weights
and for the optimizer's state:

    the split                      what a rank holds                           whole ← parts        whole → part
    tensor rows or columns         a slice of each split layer's weights       gathered by layer    sliced by layer
      (tensor_parallel)            (and of their Adam moments)                 (all-gather)
    flat shards (ZeRO-1/2/3)       a chunk of each unit's parameters laid      all-gather, cut      laid out, chunk
      (zero, sharded)              out flat, and of its optimizer state        into shapes          taken
    whole parameters by owner      the optimizer state of the parameters       all-gather of the    the owned
      (pipeline stages:            it owns (a stage: its layers', shared       owners' entries,     positions taken
      pipeline)                    ones twice)                                 at whole positions

The wrappers (:class:`~minidl.parallel.tensor_parallel.TensorParallel` and its optimizer,
:class:`~minidl.parallel.sharded.ShardedDataParallel`, :class:`~minidl.parallel.zero.ZeroRedundancyOptimizer`,
:class:`~minidl.parallel.pipeline.Pipeline` and :class:`~minidl.parallel.pipeline.PipelineOptimizer`)
answer the protocol's ``consolidated_state_dict`` and ``load_state_dict`` (:mod:`minidl.parallel.protocol`)
through these functions; nesting them (a pipeline of tensor-split stages) nests the conversions.

The primitives of a split stay with the split: a tensor-parallel layer knows which rows or columns it
holds (its ``gather_whole`` and ``slice_whole``: :class:`SplitLayer`), a flat unit which elements
(``FlatShard.split_gathered`` and ``my_chunk``). Gathers run in the same order on every rank.
"""
from __future__ import annotations

import numpy as np

from minidl import backend
from minidl.backend import to_numpy
from minidl.nn.module import Module

__all__ = ["SplitLayer", "consolidate_optimizer_state", "consolidate_shard_state", "consolidated_state_dict",
           "gather_owned_state", "gather_owned_weights", "local_optimizer_state", "local_state_dict",
           "owned_state", "parameter_layers", "regrouped", "shard_optimizer_state"]


# ---------------------------------------------------------------- tensor rows and columns
class SplitLayer(Module):
    """Base of a layer that holds one rank's slice of its parameters (the column- and row-parallel linears).

    ``split_names``: its parameters that differ from the unsplit layer's on some rank (a row-parallel bias
    is whole: both conversions copy it). ``gather_whole(name, array, what)`` turns an array shaped like
    this rank's parameter ``name`` (the weight, or Adam's moment of it) into the unsplit layer's (a
    collective of the layer's group); ``slice_whole(name, array, what)`` the other way (no communication);
    ``what`` names the array in errors.
    """

    split_names = ("weight", "bias")

    def gather_whole(self, name: str, array, what: str | None = None):
        raise NotImplementedError(f"{type(self).__name__} must define gather_whole(name, array, what)")

    def slice_whole(self, name: str, array, what: str | None = None):
        raise NotImplementedError(f"{type(self).__name__} must define slice_whole(name, array, what)")


# A checkpoint of a split model holds what one process would save: each split parameter whole, and
# the optimizer's state of it (Adam's m and v, shaped like the parameter) whole too, so it loads into
# one process or into a model split any other way. The conversions work on any array shaped like a
# split parameter; gathering is a collective of each tensor group, slicing needs no communication.
def parameter_layers(model: Module) -> dict:
    """``{id(parameter): (layer, name)}`` for every parameter of the column- and row-parallel layers of
    ``model`` (its :class:`SplitLayer` s): the layer whose ``gather_whole`` and ``slice_whole`` convert arrays
    shaped like it, and its attribute name ("weight" or "bias"). A row-parallel bias is whole on every
    rank (both conversions copy it); every parameter not in the map is whole everywhere."""
    return {id(getattr(layer, name)): (layer, name) for _, layer in model.named_modules()
            if isinstance(layer, SplitLayer) for name in layer.split_names if getattr(layer, name, None) is not None}


def consolidated_state_dict(model: Module) -> dict:
    """The state dict of the unsplit model: every split weight gathered whole (a collective of each group).

    Every rank of the tensor group must call it; each gets the full arrays,
    keyed as the plain model's state dict.
    """
    layers = parameter_layers(model)
    state = dict(model.state_dict())
    for key, p in model.named_parameters():
        if id(p) in layers:
            layer, name = layers[id(p)]
            state[key] = layer.gather_whole(name, p.array, what=f"parameter {key!r}")
    return state


def local_state_dict(model: Module, state: dict) -> dict:
    """A state dict of whole weights (one process's, or :func:`consolidated_state_dict`'s) -> this rank's:
    each split parameter's slice cut as the split model holds it, every other entry as it is (no
    communication). Raises ValueError naming the parameter, the shape got, the whole shape and this rank's
    slice shape when a split parameter's entry is not whole (one rank's slices, saved by
    ``model.state_dict()`` of a split model); what the module's own load checks (missing or unknown keys,
    the other shapes) is left to it."""
    if not isinstance(state, dict):
        raise TypeError(f"tensor_parallel.local_state_dict: expected a state dict (name → array), got "
                        f"{type(state).__name__}")
    layers = parameter_layers(model)
    out = dict(state)
    for key, p in model.named_parameters():
        if id(p) in layers and key in state:
            layer, name = layers[id(p)]
            out[key] = layer.slice_whole(name, state[key], what=f"parameter {key!r}")
    return out


def _optimizer_parts(state_dict, params, owner: str):
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) \
            or not isinstance(state_dict.get("param_groups"), list):
        raise ValueError(f"{owner}: expected an optimizer state {{'state': {{position: ...}}, 'param_groups': "
                         f"[...]}}, got {type(state_dict).__name__}")
    saved = sum(len(g.get("params", ())) for g in state_dict["param_groups"] if isinstance(g, dict))
    if saved != len(params):
        raise ValueError(f"{owner}: the optimizer state is for {saved} parameters, the optimizer has "
                         f"{len(params)}; load the state of an optimizer over the same model")
    return state_dict["state"]


def _convert_optimizer_state(model, state_dict, params, convert, owner):
    entries = _optimizer_parts(state_dict, params, owner)
    layers = parameter_layers(model)
    names = {id(p): key for key, p in model.named_parameters()}
    for pos in entries:
        if isinstance(pos, bool) or not isinstance(pos, int) or not 0 <= pos < len(params):
            raise ValueError(f"{owner}: the optimizer state has an entry at position {pos!r}; the optimizer has "
                             f"{len(params)} parameters (positions 0 to {len(params) - 1})")
    state = {}
    for pos in sorted(entries):  # the same order on every rank: the gathers meet
        entry, p = entries[pos], params[pos]
        if id(p) not in layers or not isinstance(entry, dict):
            state[pos] = entry
            continue
        layer, name = layers[id(p)]
        what = f"parameter {names.get(id(p), f'at position {pos}')!r}"
        state[pos] = {key: (convert(layer, name, value, f"the optimizer state {key!r} of {what}")
                            if np.ndim(value) > 0 else value) for key, value in entry.items()}
    return {"state": state, "param_groups": [dict(g) if isinstance(g, dict) else g for g in state_dict["param_groups"]]}


def consolidate_optimizer_state(model: Module, state_dict: dict, params) -> dict:
    """An optimizer's state over this rank's slices -> the state one process keeps (a collective of each
    tensor group).

    ``state_dict`` is minidl's ``{"state": {position: {...}}, "param_groups": [...]}``, the positions
    those of ``params`` (the optimizer's parameters in order: its groups' lists one after the other; a
    pipeline stage's, or any subset of ``model``'s). Each array of a split parameter's state (Adam's m and
    v: shaped like the parameter) is gathered whole by its layer; numbers (a step count), the other
    parameters' states and the groups are kept as they are. Every rank of the group must call it.
    """
    return _convert_optimizer_state(model, state_dict, list(params),
                                    lambda layer, name, value, what: backend.to_numpy(
                                        layer.gather_whole(name, layer.weight.xp.asarray(value), what)),
                                    "tensor_parallel.consolidate_optimizer_state")


def local_optimizer_state(model: Module, state_dict: dict, params) -> dict:
    """The state of :func:`consolidate_optimizer_state` (or of one process's optimizer over the unsplit
    model) -> this rank's, each array of a split parameter's state sliced as the parameter is (no
    communication). Raises ValueError naming the parameter, the state and the shapes when an array is
    not whole (one rank's state of a split model): checked before anything is returned."""
    return _convert_optimizer_state(model, state_dict, list(params),
                                    lambda layer, name, value, what: layer.slice_whole(name, value, what),
                                    "tensor_parallel.local_optimizer_state")


# ---------------------------------------------------------------- flat shards (ZeRO stages 1, 2 and 3)
# The optimizer of a sharded run steps one flat shard per unit (its parameters laid out in a row, cut
# into equal chunks); its state is cut the same way, and these two cut it back into parameters.
def consolidate_shard_state(units, named, state_dict: dict, layer_state=()) -> dict:
    """An optimizer's state over the flat shards of ``units`` (ZeRO's
    :class:`~minidl.parallel.sharded.FlatShard` s) -> the state one process keeps per parameter (a collective).

    Each array of a shard's state (Adam's m and v: one entry per element of the shard) is
    all-gathered and cut into the parameters' shapes; a number (a step count) goes to each
    of the unit's parameters; an entry named in ``layer_state`` (NovoGrad's v: one number per
    parameter of the unit, the same on every rank) gives each parameter its own, a 0-d array.
    Positions are those of ``named``, the (name, parameter) pairs one process's optimizer steps, in
    its order (ZeRO-2/3: the wrapped model's ``named_parameters()``; ZeRO-1: its parameter groups').
    Entries beside "state" and "param_groups" (SwitchOptimizer's "switch": one per group, the same on
    every rank) are kept as they are.
    """
    position = {id(p): i for i, (_, p) in enumerate(named)}
    groups, state = [], {}
    for group in state_dict["param_groups"]:
        params = sorted(position[id(p)] for u in group["params"] for p in units[u].params)
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    for u, unit in enumerate(units):
        saved = state_dict["state"].get(u, {})
        pieces = {key: ([np.array(value[i]) for i in range(len(unit.params))] if key in layer_state
                        else unit.split_gathered(value) if getattr(value, "shape", ()) == (unit.chunk,)
                        else [value] * len(unit.params)) for key, value in saved.items()}
        for i, p in enumerate(unit.params):
            state[position[id(p)]] = {key: values[i] for key, values in pieces.items()}
    return {**_group_wide(state_dict), "state": {pos: state[pos] for pos in sorted(state)},
            "param_groups": groups}

def shard_optimizer_state(units, named, state_dict: dict, layer_state=(), group_units=None,
                          owner: str = "ShardedDataParallel") -> dict:
    """The per-parameter state of :func:`consolidate_shard_state` -> this rank's state over the shards.

    ``named``: the (name, parameter) pairs one process's optimizer steps, in its order;
    ``group_units``: the units of each of the shards' optimizer's groups (default: one group of every
    unit, ZeRO-2/3's), one group per group of the saved state; ``owner`` names the caller in errors.

    An entry named in ``layer_state`` (one 0-d array per parameter: NovoGrad's v) becomes one
    vector of the unit's parameters' values, as the shard's optimizer keeps it. Entries beside
    "state" and "param_groups" (SwitchOptimizer's "switch") are kept as they are.

    Raises ValueError naming the parameter and both shapes when a saved array does not fit
    the model (a checkpoint of another model, or one that is not consolidated).
    """
    if not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict) \
            or not isinstance(state_dict.get("param_groups"), list):
        raise ValueError(f"{owner}: expected an optimizer state {{'state': ..., 'param_groups': [...]}} "
                         f"as one process saves it, got {type(state_dict).__name__}")
    named = list(named)
    names = {id(p): name for name, p in named}
    position = {id(p): i for i, (_, p) in enumerate(named)}
    count = len(position)
    saved_count = sum(len(g.get("params", ())) for g in state_dict["param_groups"] if isinstance(g, dict))
    if saved_count != count:
        raise ValueError(f"{owner}: the optimizer state is for {saved_count} parameters, the model "
                         f"has {count}; load a consolidated checkpoint of this model (one process saves one "
                         "entry per parameter)")
    saved = {int(k): v for k, v in state_dict["state"].items()}
    state = {}
    for u, unit in enumerate(units):
        entries = [saved.get(position[id(p)], {}) for p in unit.params]
        keys = set(entries[0])
        for p, entry in zip(unit.params, entries):
            if set(entry) != keys:
                raise ValueError(f"{owner}: parameter {names[id(p)]} has optimizer state "
                                 f"{sorted(entry)}, others of {unit.name} have {sorted(keys)}")
        if not keys:
            continue
        state[u] = {}
        for key in entries[0]:
            values = [entry[key] for entry in entries]
            if key in layer_state:  # one number per parameter: the unit's vector of them
                for p, value in zip(unit.params, values):
                    if tuple(getattr(value, "shape", (None,))) != ():
                        raise ValueError(f"{owner}: the optimizer state {key!r} of parameter "
                                         f"{names[id(p)]} must be one number per parameter (a 0-d array), got "
                                         f"{_describe(value)}; load a consolidated checkpoint of this model")
                state[u][key] = unit.xp.asarray(np.stack([to_numpy(np.asarray(v)) for v in values]))
                continue
            if getattr(values[0], "ndim", 0) == 0:  # a number shared by the unit's parameters (a step count)
                state[u][key] = values[0]
                continue
            for p, shape, value in zip(unit.params, unit.shapes, values):
                if tuple(getattr(value, "shape", ())) != shape:
                    raise ValueError(f"{owner}: the optimizer state {key!r} of parameter "
                                     f"{names[id(p)]} has shape {tuple(getattr(value, 'shape', ()))}, the model's "
                                     f"parameter has shape {shape}; load a consolidated checkpoint of this model")
            state[u][key] = unit.my_chunk(values)
    groups = []
    for group in state_dict["param_groups"]:
        entry = {k: v for k, v in group.items() if k != "params"}
        groups.append(entry)
    group_units = [list(range(len(units)))] if group_units is None else group_units
    if len(groups) != len(group_units):
        raise ValueError(f"{owner}: the optimizer over the shards has {len(group_units)} parameter "
                         f"group(s), the state has {len(groups)}")
    for group, members in zip(groups, group_units):
        group["params"] = list(members)
    return {**_group_wide(state_dict), "state": state, "param_groups": groups}


def _group_wide(state_dict: dict) -> dict:
    """An optimizer state's entries beside its per-parameter "state" and its "param_groups" (SwitchOptimizer's
    "switch", one per group): the same in one process and on every rank, so they pass through unchanged."""
    return {key: value for key, value in state_dict.items() if key not in ("state", "param_groups")}


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    return f"an array of shape {tuple(shape)}" if shape is not None else f"{type(value).__name__} {value!r}"


# ---------------------------------------------------------------- whole parameters by owner (pipeline stages)
# A rank that holds whole parameters (those of its stage in a pipeline) keeps
# an optimizer over them alone, its positions 0, 1, … standing for some of the whole optimizer's. Its
# entries are the whole optimizer's entries at those positions; a parameter held by several ranks (the
# pipeline's tied embedding, on its first and last stage) has equal entries on each, saved from one.
def _host(value):
    """A state entry with its arrays on the host (they travel between processes as Python objects)."""
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    return to_numpy(value) if hasattr(value, "shape") and value.ndim else value


def regrouped(groups: list, counts: list) -> list:
    """``groups``' hyperparameters (an optimizer state's "param_groups") with the positions of ``counts``
    parameters in each, one after the other."""
    out, start = [], 0
    for group, count in zip(groups, counts):
        out.append({**{k: v for k, v in group.items() if k != "params"}, "params": list(range(start, start + count))})
        start += count
    return out


def gather_owned_state(local: dict, positions: list, comm, group_sizes: list, saves=None) -> dict:
    """The whole optimizer's state from each rank's optimizer over the parameters it holds (a collective of
    ``comm``, every rank gets it).

    ``local``: this rank's ``optimizer.state_dict()`` (its positions 0, 1, …); ``positions[i]``: the whole
    optimizer's position of its parameter i; ``group_sizes``: the number of parameters in each of the
    whole optimizer's groups (the local groups, one per whole group, give the hyperparameters);
    ``saves[i]``: whether this rank's entry of parameter i is the one kept (default: every entry; a
    parameter held by several ranks is kept from one). Entries beside "state" and "param_groups" are
    the same on every rank and kept as they are.
    """
    mine = {positions[i]: _host(entry) for i, entry in local["state"].items()
            if entry and (saves is None or saves[i])}
    merged = {}
    for part in comm.allgather_object(mine):
        merged.update(part)
    return {**_group_wide(local), "state": {pos: merged[pos] for pos in sorted(merged)},
            "param_groups": regrouped(local["param_groups"], group_sizes)}


def owned_state(whole: dict, positions: list, local_sizes: list, owner: str) -> dict:
    """This rank's part of a whole optimizer state (as :func:`gather_owned_state` or one process gives it):
    the entries at ``positions`` (its parameters' whole positions, in its order), renumbered 0, 1, …, and
    the whole groups' hyperparameters over ``local_sizes`` parameters each (no communication). Raises
    ValueError naming ``owner`` when the state is not a whole optimizer state of as many parameters."""
    if not isinstance(whole, dict) or not isinstance(whole.get("state"), dict) \
            or not isinstance(whole.get("param_groups"), list) \
            or not all(isinstance(g, dict) for g in whole["param_groups"]):
        raise ValueError(f"{owner}: expected an optimizer state {{'state': {{position: ...}}, 'param_groups': "
                         f"[...]}} as one process saves it, got {type(whole).__name__}")
    if len(whole["param_groups"]) != len(local_sizes):
        raise ValueError(f"{owner}: the optimizer state has {len(whole['param_groups'])} parameter groups, this "
                         f"optimizer {len(local_sizes)}; load the state of the same optimizer over the same model")
    saved = {int(k): v for k, v in whole["state"].items()}
    state = {i: saved[pos] for i, pos in enumerate(positions) if saved.get(pos)}
    return {**_group_wide(whole), "state": state, "param_groups": regrouped(whole["param_groups"], local_sizes)}


def gather_owned_weights(mine: dict, comm) -> dict:
    """``{name: array}`` of every rank's ``mine`` (the whole weights each holds and saves, on the host), merged
    (a collective of ``comm``, every rank gets them)."""
    merged = {}
    for part in comm.allgather_object({name: to_numpy(value) for name, value in mine.items()}):
        merged.update(part)
    return merged
