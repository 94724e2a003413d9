"""DataParallel: replicate the model, split the batch, all-reduce the gradients.

Every rank holds a full copy of the model and computes the gradient of its
own slice of the global batch. One all-reduce then gives every rank the same
global gradient, so the same optimizer step keeps the copies identical:

    start:  w ← w of rank 0                          (broadcast: one model, N copies)
    step:   g_r = ∇ mean-loss on rank r's n_r samples
            g   = Σ_r (n_r / Σ_s n_s) · g_r           (all-reduce of the weighted gradients)
            w  ← optimizer(w, g)                      (the same update on every rank)

With equal slices the weight is 1/N. With unequal slices (a global batch
that does not divide by N) the weights n_r/B make g exactly the gradient of
the mean loss over the whole batch, which is what one process computes.

How the all-reduce is done: the gradients are packed, in the fixed order of
``model.parameters()``, into flat buckets of about 25 MB (one per dtype and
device), each bucket is all-reduced in one call, and the sums are unpacked
into new gradient Tensors (views of a bucket allocated for this step; no
gradient buffer is ever written in place). Buckets turn hundreds of small
messages, each paying the latency α, into a few large ones that run at the
network's bandwidth.

With ``overlap=True`` the buckets travel during the backward pass instead
(Li et al. 2020, "PyTorch Distributed", section 3.2.3). The forward pass
counts (:mod:`minidl.parallel.buckets`) how many recorded ops use each parameter; the
backward walk then counts them down (the same hook, after each node's
backward) and a parameter whose count reaches zero has its final gradient.
As soon as every parameter of a bucket is final, the bucket is packed and a
non-blocking all-reduce starts (``iallreduce_``: ``MPI_Iallreduce``, or NCCL
on a stream of its own), while backward goes on with the layers below;
``sync_gradients()`` starts whatever is left and waits. Buckets fill in the
order gradients arrive, last layer first, so the plan is in reverse
parameter order. Each packed gradient is then dropped: the bucket,
summed in place, holds it, so the backward holds every gradient once plus the
bucket being packed, never a flat copy of all of them (without overlap the
packing follows the backward, and the largest bucket is a copy beside every
gradient). Several backwards before one sync (gradient accumulation) each send
their buckets, weighted by their own forward's counts, and the sync adds the
sums. The sums are the same numbers as without overlap. On the
CPU the gain is small: MPI advances a non-blocking collective mostly when it
is called, and NumPy and MPI share the process's one thread.

Known limits of the equivalence: BatchNorm normalizes with each rank's own
slice statistics (as in PyTorch's DDP without SyncBatchNorm); dropout draws
from each rank's generator; a loss that is not a mean over samples needs
``reduction="sum"``.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import enable_grad, is_grad_enabled
from minidl.backend import using, using_array, xp_of
from minidl.nn.module import Module, WrapsModule
from minidl.optim.wrapper import WrapsOptimizer
from minidl.parallel.buckets import BackwardStarts, BucketsInBackward, UseCounter
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer, grad_squares, sum_numbers_
from minidl.tensor import Tensor, mark_changed

BUCKET_BYTES = 25 * 2**20  # about 25 MB per all-reduce call, as PyTorch's DDP


class DataParallel(WrapsModule, ParallelModule):
    """Wrap ``module`` so that its gradients can be averaged over every rank of ``comm``.

    At construction the model's architecture is compared across ranks (a
    mismatch raises on every rank, naming the first differences) and all
    parameters and buffers are overwritten with rank 0's. After each
    ``loss.backward()`` call :meth:`sync_gradients` (or use
    :class:`DistributedOptimizer`, which does it inside ``step()``).

    Args:
        module: the model (already on ``comm.device`` for NCCL).
        comm: a Communicator; ``parallel.init()`` by default.
        bucket_bytes: the size of one all-reduce message.
        reduction: ``"mean"`` (the loss is a mean over samples: gradients are
            averaged, weighted by sample counts) or ``"sum"`` (they are summed).
        overlap: all-reduce each bucket during the backward pass, as soon as its
            gradients are final (see the module docstring); the same numbers.

    The forward pass counts the samples of each call (the first argument's
    length) while training, for the weights; ``sync_gradients(num_samples=n)``
    overrides the count. ``state_dict()`` has the wrapped model's keys, without a prefix.
    """

    shards_gradients = False  # each rank holds every parameter's whole gradient (ZeRO-2/3: shards of them)

    def __init__(self, module: Module, comm=None, bucket_bytes: int = BUCKET_BYTES, reduction: str = "mean",
                 overlap: bool = False):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: expected a minidl Module, got {type(module).__name__}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"DataParallel: reduction must be 'mean' or 'sum', got {reduction!r}")
        if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"DataParallel: bucket_bytes must be a positive int, got {bucket_bytes!r}")
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        self.module = module
        self.comm, self.bucket_bytes, self.reduction = comm, bucket_bytes, reduction
        self.overlap = bool(overlap)
        self._overlap_step = None   # the buckets in flight of this step (overlap=True)
        self._carried_steps = []    # earlier backwards of this step, before the sync (accumulation, overlap=True)
        self.samples_seen = 0       # samples since the last sync (this rank)
        self.last_sync = {}         # what the last sync_gradients did: buckets, bytes, weight
        self._plan_key, self._plan = None, []
        check_same_model(module, comm)
        self.broadcast_state()

    # ------------------------------------------------------------ the model's own view
    def forward(self, *args, **kwargs):
        samples = 0
        if args and self.training and is_grad_enabled():
            try:
                samples = len(args[0])
            except TypeError:
                pass  # an input without a length: weights fall back to 1/N
            self.samples_seen += samples
        if not (self.overlap and self.training and is_grad_enabled()):
            return self.module(*args, **kwargs)
        params = self._trainable()
        counter = UseCounter({id(p): i for i, p in enumerate(params)})
        previous, self._overlap_step = self._overlap_step, None
        merge = previous is not None and not previous.opened  # two forwards, then one backward: count both
        if merge:
            counter.uses, samples = list(previous.uses), samples + previous.samples
        elif previous is not None:  # gradient accumulation: its backward is over, all its gradients final
            previous.close()
            if any(p.grad is not None and p.grad.requires_grad for p in params):
                pass  # gradients with a graph stay in the parameters and add up; the sync sends their sum
            else:  # each backward sends its own buckets, with its own weights; the sync adds the sums
                previous.start_the_rest()
                self._carried_steps.append(previous)
        with counter:
            out = self.module(*args, **kwargs)
        self._overlap_step = _OverlapStep(self, params, counter.uses, samples)
        if merge:
            previous.merged_into = self._overlap_step
        if isinstance(out, Tensor) and out.requires_grad:
            out = BackwardStarts(self._overlap_step)(out)
        return out

    def train_step(self, x, y, loss_fn, *, loss_scale: float = 1.0, autocast=None):
        """The wrapped module's own step (a pipeline's: see :class:`~minidl.parallel.protocol.ParallelModule`),
        its samples counted for the gradients' weights as :meth:`forward` counts them."""
        self.samples_seen += len(x)
        return super().train_step(x, y, loss_fn, loss_scale=loss_scale, autocast=autocast)

    def sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        """``values`` (a host array: running sums of losses and counts) added over the ranks, a new array;
        the Trainer's records use it, so the training loss they log is the global batch's (a collective)."""
        return self.comm.host_allreduce_(np.array(values, dtype=np.float64))

    def extra_repr(self) -> str:
        return f"rank={self.comm.rank}, size={self.comm.size}, backend={self.comm.name}"

    # ------------------------------------------------------------ start: one model everywhere
    def broadcast_state(self, root: int = 0) -> None:
        """Overwrite every parameter and buffer with rank ``root``'s values (in place)."""
        broadcast_module_state(self.module, self.comm, root)

    # ------------------------------------------------------------ after backward: one gradient everywhere
    def sync_gradients(self, num_samples: int | None = None) -> None:
        """All-reduce the gradients: afterwards every rank holds the global batch's gradient.

        A parameter without a gradient on some rank counts as zero there; one
        without a gradient on every rank keeps ``grad = None`` (so the optimizer
        skips it, as one process would).
        """
        if self._overlap_step is not None:
            if num_samples is not None:
                raise ValueError("DataParallel.sync_gradients: with overlap=True the gradients were weighted by the "
                                 "forward pass's sample counts while backward ran; num_samples cannot change them")
            step, self._overlap_step = self._overlap_step, None
            carried, self._carried_steps = self._carried_steps, []
            self.samples_seen = 0
            self.last_sync = step.finish(carried)
            return
        params = self._trainable()
        count = self.samples_seen if num_samples is None else int(num_samples)
        self.samples_seen = 0
        # One small host-side message first: sample counts and which gradients exist.
        meta = np.zeros(1 + len(params), np.float64)
        meta[0] = count
        meta[1:] = [p.grad is not None for p in params]
        self.comm.host_allreduce_(meta)
        total, present = float(meta[0]), meta[1:] > 0
        weight = self._weight(count, total)
        plan = self._bucket_plan(params)
        sent = 0
        for bucket in plan:
            flat = _pack(params, bucket, weight)
            self.comm.allreduce_(flat)
            sent += flat.nbytes
            for index, offset in bucket:
                p = params[index]
                if present[index]:
                    p.grad = Tensor(flat[offset:offset + p.numel()].reshape(p.shape))
        self.last_sync = {"buckets": len(plan), "bytes": sent, "weight": weight, "samples": int(total)}

    def _weight(self, count: int, total: float) -> float:
        """This rank's weight in the sums: n_r / Σ_s n_s (``reduction="mean"``), or 1 (``"sum"``)."""
        if self.reduction == "sum":
            return 1.0
        if total > 0:
            return float(count) / total  # a Python float: float32 gradients stay float32
        return 1.0 / self.comm.size      # no counts known: equal weights

    def probe_gradients(self, probe, params) -> None:
        """Let an optimizer probe the gradients' graph before they are all-reduced (AdaHessian's Hz).

        The all-reduced gradients are new Tensors without a graph, so an optimizer that
        differentiates its gradients again does it here, first, on this rank's gradients:
        ``probe(present, reduce)`` with ``present`` the ``params`` that have a gradient on some
        rank (what one process would see) and ``reduce(arrays)`` the gradients' own weighted sum,

            reduce([a_1, ..., a_k]) = [Σ_r w_r a_1^(r), ..., Σ_r w_r a_k^(r)],   w_r = n_r / Σ_s n_s,

        one all-reduce per dtype and device. The one-process loss is Σ_r w_r L_r, so for the same
        z on every rank Σ_r w_r (H_r z) is H z of the whole batch. Costs one small host message
        (counts and which gradients exist) besides the reduce.
        """
        params = list(params)
        meta = np.zeros(1 + len(params), np.float64)
        meta[0] = self.samples_seen
        meta[1:] = [p.grad is not None for p in params]
        self.comm.host_allreduce_(meta)
        weight = self._weight(self.samples_seen, float(meta[0]))
        present = [p for p, here in zip(params, meta[1:] > 0) if here]
        reduce = lambda arrays: self.weighted_sum_over_replicas(arrays, weight)  # noqa: E731
        probe(present, reduce)

    def weighted_sum_over_replicas(self, arrays, weight: float) -> list:
        """[Σ_r w_r a^(r) for each array a] as new arrays, ``weight`` = this rank's w_r: one all-reduce per dtype
        and device, each array multiplied by the weight first, as the gradients are (a collective)."""
        arrays = list(arrays)
        out, kinds = [None] * len(arrays), {}
        for i, a in enumerate(arrays):
            kinds.setdefault((a.dtype.str, type(a)), []).append(i)
        for indices in kinds.values():
            xp = xp_of(arrays[indices[0]])
            flat = xp.concatenate([arrays[i].reshape(-1) for i in indices])
            if weight != 1.0:
                xp.multiply(flat, weight, out=flat)
            self.comm.allreduce_(flat)
            offset = 0
            for i in indices:
                out[i] = flat[offset:offset + arrays[i].size].reshape(arrays[i].shape)
                offset += arrays[i].size
        return out

    def after_step(self) -> None:
        """Called by :class:`DistributedOptimizer` after each update (nothing to do here; ZeRO-2 all-gathers)."""

    def check_optimizer(self, optimizer) -> None:
        """Called by :class:`DistributedOptimizer`: every optimizer works with plain data parallelism."""

    def _trainable(self):
        return [p for p in self.module.parameters() if p.requires_grad]

    def _bucket_plan(self, params):
        """Buckets of (parameter index, offset), in parameter order (reversed with overlap: the order
        gradients arrive in), split by dtype/device and size."""
        key = tuple((p.dtype.str, p.device, p.numel()) for p in params)
        if key == self._plan_key:
            return self._plan
        plan, open_buckets = [], {}  # (dtype, device) -> (bucket list, bytes so far)
        order = range(len(params) - 1, -1, -1) if self.overlap else range(len(params))
        for index in order:
            p = params[index]
            kind = (p.dtype.str, p.device)
            bucket, used = open_buckets.get(kind, (None, 0))
            if bucket is None or (used and used + p.array.nbytes > self.bucket_bytes):
                bucket, used = [], 0
                plan.append(bucket)
            bucket.append((index, used // p.dtype.itemsize))
            open_buckets[kind] = (bucket, used + p.array.nbytes)
        self._plan_key, self._plan = key, plan
        return plan


def _pack(params, bucket, weight: float):
    """One flat buffer (new for this step) holding weight · gradient of each parameter of ``bucket``."""
    first = params[bucket[0][0]]
    last_index, last_offset = bucket[-1]
    flat = first.xp.empty(last_offset + params[last_index].numel(), first.dtype)
    for index, offset in bucket:
        p = params[index]
        piece = flat[offset:offset + p.numel()]
        if p.grad is None:
            piece[...] = 0
        elif weight == 1.0:
            piece[...] = p.grad.array.reshape(-1)
        else:
            p.xp.multiply(p.grad.array.reshape(-1), weight, out=piece)
    return flat


class _OverlapStep(BucketsInBackward):
    """One backward's buckets with overlap: which parameters are final, which buckets are in flight.

    A bucket is packed as soon as its parameters' gradients are final, and each packed gradient is
    dropped (``p.grad = None``): from then on the bucket, reduced in place, holds it. So the backward
    holds each gradient once, in its parameter or in its bucket, plus the one bucket being packed:
    no full flat copy of the gradients besides the gradients. (A gradient that carries a graph, for
    an optimizer that differentiates it again, stays until the sync.)

    With gradient accumulation (several forwards and backwards before one sync) each backward's
    buckets carry the weights of its own forward, w_r = n_r / Σ_s n_s, and the sync adds the
    backwards' sums: Σ_backwards Σ_r w_r g_r, each term the gradient of that micro-batch's mean loss
    over the ranks' slices together, as one process accumulates them.
    """

    def __init__(self, dp: DataParallel, params, uses, samples: int):
        super().__init__(params, uses, dp._bucket_plan(params))
        self.dp, self.samples = dp, samples
        comm = dp.comm
        counts = np.array([samples], np.float64)
        comm.host_allreduce_(counts)  # the weights are needed as soon as the first bucket starts
        if dp.reduction == "sum":
            self.weight = 1.0
        elif counts[0] > 0:
            self.weight = float(samples) / float(counts[0])
        else:
            self.weight = 1.0 / comm.size
        self.total = int(counts[0])
        self.flights = {}
        self.had_gradient = [False] * len(params)  # whether each parameter had a gradient when packed

    def start(self, b: int) -> None:
        """Pack bucket ``b`` (weighted), drop the gradients it now holds, and start its all-reduce."""
        bucket = self.plan[b]
        for index, _ in bucket:
            self.had_gradient[index] = self.params[index].grad is not None
        flat = _pack(self.params, bucket, self.weight)
        for index, _ in bucket:
            p = self.params[index]
            if p.grad is not None and not p.grad.requires_grad:
                p.grad = None
        self.flights[b] = (flat, self.dp.comm.iallreduce_(flat))

    def finish(self, carried=()) -> dict:
        """Start the buckets left, wait for every one (``carried``: earlier backwards' steps too), and hand each
        parameter its summed gradient (the sum of the steps' sums, with accumulation)."""
        steps = [*carried, self]
        for step in steps:
            step.start_the_rest()
        had = np.array([any(step.had_gradient[i] for step in steps) for i in range(len(self.params))], np.float64)
        self.dp.comm.host_allreduce_(had)
        sent = 0
        summed = [None] * len(self.params)
        for step in steps:
            for b, bucket in enumerate(step.plan):
                flat, flight = step.flights[b]
                flight.wait()
                sent += flat.nbytes
                for index, offset in bucket:
                    piece = flat[offset:offset + self.params[index].numel()]
                    summed[index] = piece if summed[index] is None else summed[index] + piece
        for index, p in enumerate(self.params):
            if had[index] > 0:
                p.grad = Tensor(summed[index].reshape(p.shape))
        return {"buckets": len(self.plan), "bytes": sent, "weight": self.weight,
                "samples": sum(step.total for step in steps),
                "started_in_backward": self.started_in_backward}


def _group_by_kind(tensors):
    """Tensors grouped by (dtype, device), each group in the original order."""
    groups = {}
    for t in tensors:
        groups.setdefault((t.dtype.str, t.device), []).append(t)
    return [g for g in groups.values() if g]


def broadcast_module_state(module: Module, comm, root: int = 0) -> None:
    """Overwrite every parameter and buffer of ``module`` with rank ``root``'s values, in place (a collective:
    one broadcast per dtype and device); every scheme that starts from one model on every rank calls it."""
    tensors = [t for _, t in module.named_parameters()] + [t for _, t in module.named_buffers()]
    for group in _group_by_kind(tensors):
        with using(group[0].device):  # the group's GPU current: CuPy makes arrays on the current GPU
            flat = group[0].xp.concatenate([t.array.reshape(-1) for t in group])
            comm.broadcast_(flat, root)
            offset = 0
            for t in group:
                t.array[...] = flat[offset:offset + t.numel()].reshape(t.shape)
                mark_changed(t)
                offset += t.numel()
    comm.synchronize()


def check_same_model(module: Module, comm) -> None:
    """Raise ValueError on every rank when the ranks' models differ in names, shapes or dtypes."""
    mine = [("parameter", name, tuple(p.shape), str(p.dtype), bool(p.requires_grad))
            for name, p in module.named_parameters()]
    mine += [("buffer", name, tuple(b.shape), str(b.dtype), False) for name, b in module.named_buffers()]
    everyone = comm.allgather_object(mine)
    reference, problems = everyone[0], []
    for rank, theirs in enumerate(everyone[1:], start=1):
        if theirs == reference:
            continue
        if len(theirs) != len(reference):
            problems.append(f"rank {rank} has {len(theirs)} parameters and buffers, rank 0 has {len(reference)}")
        for got, want in zip(theirs, reference):
            if got != want:
                problems.append(f"rank {rank}: {got[0]} {got[1]!r} has shape {got[2]} ({got[3]}), "
                                f"rank 0: {want[0]} {want[1]!r} has shape {want[2]} ({want[3]})")
                break
    if problems:
        raise ValueError("DataParallel: the model differs between ranks; every rank must build the same "
                         "architecture (same layers, sizes, dtypes, frozen parameters):\n  "
                         + "\n  ".join(problems[:8]))


class DistributedOptimizer(ParallelOptimizer):
    """An optimizer whose ``step()`` first all-reduces the gradients of a ``DataParallel`` model.

    Everything else (``param_groups``, ``state``, ``zero_grad``, ``state_dict``)
    is the wrapped optimizer's, so schedulers, clipping and checkpoints work
    unchanged. Call ``synchronize()`` before touching the gradients yourself
    (clipping by global norm must see the global gradient); ``step()`` then
    does not all-reduce a second time.
    """

    def __init__(self, optimizer, model: DataParallel):
        if not isinstance(model, DataParallel):
            raise TypeError(f"DistributedOptimizer: model must be a DataParallel, got {type(model).__name__}")
        model.check_optimizer(optimizer)
        self.optimizer, self.model = optimizer, model
        self._synchronized = False
        probing = self._probing_optimizer()
        if probing is not None:  # one z on every rank: rank 0's generator state (a collective)
            probing.set_generator_state(model.comm.allgather_object(probing.generator_state())[0])

    @property
    def requires_create_graph(self) -> bool:
        """Whether the backward must record the graph of the gradients (an optimizer that probes it, as
        AdaHessian, anywhere in the wrapped chain: ZeRO stage 1 wraps it too)."""
        return self._probing_optimizer() is not None or bool(getattr(self.optimizer, "requires_create_graph",
                                                                      False))

    def synchronize(self) -> None:
        """All-reduce the gradients now (once per step).

        An optimizer that probes the gradients' graph (one with ``probe(params, reduce)``,
        ``generator_state()`` and ``set_generator_state(state)``: AdaHessian's Hessian-vector
        product) probes first, through :meth:`DataParallel.probe_gradients`: after the
        all-reduce the graph is gone.
        """
        if not self._synchronized:
            probing = self._probing_optimizer()
            if probing is not None:
                # ZeRO stage 1: z for every rank's parameters, in one process's order
                params = getattr(self.optimizer, "all_params", None)
                if params is None:
                    params = [p for g in probing.param_groups for p in g["params"]]
                probe_for = getattr(self.optimizer, "probe_for", None)  # ZeRO-1: D laid out into its chunks
                probe = probe_for(probing.probe) if probe_for is not None else probing.probe
                self.model.probe_gradients(probe, [p for p in params if p.requires_grad])
            self.model.sync_gradients()
            if isinstance(self.optimizer, ParallelOptimizer):  # ZeRO-1: its chunks' gradients from the sums
                self.optimizer.synchronize()
            self._synchronized = True

    def _probing_optimizer(self):
        return probing_optimizer(self.optimizer)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
            self._synchronized = False
        self.synchronize()
        self.optimizer.step()
        self.model.after_step()
        self._synchronized = False
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self._synchronized = False
        self.optimizer.zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm: float):
        """Clip by the norm of the global gradient, as one process would; returns the norm before clipping.

        Synchronizes first. Plain data parallelism holds the whole global gradient on every rank
        after the all-reduce. ZeRO stage 1 holds it too, but its optimizer steps (and a loss scaler
        unscales) only this rank's chunks of the flat parameters: those are clipped, by the norm whose
        squares every rank adds for its own chunks (a collective); stages 2 and 3 hold a shard of it,
        and :meth:`ShardedDataParallel.clip_grad_norm_` adds the squares over the ranks likewise.
        """
        from minidl.nn.utils import clip_grad_norm_
        self.synchronize()
        if self.model.shards_gradients:  # stages 2 and 3: this rank's shards
            return self.model.clip_grad_norm_(max_norm)
        if isinstance(self.optimizer, ParallelOptimizer):  # ZeRO stage 1: this rank's chunks
            return self.optimizer.clip_grad_norm_(max_norm)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return clip_grad_norm_([p for p in params if p.grad is not None], max_norm).array

    def grad_squares(self, params) -> float:
        """Σ ‖g‖² of ``params``' synchronized gradients: every rank holds the whole global gradient, so
        no sum over the ranks (ZeRO stage 1 adds its chunks' parts; stages 2 and 3 hold shards of no
        parameter and are not cut further: a pipeline of ZeRO shards is not a layout)."""
        if self.model.shards_gradients:
            raise ValueError("DistributedOptimizer.grad_squares: the gradients are ZeRO-2/3 shards, not "
                             "parameters; clip with clip_grad_norm_ (ZeRO stages 2 and 3 do not nest in a pipeline)")
        return super().grad_squares(params)

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank found an inf or NaN in the gradients it unscaled (a collective).

        :class:`minidl.amp.GradScaler` calls it from ``unscale_``: under ZeRO a rank unscales only
        its part of the gradient (stage 1: its chunks; stages 2 and 3: its shard), and
        an overflow in one rank's part must make every rank skip the step and back off its scale,
        as one process checking the whole gradient would. A SUM of the 0/1 flags over the ranks.
        """
        flags = np.array([1.0 if found_inf else 0.0])
        self.model.comm.host_allreduce_(flags)
        return bool(flags[0] > 0)

    def state_dict(self):
        """This rank's optimizer state, as it holds it (ZeRO: its shard; see :meth:`consolidated_state_dict`)."""
        return self.optimizer.state_dict()

    def consolidated_state_dict(self) -> dict:
        """The whole optimizer state in the per-parameter form one process saves (a collective under ZeRO).

        ZeRO stages 1, 2 and 3 gather each chunk's or shard's state and cut it into the parameters'
        shapes. The result loads into a plain
        optimizer in one process, or through :meth:`load_state_dict` into any number of ranks.
        """
        consolidate = getattr(self.model, "consolidate_optimizer_state", None)
        if consolidate is not None:
            return consolidate(self.optimizer.state_dict(), self._layer_state())
        if callable(getattr(self.optimizer, "consolidated_state_dict", None)):
            return self.optimizer.consolidated_state_dict()
        return self.optimizer.state_dict()

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        local = self._local(state_dict)
        if not isinstance(self.optimizer, WrapsOptimizer):  # a wrapper (ZeRO stage 1) checks as it loads
            self.optimizer.check_state_dict(local)

    def load_state_dict(self, state_dict):
        """Load a state as :meth:`consolidated_state_dict` gives it (per parameter: any number of ranks saved
        it); without ZeRO stage 2 or 3 also the wrapped optimizer's own form."""
        return self.optimizer.load_state_dict(self._local(state_dict))

    def _local(self, state_dict):
        shard = getattr(self.model, "shard_optimizer_state", None)
        return shard(state_dict, self._layer_state()) if shard is not None else state_dict

    def _layer_state(self) -> tuple:
        """The state entries the optimizer keeps one number per layer of (NovoGrad's v), for ZeRO's shards."""
        return tuple(getattr(self.optimizer, "layer_state", ()))

    def __repr__(self):
        return f"DistributedOptimizer({self.optimizer!r})"


def clip_spread_grad_norm_(tensors, comm, max_norm: float, owner: str) -> float:
    """Clip by the global norm of a gradient whose parts are spread over the ranks (a collective).

    ``tensors`` are this rank's part (every element of the gradient is on exactly one rank):
    ‖g‖² = Σ_ranks Σ (this rank's part)², added in float64; then each part is scaled by
    min(1, max_norm / (‖g‖ + 1e-6)), PyTorch's rule, as one process clipping the whole gradient.
    Returns ‖g‖ before clipping, the same number on every rank: a float on the CPU, a 0-d array on
    the GPU, where the sum, its all-reduce and the scaling stay on the device (no host read).
    """
    max_norm = float(max_norm)
    if not max_norm > 0:
        raise ValueError(f"{owner}: max_norm must be > 0, got {max_norm}")
    parts = [t for t in tensors if t.grad is not None]
    return scale_to_norm_(parts, sum_numbers_(comm, grad_squares(parts)), max_norm)


def probing_optimizer(optimizer):
    """The optimizer in ``optimizer``'s wrapped chain (Lookahead, ZeRO-1, offloading...) that probes the
    gradients' graph (one with ``probe``: AdaHessian), or None."""
    inner = optimizer
    while inner is not None:
        if callable(getattr(type(inner), "probe", None)):
            return inner
        inner = vars(inner).get("optimizer")
    return None


def scale_to_norm_(tensors, squares, max_norm: float):
    """Scale the gradient of each of ``tensors`` by min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ = √``squares``:
    the rule of :func:`minidl.nn.utils.clip_grad_norm_`, ``squares`` the 1-element array of Σ ‖g‖² over
    the whole gradient (found however it is spread over the ranks), on the gradients' device. Returns
    ‖g‖: a float on the CPU; on a GPU a 0-d device array, the scale computed there (no host read)."""
    xp = xp_of(squares)
    with using_array(squares):
        total = xp.sqrt(squares[0])
        scale = xp.minimum(max_norm / (total + 1e-6), 1.0)
        for t in tensors:
            if t.grad is not None:
                t.grad = Tensor(t.grad.array * scale.astype(t.grad.dtype))
    return float(total) if xp is np else total


def prepare_data_parallel(model, optimizer, loader=None, comm=None):
    """The three wrappings a training loop needs: ``(DataParallel model, DistributedOptimizer, sharded loader)``.

    ``comm`` defaults to ``parallel.init()``. The loader (if given) must be a
    DataLoader over the whole dataset with the *global* batch size.
    """
    from minidl.parallel.sampler import shard_loader
    from minidl.parallel.world import init
    comm = init() if comm is None else comm
    dp = model if isinstance(model, DataParallel) else DataParallel(model, comm)
    opt = optimizer if isinstance(optimizer, DistributedOptimizer) else DistributedOptimizer(optimizer, dp)
    return dp, opt, (shard_loader(loader, comm) if loader is not None else None)
