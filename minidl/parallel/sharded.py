"""ZeRO stages 2 and 3: gradients, and then the parameters too, sharded across the ranks.

Plain data parallelism keeps on every rank Ψ parameters, Ψ gradients and the
optimizer's state for Ψ parameters (K bytes each: 8 for Adam's m and v in
float32). ZeRO (Rajbhandari et al., 2020) removes the copies, one kind at a
time; with N ranks, the bytes per rank are

    stage 0 (DataParallel):   (p + g + K) Ψ
    stage 1 (optimizer):      (p + g) Ψ + K Ψ/N
    stage 2 (+ gradients):    p Ψ + (g + K) Ψ/N
    stage 3 (+ parameters):   (p + g + K) Ψ/N

with p and g the bytes of one parameter and one gradient (the paper's mixed
precision: p = g = 2, K = 12). Here every parameter of a *unit* is laid out in
one flat vector of Ψ' = N·⌈Ψ/N⌉ entries (zeros pad the end), and rank r owns
the contiguous chunk r·Ψ'/N .. (r+1)·Ψ'/N: its *shard*.

    stage 2:  during the backward, as soon as a unit's gradients are final:
              g_r ← chunk r of Σ_s w_s·g_s       reduce-scatter: this rank's shard of the global gradient,
                                                  and the unit's full gradients freed
              shard ← optimizer(shard, g_r)       the optimizer holds state for Ψ'/N entries only
              w ← all-gather of the shards        every rank has every updated weight again
    stage 3:  between steps a rank keeps only its shard of the weights;
              before a unit's forward:  its weights ← all-gather of its shards
              after the unit's backward: its gradient reduce-scattered into the shard's gradient,
                                         its full weights and gradients freed

Units: stage 2's are buckets of consecutive parameters of about ``bucket_bytes``
(:func:`gradient_buckets`; a model smaller than a bucket is one unit), each
reduce-scattered as soon as the backward has finished its gradients (the uses
counted as :class:`~minidl.parallel.buckets.BucketsInBackward` counts them),
so the backward never holds the whole model's gradients. Stage 3 shards an
``nn.Sequential`` layer by layer (:func:`gather_units`: each layer with parameters
is a unit, and a nested ``Sequential`` larger than ``bucket_bytes`` is split into
its layers), so only the layers whose forward has started and whose backward has
not finished hold full weights. Every collective moves a unit in pieces of at most
``bucket_bytes`` (:mod:`minidl.parallel.flat`), so no flat copy of a unit's
gradient or weights sits beside them.
As in the paper, a unit's whole weights live only while it computes: freed
right after its forward, and gathered again when its backward first needs
them. The ops inside the unit record under saved-tensor hooks
(:class:`minidl.autograd.saved_tensors_hooks`) that pack each of the unit's
weights as its place in the unit rather than its values, and unpack it by
all-gathering the shards again; freeing storage is not a change of value, so
the weights keep their versions and the recorded graph stays valid. So only the
units whose forward or backward is running hold whole weights, and a step
all-gathers the weights twice: (N−1)/N·(g + 2p)Ψ bytes per rank, the paper's
3Ψ against data parallelism's 2Ψ (p = g). Inside a unit these hooks take the
place of any hooks around the model (``save_on_cpu``, ``save_as``).

The optimizer sees the shards: flat vectors. An elementwise optimizer updates each entry
exactly as on the whole model; the layer-wise ones read each parameter's norms through the
seam of :mod:`minidl.optim.layerwise` (:class:`ShardLayers` here: one all-reduce per norm),
SWATS completes its group sums the same way, and AdaHessian's Hessian probe runs before the
reduce-scatter (:meth:`ShardedDataParallel.probe_gradients`). Which optimizer needs what, and
what it costs per step: docs/parallelism.md, "Sharded data parallelism".

    model = parallel.ShardedDataParallel(model, comm, stage=3)
    opt = parallel.DistributedOptimizer(optim.Adam(model.parameters(), lr=1e-3), model)
    loss.backward(); opt.step()                   # reduce-scatter (stage 2), step, all-gather (stage 2)

Clipping by the global norm must add the squares of every rank's shard:
``opt.synchronize(); model.clip_grad_norm_(1.0); opt.step()`` (or
``opt.clip_grad_norm_(1.0)``, which the Trainer's ``max_grad_norm`` calls).
``nn.utils.clip_grad_norm_`` over ``parameters()`` would measure this rank's shards only.

Under autocast a unit's weights reach its ops through casts, graph nodes that depend on the
weights alone, so the backward walk may run them after the unit's boundary: a stage-3 forward
under autocast leaves each unit's reduce-scatter to ``sync_gradients``, after the backward
(stage 2's gradient memory for that step). ``whole_module()`` lends the wrapped module with its
whole weights (a collective at stage 3), for TensorBoard's histograms.

Checkpoints hold what one process saves: :meth:`ShardedDataParallel.consolidated_state_dict`
(the whole weights) and ``DistributedOptimizer.consolidated_state_dict()`` (each shard's
optimizer state all-gathered and cut into the parameters' shapes), so they load into one
process or into any number of ranks; ``load_state_dict`` of each cuts this rank's shard back out.
"""
from __future__ import annotations

import contextlib
import functools
import math

import numpy as np

from minidl.autocast_mode import is_autocast_enabled
from minidl.autograd import Function, is_grad_enabled, saved_tensors_hooks
from minidl.backend import using, xp_of
from minidl.nn.containers import Sequential
from minidl.nn.module import Module, Parameter
from minidl.optim.layerwise import Layers
from minidl.parallel import flat as flat_layout
from minidl.parallel.buckets import BackwardStarts, BucketsInBackward, UseCounter
from minidl.parallel.data_parallel import BUCKET_BYTES, DataParallel, clip_spread_grad_norm_, probing_optimizer
from minidl.parallel.whole_state import consolidate_shard_state, shard_optimizer_state
from minidl.tensor import Tensor, keep_version, mark_changed, version_of


class ShardLayers(Layers):
    """The layers of a shard (:class:`minidl.optim.layerwise.Layers`, the layer-wise optimizers' seam): which
    of the unit's parameters each element of this rank's shard belongs to.

    ``pieces`` are (k, start, stop): elements start..stop of this rank's shard belong to the unit's
    parameter k (a shard is a run of contiguous pieces, then the padding at the end of the unit), so for
    each of the unit's P parameters
        layer_norms(x)[k] = ‖x_k‖ = √( Σ_ranks Σ_{pieces of k} x[start:stop]·x[start:stop] )
    one all-reduce of a vector of P numbers (x's dtype) per norm; the padding enters no norm, and every
    rank holds all P (NovoGrad's v, one number per parameter of the unit, is the same on every rank).
    ``per_element(a)`` gives each element the value a[k] of its parameter (0 on the padding), so the
    inherited ``norm(x)`` is each element's parameter's norm; ``ndim`` is each element's parameter's own
    ndim (0 on the padding, which LARS then leaves alone); ``ndims`` the P ndims, on the host.
    ``dots(a, b)`` are this rank's terms of a sum over the group's elements (one per piece) and
    ``complete_sums_`` the all-reduce that adds a group's sums over the ranks (SWATS's pᵀp and pᵀg:
    the same all-reduce for every shard of one communicator, so a group of them completes its sums once).
    """

    def __init__(self, pieces, size: int, ndims, comm=None, xp=np):
        self.pieces, self.size, self.ndims, self.comm, self.xp = pieces, size, np.asarray(ndims), comm, xp
        if comm is not None:  # otherwise Layers' own: the sums as they are
            self.complete_sums_ = comm.allreduce_

    @classmethod
    def of(cls, unit: "FlatShard") -> "ShardLayers":
        first, pieces, offset = unit.comm.rank * unit.chunk, [], 0
        for k, size in enumerate(unit.sizes):
            start, stop = max(offset, first) - first, min(offset + size, first + unit.chunk) - first
            if start < stop:
                pieces.append((k, start, stop))
            offset += size
        return cls(pieces, unit.chunk, [len(s) for s in unit.shapes], unit.comm, unit.xp)

    @property
    def ndim(self):
        """Each element's parameter's ndim (0 on the padding), made when asked (LARS's step): kept, it would
        hold one int8 per element of the shard besides the shard itself."""
        return self.per_element(self.xp.asarray(self.ndims, dtype=np.int8))

    def layer_norms(self, x):
        xp = xp_of(x)
        squares = xp.zeros(len(self.ndims), x.dtype)
        for k, start, stop in self.pieces:
            piece = x[start:stop]
            squares[k] = piece.dot(piece)  # as np.linalg.norm squares a whole tensor
        if self.comm is not None:
            self.comm.allreduce_(squares)
        return xp.sqrt(squares)

    def per_element(self, values):
        out = xp_of(values).zeros(self.size, values.dtype)
        for k, start, stop in self.pieces:
            out[start:stop] = values[k]
        return out

    def dots(self, a, b):
        """Σ a[start:stop]·b[start:stop] of each piece: this rank's terms of a sum over the group's
        elements (the padding in none); :attr:`complete_sums_` adds the group's sums over the ranks."""
        return [(a[start:stop] * b[start:stop]).sum() for _, start, stop in self.pieces]

    def local(self) -> "ShardLayers":
        """The same layers without the all-reduces, on the host (a trial step on zeros: the state's shapes)."""
        return ShardLayers(self.pieces, self.size, self.ndims)


class ShardParameter(Parameter):
    """This rank's shard of a unit, as the optimizer sees it: a flat Parameter whose ``layers``
    (:class:`ShardLayers`, set here) say which of the unit's parameters each element belongs to, so the
    layer-wise optimizers (LARS, LAMB, NovoGrad, RangerLARS) take each parameter's norm and ndim, and
    SwitchOptimizer its sums over the group, as one process does."""

    def __init__(self, data, layers: ShardLayers):
        super().__init__(data)
        self.layers = layers


def _on_unit_device(method):
    """Run a :class:`FlatShard` method with the unit's GPU current: CuPy makes new arrays, and runs kernels,
    on the *current* GPU, so a model on cuda:1 in a process whose current GPU is 0 needs it."""
    @functools.wraps(method)
    def run(unit, *args, **kwargs):
        with using(unit.device):
            return method(unit, *args, **kwargs)
    return run


class FlatShard:
    """The parameters of one unit laid out flat (padded to N·⌈Ψ/N⌉), and this rank's chunk as a Parameter."""

    def __init__(self, params, comm, name: str, keep_full: bool, piece_bytes: int = BUCKET_BYTES):
        kinds = {(p.dtype.str, p.device) for p in params}
        if len(kinds) != 1:
            raise ValueError(f"ShardedDataParallel: the parameters of {name} must share one dtype and device to "
                             f"be laid out flat, got {sorted(kinds)}; convert the model with .to(dtype) first")
        self.device = params[0].device
        self._lay_out(params, comm, name, keep_full, piece_bytes)

    @_on_unit_device
    def _lay_out(self, params, comm, name: str, keep_full: bool, piece_bytes: int):
        self.params, self.comm, self.name = params, comm, name
        self.shapes = [tuple(p.shape) for p in params]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.numel = sum(self.sizes)
        self.chunk = -(-self.numel // comm.size)               # ⌈Ψ/N⌉
        self.padded = self.chunk * comm.size                  # Ψ'
        self.xp, self.dtype = params[0].xp, params[0].dtype
        # each collective moves the unit in pieces of at most piece_bytes (all ranks' parts together)
        self.piece_ranges = flat_layout.pieces(self.chunk, np.dtype(self.dtype).itemsize, piece_bytes, comm.size)
        full = self.xp.zeros(self.padded, self.dtype)
        self._pack(full, [p.array for p in params])
        mine = slice(comm.rank * self.chunk, (comm.rank + 1) * self.chunk)
        self.whole = True  # whether the parameters hold their whole values now
        layers = ShardLayers.of(self)
        if keep_full:  # stage 2: the weights live in one flat buffer; the shard is a view of this rank's chunk
            self.full = full
            self._point_params_at(full)
            self.shard = ShardParameter(full[mine], layers)
        else:          # stage 3: the shard is all this rank keeps
            self.full = None
            self.shard = ShardParameter(full[mine].copy(), layers)
            self.release()

    def _pack(self, out, arrays):
        offset = 0
        for array, size in zip(arrays, self.sizes):
            if array is None:
                out[offset:offset + size] = 0
            else:
                out[offset:offset + size] = array.reshape(-1)
            offset += size
        out[offset:] = 0
        return out

    def _point_params_at(self, full, changed=True):
        offset = 0
        for p_index, (p, shape, size) in enumerate(zip(self.params, self.shapes, self.sizes)):
            if changed:
                p.array = full[offset:offset + size].reshape(shape)
            else:  # the same values again (see unpack): not an in-place change, so the version at release
                p._data = full[offset:offset + size].reshape(shape)
                keep_version(p, self.released_versions[p_index])
            offset += size

    @_on_unit_device
    def gather(self, changed: bool = True) -> None:
        """Every rank's shard, all-gathered: the unit's parameters whole again (``changed=False``: the
        values they had when freed, so their versions stay).

        Piece by piece (:func:`minidl.parallel.flat.pieces`): piece [a, b) of every rank's chunk is
        all-gathered and written where those elements live, so besides the whole weights only one
        piece's buffer is held (stage 2 gathers into the buffer the weights already live in).
        """
        full = self.full if self.full is not None else self.xp.empty(self.padded, self.dtype)
        by_rank = full.reshape(self.comm.size, self.chunk)
        shard = self.shard.array
        for start, stop in self.piece_ranges:
            by_rank[:, start:stop] = self.comm.allgather(self.xp.ascontiguousarray(shard[start:stop]))
        if self.full is not None:  # stage 2: the shard is a view of the same buffer
            mark_changed(*self.params)
        else:
            self._point_params_at(full, changed)
        self.whole = True

    @_on_unit_device
    def release(self, keep_grads: bool = False) -> None:
        """Free the whole parameters (stage 3): each keeps an empty array until the next gather.

        Storage is freed, no value changes: the parameters keep their versions, so a graph
        recorded with them still runs its backward (which gathers them again: :meth:`unpack`).
        Their gradients are dropped too, unless ``keep_grads`` (they wait for a reduction
        after the backward: see ``ShardedDataParallel``'s notes on autocast).
        """
        empty = self.xp.empty(0, self.dtype)
        # each weight's version, for the buffer that holds the same values again (a freed buffer's id
        # may be reused by one stamped later, which would read as a change of these weights)
        self.released_versions = [version_of(p) for p in self.params]
        for p in self.params:
            p._data = empty  # not .array =, which would count as an in-place change
            if not keep_grads:
                p.grad = None
        self.whole = False

    # saved-tensor hooks of the unit's forward: a weight is saved as its place, not its values
    def pack(self, tensor):
        for index, p in enumerate(self.params):
            if tensor is p:
                return (self, index)
        return tensor

    def unpack(self, packed):
        if type(packed) is tuple and packed[0] is self:
            if not self.whole:  # the first of the unit's ops to run backward: gather the unit again
                self.gather(changed=False)
            return self.params[packed[1]]._data
        return packed

    @_on_unit_device
    def reduce_gradients(self, weight: float):
        """This rank's chunk of Σ_s weight_s · (gradients of rank s), reduce-scattered; frees the full gradients.

        Piece by piece, without a flat copy of the unit's gradient: for each piece [a, b) the send
        buffer holds elements r·chunk + a .. r·chunk + b of the weighted flat gradient for every
        rank r (read from the gradients where they live, :func:`minidl.parallel.flat.read_range`),
        and the reduce-scatter hands rank r the sum of its own run. The same elements and bytes
        as one reduce-scatter of the whole flat vector.
        """
        grads = [None if p.grad is None else p.grad.array for p in self.params]
        for p in self.params:
            p.grad = None
        out = None if len(self.piece_ranges) == 1 else self.xp.empty(self.chunk, self.dtype)
        for start, stop in self.piece_ranges:
            send = self.xp.empty((self.comm.size, stop - start), self.dtype)
            for rank in range(self.comm.size):
                flat_layout.read_range(grads, self.sizes, rank * self.chunk + start, send[rank], weight)
            if stop == self.chunk:
                grads = None  # the last piece is read: the full gradients go before its collective
            summed = self.comm.reduce_scatter(send.reshape(-1))
            del send
            if out is None:
                out = summed
            else:
                out[start:stop] = summed
        return out

    @_on_unit_device
    def zeros(self, shape):
        """Zeros of ``shape`` in the unit's dtype, on its device."""
        return self.xp.zeros(shape, self.dtype)

    def nbytes(self) -> int:
        return self.padded * np.dtype(self.dtype).itemsize

    # checkpoints: the unit's flat arrays (an optimizer's moments) to and from per-parameter arrays
    @_on_unit_device
    def split_gathered(self, chunk) -> list:
        """This rank's ``chunk`` of a flat array of the unit, all-gathered and cut into one array per
        parameter, of its shape (a collective)."""
        flat = self.comm.allgather(self.xp.ascontiguousarray(self.xp.asarray(chunk))).reshape(-1)  # (saved on host)
        out, offset = [], 0
        for shape, size in zip(self.shapes, self.sizes):
            out.append(flat[offset:offset + size].reshape(shape).copy())
            offset += size
        return out

    @_on_unit_device
    def my_chunk(self, arrays):
        """This rank's chunk of the unit's per-parameter ``arrays`` laid out flat (zeros pad the end)."""
        xp = self.xp
        flat = xp.zeros(self.padded, np.result_type(*[a.dtype for a in arrays]))
        self._pack(flat, [xp.asarray(a) for a in arrays])
        return flat[self.comm.rank * self.chunk:(self.comm.rank + 1) * self.chunk].copy()

    @_on_unit_device
    def take_whole_weights(self) -> None:
        """Copy the parameters' whole values (just loaded) into the shard; stage 3 frees them again."""
        if self.full is not None:  # stage 2: the parameters are views of the buffer the shard is a view of
            mark_changed(self.shard)
            return
        self.shard.array[...] = self.my_chunk([p.array for p in self.params])
        mark_changed(self.shard)
        self.release()


class _UnitBoundary(Function):
    """y = x (the unit's input, passed on);  dx = dy,  d(shard) = this rank's chunk of the unit's gradient.

    Placed at a stage-3 unit's input with the unit's shard as a second input:
    its backward runs when the unit's backward is done, reduce-scatters the
    unit's gradients into the shard's gradient and frees the whole weights.

    With ``deferred`` (a forward under autocast) it passes ``dy`` on and nothing more: the
    unit's weights then reach its ops through casts, graph nodes of their own that depend on
    the weights only, and the walk may run them after this one; their gradients are reduced
    after the backward, by :meth:`ShardedDataParallel.sync_gradients`.

    Tangent: ẏ = ẋ. The shard reaches y only through the unit's whole weights, which are
    gathered outside the graph, so a tangent of the shard does not reach ẏ here: forward
    mode through a stage-3 unit carries the input's tangent, not the parameters'.
    """

    def __init__(self, unit: FlatShard, owner: "ShardedDataParallel", deferred: bool = False):
        self.unit, self.owner, self.deferred = unit, owner, deferred

    def forward(self, x, shard):
        return x.view()

    def backward(self, gy):
        gx = gy if self.inputs[0].requires_grad else None
        if self.deferred:
            return gx, None
        shard_grad = Tensor(self.unit.reduce_gradients(self.owner.gradient_weight))
        self.unit.release()
        return gx, shard_grad

    def jvp(self, dx, dshard):
        return dx


def gradient_buckets(params, bucket_bytes: int) -> list[list[int]]:
    """Stage 2's units: runs of consecutive parameter indices of about ``bucket_bytes`` each, cut from the last
    parameter back (the order the backward finishes them), each run in forward order. A parameter larger
    than ``bucket_bytes`` is a run of its own."""
    runs, run, used = [], [], 0
    for index in range(len(params) - 1, -1, -1):
        nbytes = params[index].array.nbytes
        if run and used + nbytes > bucket_bytes:
            runs.append(run[::-1])
            run, used = [], 0
        run.append(index)
        used += nbytes
    if run:
        runs.append(run[::-1])
    return runs[::-1]


def gather_units(module: Sequential, bucket_bytes: int, prefix: str = "") -> list:
    """Stage 3's units, (name, layer) in forward order: each layer of the ``Sequential``; a layer that is itself
    a ``Sequential`` holding more than ``bucket_bytes`` of parameters is split into its own layers (recursively),
    so that one block does not set every rank's whole-weights peak. A single layer is never split: its op
    needs its whole weight (cutting a weight is tensor parallelism)."""
    units = []
    for index, layer in enumerate(module):
        name = f"{prefix}{index}"
        if isinstance(layer, Sequential) and sum(p.array.nbytes for p in layer.parameters()) > bucket_bytes:
            units.extend(gather_units(layer, bucket_bytes, f"{name}."))
        else:
            units.append((name, layer))
    return units


def add_shard_gradient(unit: "FlatShard", summed) -> None:
    """shard.grad += this backward's reduce-scattered chunk (the first one: becomes the gradient)."""
    if unit.shard.grad is None:
        unit.shard.grad = Tensor(summed)
    else:
        unit.shard.grad = Tensor(unit.shard.grad.array + summed)


class _ShardStep(BucketsInBackward):
    """Stage 2's backward: each unit (one bucket of parameters) is reduce-scattered into its shard's gradient,
    with this forward's weight, as soon as its parameters' gradients are final, and the full gradients are
    freed (:meth:`FlatShard.reduce_gradients`): the backward holds one unit's full gradients beyond those
    still being computed, not the whole model's. Several backwards before one sync add their chunks."""

    def __init__(self, owner: "ShardedDataParallel", params, uses):
        units = owner._shard_units()
        plan, first = [], 0
        for unit in units:
            plan.append([(first + k, 0) for k in range(len(unit.params))])
            first += len(unit.params)
        super().__init__(params, uses, plan)
        self.owner, self.units, self.weight = owner, units, owner.gradient_weight

    def start(self, b: int) -> None:
        unit = self.units[b]
        add_shard_gradient(unit, unit.reduce_gradients(self.weight))


class ShardedDataParallel(DataParallel):
    """Data parallelism with ZeRO stage 2 or 3: ``ShardedDataParallel(module, comm=None, stage=3, reduction="mean",
    bucket_bytes=25 MB)``; ``bucket_bytes`` is the size of stage 2's units (reduce-scattered during the backward),
    of the blocks stage 3 splits (:func:`gather_units`), and the most any one collective moves.

    ``parameters()`` are the shards (flat vectors, one per unit, each a :class:`ShardParameter`):
    give them to an optimizer and wrap it in :class:`DistributedOptimizer`,
    whose ``step()`` calls :meth:`sync_gradients` and :meth:`after_step`.
    Starts like :class:`DataParallel` (rank 0's weights everywhere, the same
    architecture checked on every rank). ``gather_parameters()`` puts the
    whole weights back into the wrapped model (a collective), for saving or
    comparing; ``memory_report()`` measures what this rank holds.
    """

    shards_gradients = True  # the optimizer sees flat shards: clipping adds their squares over the ranks

    def __init__(self, module: Module, comm=None, stage: int = 3, reduction: str = "mean",
                 bucket_bytes: int = BUCKET_BYTES):
        if stage not in (2, 3):
            raise ValueError(f"ShardedDataParallel: stage must be 2 (gradients and optimizer state sharded) or 3 "
                             f"(parameters too), got {stage!r}; for stage 1 use ZeroRedundancyOptimizer")
        if stage == 3 and not isinstance(module, Sequential):
            raise TypeError(f"ShardedDataParallel(stage=3) shards an nn.Sequential layer by layer, got "
                            f"{type(module).__name__}; put the model's blocks in an nn.Sequential, or use stage=2")
        super().__init__(module, comm, bucket_bytes=bucket_bytes, reduction=reduction)
        self.stage, self.gradient_weight = stage, 1.0 / self.comm.size
        self._deferred = False  # stage 3 under autocast: the units' gradients wait for sync_gradients
        self._keep_graph = False  # an optimizer probes the gradients' graph (AdaHessian): see check_optimizer
        self._shard_step = None  # stage 2: this backward's buckets (units) reduce-scattered as they finish
        if stage == 2:
            params = [p for p in module.parameters() if p.requires_grad]
            kinds = {(p.dtype.str, p.device) for p in params}
            if len(kinds) > 1:
                raise ValueError(f"ShardedDataParallel: the parameters of {type(module).__name__} must share one dtype "
                                 f"and device to be laid out flat, got {sorted(kinds)}; convert the model with "
                                 ".to(dtype) first")
            self.units = [(None, FlatShard([params[i] for i in run], self.comm,
                                           f"{type(module).__name__} parameters {run[0]}..{run[-1]}", keep_full=True,
                                           piece_bytes=bucket_bytes))
                          for run in gradient_buckets(params, bucket_bytes)]
        else:
            self.units = []
            for name, layer in gather_units(module, bucket_bytes):
                params = [p for p in layer.parameters() if p.requires_grad]
                shard = FlatShard(params, self.comm, f"layer {name} ({type(layer).__name__})",
                                  keep_full=False, piece_bytes=bucket_bytes) if params else None
                self.units.append((layer, shard))

    # ------------------------------------------------------------ what the optimizer sees
    def named_parameters(self, prefix: str = "", recurse: bool = True):
        for index, (_, unit) in enumerate(self.units):
            if unit is not None:
                yield f"{prefix}shard{index}", unit.shard

    # ------------------------------------------------------------ forward
    def forward(self, x, *args, **kwargs):
        grad_step = self.training and is_grad_enabled()
        if grad_step:
            self._count_samples(x)
        if self.stage == 2:
            if not grad_step or self._keep_graph:  # the sync reduce-scatters (AdaHessian probes the whole first)
                return self.module(x, *args, **kwargs)
            return self._forward_reducing_in_backward(x, *args, **kwargs)
        keep_whole = grad_step and self._keep_graph
        deferred = grad_step and (is_autocast_enabled() or keep_whole)
        self._deferred = self._deferred or deferred
        for layer, unit in self.units:
            if unit is None:
                x = layer(x)
                continue
            unit.gather()
            if grad_step:
                if not isinstance(x, Tensor):
                    x = Tensor(x)
                x = _UnitBoundary(unit, self, deferred)(x, unit.shard)
                if keep_whole:  # a second backward follows: plain saved values, whole weights until the sync
                    x = layer(x)
                    continue
                with saved_tensors_hooks(unit.pack, unit.unpack):  # the weights saved as places, not values
                    x = layer(x)
            else:
                x = layer(x)
            unit.release(keep_grads=self._deferred)  # freed until its backward (or the next forward) gathers it
        return x

    def _forward_reducing_in_backward(self, x, *args, **kwargs):
        """Stage 2's forward, counting each parameter's uses, so that its backward reduce-scatters each unit (a
        bucket of about ``bucket_bytes``) as soon as its gradients are final and frees them (:class:`_ShardStep`)."""
        params = [p for unit in self._shard_units() for p in unit.params]
        counter = UseCounter({id(p): i for i, p in enumerate(params)})
        previous, self._shard_step = self._shard_step, None
        merge = previous is not None and not previous.opened  # two forwards, then one backward: count both
        if merge:
            counter.uses = list(previous.uses)
        elif previous is not None:  # gradient accumulation: its backward is over; its units go into the shards'
            previous.start_the_rest()  # gradients with its own weight, and this backward's add to them
        with counter:
            out = self.module(x, *args, **kwargs)
        self._shard_step = _ShardStep(self, params, counter.uses)
        if merge:
            previous.merged_into = self._shard_step
        if isinstance(out, Tensor) and out.requires_grad:
            out = BackwardStarts(self._shard_step)(out)
        return out

    def _count_samples(self, x):
        """The weight of this rank's gradient, n_r / Σ_s n_s (a small host all-reduce of the counts)."""
        try:
            count = len(x)
        except TypeError:
            self.gradient_weight = 1.0 / self.comm.size
            return
        if self.reduction == "sum":
            self.gradient_weight = 1.0
            return
        counts = np.array([count], np.float64)
        self.comm.host_allreduce_(counts)
        self.gradient_weight = count / float(counts[0])

    # ------------------------------------------------------------ the step
    def sync_gradients(self, num_samples: int | None = None) -> None:
        """Stage 2: reduce-scatter the buckets the backward left (those its last node finished) into their shards'
        gradients (all of them after a forward that kept the graph); stage 3 did it during backward, except after
        a forward under autocast: then each unit's, here, and its weights freed."""
        if num_samples is not None and self._shard_step is not None:
            raise ValueError("ShardedDataParallel.sync_gradients: stage 2 reduce-scatters its buckets during the "
                             "backward, weighted by the forward pass's sample counts; num_samples cannot change them")
        if num_samples is not None:
            counts = np.array([num_samples], np.float64)
            self.comm.host_allreduce_(counts)
            self.gradient_weight = num_samples / float(counts[0])
        if self.stage == 2:
            step, self._shard_step = self._shard_step, None
            if step is not None:  # the units whose backward finished are reduced already
                step.start_the_rest()
            else:
                for unit in self._shard_units():
                    add_shard_gradient(unit, unit.reduce_gradients(self.gradient_weight))
        elif self._deferred:
            self._deferred = False
            for unit in self._shard_units():
                unit.shard.grad = Tensor(unit.reduce_gradients(self.gradient_weight))
                unit.release()

    def probe_gradients(self, probe, params=None) -> None:
        """An optimizer's probe of the gradients' graph (AdaHessian), before they are reduce-scattered.

        z is drawn for the units' whole parameters, in the order one process draws them (the wrapped
        model's parameters that have a gradient on some rank; ``params``, the shards, are not what it
        probes); Hz is summed over the ranks with the gradients' weights (an all-reduce of Ψ numbers,
        :meth:`DataParallel.weighted_sum_over_replicas`), so |z ⊙ Hz| and a convolution kernel's
        spatial average see whole parameters; ``place`` then lays D out flat as the unit's parameters
        are and hands each shard this rank's chunk of it. Stage 3 holds the whole weights from the
        forward until here (see :meth:`check_optimizer`).
        """
        units = self._shard_units()
        whole = [p for unit in units for p in unit.params]
        flags = np.array([p.grad is not None for p in whole], np.float64)
        self.comm.host_allreduce_(flags)
        present = [p for p, here in zip(whole, flags > 0) if here]
        weight = self.gradient_weight

        def place(diagonals):
            of = {id(p): d for p, d in zip(present, diagonals)}
            return [(unit.shard, unit.my_chunk([of.get(id(p)) if id(p) in of else unit.zeros(shape)
                                                for p, shape in zip(unit.params, unit.shapes)]))
                    for unit in units]

        probe(present, lambda arrays: self.weighted_sum_over_replicas(arrays, weight), place)

    def after_step(self) -> None:
        """Stage 2: all-gather the updated shards (stage 3 gathers each unit before its next forward)."""
        if self.stage == 2:
            for unit in self._shard_units():
                unit.gather()

    def gather_parameters(self) -> None:
        """Whole weights in the wrapped model on every rank (a collective); stage 3 frees them at the next step."""
        for _, unit in self.units:
            if unit is not None:
                unit.gather()

    @contextlib.contextmanager
    def whole_module(self):
        """``with model.whole_module() as module:`` the wrapped module with its whole weights, to read
        them or to run it alone (TensorBoard's histograms; a collective at stage 3, where every rank
        enters it: the units are all-gathered on entry and freed again on exit)."""
        if self.stage == 3:
            self.gather_parameters()
        try:
            yield self.module
        finally:
            self._release_whole()

    # ------------------------------------------------------------ checkpoints
    # A checkpoint holds what one process would save: the whole weights (state_dict after
    # gather_parameters) and the optimizer state per parameter, so it loads into one process
    # or into any number of ranks. Each conversion is a collective: every rank calls it.
    def consolidated_state_dict(self) -> dict:
        """The wrapped model's whole weights (a collective; stage 3 frees them again afterwards)."""
        self.gather_parameters()
        state = self.module.state_dict()
        if self.stage == 3:
            for _, unit in self.units:
                if unit is not None:
                    unit.release()
        return state

    def check_state_dict(self, state, strict: bool = True):
        """What ``load_state_dict(state)`` would raise or return, checked against the whole shapes (a collective)."""
        self.gather_parameters()
        try:
            return self.module.check_state_dict(state, strict)
        finally:
            self._release_whole()

    def load_state_dict(self, state, strict: bool = True):
        """Load whole weights (as one process saves them) and cut this rank's shards from them (a collective)."""
        self.gather_parameters()
        try:
            result = self.module.load_state_dict(state, strict)
        except BaseException:
            self._release_whole()
            raise
        for _, unit in self.units:
            if unit is not None:
                unit.take_whole_weights()
        return result

    def _release_whole(self):
        if self.stage == 3:
            for _, unit in self.units:
                if unit is not None:
                    unit.release()

    def _shard_units(self):
        return [unit for _, unit in self.units if unit is not None]

    def consolidate_optimizer_state(self, state_dict: dict, layer_state=()) -> dict:
        """An optimizer's state over the shards -> the state one process keeps per parameter (a collective):
        :func:`minidl.parallel.whole_state.consolidate_shard_state` of this model's units."""
        return consolidate_shard_state(self._shard_units(), list(self.module.named_parameters()), state_dict,
                                       layer_state)

    def shard_optimizer_state(self, state_dict: dict, layer_state=()) -> dict:
        """The per-parameter state one process keeps -> this rank's state over the shards (no communication):
        :func:`minidl.parallel.whole_state.shard_optimizer_state` of this model's units."""
        return shard_optimizer_state(self._shard_units(), list(self.module.named_parameters()), state_dict, layer_state)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the global norm of the gradient, whose pieces are spread over the ranks (a collective).

        ‖g‖² = Σ_ranks Σ (this rank's shard of g)²; then every shard is scaled by
        min(1, max_norm / (‖g‖ + 1e-6)), PyTorch's rule, as one process clipping the whole gradient.
        Call it after ``DistributedOptimizer.synchronize()`` (``nn.utils.clip_grad_norm_`` over
        ``parameters()`` would see this rank's shards only). Returns ‖g‖ before clipping.
        """
        shards = [u.shard for _, u in self.units if u is not None]
        return clip_spread_grad_norm_(shards, self.comm, max_norm, "ShardedDataParallel.clip_grad_norm_")

    def check_optimizer(self, optimizer) -> None:
        """Called by :class:`DistributedOptimizer`: every optimizer runs on the shards; this notes the one
        that probes the gradients' graph.

        Elementwise optimizers run on the flat shards as they are; the layer-wise ones (LARS, LAMB,
        NovoGrad, RangerLARS) take each parameter's norm from the shards' :class:`ShardLayers`, and
        SwitchOptimizer its group-wide sums pᵀp and pᵀg (``dots``, ``complete_sums_``).
        One that probes the gradients' graph (AdaHessian's ``probe``: a second backward through
        the whole weights) gets it through :meth:`probe_gradients`; at stage 3 each unit then
        keeps its whole weights from its forward until the step's reduce-scatter (the second
        backward needs them, and values the saved-tensor hooks packed carry no graph): during a
        step a rank holds the whole parameters, pΨ as at stage 2, and the shards only between steps.
        """
        if probing_optimizer(optimizer) is not None:
            self._keep_graph = True

    # ------------------------------------------------------------ memory
    def memory_report(self, optimizer=None) -> dict:
        """Bytes this rank holds now: parameters (whole and shards, each buffer once), gradients, optimizer state."""
        seen, params, grads = set(), 0, 0
        tensors = [p for p in self.module.parameters()] + [u.shard for _, u in self.units if u is not None]
        for t in tensors:
            params += _new_bytes(t.array, seen)
            if t.grad is not None:
                grads += _new_bytes(t.grad.array, seen)
        state = 0
        if optimizer is not None:
            inner = getattr(optimizer, "optimizer", optimizer)
            arrays = [v.array if isinstance(v, Tensor) else v for s in inner.state.values() for v in s.values()]
            state = sum(_new_bytes(a, seen) for a in arrays if getattr(a, "ndim", 0) > 0)  # not step counters
        return {"stage": self.stage, "rank": self.comm.rank, "size": self.comm.size, "parameter_bytes": params,
                "gradient_bytes": grads, "optimizer_bytes": state, "total_bytes": params + grads + state,
                "elements": sum(u.numel for _, u in self.units if u is not None),
                "padded_elements": sum(u.padded for _, u in self.units if u is not None)}

    def extra_repr(self) -> str:
        return f"stage={self.stage}, rank={self.comm.rank}, size={self.comm.size}, units={len(self.units)}"


def _new_bytes(array, seen: set) -> int:
    """``array``'s bytes the first time its memory is seen (views of a seen buffer count nothing)."""
    base = array
    while getattr(base, "base", None) is not None:
        base = base.base
    key = id(base)
    if key in seen:
        return 0
    seen.add(key)
    return int(base.nbytes)
