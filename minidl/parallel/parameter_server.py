"""Parameter server: server ranks hold the weights and the optimizer, worker ranks compute the gradients.

The world of N ranks is cut in two (Li et al. 2014, "Scaling Distributed Machine Learning with the
Parameter Server"; Dean et al. 2012, "Large Scale Distributed Deep Networks"): ranks 0..S−1 are
*servers*, ranks S..N−1 the W = N − S *workers*. Each parameter belongs to one server (whole
parameters, the largest first to the least-loaded server), which alone keeps its optimizer state and
applies its update. A step, with B samples in the global batch and worker w taking its slice of
n_w samples (:func:`~minidl.parallel.sampler.shard_bounds` over the workers):

    worker w:   g_w = (n_w / B) · ∇ mean-loss on its n_w samples         (forward and backward)
                push: to each server s, the part of g_w that s owns       (point-to-point ``send``)
    server s:   g = Σ_w g_w over every worker's push, in arrival order     (``recv_``)
                w_s ← optimizer(w_s, g)                                   (its own shard and state)
                pull: the new w_s to the workers that take fresh weights  (``send``)

**Synchronous** (``staleness=None``): every worker pulls after every step, so every gradient is
computed on the newest weights and Σ_w g_w is the global batch's gradient: the run is one process
training on the global batch, for any optimizer.

**Asynchronous with bounded staleness τ** (``staleness=τ``; the stale-synchronous parallel model of
Ho et al. 2013): a worker does not wait for the newest weights, it computes its next gradient on
the weights it holds, as long as they are at most τ versions old (a version is one server update);
older than that, it waits for a pull. So the server's update for version t is

    w_{t+1} = w_t − η · Σ_w (n_w / B) · ∇L_w(w_{t − d_w,t}),      0 ≤ d_w,t ≤ τ,

the gradients of the global batch, each taken at weights up to τ updates old: not one process's
result, but the same update applied with delayed gradients (τ = 0 is the synchronous run). Each push
is added to the version's sum as it arrives.

*The schedule is deterministic*, set by ``seed``: after each step every worker draws (from
``numpy.random.default_rng([seed, step])``, the same draw on every rank) whether it pulls the new
weights or keeps its own, with probability 1/2 each; a worker whose weights would become more than τ
versions old always pulls. The pushes of a step arrive (are received and added) in an order drawn
from the same generator. The messages themselves run in that fixed order on every run, so a test
can repeat an asynchronous run exactly; what an asynchronous system gains, fewer pulls, shows in
the bytes (:func:`minidl.parallel.cost_model.parameter_server_step_payloads`).

The Trainer drives it through :mod:`minidl.parallel.protocol` with the *global* batch on every rank
(a plain loader, not a sharded one): the model runs its own step (:meth:`ParameterServer.train_step`:
a worker takes its slice, a server computes nothing), and the optimizer wrapper
(:class:`ParameterServerOptimizer`) pushes, updates on the servers and pulls.

Known limits: a parameter without a gradient on a worker counts as a zero gradient (an optimizer with
weight decay or momentum then still moves it); every trainable parameter shares one dtype and device.
"""
from __future__ import annotations

import contextlib

import numpy as np

from minidl.autograd import no_grad
from minidl.backend import to_numpy, using
from minidl.nn.module import Module, WrapsModule
from minidl.parallel.data_parallel import broadcast_module_state, check_same_model, scale_to_norm_
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer, grad_squares, sum_numbers_
from minidl.parallel.sampler import shard_bounds
from minidl.tensor import Tensor, mark_changed

__all__ = ["ParameterServer", "ParameterServerOptimizer", "StalenessSchedule", "assign_to_servers"]


def assign_to_servers(sizes, servers: int) -> list[int]:
    """The server of each parameter (``sizes``: their element counts): the largest first, each to the
    server holding the fewest elements so far (ties: the lower index), so the shards are balanced."""
    load = [0] * servers
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        server = min(range(servers), key=lambda s: (load[s], s))
        owner[index] = server
        load[server] += sizes[index]
    return owner


class StalenessSchedule:
    """Who pulls after each step and the order pushes arrive in, drawn from ``seed`` (the same on every rank).

    ``staleness=None`` is the synchronous schedule: every worker pulls every step, pushes arrive in
    worker order. Otherwise, after step t each worker keeps its weights with probability 1/2 unless
    they would then be more than ``staleness`` versions old. Call :meth:`arrival_order` and
    :meth:`pulls_after` once per step, in step order (the ages of the workers' weights carry over).
    """

    def __init__(self, workers: int, staleness: int | None, seed: int = 0):
        self.workers, self.staleness, self.seed = int(workers), staleness, int(seed)
        self.age = np.zeros(self.workers, np.int64)  # versions each worker's weights are behind the servers'

    def _rng(self, step: int, what: int):
        return np.random.default_rng([self.seed, int(step), what])

    def arrival_order(self, step: int) -> list[int]:
        """The workers in the order their pushes of ``step`` arrive."""
        if self.staleness is None:
            return list(range(self.workers))
        return [int(w) for w in self._rng(step, 0).permutation(self.workers)]

    def pulls_after(self, step: int) -> np.ndarray:
        """Booleans, one per worker: whether it takes the weights the servers hold after ``step``."""
        if self.staleness is None:
            return np.ones(self.workers, bool)
        keep = self._rng(step, 1).random(self.workers) < 0.5
        pull = ~keep | (self.age + 1 > self.staleness)  # too old: the worker waits for fresh weights
        self.age = np.where(pull, 0, self.age + 1)
        return pull


class ParameterServer(WrapsModule, ParallelModule):
    """Wrap ``module`` for training with ``servers`` server ranks and ``comm.size − servers`` workers.

    Args:
        module: the model, the same architecture on every rank (rank 0's weights are broadcast).
        comm: a Communicator; ``parallel.init()`` by default.
        servers: S, the number of server ranks (ranks 0..S−1); at least one worker must remain.
        staleness: None for the synchronous server; an int τ ≥ 0 for the asynchronous one, whose
            workers compute on weights up to τ versions old (see the module docstring).
        seed: the asynchronous schedule's seed.
    """

    def __init__(self, module: Module, comm=None, servers: int = 1, staleness: int | None = None, seed: int = 0):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"ParameterServer: expected a minidl Module, got {type(module).__name__}")
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or not 1 <= servers < comm.size:
            raise ValueError(f"ParameterServer: servers must be an int in [1, {comm.size - 1}] on {comm.size} ranks "
                             f"(at least one server and one worker), got {servers!r}; start more ranks with mpiexec -n")
        if staleness is not None and (isinstance(staleness, bool) or not isinstance(staleness, (int, np.integer))
                                      or staleness < 0):
            raise ValueError(f"ParameterServer: staleness must be None (synchronous) or an int >= 0, got {staleness!r}")
        params = [p for p in module.parameters() if p.requires_grad]
        kinds = sorted({(p.dtype.str, p.device) for p in params})
        if len(kinds) > 1:
            raise ValueError(f"ParameterServer: the trainable parameters must share one dtype and device, got {kinds}; "
                             "cast the model first, e.g. model.to(dtype=np.float32)")
        self.module = module
        self.comm, self.servers, self.workers = comm, int(servers), comm.size - int(servers)
        self.staleness = None if staleness is None else int(staleness)
        self.schedule = StalenessSchedule(self.workers, self.staleness, seed)
        self.is_server = comm.rank < self.servers
        self.worker_index = None if self.is_server else comm.rank - self.servers
        self._params = params
        owner = assign_to_servers([p.numel() for p in params], self.servers)
        self.shards = [[i for i in range(len(params)) if owner[i] == s] for s in range(self.servers)]
        self.steps = 0  # server updates so far: the servers' version
        self.last_step = {}
        check_same_model(module, comm)
        broadcast_module_state(module, comm)

    def extra_repr(self) -> str:
        role = "server" if self.is_server else f"worker {self.worker_index}"
        mode = "synchronous" if self.staleness is None else f"staleness={self.staleness}"
        return f"rank={self.comm.rank} ({role}), servers={self.servers}, workers={self.workers}, {mode}"

    # ------------------------------------------------------------ the step, as the Trainer drives it
    @property
    def runs_own_step(self) -> bool:
        return True  # servers compute no forward: the loop hands every rank the global batch, each takes its part

    def _slice(self, x, y):
        lo, hi = shard_bounds(len(x), self.worker_index, self.workers)
        x = x if isinstance(x, Tensor) else Tensor(x)
        y = y if isinstance(y, Tensor) else Tensor(y)
        return x[lo:hi], y[lo:hi]

    def _mean_over_batch(self, weighted_loss: float, batch: int) -> float:
        """Σ_w n_w · loss_w over the workers (servers add 0), / B: the global batch's mean loss on every rank."""
        sums = np.array([weighted_loss], np.float64)
        self.comm.host_allreduce_(sums)
        return float(sums[0]) / batch

    def train_step(self, x, y, loss_fn, *, loss_scale: float = 1.0, autocast=None):
        """A worker's forward and backward on its slice of the global batch ``(x, y)``, its gradients those of
        ``loss_scale · (n_w / B) · loss`` (so the workers' pushes add up to the global batch's gradient); a
        server does nothing. Returns the global batch's mean loss on every rank (a small host all-reduce)."""
        if self.is_server:
            return self._mean_over_batch(0.0, len(x))
        xs, ys = self._slice(x, y)
        context = autocast() if autocast is not None else contextlib.nullcontext()
        with context:
            loss = loss_fn(self.module(xs), ys)
        (loss * (loss_scale * len(xs) / len(x))).backward()
        return self._mean_over_batch(float(loss.item()) * len(xs), len(x))

    def eval_step(self, x, y, loss_fn) -> float:
        """The global batch's mean loss without gradients, each worker on its slice with the weights it holds."""
        if self.is_server:
            return self._mean_over_batch(0.0, len(x))
        xs, ys = self._slice(x, y)
        with no_grad():
            loss = loss_fn(self.module(xs), ys)
        return self._mean_over_batch(float(loss.item()) * len(xs), len(x))

    # ------------------------------------------------------------ push, update, pull
    def _flat(self, indices, arrays):
        """The arrays of the parameters ``indices`` (one server's shard), one after the other in a new flat array."""
        first = self._params[0]
        with using(first.device):
            return first.xp.concatenate([arrays[i].reshape(-1) for i in indices])

    def _buffer(self, indices):
        """An empty flat array the size of the parameters ``indices``, to receive a shard into."""
        first = self._params[0]
        with using(first.device):
            return first.xp.empty(sum(self._params[i].numel() for i in indices), first.dtype)

    def push(self) -> None:
        """A worker: send each server its part of this rank's gradients (zeros for a missing one), then drop them."""
        grads = [p.grad.array if p.grad is not None else p.xp.zeros_like(p.array) for p in self._params]
        sent = 0
        for server, indices in enumerate(self.shards):
            flat = self._flat(indices, grads)
            self.comm.send(flat, server)
            sent += flat.nbytes
        for p in self._params:
            p.grad = None
        self.last_step = {"pushed": sent}

    def gather_pushes(self) -> None:
        """A server: receive every worker's push in the schedule's arrival order and add it up; each of its
        parameters' gradient is then the global batch's."""
        indices = self.shards[self.comm.rank]
        total = None
        for worker in self.schedule.arrival_order(self.steps):
            flat = self._buffer(indices)
            self.comm.recv_(flat, self.servers + worker)
            total = flat if total is None else total + flat
        offset = 0
        for i in indices:
            p = self._params[i]
            p.grad = Tensor(total[offset:offset + p.numel()].reshape(p.shape))
            offset += p.numel()
        self.last_step = {"received": total.nbytes * self.workers}

    def pull(self) -> None:
        """After the servers' update: the workers the schedule names receive every server's new weights."""
        fresh = self.schedule.pulls_after(self.steps)
        self.steps += 1
        weights = [p.array for p in self._params]
        for worker in np.flatnonzero(fresh):
            if self.is_server:
                self.comm.send(self._flat(self.shards[self.comm.rank], weights), self.servers + int(worker))
            elif worker == self.worker_index:
                self._receive_weights()
        self.last_step["pulled"] = bool(fresh[self.worker_index]) if not self.is_server else int(fresh.sum())

    def _receive_weights(self) -> None:
        for server, indices in enumerate(self.shards):
            flat = self._buffer(indices)
            self.comm.recv_(flat, server)
            self._write(indices, flat)

    def _write(self, indices, flat) -> None:
        offset = 0
        for i in indices:
            p = self._params[i]
            p.array[...] = flat[offset:offset + p.numel()].reshape(p.shape)
            mark_changed(p)
            offset += p.numel()

    # ------------------------------------------------------------ whole weights
    def _newest_weights(self) -> list:
        """Every parameter's newest value (its server's), on every rank: one broadcast per server (a collective)."""
        arrays = [None] * len(self._params)
        for server, indices in enumerate(self.shards):
            flat = self._flat(indices, [p.array for p in self._params]) if self.comm.rank == server \
                else self._buffer(indices)
            self.comm.broadcast_(flat, server)
            offset = 0
            for i in indices:
                arrays[i] = flat[offset:offset + self._params[i].numel()].reshape(self._params[i].shape)
                offset += self._params[i].numel()
        return arrays

    def consolidated_state_dict(self) -> dict:
        """The model's state with every parameter as its server holds it (a collective)."""
        newest = {id(p): a for p, a in zip(self._params, self._newest_weights())}
        state = self.module.state_dict()
        for name, p in self.module.named_parameters():
            if id(p) in newest:
                state[name] = np.array(to_numpy(newest[id(p)]))
        return state

    def load_state_dict(self, state, strict: bool = True):
        """Load a whole state on every rank: servers and workers then hold the same, newest weights."""
        result = super().load_state_dict(state, strict)
        self.schedule.age[:] = 0
        return result

    @contextlib.contextmanager
    def whole_module(self):
        """The module holding the servers' newest weights on every rank (a collective); a worker's own
        (perhaps older) weights are put back afterwards, so the schedule's run is unchanged."""
        saved = [p.array.copy() for p in self._params]
        for p, a in zip(self._params, self._newest_weights()):
            p.array[...] = a
            mark_changed(p)
        try:
            yield self.module
        finally:
            for p, a in zip(self._params, saved):
                p.array[...] = a
                mark_changed(p)


class ParameterServerOptimizer(ParallelOptimizer):
    """The optimizer of a :class:`ParameterServer`: built over every parameter on every rank, it steps
    only on the servers and only their own parameters (the others have no gradient there), so each
    server keeps the state of its shard alone; a worker's optimizer never steps and holds no state.

    ``synchronize()`` pushes (a worker) or receives and adds the pushes (a server); ``step()`` then
    updates the servers' shards and pulls the new weights to the workers the schedule names.
    """

    def __init__(self, optimizer, model: ParameterServer):
        if not isinstance(model, ParameterServer):
            raise TypeError(f"ParameterServerOptimizer: model must be a ParameterServer, got {type(model).__name__}")
        self.optimizer, self.model = optimizer, model
        self._synchronized = False

    def synchronize(self) -> None:
        if not self._synchronized:
            if self.model.is_server:
                self.model.gather_pushes()
            else:
                self.model.push()
            self._synchronized = True

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("ParameterServerOptimizer.step: a closure would recompute the loss on the servers, "
                             "which hold no data; run train_step, then step()")
        self.synchronize()
        if self.model.is_server:
            self.optimizer.step()
        self.model.pull()
        self._synchronized = False

    def zero_grad(self, set_to_none: bool = True):
        self._synchronized = False
        self.optimizer.zero_grad(set_to_none)

    def _shard_grads(self) -> list:
        return [p for p in self.model._params if p.grad is not None] if self.model.is_server else []

    def clip_grad_norm_(self, max_norm: float):
        """Clip the global batch's gradient, which the servers hold in shards, by its whole norm (a collective)."""
        max_norm = float(max_norm)
        if not max_norm > 0:
            raise ValueError(f"ParameterServerOptimizer.clip_grad_norm_: max_norm must be > 0, got {max_norm}")
        self.synchronize()
        parts = self._shard_grads()
        squares = grad_squares(parts, device=self.model._params[0].device)
        return scale_to_norm_(parts, sum_numbers_(self.model.comm, squares), max_norm)

    def grad_squares(self, params):
        return grad_squares([p for p in params if p.grad is not None])

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether a server found an inf or NaN in the gradients it unscaled (a collective over every rank)."""
        flags = np.array([1.0 if found_inf else 0.0])
        self.model.comm.host_allreduce_(flags)
        return bool(flags[0] > 0)

    def state_dict(self):
        """This rank's optimizer state (a server: its shard's; a worker: none)."""
        return self.optimizer.state_dict()

    def consolidated_state_dict(self) -> dict:
        """The whole optimizer state, each parameter's from its server, as one process saves it (a collective)."""
        mine = self.optimizer.state_dict()
        everyone = self.model.comm.allgather_object(mine["state"])
        state = {}
        for server in range(self.model.servers):
            state.update(everyone[server])
        return {"state": state, "param_groups": mine["param_groups"]}

    def load_state_dict(self, state_dict):
        """Load a whole state: a server keeps the entries of its own parameters, a worker none."""
        positions = {id(p): pos for pos, p, _ in self.optimizer.parameters()}
        own = {positions[id(self.model._params[i])] for i in self.model.shards[self.model.comm.rank]} \
            if self.model.is_server else set()
        local = {"state": {k: v for k, v in state_dict["state"].items() if int(k) in own},
                 "param_groups": state_dict["param_groups"]}
        return self.optimizer.load_state_dict(local)

    def __repr__(self):
        return f"ParameterServerOptimizer({self.optimizer!r})"
