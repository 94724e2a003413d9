"""Expert parallelism: the experts of a mixture-of-experts layer placed over the ranks, tokens moved by all-to-all.

    model = build_model()                                # holds nn.MoE layers (E experts each)
    model = parallel.expert_parallel(model, comm)        # rank r keeps experts r·E/N .. (r+1)·E/N − 1
    opt = parallel.ExpertParallelOptimizer(optim.SGD(model.parameters(), lr), model)
    loss = F.cross_entropy(model(x_r), y_r) + α · Σ moe.aux_loss     # x_r: this rank's slice of the batch
    opt.zero_grad(); loss.backward(); opt.step()         # step() synchronizes the gradients first

(Lepikhin et al. 2020, "GShard"; Fedus et al. 2021, "Switch Transformers", section 2.2.) Each rank
holds the router and every layer but the experts whole, as data parallelism does, and E/N of each
MoE layer's experts. A forward of one MoE layer on rank r:

    1. route its T_r tokens (the router is replicated), capacity ⌈C · T_r · k / E⌉ per expert;
    2. dispatch: the kept (token, expert) rows, sorted by expert, go to their experts' ranks
       (``all_to_all_v``; the per-expert counts first, one ``all_to_all`` of E int64s);
    3. each local expert runs on the rows it received from every rank;
    4. combine: the outputs go back the way they came (``all_to_all_v`` with the counts reversed)
       and are weighted by their gates and added per token, as one process does.

The exchange is an autograd op whose backward is the exchange the other way (:class:`AllToAllV`),
so the backward sends each output's gradient to its expert and each input's gradient home.

Equal to one process. The capacity is per rank, so the run equals one process running the same
layer with ``groups = N`` on the global batch (the ranks' slices one after the other, equal in size):
the same outputs, the same dropped tokens (``dropped_tokens`` summed over the ranks), the same
auxiliary loss (each rank's is its group's; the average over the ranks is the layer's). With no token
dropped the grouping changes nothing, so it equals the plain layer (any ``groups``) outright.
Gradients: every rank's loss is the mean over its T_r tokens and the one process's the mean of those
means; :meth:`ExpertParallel.sync_gradients` averages the replicated gradients over the ranks
(all-reduce, ÷N) and divides the experts' by N (each already holds the sum over all ranks' losses,
carried home by the backward's exchange). The ranks' batches must be of equal size.
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl import backend
from minidl.autograd import Function
from minidl.nn.containers import ModuleDict
from minidl.nn.module import Module, WrapsModule
from minidl.nn.moe import MoE, combine
from minidl.nn.utils import replace_module
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer
from minidl.tensor import Tensor, as_tensor

__all__ = ["AllToAllV", "ExpertParallel", "ExpertParallelMoE", "ExpertParallelOptimizer", "all_to_all_v",
           "expert_parallel"]


class AllToAllV(Function):
    """y = the rows every rank sent this one (``comm.all_to_all_v``);  dx = the exchange of dy the other way.

    The rows ``send_counts[p]`` for rank p leave, the ``recv_counts[p]`` from rank p arrive; each row's
    gradient goes back to the rank its row came from, so the backward is the same op with the two counts
    swapped (and its backward the forward again: second derivatives travel too).
    """

    def __init__(self, comm, send_counts, recv_counts):
        self.comm, self.send_counts, self.recv_counts = comm, list(send_counts), list(recv_counts)

    def forward(self, x):
        with backend.using_array(x):
            rows, _ = self.comm.all_to_all_v(backend.xp_of(x).ascontiguousarray(x), self.send_counts,
                                             self.recv_counts)
        return rows

    def backward(self, gy):
        return (AllToAllV(self.comm, self.recv_counts, self.send_counts)(gy),)

    def jvp(self, dx):
        """ẏ = the same exchange of ẋ (y is linear in x)."""
        return AllToAllV(self.comm, self.send_counts, self.recv_counts)(dx)


def all_to_all_v(x, comm, send_counts, recv_counts):
    """Rows of ``x`` to the ranks (``send_counts[p]`` for rank p, in order), differentiable (:class:`AllToAllV`)."""
    if not callable(getattr(comm, "all_to_all_v", None)):
        raise TypeError(f"all_to_all_v: comm must be a communicator of minidl.parallel, got {type(comm).__name__}")
    return AllToAllV(comm, send_counts, recv_counts)(as_tensor(x))


class ExpertParallelMoE(MoE):
    """One :class:`~minidl.nn.MoE` layer with this rank's E/N experts; the router whole.

    ``ExpertParallelMoE.from_moe(moe, comm)`` keeps ``moe``'s router and experts
    ``rank·E/N .. (rank+1)·E/N − 1`` (the same numbers as the plain layer built from the same seed),
    under the plain layer's names (``experts.5.fc1.weight``), so this rank's state dict is the part of
    the plain one it holds. After each forward: ``aux_loss``, ``dropped_tokens`` (this rank's tokens),
    ``routing`` and ``last_exchange`` (rows sent and received).
    """

    def __init__(self, moe: MoE, comm):
        Module.__init__(self)  # not MoE's: the layer is made from ``moe``, not drawn anew
        if not isinstance(moe, MoE) or isinstance(moe, ExpertParallelMoE):
            raise TypeError(f"ExpertParallelMoE: expected an nn.MoE layer, got {type(moe).__name__}")
        if moe.num_experts % comm.size:
            divisors = [d for d in range(1, moe.num_experts + 1) if moe.num_experts % d == 0]
            raise ValueError(f"ExpertParallelMoE: {moe.num_experts} experts do not divide among {comm.size} ranks; "
                             f"run on {', '.join(map(str, divisors))} ranks, or change num_experts")
        if moe.groups != 1:
            raise ValueError(f"ExpertParallelMoE: the plain layer has groups={moe.groups}; expert parallelism makes "
                             "one group per rank, so build the layer with groups=1")
        self.comm = comm
        for name in ("in_features", "hidden_features", "out_features", "num_experts", "k", "capacity_factor"):
            setattr(self, name, getattr(moe, name))
        self.groups = 1  # one group per rank: this rank's tokens
        self.local = moe.num_experts // comm.size
        self.first = comm.rank * self.local
        self.router = moe.router
        self.experts = ModuleDict({str(e): moe.experts[e] for e in range(self.first, self.first + self.local)})
        self.aux_loss, self.dropped_tokens, self.routing, self.last_exchange = None, 0, None, {}
        self.rows_seen = np.zeros(self.local, np.int64)  # rows each local expert took since the last sync

    @classmethod
    def from_moe(cls, moe: MoE, comm) -> "ExpertParallelMoE":
        return cls(moe, comm)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"ExpertParallelMoE({self.in_features} → {self.out_features}): input of shape "
                             f"{tuple(x.shape)} has {x.shape[-1]} features, expected {self.in_features}")
        lead = tuple(x.shape[:-1])
        x = x.reshape(-1, self.in_features)
        routing, gates, self.aux_loss = self.gate(x, 1)   # this rank's tokens are one group
        self.routing, self.dropped_tokens = routing, routing.dropped
        xp, N, L, E = x.xp, self.comm.size, self.local, self.num_experts
        # 2. dispatch: the kept pairs sorted by expert (so by rank), each expert's in token order
        experts = backend.to_numpy(routing.experts)
        kept = backend.to_numpy(routing.kept)
        t, j = np.nonzero(kept)
        order = np.lexsort((t, experts[t, j]))
        t, j = t[order], j[order]
        per_expert = np.bincount(experts[t, j], minlength=E).astype(np.int64)
        with backend.using_array(x.array):
            got = backend.to_numpy(self.comm.all_to_all(xp.asarray(per_expert.reshape(N, L))))  # (source, local expert)
        send_counts = per_expert.reshape(N, L).sum(axis=1).tolist()
        recv_counts = got.sum(axis=1).tolist()
        self.last_exchange = {"sent": int(sum(send_counts)), "received": int(sum(recv_counts))}
        t_dev = xp.asarray(t)
        received = all_to_all_v(F.index_select(x, 0, t_dev), self.comm, send_counts, recv_counts)
        # 3. each local expert on its rows: the block from source s for local expert l starts at starts[s, l]
        starts = np.cumsum(np.concatenate([[0], got.reshape(-1)]))[:-1].reshape(N, L)
        outputs, positions = [], []
        for local in range(L):  # every local expert runs, on no rows too: the backward's exchange needs its node
            rows = np.concatenate([np.arange(starts[s, local], starts[s, local] + got[s, local]) for s in range(N)])
            if self.training:
                self.rows_seen[local] += len(rows)
            rows = xp.asarray(rows.astype(np.int64))
            outputs.append(self.experts[str(self.first + local)](F.index_select(received, 0, rows)))
            positions.append(rows)
        done = F.cat(outputs)  # back into the order the rows arrived in
        arrived = xp.empty(done.shape[0], np.int64)
        arrived[xp.concatenate(positions)] = xp.arange(done.shape[0])
        done = F.index_select(done, 0, arrived)
        # 4. combine: the outputs home, in the order they left, weighted by their gates
        back = all_to_all_v(done, self.comm, recv_counts, send_counts)
        weights = F.index_select(gates.reshape(-1), 0, xp.asarray(t * self.k + j))
        y = combine(back, t_dev, weights, x.shape[0])
        return y.reshape(lead + (self.out_features,))

    def extra_repr(self):
        return (f"experts {self.first}..{self.first + self.local - 1} of {self.num_experts} on rank "
                f"{self.comm.rank} of {self.comm.size}, k={self.k}, capacity_factor={self.capacity_factor}")


def expert_layers(model: Module) -> list:
    """``(name, layer)`` of every :class:`ExpertParallelMoE` of ``model``."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, ExpertParallelMoE)]


def expert_parameters(model: Module) -> list:
    """The parameters only this rank holds: its experts' (the router and the rest are replicated)."""
    return [p for _, layer in expert_layers(model) for p in layer.experts.parameters()]


def expert_parallel(model: Module, comm=None) -> "ExpertParallel":
    """Replace every ``nn.MoE`` of ``model`` by an :class:`ExpertParallelMoE` over ``comm`` (this rank's experts)
    and wrap the model in :class:`ExpertParallel`. ``model`` itself is changed (its MoE layers are replaced)."""
    if comm is None:
        from minidl.parallel.world import init
        comm = init()
    if isinstance(model, MoE) and not isinstance(model, ExpertParallelMoE):
        return ExpertParallel(ExpertParallelMoE(model, comm), comm)
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MoE) and not isinstance(m, ExpertParallelMoE)]
    for name, layer in layers:
        replace_module(model, name, ExpertParallelMoE(layer, comm))
    return ExpertParallel(model, comm)


class ExpertParallel(WrapsModule, ParallelModule):
    """A model whose MoE layers are :class:`ExpertParallelMoE`: experts on their ranks, the rest data-parallel.

    At construction every replicated parameter and buffer is overwritten with rank 0's (the experts stay
    as they are: each rank holds its own). Each rank feeds its slice of the global batch (equal slices);
    after ``loss.backward()`` call :meth:`sync_gradients`, or let :class:`ExpertParallelOptimizer` do it.
    The protocol of :mod:`minidl.parallel.protocol`: the Trainer drives it as it drives data parallelism,
    and a checkpoint holds the plain model's whole state (every expert, keyed as the plain model).
    """

    def __init__(self, module: Module, comm=None):
        super().__init__()
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        if not expert_layers(module):
            raise ValueError(f"ExpertParallel: {type(module).__name__} has no expert-parallel MoE layer; "
                             "build it with parallel.expert_parallel(model, comm)")
        self.module, self.comm = module, comm
        self.samples_seen = 0
        self.last_sync = {}
        own = {id(p) for p in expert_parameters(module)}
        tensors = [p for p in module.parameters() if id(p) not in own] + [b for _, b in module.named_buffers()]
        for t in tensors:  # rank 0's replicated weights everywhere (a few small broadcasts, once)
            with backend.using(t.device):
                flat = t.xp.ascontiguousarray(t.array.reshape(-1))
                comm.broadcast_(flat, 0)
                t.array[...] = flat.reshape(t.shape)
        comm.synchronize()

    def forward(self, *args, **kwargs):
        if args and self.training:
            try:
                self.samples_seen += len(args[0])
            except TypeError:
                pass
        return self.module(*args, **kwargs)

    def sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        """``values`` added over the ranks (each trains on its own samples): the global batch's records."""
        return self.comm.host_allreduce_(np.array(values, dtype=np.float64))

    @property
    def dropped_tokens(self) -> int:
        """The dropped (token, expert) pairs of the last forward of every MoE layer, summed over the ranks."""
        counts = np.array([float(sum(layer.dropped_tokens for _, layer in expert_layers(self.module)))])
        return int(self.comm.host_allreduce_(counts)[0])

    def sync_gradients(self) -> None:
        """Make every gradient the global batch's: replicated ones averaged over the ranks (one all-reduce per
        dtype and device), the experts' divided by N (each holds the sum over the ranks' losses already).

        The ranks' sample counts must be equal (each rank's loss is a mean over its samples, and the
        experts' gradients cannot be reweighted after the exchange added them up).
        """
        N, count = self.comm.size, self.samples_seen
        self.samples_seen = 0
        own = {id(p) for p in expert_parameters(self.module)}
        replicated = [p for p in self.module.parameters() if p.requires_grad and id(p) not in own]
        meta = np.zeros(2 + len(replicated))
        meta[0], meta[1] = count, count * count
        meta[2:] = [p.grad is not None for p in replicated]
        self.comm.host_allreduce_(meta)
        if meta[0] * meta[0] != N * meta[1]:  # Σc² = (Σc)²/N only when every c is the same
            raise ValueError(f"ExpertParallel.sync_gradients: the ranks' batches differ in size (this rank: {count} "
                             f"samples, {meta[0]:g} in all over {N} ranks); give every rank an equal slice")
        present = meta[2:] > 0
        sent = 0
        kinds = {}
        for p, here in zip(replicated, present):
            if here:
                kinds.setdefault((p.dtype.str, p.device), []).append(p)
        for group in kinds.values():
            with backend.using(group[0].device):
                xp = group[0].xp
                flat = xp.concatenate([(p.grad.array if p.grad is not None else xp.zeros(p.shape, p.dtype)).reshape(-1)
                                       for p in group])
                self.comm.allreduce_(flat)
                flat *= 1.0 / N
                sent += flat.nbytes
                offset = 0
                for p in group:
                    p.grad = Tensor(flat[offset:offset + p.numel()].reshape(p.shape))
                    offset += p.numel()
        for _, layer in expert_layers(self.module):
            for local, rows in enumerate(layer.rows_seen):
                for p in layer.experts[str(layer.first + local)].parameters():
                    if rows == 0:  # ran on no row (only for the backward's exchange): no gradient, as in one process
                        p.grad = None
                    elif p.grad is not None:
                        p.grad = Tensor(p.grad.array * (1.0 / N))
            layer.rows_seen[:] = 0
        self.last_sync = {"allreduce_bytes": sent, "samples": int(meta[0])}

    # ------------------------------------------------------------ whole state: every expert, keyed as the plain model
    def consolidated_state_dict(self) -> dict:
        """The plain model's state dict: the replicated entries and every rank's experts (a collective)."""
        everyone = self.comm.allgather_object({k: backend.to_numpy(v) for k, v in self.module.state_dict().items()})
        return self._whole_order({k: v for state in everyone for k, v in state.items()},
                                 [list(state) for state in everyone])

    def _whole_order(self, merged: dict, keys_by_rank: list) -> dict:
        """``merged`` in the plain model's order: each MoE layer's experts where rank 0's first expert stands."""
        prefixes = [f"{name}.experts." if name else "experts." for name, _ in expert_layers(self.module)]
        out = {}
        for key in keys_by_rank[0]:
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if prefix is None:
                out[key] = merged[key]
            elif not any(k.startswith(prefix) for k in out):
                for keys in keys_by_rank:  # ranks hold the experts in order: rank r the r-th block
                    out.update({k: merged[k] for k in keys if k.startswith(prefix)})
        return out

    def _local(self, state) -> dict:
        """This rank's entries of a whole state (its experts and the replicated ones)."""
        mine = set(self.module.state_dict())
        return {k: v for k, v in state.items() if k in mine or not self._is_expert_key(k)}

    def _is_expert_key(self, key: str) -> bool:
        return any(key.startswith(f"{name}.experts." if name else "experts.") for name, _ in expert_layers(self.module))

    def check_state_dict(self, state, strict: bool = True):
        """What ``load_state_dict(state, strict)`` would raise or return; no change."""
        return self.module.check_state_dict(self._local(state), strict)

    def load_state_dict(self, state, strict: bool = True):
        """Load the plain model's whole state (as one process or :meth:`consolidated_state_dict` gives it):
        this rank keeps the replicated entries and its experts."""
        return self.module.load_state_dict(self._local(state), strict)

    def extra_repr(self) -> str:
        return f"rank={self.comm.rank}, size={self.comm.size}, backend={self.comm.name}"


class ExpertParallelOptimizer(ParallelOptimizer):
    """The optimizer of an :class:`ExpertParallel` model: ``step()`` synchronizes the gradients first (once).

    ``param_groups``, ``state`` and ``zero_grad`` are the wrapped optimizer's (this rank's parameters:
    the replicated ones and its experts). :meth:`clip_grad_norm_` clips to the plain model's global norm:
    the replicated gradients' squares once, the experts' added over the ranks (one all-reduce).
    """

    def __init__(self, optimizer, model: ExpertParallel):
        if not isinstance(model, ExpertParallel):
            raise TypeError(f"ExpertParallelOptimizer: model must be an ExpertParallel, got {type(model).__name__}")
        self.optimizer, self.model = optimizer, model
        self._synchronized = False

    def synchronize(self) -> None:
        if not self._synchronized:
            self.model.sync_gradients()
            self._synchronized = True

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("ExpertParallelOptimizer.step: a closure is not supported; call backward, then step()")
        self.synchronize()
        self.optimizer.step()
        self._synchronized = False

    def zero_grad(self, set_to_none: bool = True):
        self._synchronized = False
        self.optimizer.zero_grad(set_to_none)

    def grad_squares(self, params):
        """Σ ‖g‖² of ``params`` as the plain model holds them: the experts' squares added over the ranks."""
        from minidl.parallel.tensor_parallel import unsplit_grad_squares
        return unsplit_grad_squares(params, expert_parameters(self.model.module), self.model.comm)

    def clip_grad_norm_(self, max_norm: float):
        """Synchronize, then clip every gradient by the plain model's global norm; returns that norm."""
        from minidl.parallel.data_parallel import scale_to_norm_
        self.synchronize()
        params = self._own_params()
        return scale_to_norm_(params, self.grad_squares(params), float(max_norm))

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank found an inf or NaN (each unscales its own experts; a collective)."""
        flags = np.array([1.0 if found_inf else 0.0])
        self.model.comm.host_allreduce_(flags)
        return bool(flags[0] > 0)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def consolidated_state_dict(self) -> dict:
        """The state one process keeps for the plain model (its parameter order), every expert's (a collective)."""
        names = self._names()
        state = self.optimizer.state_dict()
        if len(state["param_groups"]) != 1:
            raise ValueError("ExpertParallelOptimizer.consolidated_state_dict: the optimizer has "
                             f"{len(state['param_groups'])} parameter groups; a whole state is written for one group")
        mine = {names[pos]: s for pos, s in state["state"].items()}
        everyone = self.model.comm.allgather_object((names, mine))
        whole_names = self._whole_names([n for n, _ in everyone])
        merged = {k: v for _, m in everyone for k, v in m.items()}
        group = dict(state["param_groups"][0], params=list(range(len(whole_names))))
        return {"state": {i: merged[n] for i, n in enumerate(whole_names) if n in merged}, "param_groups": [group]}

    def load_state_dict(self, state_dict) -> None:
        """Load a state as :meth:`consolidated_state_dict` (or one process with the plain model) gives it."""
        self.optimizer.load_state_dict(self._local(state_dict))

    def check_state_dict(self, state_dict) -> None:
        self.optimizer.check_state_dict(self._local(state_dict))

    def _local(self, state_dict) -> dict:
        names = self._names()
        whole_names = self._whole_names(self.model.comm.allgather_object(names))
        position = {n: i for i, n in enumerate(names)}
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(whole_names):
            raise ValueError(f"ExpertParallelOptimizer.load_state_dict: expected one parameter group of the plain "
                             f"model's {len(whole_names)} parameters, got groups of "
                             f"{[len(g['params']) for g in groups]}")
        state = {position[n]: s for i, n in enumerate(whole_names) if n in position
                 for s in [state_dict["state"].get(i)] if s is not None}
        return {"state": state, "param_groups": [dict(groups[0], params=list(range(len(names))))]}

    def _names(self) -> list:
        """The names of this rank's optimizer's parameters, in its order."""
        by_id = {id(p): n for n, p in self.model.module.named_parameters()}
        return [by_id[id(p)] for p in self._own_params()]

    def _whole_names(self, names_by_rank: list) -> list:
        """The plain model's parameter names in order (each MoE layer's experts in rank order)."""
        return list(self.model._whole_order({n: n for names in names_by_rank for n in names}, names_by_rank))

    def __repr__(self):
        return f"ExpertParallelOptimizer({self.optimizer!r})"
