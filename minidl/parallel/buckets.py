"""Buckets of parameters whose gradients are final while the backward still runs.

Overlapped data parallelism (:class:`~minidl.parallel.data_parallel.DataParallel` with ``overlap=True``)
all-reduces, and ZeRO-2 (:class:`~minidl.parallel.sharded.ShardedDataParallel`) reduce-scatters, each
bucket of parameters as soon as the backward has finished its gradients. Both learn it the same way:

    forward:   UseCounter counts how many recorded ops take each parameter            (uses[i])
               BackwardStarts marks the forward's output
    backward:  BackwardStarts opens the step; GradientReady counts uses[i] down after each node;
               uses[i] = 0: parameter i's gradient is final; every parameter of bucket b final:
               BucketsInBackward.start(b), the subclass's collective

A parameter no recorded op used is final from the start; :meth:`BucketsInBackward.start_the_rest`
starts what is left at the sync (a counted use whose backward never ran).
"""
from __future__ import annotations

from minidl.autograd import Function, FunctionHook

__all__ = ["BackwardStarts", "BucketsInBackward", "GradientReady", "UseCounter"]


class UseCounter(FunctionHook):
    """During a forward (``with counter:``): ``uses[i]``, how many recorded ops take parameter i as an input
    (``positions``: ``{id(parameter): i}``). Ops recorded without a graph (no inputs kept) do not count:
    their backward never runs."""

    def __init__(self, positions: dict):
        self.positions, self.uses = positions, [0] * len(positions)

    def forward_postprocess(self, function, inputs, outputs):
        if function.inputs:  # recorded: its backward will run
            for x in inputs:
                index = self.positions.get(id(x))
                if index is not None:
                    self.uses[index] += 1


class GradientReady(FunctionHook):
    """During a backward: counts each parameter's uses down in ``step`` (a :class:`BucketsInBackward`) after
    each node's backward; at zero its gradient is final. Before each node it starts the buckets made ready
    by the nodes before (their gradients are accumulated into the parameters by then)."""

    def __init__(self, step: "BucketsInBackward"):
        self.step = step

    def backward_preprocess(self, function, grad_outputs):
        self.step.start_ready_buckets()  # the previous node's gradients are accumulated by now

    def backward_postprocess(self, function, grad_outputs, grad_inputs):
        if grad_inputs is None or not function.inputs:
            return
        for x, g in zip(function.inputs, grad_inputs):
            index = self.step.positions.get(id(x))
            if index is not None and g is not None:
                self.step.used(index)


class BackwardStarts(Function):
    """y = x;  dx = dy, and from here on :class:`GradientReady` watches the backward walk;  ẏ = ẋ.

    Placed on a forward's output: the backward reaching it opens ``step`` (a :class:`BucketsInBackward`),
    so only the walk of this forward's backward counts the uses down."""

    def __init__(self, step: "BucketsInBackward"):
        self.step = step

    def forward(self, x):
        return x.view()

    def backward(self, gy):
        self.step.open()
        return (gy,)

    def jvp(self, dx):
        return dx


class BucketsInBackward:
    """Which buckets of parameters have their final gradients, while a backward runs.

    The forward counted, with :class:`UseCounter`, how many recorded ops take each parameter;
    the backward walk counts them down (:class:`GradientReady`, after each node's backward), and
    a parameter whose count reaches zero has its final gradient. When every parameter of bucket
    ``b`` of ``plan`` (lists of (parameter index, offset)) is final, :meth:`start` ``(b)`` runs:
    data parallelism's all-reduce (``minidl.parallel.data_parallel``), ZeRO-2's reduce-scatter
    (``minidl.parallel.sharded``). :meth:`start_the_rest` starts the buckets left at the sync.
    """

    def __init__(self, params, uses, plan):
        self.params, self.uses, self.plan = params, list(uses), plan
        self.positions = {id(p): i for i, p in enumerate(params)}
        self.bucket_of = {index: b for b, bucket in enumerate(plan) for index, _ in bucket}
        self.waiting = [len(bucket) for bucket in plan]   # parameters not yet final, per bucket
        self.ready, self.started, self.hook, self.opened = [], set(), None, False
        self.merged_into = None  # a later forward's step that counts this one's uses too (see open)
        self.started_in_backward = 0
        for index, count in enumerate(self.uses):
            if count == 0:  # not used (or frozen path): final from the start
                self.ready.append(index)

    def start(self, b: int) -> None:
        raise NotImplementedError

    def open(self):
        """The backward reached this forward's output: watch the walk from here on (this step's, or the step
        of a later forward that took over its uses: two forwards, then one backward)."""
        if self.merged_into is not None:
            return self.merged_into.open()
        if self.hook is None:
            self.opened = True
            self.hook = GradientReady(self)
            self.hook.__enter__()

    def close(self):
        if self.hook is not None:
            hook, self.hook = self.hook, None
            hook.__exit__(None, None, None)

    def used(self, index: int):
        self.uses[index] -= 1
        if self.uses[index] == 0:
            self.ready.append(index)

    def start_ready_buckets(self, in_backward: bool = True):
        ready, self.ready = self.ready, []
        for index in ready:
            b = self.bucket_of[index]
            self.waiting[b] -= 1
            if self.waiting[b] == 0 and b not in self.started:
                self.started.add(b)
                self.start(b)
                self.started_in_backward += in_backward

    def start_the_rest(self) -> None:
        """Start the buckets left (a parameter counted uses that never ran backward)."""
        self.close()
        self.start_ready_buckets(in_backward=False)
        for b in range(len(self.plan)):
            if b not in self.started:
                self.started.add(b)
                self.start(b)
