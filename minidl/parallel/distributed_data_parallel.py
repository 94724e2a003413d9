"""DistributedDataParallel: PyTorch's DDP, as minidl's DataParallel with the all-reduce inside backward.

PyTorch's training loops never call ``sync_gradients()``: DDP averages the gradients while
``loss.backward()`` runs, so the loop reads (clips, steps) gradients that are already the global
batch's. Here the wrapper marks each Tensor its forward returns with an identity node and keeps
a :class:`~minidl.autograd.FunctionHook` active until the next backward walk has reached one of
them; when that walk ends, every gradient is final, and the bucketed all-reduce of
:meth:`DataParallel.sync_gradients` runs:

    g = (1/N) Σ_r g_r            (PyTorch's DDP: the mean over the N ranks)

Gradient accumulation: with ``model.require_backward_grad_sync = False`` (nanoGPT's loop) or inside
``with model.no_sync():`` a backward only accumulates this rank's gradients; the next backward with
the sync on all-reduces the accumulated sums, as PyTorch does.
"""
from __future__ import annotations

import contextlib

from minidl.autograd import Function, FunctionHook, is_grad_enabled
from minidl.nn.module import Module
from minidl.parallel.data_parallel import BUCKET_BYTES, DataParallel
from minidl.parallel.world import get_world, is_initialized
from minidl.tensor import Tensor

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(DataParallel):
    """``DistributedDataParallel(module, device_ids=[local_rank])``: gradients averaged over the ranks at the
    end of every ``backward()`` (PyTorch's DDP), after :func:`minidl.distributed.init_process_group`.

    Args:
        module: the model, already on this rank's device (``comm.device``).
        device_ids: ``None`` or ``[local_rank]`` (the one device this rank's model lives on); PyTorch's
            multi-device form (several ids) is refused.
        output_device, broadcast_buffers, find_unused_parameters, gradient_as_bucket_view, static_graph:
            PyTorch's keywords, accepted: buffers are broadcast at construction, unused parameters count
            as zero gradients (:meth:`DataParallel.sync_gradients`).
        bucket_cap_mb: the size of one all-reduce message, in MiB (25, as PyTorch).
        process_group: a minidl Communicator; the one ``init_process_group`` made by default.

    ``.module`` is the wrapped model; ``state_dict()`` has its keys without PyTorch's ``module.`` prefix
    (save ``model.module.state_dict()`` as nanoGPT does, and the keys are the same in both).
    """

    def __init__(self, module: Module, device_ids=None, output_device=None, broadcast_buffers: bool = True,
                 process_group=None, bucket_cap_mb: float = BUCKET_BYTES / 2**20,
                 find_unused_parameters: bool = False, gradient_as_bucket_view: bool = False,
                 static_graph: bool = False):
        if process_group is None:
            if not is_initialized():
                raise RuntimeError("DistributedDataParallel: the default process group has not been initialized; "
                                   "call minidl.distributed.init_process_group() first (under mpiexec, or "
                                   "python -m minidl.distributed.run for a torchrun-style script)")
            process_group = get_world()
        _check_device_ids(device_ids, process_group)
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        super().__init__(module, process_group, bucket_bytes=max(1, int(bucket_cap_mb * 2**20)))
        self.device_ids = None if device_ids is None else list(device_ids)
        self.require_backward_grad_sync = True  # nanoGPT's switch; no_sync() sets it for a block
        self._watch = _EndOfBackward(self)

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        if not (self.training and is_grad_enabled()):
            return out
        marks = []
        marked = _mark_outputs(out, self._watch, marks)
        if marks:  # some output has a graph: its backward is the one to wait for
            self._watch.arm()
        return marked

    @contextlib.contextmanager
    def no_sync(self):
        """``with model.no_sync():`` backwards inside only accumulate this rank's gradients (PyTorch's name for
        ``require_backward_grad_sync = False``); the first backward after the block averages the sums."""
        before = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def _weight(self, count: int, total: float) -> float:
        """1/N, whatever the slices' sizes: PyTorch's DDP averages over the ranks (DataParallel weighs each
        rank by its samples, the same number when the slices are equal)."""
        return 1.0 if self.reduction == "sum" else 1.0 / self.comm.size

    def extra_repr(self) -> str:
        return super().extra_repr() + f", require_backward_grad_sync={self.require_backward_grad_sync}"


def _check_device_ids(device_ids, comm) -> None:
    if device_ids is None:
        return
    ids = list(device_ids) if isinstance(device_ids, (list, tuple)) else None
    wanted = int(str(comm.device).split(":")[1]) if str(comm.device).startswith("cuda:") else comm.local_rank
    if ids is None or len(ids) != 1 or str(ids[0]).split(":")[-1] != str(wanted):
        raise ValueError(f"DistributedDataParallel: device_ids={device_ids!r}, but this rank's model lives on "
                         f"{comm.device} (local rank {comm.local_rank}); pass device_ids=[{wanted}] "
                         "(one device per process) or leave it out")


def _mark_outputs(out, watch, marks: list):
    """``out`` with each Tensor that needs a gradient passed through a node whose backward tells ``watch``
    (each one marked is appended to ``marks``)."""
    if isinstance(out, Tensor):
        if not out.requires_grad:
            return out
        marks.append(out)
        return _Reached(watch)(out)
    if isinstance(out, (tuple, list)):
        return type(out)(_mark_outputs(o, watch, marks) for o in out)
    if isinstance(out, dict):
        return {k: _mark_outputs(v, watch, marks) for k, v in out.items()}
    return out


class _Reached(Function):
    """y = x;  dx = dy, and the wrapper learns that this backward walk runs through its outputs;  ẏ = ẋ."""

    def __init__(self, watch: "_EndOfBackward"):
        self.watch = watch

    def forward(self, x):
        return x.view()

    def backward(self, gy):
        self.watch.reached = True
        return (gy,)

    def jvp(self, dx):
        return dx


class _EndOfBackward(FunctionHook):
    """Active from a training forward until the end of the backward walk that reaches its outputs; at that
    walk's end every gradient is final, and the gradients are averaged (when the sync is on)."""

    def __init__(self, ddp: DistributedDataParallel):
        self.ddp, self.armed, self.reached = ddp, False, False

    def arm(self) -> None:
        if not self.armed:
            self.__enter__()
            self.armed = True

    def walk_postprocess(self, outputs):
        if not self.reached:  # a walk that did not go through the model (autograd.grad of something else)
            return
        self.reached, self.armed = False, False
        self.__exit__(None, None, None)
        if self.ddp.require_backward_grad_sync:
            self.ddp.sync_gradients()
