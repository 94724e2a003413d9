"""ZeRO stage 1: each rank keeps the optimizer state of only its share of the parameters' elements.

Plain data parallelism stores everything N times: N copies of the weights,
of the gradients and of the optimizer state. For Adam the state (m and v) is
twice the size of the weights, so it is the largest of the three. ZeRO
stage 1 (Rajbhandari et al., 2020, "ZeRO: Memory optimizations toward
training trillion parameter models") shards it:

    partition:  each parameter group's parameters (per dtype and device) laid out as one flat
                vector of Ψ' = N·⌈Ψ/N⌉ elements (zeros pad the end); rank r owns the contiguous
                chunk r·Ψ'/N .. (r+1)·Ψ'/N, whatever parameters its elements belong to
    step:       g  ← all-reduced gradient                          (as in DataParallel)
                g_r ← chunk r of g, read from the gradients where they live
                rank r updates its chunk, with the state only it holds (KΨ'/N bytes)
                w  ← all-gather of the updated chunks             (every rank has every weight again)

The units are those of ZeRO-2 (:class:`~minidl.parallel.sharded.FlatShard`, whose weights live in
one flat buffer the parameters are views of): the optimizer steps each unit's chunk, a
:class:`~minidl.parallel.sharded.ShardParameter`, so a layer-wise optimizer (LARS, LAMB, NovoGrad)
reads each parameter's norm over the ranks through its :class:`~minidl.parallel.sharded.ShardLayers`,
and AdaHessian's probe is laid out into the chunks (:meth:`ZeroRedundancyOptimizer.probe_for`). The
state per rank is KΨ'/N however the model's sizes fall (a 512×512 weight that is half the model puts
a quarter of its state on each of 4 ranks, not half on one). The all-gather moves each unit in pieces
of at most ``bucket_bytes`` (all ranks' parts together), written straight into the flat buffer.
The price is one all-gather of the weights per step, (N−1)/N·pΨ' bytes per rank, on top of the
all-reduce's 2(N−1)/N·gΨ (:func:`minidl.parallel.cost_model.zero_step_payloads`). (ZeRO proper
replaces the all-reduce by a reduce-scatter, which keeps the total at 2(N−1)/N·gΨ: that is stage 2,
:class:`~minidl.parallel.sharded.ShardedDataParallel`; here the gradient step stays that of
DataParallel, so stage 1 composes with it.)

An elementwise optimizer's update of a chunk is the very same arithmetic as on the whole parameters,
and the all-gather copies the results bit for bit: training is identical to plain data parallelism.
A parameter that no rank gave a gradient steps with a zero gradient when it shares a unit with
parameters that have one (as at stages 2 and 3); a unit without any gradient is skipped on every rank
(the all-reduce leaves the same gradients everywhere, so a layer-wise optimizer's norms still meet).

    opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, comm, lr=1e-3)
    opt = DistributedOptimizer(opt, dp_model)          # all-reduce, the chunks' gradients, the sharded step
"""
from __future__ import annotations

import numpy as np

from minidl.parallel import flat as flat_layout
from minidl.parallel.data_parallel import BUCKET_BYTES, clip_spread_grad_norm_
from minidl.parallel.protocol import ParallelOptimizer, sum_numbers_
from minidl.parallel.sharded import FlatShard
from minidl.parallel.whole_state import consolidate_shard_state, regrouped, shard_optimizer_state
from minidl.tensor import Tensor

_SHARD_MARKS = ("zero_rank", "zero_size")  # a rank's own state_dict() says whose chunks it holds


class ZeroRedundancyOptimizer(ParallelOptimizer):
    """``ZeroRedundancyOptimizer(params, optimizer_class, comm=None, *, bucket_bytes=25 MB, **options)``.

    ``params`` is what ``optimizer_class`` takes (tensors or parameter-group
    dicts); ``options`` are its hyperparameters. Each group's parameters that require a gradient
    are laid out flat per dtype and device (a *unit*, :class:`~minidl.parallel.sharded.FlatShard`),
    and this rank builds ``optimizer_class`` over its chunk of each unit, in the same groups.
    ``step()`` reads the chunks' gradients from the parameters' (they must already be the global
    ones: wrap in :class:`DistributedOptimizer`, or call ``DataParallel.sync_gradients()`` before
    ``step()``), updates the chunks and all-gathers every rank's, in pieces of at most
    ``bucket_bytes`` (all ranks' parts together).
    """

    def __init__(self, params, optimizer_class, comm=None, *, bucket_bytes: int = BUCKET_BYTES, **options):
        if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"ZeroRedundancyOptimizer: bucket_bytes must be a positive int, got {bucket_bytes!r}")
        self.bucket_bytes = bucket_bytes
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        self.comm, self.optimizer_class = comm, optimizer_class
        if isinstance(params, Tensor):
            raise TypeError("ZeroRedundancyOptimizer: params must be an iterable of Tensors or of dicts, "
                            "got a single Tensor; wrap it in a list")
        groups = list(params)
        if not groups:
            raise ValueError("ZeroRedundancyOptimizer: got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [{**g, "params": [g["params"]] if isinstance(g["params"], Tensor) else list(g["params"])}
                  for g in groups]
        self.all_params = [p for g in groups for p in g["params"]]
        self.group_sizes = [len(g["params"]) for g in groups]
        self.units, self.group_units, local_groups = [], [], []
        for index, g in enumerate(groups):
            kinds = {}
            for p in g["params"]:
                if p.requires_grad:
                    kinds.setdefault((p.dtype.str, p.device), []).append(p)
            members = []
            for (dtype, device), params in kinds.items():
                members.append(len(self.units))
                self.units.append(FlatShard(params, comm, f"parameter group {index} ({dtype} on {device})",
                                            keep_full=True, piece_bytes=bucket_bytes))
            self.group_units.append(members)
            local_groups.append({**g, "params": [self.units[u].shard for u in members]})
        self.optimizer = optimizer_class(local_groups, **options)
        self._chunk_grads = False  # whether the chunks hold this step's gradients (see synchronize)

    # param_groups (WrapsOptimizer) are this rank's groups: the same hyperparameters
    # everywhere, this rank's chunks as the parameters.

    def zero_grad(self, set_to_none: bool = True):
        for p in self.all_params:
            p.grad = None
        self.optimizer.zero_grad(set_to_none)
        for unit in self.units:
            unit.shard.grad = None
        self._chunk_grads = False

    def synchronize(self) -> None:
        """This rank's chunk of each unit's (global) gradient into the chunk's gradient, read from the
        parameters' gradients where they live (:func:`minidl.parallel.flat.read_range`); once per step.
        :class:`DistributedOptimizer` calls it after the all-reduce, so that clipping and a loss scaler
        see the chunks' gradients; ``step()`` calls it when nothing did."""
        if self._chunk_grads:
            return
        for unit in self.units:
            grads = [None if p.grad is None else p.grad.array for p in unit.params]
            if all(g is None for g in grads):
                unit.shard.grad = None
                continue
            chunk = unit.xp.empty(unit.chunk, unit.dtype)
            flat_layout.read_range(grads, unit.sizes, unit.comm.rank * unit.chunk, chunk)
            unit.shard.grad = Tensor(chunk)
        self._chunk_grads = True

    def step(self, closure=None):
        """Update this rank's chunks, then all-gather every rank's updated chunks."""
        self.synchronize()
        loss = self.optimizer.step(closure)
        for unit in self.units:  # the chunks' gradients were copies: the parameters keep theirs
            unit.shard.grad = None
        self._chunk_grads = False
        self.gather_parameters()
        return loss

    def gather_parameters(self) -> None:
        """Every rank's chunks, all-gathered into every rank's parameters (:meth:`FlatShard.gather`: in pieces
        of at most ``bucket_bytes`` for all ranks together, written straight into the flat buffer)."""
        for unit in self.units:
            unit.gather()

    def probe_for(self, probe):
        """``probe`` (AdaHessian's) with the diagonals of the whole parameters laid out as the units are and
        cut into this rank's chunks: what :class:`DistributedOptimizer` hands
        :meth:`DataParallel.probe_gradients` (z drawn for every parameter, in one process's order)."""
        def placed(present, reduce):
            def place(diagonals):
                of = {id(p): d for p, d in zip(present, diagonals)}
                return [(unit.shard, unit.my_chunk([of.get(id(p), unit.xp.zeros(shape, unit.dtype))
                                                    for p, shape in zip(unit.params, unit.shapes)]))
                        for unit in self.units]
            probe(present, reduce, place)
        return placed

    # ------------------------------------------------------------ the protocol (minidl.parallel.protocol)
    # Each rank steps (and a loss scaler unscales) only its chunks: the global norm adds the chunks'
    # squares over the ranks, and an overflow in any rank's chunks skips the step everywhere.
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip this rank's chunks by the norm of the whole (all-reduced) gradient: the chunks' squares added
        over the ranks (a collective; the padding adds nothing); returns the norm before clipping."""
        self.synchronize()
        return clip_spread_grad_norm_(self._own_params(), self.comm, max_norm, "DistributedOptimizer.clip_grad_norm_")

    def grad_squares(self, params):
        """Σ ‖g‖² over those of ``params`` that are this rank's chunks, added over the ranks (an all-reduce of
        one number, on the gradients' device): each element of the gradient counted once, on the rank that
        owns it."""
        owned = {id(p) for p in self._own_params()}
        return sum_numbers_(self.comm, super().grad_squares([p for p in params if id(p) in owned]))

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank found an inf or NaN in the gradients of its chunks (a collective)."""
        flags = np.array([1.0 if found_inf else 0.0])
        self.comm.host_allreduce_(flags)
        return bool(flags[0] > 0)

    # ------------------------------------------------------------ memory
    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank (arrays only)."""
        return sum(_nbytes(value) for state in self.optimizer.state.values() for value in state.values())

    def memory_report(self) -> dict:
        """The optimizer-state memory on this rank against a full replica (a collective: every rank calls it).

        ``replicated_bytes`` is what every rank would hold without ZeRO (the
        sum over ranks of their shards); ``saved_bytes`` the difference per rank;
        ``parameters_owned`` how many parameters have elements in this rank's chunks.
        """
        owned = {id(unit.params[k]) for unit in self.units for k, _, _ in unit.shard.layers.pieces}
        elements = sum(unit.chunk for unit in self.units)
        counts = np.array([self.state_bytes(), len(owned), elements], np.float64)
        mine = counts.copy()
        self.comm.host_allreduce_(counts)
        total = int(counts[0])
        return {"rank": self.comm.rank, "size": self.comm.size, "state_bytes": int(mine[0]),
                "replicated_bytes": total, "saved_bytes": total - int(mine[0]),
                "saved_fraction": (total - mine[0]) / total if total else 0.0,
                "parameters_owned": int(mine[1]), "parameters_total": len(self.all_params),
                "elements_owned": int(mine[2]), "padded_elements": int(counts[2])}

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """This rank's state over its chunks (one entry per unit), marked with this rank and the number of
        ranks; it loads back into the same rank of the same layout (``consolidated_state_dict`` for any).

        Local: no communication, so rank 0 alone may call it.
        """
        return {**self.optimizer.state_dict(), "zero_rank": self.comm.rank, "zero_size": self.comm.size}

    def consolidated_state_dict(self) -> dict:
        """The full optimizer state, as the unsharded optimizer would save it (a collective):
        :func:`minidl.parallel.whole_state.consolidate_shard_state` of the units, each chunk's state
        all-gathered and cut into the parameters' shapes, at the positions of ``params``."""
        whole = consolidate_shard_state(self.units, self._named(), self.optimizer.state_dict(), self._layer_state())
        whole["param_groups"] = regrouped(whole["param_groups"], self.group_sizes)
        return whole

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full (consolidated, or one process's) state, each rank cutting its chunks from it, or this
        rank's own :meth:`state_dict` (same rank, same number of ranks)."""
        if isinstance(state_dict, dict) and any(mark in state_dict for mark in _SHARD_MARKS):
            saved = (state_dict.get("zero_rank"), state_dict.get("zero_size"))
            if saved != (self.comm.rank, self.comm.size):
                raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: the state holds the chunks of rank "
                                 f"{saved[0]} of {saved[1]}, this is rank {self.comm.rank} of {self.comm.size}; "
                                 "save consolidated_state_dict() to load into another rank or layout")
            self.optimizer.load_state_dict({k: v for k, v in state_dict.items() if k not in _SHARD_MARKS})
            return
        local = shard_optimizer_state(self.units, self._named(), state_dict, self._layer_state(), self.group_units,
                                      "ZeroRedundancyOptimizer.load_state_dict")
        self.optimizer.load_state_dict(local)

    def _named(self) -> list:
        """(name, parameter) at each of one process's optimizer's positions (names for error messages)."""
        return [(f"at position {i}", p) for i, p in enumerate(self.all_params)]

    def _layer_state(self) -> tuple:
        """The state entries the optimizer keeps one number per layer of (NovoGrad's v)."""
        return tuple(getattr(self.optimizer, "layer_state", ()))

    def __repr__(self):
        return (f"ZeroRedundancyOptimizer({self.optimizer_class.__name__}, rank {self.comm.rank}/{self.comm.size}, "
                f"{len(self.units)} units of {len(self.all_params)} parameters)")


def _nbytes(value) -> int:
    if isinstance(value, Tensor):
        value = value.array
    if hasattr(value, "nbytes"):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0
