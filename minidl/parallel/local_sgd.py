"""Local SGD (periodic averaging): each rank steps alone on its slice of the batch; every H steps the
weights are averaged over the ranks.

    every step, rank r:   w_r ← optimizer(w_r, ∇ mean-loss on its n_r samples)     (no communication)
    every H-th step:      w_r ← Σ_s (m_s / M) · w_s   on every rank                 (one all-reduce)

with m_s the samples rank s trained on since the last average and M = Σ_s m_s (equal slices: the plain
mean). Stich 2019 ("Local SGD converges fast and communicates little") and Lin et al. 2020 ("Don't use
large mini-batches, use local SGD") study it; the systems chapter among our sources describes the same
schedule: "weight updates happen independently on each GPU ... after a configured number of iterations,
updated weights synchronize and equalize across devices" (Machine Learning Systems, ch. 7 "AI
Training", §7.11.1).

With H = 1 and plain SGD the average of the ranks' steps *is* data parallelism's step: Σ_s (n_s/B)
(w − η g_s) = w − η Σ_s (n_s/B) g_s, so the run equals one process on the global batch. With H > 1
the ranks drift apart between averages and the result differs (measured in the tests and the
notebook); what it buys is communication: one all-reduce of the weights every H steps,

    bytes per step = all-reduce payload of the weights / H

(:func:`~minidl.parallel.cost_model.local_sgd_step_payloads`).

The optimizer's state (momentum, Adam's moments) stays local by default, as in Lin et al. 2020's local
momentum, so the bytes are the weights' alone; ``average_state=True`` averages every floating-point state
array with the same weights at each average (twice or three times the bytes, for SGD with momentum or
Adam), which keeps H = 1 equal to data parallelism for SGD with momentum too (its state is linear in
the gradients; Adam's is not). Buffers (BatchNorm's running statistics) stay each rank's own.

The Trainer drives it as it drives :class:`~minidl.parallel.data_parallel.DataParallel`: a sharded
loader (:func:`~minidl.parallel.sampler.shard_loader`), ``model(x)`` and backward on every rank, and
:class:`LocalSGDOptimizer`'s ``step()`` averaging every H-th step.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import is_grad_enabled
from minidl.backend import to_numpy, using, xp_of
from minidl.nn.module import Module, WrapsModule
from minidl.parallel.data_parallel import broadcast_module_state, check_same_model
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer
from minidl.tensor import mark_changed

__all__ = ["LocalSGD", "LocalSGDOptimizer"]


class LocalSGD(WrapsModule, ParallelModule):
    """Wrap ``module`` for local SGD over ``comm``'s ranks, averaging the weights every ``period`` (H) steps.

    At construction rank 0's weights are broadcast (one model everywhere). The forward pass counts the
    samples each rank trains on (the first argument's length), for the average's weights.
    """

    def __init__(self, module: Module, comm=None, period: int = 1):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"LocalSGD: expected a minidl Module, got {type(module).__name__}")
        if isinstance(period, bool) or not isinstance(period, (int, np.integer)) or period < 1:
            raise ValueError(f"LocalSGD: period (H, the steps between averages) must be an int >= 1, got {period!r}")
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        self.module, self.comm, self.period = module, comm, int(period)
        self.samples_seen = 0  # samples this rank trained on since the last average
        self.steps = 0
        check_same_model(module, comm)
        broadcast_module_state(module, comm)

    def extra_repr(self) -> str:
        return f"rank={self.comm.rank}, size={self.comm.size}, period={self.period}"

    def forward(self, *args, **kwargs):
        if args and self.training and is_grad_enabled():
            try:
                self.samples_seen += len(args[0])
            except TypeError:
                pass  # an input without a length: the average falls back to equal weights
        return self.module(*args, **kwargs)

    def sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        """``values`` (a host array of sums: losses, counts) added over the ranks, so a record is the global batch's."""
        return self.comm.host_allreduce_(np.array(values, dtype=np.float64))

    def _weight(self) -> float:
        """This rank's share of the average: m_r / Σ_s m_s (a small host all-reduce), or 1/N without counts."""
        total = np.array([self.samples_seen], np.float64)
        self.comm.host_allreduce_(total)
        return self.samples_seen / float(total[0]) if total[0] > 0 else 1.0 / self.comm.size

    def average_(self, arrays, weight: float) -> int:
        """Replace each array, in place, by Σ_r weight_r · array_r over the ranks: one all-reduce per dtype and
        device (a collective). Returns the payload bytes."""
        kinds = {}
        for a in arrays:
            kinds.setdefault((a.dtype.str, type(a)), []).append(a)
        sent = 0
        for group in kinds.values():
            xp = xp_of(group[0])
            flat = xp.concatenate([a.reshape(-1) for a in group])
            flat *= flat.dtype.type(weight)
            self.comm.allreduce_(flat)
            sent += flat.nbytes
            offset = 0
            for a in group:
                a[...] = flat[offset:offset + a.size].reshape(a.shape)
                offset += a.size
        return sent

    def consolidated_state_dict(self) -> dict:
        """The state dict of the averaged weights, the same on every rank, without changing the ranks' own
        (between two averages they differ): the model a checkpoint should hold (a collective)."""
        weight = self._weight()
        state = self.module.state_dict()
        names = [name for name, p in self.module.named_parameters() if p.requires_grad]
        params = dict(self.module.named_parameters())
        with using(params[names[0]].device if names else "cpu"):
            copies = [params[name].array.copy() for name in names]
            self.average_(copies, weight)
        for name, a in zip(names, copies):
            state[name] = np.array(to_numpy(a))
        return state

    def after_step(self, optimizer_state=None) -> bool:
        """Count one local step; on every H-th, average the weights (and ``optimizer_state``'s arrays, when
        given) over the ranks. Returns whether it averaged."""
        self.steps += 1
        if self.steps % self.period:
            return False
        self.average(optimizer_state)
        return True

    def average(self, optimizer_state=None) -> None:
        """Average the weights now (and ``optimizer_state``'s floating-point arrays), weighted by samples."""
        weight = self._weight()
        params = [p for p in self.module.parameters() if p.requires_grad]
        with using(params[0].device if params else "cpu"):
            self.last_average_bytes = self.average_([p.array for p in params], weight)
            if optimizer_state:
                self.last_average_bytes += self.average_(optimizer_state, weight)
        mark_changed(*params)
        self.samples_seen = 0


def _state_arrays(optimizer) -> list:
    """The optimizer's floating-point state arrays (momentum, moments), in the order of its positions."""
    arrays = []
    for pos in sorted(optimizer.state):
        for key in sorted(optimizer.state[pos]):
            value = optimizer.state[pos][key]
            if hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0 and np.dtype(value.dtype).kind == "f":
                arrays.append(value)
    return arrays


class LocalSGDOptimizer(ParallelOptimizer):
    """The optimizer of a :class:`LocalSGD` model: ``step()`` is the wrapped optimizer's own step on this rank's
    gradient, then, every H-th step, the average over the ranks.

    ``average_state``: also average the optimizer's floating-point state arrays (see the module docstring).
    """

    def __init__(self, optimizer, model: LocalSGD, average_state: bool = False):
        if not isinstance(model, LocalSGD):
            raise TypeError(f"LocalSGDOptimizer: model must be a LocalSGD, got {type(model).__name__}")
        self.optimizer, self.model, self.average_state = optimizer, model, bool(average_state)

    def step(self, closure=None):
        loss = self.optimizer.step(closure)
        self.model.after_step(_state_arrays(self.optimizer) if self.average_state else None)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none)

    def state_dict(self):
        return self.optimizer.state_dict()

    def __repr__(self):
        return f"LocalSGDOptimizer({self.optimizer!r}, period={self.model.period})"
