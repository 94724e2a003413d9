"""What the training loop calls on a parallel scheme: the protocol of the model and optimizer wrappers.

The Trainer (:mod:`minidl.train.trainer`) drives a plain model and optimizer with ``model(x)``,
``loss.backward()`` and ``optimizer.step()``. Every parallel scheme is a wrapper around the model
(a :class:`ParallelModule`) and one around the optimizer (a :class:`ParallelOptimizer`), and the
Trainer calls these names on them, and no others:

    the loop's part                 a plain model and optimizer       a wrapper
    forward and backward            loss_fn(model(x), y).backward()   model.train_step(x, y, loss_fn, …)
                                                                      (only where model.runs_own_step)
    one gradient for the batch      (nothing)                         optimizer.synchronize()
    clip to the global norm         clip_grad_norm_(params, c)        optimizer.clip_grad_norm_(c)
    fp16: skip the step everywhere  the scaler's found_inf            optimizer.reduce_found_inf(found_inf)
    the logged training loss        this process's sums               model.sum_over_replicas(sums)
    the validation loss             loss_fn(model(x), y)              model.eval_step(x, y, loss_fn)
                                                                      (only where model.runs_own_step)
    a checkpoint                    state_dict()                      consolidated_state_dict()
    a resume                        load_state_dict(state)            load_state_dict(whole state),
                                                                      check_state_dict(whole state)
    the whole weights (TensorBoard) the model                         with model.whole_module() as m

A plain model or optimizer needs none of it: the Trainer asks once, when it is built, whether its
model and optimizer are such wrappers (``isinstance``), and keeps the bound methods it will call.

*Consolidated* (whole) state is what one process training the unsplit model would save: every
parameter whole, keyed as the plain model's state dict, and the optimizer's state per parameter at
the positions the plain optimizer gives it. So a checkpoint written by any layout loads into one
process and into any other layout (:mod:`minidl.parallel.whole_state` converts each kind of split
both ways). Gathering it is a collective: every rank calls ``consolidated_state_dict()``.

Wrappers nest (a data-parallel copy of a pipeline whose stages are split over tensor groups: see
:func:`minidl.parallel.prepare`); each answers for its own split and hands the rest of every call to
the object it wraps (``module``, ``optimizer``), so the outermost one answers for the whole nest.
The defaults below are those hand-offs; a wrapper overrides what its split changes.
"""
from __future__ import annotations

import contextlib

import numpy as np

from minidl import backend
from minidl.nn.module import Module
from minidl.optim.wrapper import WrapsOptimizer

__all__ = ["ParallelModule", "ParallelOptimizer", "grad_squares", "sum_numbers_"]


def sum_numbers_(comm, numbers):
    """``numbers`` (a few float64 figures: a clip's squares, a loss) summed over ``comm``'s ranks in place,
    where they are: NumPy ones on the host (``host_allreduce_``: bookkeeping, not counted in
    ``comm.traffic``), device ones on the device (``allreduce_``), so a GPU step never waits for the host."""
    if backend.xp_of(numbers) is np:
        return comm.host_allreduce_(numbers)
    return comm.allreduce_(numbers)


def grad_squares(params, device="cpu"):
    """Σ ‖g‖² over the gradients of ``params``, in float64, as a 1-element array on their device.

    It stays there: a global clip adds such sums over ranks with an all-reduce on the device and
    scales by the result there, so a training step waits for the host at no point (on the CPU
    the array is a NumPy one). With no gradient: a zero on ``device``.
    """
    grads = [p.grad.array for p in params if p.grad is not None]
    if not grads:
        with backend.using(device):
            return backend.xp_for(device).zeros(1)
    xp = backend.xp_of(grads[0])
    with backend.using_array(grads[0]):  # the gradients' GPU current (cuda:1 too)
        return xp.stack([(g.astype(np.float64) ** 2).sum() for g in grads]).sum().reshape(1)


class ParallelModule(Module):
    """Base of the model wrappers the Trainer drives (DataParallel, ShardedDataParallel, TensorParallel,
    Pipeline). Each method's default hands the call to the wrapped ParallelModule (``self.module``),
    or does what one process does when the wrapped module is a plain one."""

    def _inner(self):
        inner = self._modules.get("module")
        return inner if isinstance(inner, ParallelModule) else None

    # ------------------------------------------------------------ a wrapper that runs the step itself
    @property
    def runs_own_step(self) -> bool:
        """True when forward and backward run inside :meth:`train_step` (a pipeline sends micro-batches
        from stage to stage), so the loop calls it instead of ``loss_fn(model(x), y).backward()``."""
        inner = self._inner()
        return inner.runs_own_step if inner is not None else False

    def train_step(self, x, y, loss_fn, *, loss_scale: float = 1.0, autocast=None):
        """Forward and backward of the batch ``(x, y)`` (only where :attr:`runs_own_step`): gradients are
        those of ``loss_scale · loss_fn(outputs, y)``, added to the parameters' gradients (so k calls
        with ``loss_scale = 1/k`` accumulate k batches); ``autocast()``, when given, is the context each
        forward and its loss run in (mixed precision; never the backward). Returns the batch's mean loss,
        unscaled, the same number on every rank that shares the batch: a float on the CPU, a 0-d array
        on a GPU (read with the step's other numbers, so the step never waits for the host)."""
        inner = self._inner()
        if inner is None:
            raise TypeError(f"{type(self).__name__}.train_step: this model runs its forward through "
                            "model(x); call it, then backward (only a pipeline runs its own step)")
        return inner.train_step(x, y, loss_fn, loss_scale=loss_scale, autocast=autocast)

    def eval_step(self, x, y, loss_fn) -> float:
        """The mean of ``loss_fn(outputs, y)`` over the batch, without gradients (only where
        :attr:`runs_own_step`: the outputs exist on one rank only), the same number on every rank."""
        inner = self._inner()
        if inner is None:
            raise TypeError(f"{type(self).__name__}.eval_step: this model's outputs come from model(x)")
        return inner.eval_step(x, y, loss_fn)

    # ------------------------------------------------------------ records
    def sum_over_replicas(self, values):
        """``values`` (a host array of sums: losses, sample counts) added over the replicas that train on
        different samples, so a record is the global batch's; a collective where there are replicas."""
        inner = self._inner()
        return inner.sum_over_replicas(values) if inner is not None else values

    # ------------------------------------------------------------ whole state
    def consolidated_state_dict(self) -> dict:
        """The state dict one process would save for the unsplit model (a collective)."""
        inner = self._inner()
        return inner.consolidated_state_dict() if inner is not None else self.state_dict()

    def check_state_dict(self, state, strict: bool = True):
        """What ``load_state_dict(state, strict)`` would raise or return; no change."""
        inner = self._inner()
        return inner.check_state_dict(state, strict) if inner is not None else super().check_state_dict(state, strict)

    def load_state_dict(self, state, strict: bool = True):
        """Load a whole state (as :meth:`consolidated_state_dict` or one process gives it), this rank
        keeping its part; all or nothing."""
        inner = self._inner()
        return inner.load_state_dict(state, strict) if inner is not None else super().load_state_dict(state, strict)

    @contextlib.contextmanager
    def whole_module(self):
        """``with model.whole_module() as module:`` the module with its whole weights, to read them (a
        collective where the weights are sharded: every rank enters it)."""
        inner = self._inner()
        if inner is not None:
            with inner.whole_module() as module:
                yield module
        else:
            yield self._modules.get("module", self)


class ParallelOptimizer(WrapsOptimizer):
    """Base of the optimizer wrappers the Trainer drives (DistributedOptimizer, TensorParallelOptimizer,
    PipelineOptimizer). ``self.optimizer`` is the wrapped optimizer; each method's default hands the
    call to it where it is a ParallelOptimizer, or does what one process does."""

    def _inner(self):
        inner = self.__dict__.get("optimizer")
        return inner if isinstance(inner, ParallelOptimizer) else None

    def _own_params(self) -> list:
        """The parameters this rank's optimizer steps (its groups' lists one after the other)."""
        return [p for group in self.param_groups for p in group["params"]]

    def synchronize(self) -> None:
        """Make every gradient this rank steps the gradient of the global batch (all-reduces, sums of a
        shared parameter's parts), once per step; ``step()`` calls it when the loop did not."""
        inner = self._inner()
        if inner is not None:
            inner.synchronize()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Synchronize, then scale the gradients by min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the norm of the
        whole model's gradient however it is spread over the ranks (a collective); returns ‖g‖."""
        inner = self._inner()
        if inner is not None:
            self.synchronize()
            return inner.clip_grad_norm_(max_norm)
        from minidl.optim import clip_grad_norm_
        self.synchronize()
        return clip_grad_norm_([p for p in self._own_params() if p.grad is not None], max_norm).array

    def grad_squares(self, params):
        """Σ ‖g‖² over the gradients of ``params`` (this rank's parameters, synchronized) as the unsplit
        model holds them: where ranks hold parts of a parameter, the parts' squares added over them (a
        collective). A pipeline adds its stages' numbers for the global norm. A 1-element float64
        array on the gradients' device (:func:`grad_squares`): no host read."""
        inner = self._inner()
        if inner is not None:
            return inner.grad_squares(params)
        return grad_squares(params)

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank whose gradients differ from this one's found an inf or NaN in those it
        unscaled (:class:`minidl.amp.GradScaler` asks, so every rank skips the same steps; a collective)."""
        inner = self._inner()
        return inner.reduce_found_inf(found_inf) if inner is not None else bool(found_inf)

    def consolidated_state_dict(self) -> dict:
        """The optimizer state one process keeps for the unsplit model (a collective)."""
        inner = self._inner()
        return inner.consolidated_state_dict() if inner is not None else self.optimizer.state_dict()

    def __getattr__(self, name):
        if name == "optimizer":  # not yet set (during unpickling): avoid recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)
