"""ZeRO stage 1: each rank keeps the optimizer state of only its share of the parameters.

Plain data parallelism stores everything N times: N copies of the weights,
of the gradients and of the optimizer state. For Adam the state (m and v) is
twice the size of the weights, so it is the largest of the three. ZeRO
stage 1 (Rajbhandari et al., 2020, "ZeRO: Memory optimizations toward
training trillion parameter models") shards it:

    partition:  every parameter is owned by one rank (sizes balanced)
    step:       g  ← all-reduced gradient                (as in DataParallel)
                rank r updates the parameters it owns, with the state only it holds
                w  ← all-gather of the updated shards     (every rank has every weight again)

The all-gather moves each rank's share in pieces of at most ``bucket_bytes`` (all
ranks' parts together), written straight into the parameters: no buffer of every
rank's whole share. The state per rank drops from S to about S/N; the update arithmetic is split
N ways too. The price is one all-gather of the weights per step, (N−1)/N·n
bytes per rank, on top of the all-reduce's 2(N−1)/N·n. (ZeRO proper replaces
the all-reduce by a reduce-scatter, which keeps the total at 2(N−1)/N·n; here
the gradient step stays that of DataParallel, so stage 1 composes with it.)

Parameters are owned whole, not cut into element ranges, so every optimizer
works unchanged, including the layer-wise ones (LARS, LAMB) that need a whole
tensor's norm. The price: the owner of a parameter that is a large part of the
model holds all of its state (a 512×512 weight that is half the model puts half
of Adam's state on one of 4 ranks, not a quarter); stages 2 and 3
(:class:`~minidl.parallel.sharded.ShardedDataParallel`) cut by elements.
Each owned parameter's update is the very same arithmetic as without ZeRO, and
the all-gather copies the results bit for bit: training is identical to plain
data parallelism.

    opt = ZeroRedundancyOptimizer(model.parameters(), optim.Adam, comm, lr=1e-3)
    opt = DistributedOptimizer(opt, dp_model)          # all-reduce, then the sharded step
"""
from __future__ import annotations

import numpy as np

from minidl.parallel import flat as flat_layout
from minidl.parallel.data_parallel import BUCKET_BYTES
from minidl.parallel.protocol import ParallelOptimizer, sum_numbers_
from minidl.parallel.whole_state import gather_owned_state, owned_state, regrouped
from minidl.tensor import Tensor, mark_changed


def partition_parameters(sizes, size: int) -> list[int]:
    """The owning rank of each parameter: largest first to the least-loaded rank (ties: lowest rank)."""
    loads = [0] * size
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(size), key=lambda r: (loads[r], r))
        owner[index] = rank
        loads[rank] += sizes[index]
    return owner


class ZeroRedundancyOptimizer(ParallelOptimizer):
    """``ZeroRedundancyOptimizer(params, optimizer_class, comm=None, *, bucket_bytes=25 MB, **options)``.

    ``params`` is what ``optimizer_class`` takes (tensors or parameter-group
    dicts); ``options`` are its hyperparameters. This rank builds
    ``optimizer_class`` over the parameters it owns only. ``step()`` updates
    them and all-gathers every rank's results, in pieces of at most
    ``bucket_bytes`` (all ranks' parts together); the gradients must already be
    the global ones (wrap in :class:`DistributedOptimizer`, or call
    ``DataParallel.sync_gradients()`` before ``step()``).
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
        self.owner = partition_parameters([p.numel() for p in self.all_params], comm.size)
        mine = {pos for pos, r in enumerate(self.owner) if r == comm.rank}
        self.local_positions = sorted(mine)  # global positions, in the local optimizer's order
        local_groups, position = [], 0
        for g in groups:
            owned = [p for i, p in enumerate(g["params"], start=position) if i in mine]
            position += len(g["params"])
            local_groups.append({**g, "params": owned})
        self.optimizer = optimizer_class(local_groups, **options)
        self._layout = self._gather_layout()

    # param_groups (WrapsOptimizer) are this rank's groups: the same hyperparameters
    # everywhere, only the owned parameters.

    def zero_grad(self, set_to_none: bool = True):
        for p in self.all_params:
            p.grad = None

    def step(self, closure=None):
        """Update the owned parameters, then all-gather every rank's updated parameters."""
        loss = self.optimizer.step(closure)
        self.gather_parameters()
        return loss

    def gather_parameters(self) -> None:
        """Every rank's owned parameters, copied into every rank: per dtype/device, each rank's owned
        parameters laid out flat (padded to the largest rank's length) and all-gathered in pieces of at
        most ``bucket_bytes`` for all ranks together (:mod:`minidl.parallel.flat`), each piece written
        straight into the parameters it belongs to: no buffer of every rank's whole share."""
        for params_by_rank, length in self._layout:
            first = next(p for ps in params_by_rank for p in ps)
            arrays = [[p.array for p in params] for params in params_by_rank]
            sizes = [[p.numel() for p in params] for params in params_by_rank]
            for start, stop in flat_layout.pieces(length, first.dtype.itemsize, self.bucket_bytes, self.comm.size):
                send = flat_layout.read_range(arrays[self.comm.rank], sizes[self.comm.rank], start,
                                              first.xp.empty(stop - start, first.dtype))
                gathered = self.comm.allgather(send)
                for rank in range(self.comm.size):
                    if rank != self.comm.rank:
                        flat_layout.write_range(arrays[rank], sizes[rank], start, gathered[rank])
            for rank, params in enumerate(params_by_rank):
                if rank != self.comm.rank and params:
                    mark_changed(*params)

    def _gather_layout(self):
        """Per (dtype, device): the parameters each rank owns, and the padded shard length."""
        kinds = {}
        for pos, p in enumerate(self.all_params):
            by_rank = kinds.setdefault((p.dtype.str, p.device), [[] for _ in range(self.comm.size)])
            by_rank[self.owner[pos]].append(p)
        return [(by_rank, max(sum(p.numel() for p in ps) for ps in by_rank)) for by_rank in kinds.values()]

    # ------------------------------------------------------------ the protocol (minidl.parallel.protocol)
    # Each rank steps (and a loss scaler unscales) only the parameters it owns: the global norm adds the
    # owners' squares over the ranks, and an overflow in any rank's part skips the step everywhere.
    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the owned parameters by the norm of the whole (all-reduced) gradient: its squares added over
        the owners (a collective); returns the norm before clipping."""
        from minidl.parallel.data_parallel import clip_spread_grad_norm_
        return clip_spread_grad_norm_(self._own_params(), self.comm, max_norm, "DistributedOptimizer.clip_grad_norm_")

    def grad_squares(self, params):
        """Σ ‖g‖² over ``params``, each counted on the rank that owns it (an all-reduce of one number, on
        the gradients' device)."""
        owned = {id(p) for p in self._own_params()}
        return sum_numbers_(self.comm, super().grad_squares([p for p in params if id(p) in owned]))

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank found an inf or NaN in the gradients of the parameters it owns (a collective)."""
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
        sum over ranks of their shards); ``saved_bytes`` the difference per rank.
        """
        counts = np.array([self.state_bytes(), len(self.local_positions)], np.float64)
        mine = counts.copy()
        self.comm.host_allreduce_(counts)
        total = int(counts[0])
        return {"rank": self.comm.rank, "size": self.comm.size, "state_bytes": int(mine[0]),
                "replicated_bytes": total, "saved_bytes": total - int(mine[0]),
                "saved_fraction": (total - mine[0]) / total if total else 0.0,
                "parameters_owned": int(mine[1]), "parameters_total": len(self.all_params)}

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """This rank's shard, keyed by global parameter positions (``consolidated_state_dict`` for all).

        Local: no communication, so rank 0 alone may call it.
        """
        local = self.optimizer.state_dict()
        state = {self.local_positions[pos]: value for pos, value in local["state"].items()}
        return {"state": state, "param_groups": regrouped(local["param_groups"], self.group_sizes),
                "zero_rank": self.comm.rank, "zero_size": self.comm.size}

    def consolidated_state_dict(self) -> dict:
        """The full optimizer state, as the unsharded optimizer would save it (a collective):
        :func:`minidl.parallel.whole_state.gather_owned_state` of every rank's owned parameters."""
        return gather_owned_state(self.optimizer.state_dict(), self.local_positions, self.comm, self.group_sizes)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full (consolidated) or sharded state: each rank keeps the positions it owns."""
        whole = {k: v for k, v in state_dict.items() if k not in ("zero_rank", "zero_size")}  # a shard's own marks
        self.optimizer.load_state_dict(owned_state(whole, self.local_positions,
                                                   [len(g["params"]) for g in self.optimizer.param_groups],
                                                   "ZeroRedundancyOptimizer.load_state_dict"))

    def __repr__(self):
        return (f"ZeroRedundancyOptimizer({self.optimizer_class.__name__}, rank {self.comm.rank}/{self.comm.size}, "
                f"{len(self.local_positions)} of {len(self.all_params)} parameters owned)")


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
