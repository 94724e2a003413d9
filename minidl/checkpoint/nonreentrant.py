"""The non-reentrant checkpoint: saved tensors packed as placeholders, recomputed on their first unpack.

``checkpoint(fn, x, use_reentrant=False)``, as PyTorch's
``torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)`` does it.
The reentrant checkpoint (:mod:`minidl.checkpoint.segments`) runs ``fn``
without a graph and puts one node in its place, whose backward reruns ``fn``
and starts a second backward pass inside the first. This one records ``fn``'s
graph as usual, but under :class:`minidl.autograd.saved_tensors_hooks`:

- **pack**: each array an op of ``fn`` saves for backward is replaced by a
  placeholder (the segment and the value's position k in the order of saving),
  so the graph keeps its edges and none of its activations;
- **unpack**: the first unpack in backward reruns ``fn`` on the kept inputs,
  with grad recording on and the random state of the forward pass (the same
  dropout masks), and records what that run saves, in the same order: the
  k-th array saved by the rerun is the k-th placeholder's value. Each value is
  handed out once and dropped, so the recomputed activations go as the
  backward passes them.

The graph is the plain one, so everything the engine does with a graph works
through it: ``autograd.grad`` with respect to any tensor (an intermediate
inside ``fn`` included), ``backward(inputs=...)``, inputs that do not require
a gradient, hooks on tensors inside ``fn``. Peak memory is the reentrant
checkpoint's: the inputs kept, plus one segment's activations while its
backward runs. Higher-order gradients (``create_graph=True``) do not go
through packed nodes (see ``saved_tensors_hooks``).
"""
from __future__ import annotations

from minidl.autograd import enable_grad, saved_tensors_hooks
from minidl.checkpoint.replay import BufferGuard, RngState, first_draws_recorded
from minidl.tensor import Tensor

__all__ = ["checkpoint_nonreentrant"]


class _Placeholder:
    """What the graph holds instead of a saved array: its segment and its position in the saving order."""

    __slots__ = ("frame", "index")

    def __init__(self, frame, index):
        self.frame, self.index = frame, index


class _Frame:
    """One checkpointed call: fn, its kept inputs, its random state, and the values recomputed for backward."""

    def __init__(self, fn, args, rng):
        self.fn, self.rng = fn, rng
        # The inputs as fn saw them, without their graph (the graph reaches them through the recorded ops):
        # a recomputation starts from these arrays, as the forward pass did.
        self.args = [Tensor(a.array, requires_grad=a.requires_grad) if isinstance(a, Tensor) else a for a in args]
        self.saved = 0  # values packed in the forward pass
        self.values = {}  # position -> recomputed array, until handed out

    def pack(self, tensor):
        self.saved += 1
        return _Placeholder(self, self.saved - 1)

    def unpack(self, placeholder):
        if placeholder.index not in self.values:  # the first unpack (or one after a retain_graph pass)
            self.recompute()
        return self.values.pop(placeholder.index)

    def recompute(self):
        """Run fn again recording its graph, keeping the arrays it saves in the order it saves them."""
        arrays = []

        def keep(tensor):
            arrays.append(tensor.array)

        now = self.rng.now() if self.rng else None
        try:
            if now is not None:
                self.rng.restore()
            with BufferGuard(), enable_grad(), saved_tensors_hooks(keep, _never_unpacked):
                self.fn(*self.args)  # its outputs and graph are dropped: only the saved arrays are wanted
        finally:
            if now is not None:
                now.restore()  # the random stream goes on as if nothing had been recomputed
        if len(arrays) != self.saved:
            raise RuntimeError(f"checkpoint(use_reentrant=False): fn saved {self.saved} tensors for backward in "
                               f"the forward pass and {len(arrays)} when recomputed; fn must compute the same "
                               "thing every time it runs (no data-dependent branches outside its inputs)")
        self.values = dict(enumerate(arrays))


def _never_unpacked(packed):  # pragma: no cover - the recomputed graph is dropped before any backward
    raise RuntimeError("checkpoint(use_reentrant=False): a recomputed graph was backpropagated")


def checkpoint_nonreentrant(fn, *args, preserve_rng_state: bool = True):
    """``fn(*args)`` with its graph recorded but its saved tensors recomputed on backward (see the module).

    Gradients are exactly the plain run's. With ``preserve_rng_state`` (default)
    the recomputation draws the same random numbers as the forward pass.
    """
    if not callable(fn):
        raise TypeError(f"checkpoint(use_reentrant=False): fn must be callable (a Module or a function), "
                        f"got {type(fn).__name__}")
    rng = RngState()
    frame = _Frame(fn, args, rng)
    with saved_tensors_hooks(frame.pack, frame.unpack):
        if preserve_rng_state:
            with first_draws_recorded(rng):
                return fn(*args)
        return fn(*args)
