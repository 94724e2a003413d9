"""Where the time of a step goes: time per op type, forward and backward, and the engine's overhead.

    import minidl.profiler

    with minidl.profiler.profile() as prof:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    prof.print_table()

    op                phase      calls   total ms      %    mean µs  overhead µs
    Linear            backward       3      9.662   48.4     3220.6          0.0
    Linear            forward        3      6.515   32.6     2171.6         22.4
    SGD.step          update         1      1.897    9.5     1896.7            -
    ReLU              backward       2      0.853    4.3      426.5          0.0
    ...
    autograd engine   backward       1      0.239    1.2      239.3        239.3

Each row is one op type (the Function's class) in one phase:

- **forward**: a call of the op, from entering ``Function.__call__`` to the
  returned Tensor (the array math plus recording the node);
- **backward**: the node's ``backward`` during ``loss.backward()``, with every
  op it calls inside (they are part of that node's gradient, not rows of their own);
- **autograd engine**: the rest of the backward walk (sorting the graph,
  summing gradients over uses, accumulating into ``.grad``);
- **update**: an optimizer's ``step()``; ``prof.region(name)`` adds rows for any
  other block of code (data loading, a metric).

``overhead µs`` is the framework's own cost per call: the time of minidl's
machinery rather than of the op's work. For a forward, the op call minus the
time inside its ``forward`` on raw arrays (checking, wrapping the output,
recording the node); for a backward, that same machinery of the ops the node's
backward calls; for the engine, the whole walk outside the nodes except the
gradient sums it computes. On tiny tensors it is nearly the whole time; on
large ones it vanishes next to the arithmetic.

On the GPU, kernels run asynchronously, so the time of the Python call is not
the time of the work. By default each top-level interval is bracketed by two
CUDA events and the table's times are their elapsed time, read once the
context exits (one synchronization at the end), with the host time in a
column of its own; ``synchronize=True`` instead
waits for the GPU before and after every op, so the host times are the true
times at the cost of serializing the step.

Zero cost when not profiling: nothing is installed outside the ``with``
block. A profile is a :class:`minidl.autograd.FunctionHook`: the engine calls
it around every op call and every node's backward. Each op's own ``forward``
on arrays is timed by handing that op object, for that one call, a forward
that times itself (no class is changed). The same hook sees each backward
walk start and end (``walk_preprocess``, ``walk_postprocess``), and the
optimizers' steps are timed by a step hook for every optimizer
(:func:`minidl.hooks.register_optimizer_step_pre_hook`), removed on exit.
Not thread-safe: profile one thread at a time.

Besides the table, a profile keeps the **timeline**: every interval a row adds to (a top-level
op call with its inputs' shapes, a node's backward, the backward walk, an optimizer step, a
region) with its start and duration, in ``prof.events``. ``prof.export_chrome_trace(path)``
(PyTorch's name) writes it in Chrome's trace-event format: open the file in ``chrome://tracing``
or https://ui.perfetto.dev to see the step as bars on a time axis, the node backwards nested
inside the walk that ran them.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from dataclasses import dataclass
from time import perf_counter

from minidl import autograd, backend, hooks

_active = None  # the running profile, or None
ENGINE = "autograd engine"  # the row for the backward walk's own work


@dataclass
class OpStats:
    """Accumulated time of one op type in one phase (seconds)."""

    name: str
    phase: str
    calls: int = 0
    total: float = 0.0  # host time of every call, including the framework's own work
    overhead: float = 0.0  # of which: minidl's machinery, not the op's work
    gpu: float | None = None  # device time between CUDA events (GPU profiles only)

    @property
    def time(self) -> float:
        """The row's time: device time on the GPU (events), host time otherwise."""
        return self.total if self.gpu is None else self.gpu

    @property
    def work(self) -> float:
        """Host time of the op's own work (array math and the Python that drives it)."""
        return max(self.total - self.overhead, 0.0)

    @property
    def mean_us(self) -> float:
        return self.time / max(self.calls, 1) * 1e6

    @property
    def overhead_us(self) -> float:
        """Framework time per call in µs."""
        return max(self.overhead, 0.0) / max(self.calls, 1) * 1e6

    def as_dict(self) -> dict:
        return {"name": self.name, "phase": self.phase, "calls": self.calls, "total_s": self.total,
                "overhead_s": self.overhead, "gpu_s": self.gpu, "time_s": self.time,
                "mean_us": self.mean_us, "overhead_us": self.overhead_us}


@dataclass(frozen=True)
class Event:
    """One interval of the timeline: a row's name and phase, start (seconds after the block was
    entered), duration (host seconds), and for an op call its inputs' shapes."""

    name: str
    phase: str
    start: float
    duration: float
    shapes: tuple = ()


class _Frame:
    """The start of one timed interval: clock, the saved accumulators, CUDA start event."""

    __slots__ = ("start", "saved", "event", "shapes")

    def __init__(self, prof, shapes: tuple = ()):
        self.shapes = shapes
        self.saved = (prof._overhead, prof._work)
        prof._overhead = prof._work = 0.0
        self.event = prof._start_event()
        self.start = perf_counter()


class profile(autograd.FunctionHook):
    """Context that records the time of every op type, forward and backward (see the module docstring).

    ``cuda``: time GPU work with CUDA events (None: when CuPy is in use).
    ``synchronize``: on the GPU, wait for the device around every op instead.
    ``show``: print the table when the block ends.
    """

    def __init__(self, cuda: bool | None = None, synchronize: bool = False, show: bool = False):
        self.cuda = cuda
        self.synchronize = synchronize
        self.show = show
        self.stats: dict[tuple[str, str], OpStats] = {}
        self.events: list[Event] = []  # the timeline (see the module docstring)
        self.wall = 0.0  # seconds from entering to leaving the block
        self._overhead = 0.0  # machinery time inside the interval being timed
        self._work = 0.0  # time inside forward() of the op calls in that interval
        self._forward = 0.0  # time inside forward() of the current op call
        self._depth = 0  # > 0 while inside an op, a node's backward, the walk or a region
        self._call = None  # (start, frame or None) of the op call in progress (calls never nest)
        self._nodes = []  # frames of the node backwards in progress (a walk may run inside one)
        self._walk_nodes = [0.0, 0.0]  # node backward (total, forward work) inside the current walk
        self._events = []  # (key, start event, end event) to read after the block (GPU)
        self._walks = []  # per backward walk in progress: None (inside an op) or (saved node sums, frame)
        self._steps = []  # per optimizer step in progress: None (inside another step) or its frame
        self._handles = []  # the step hooks, removed on exit
        self._cp = None

    # ------------------------------------------------------------ install / uninstall
    def __enter__(self):
        global _active
        if _active is not None:
            raise RuntimeError("minidl.profiler.profile(): a profile is already running; "
                               "profiles cannot be nested")
        if self.cuda is None:
            self.cuda = backend._cupy is not None
        if self.cuda:
            self._cp = backend.cupy_module()
            self._cp.cuda.Device().synchronize()  # earlier queued work is not ours
        super().__enter__()
        self._handles = [hooks.register_optimizer_step_pre_hook(self._step_starts),
                         hooks.register_optimizer_step_post_hook(self._step_ends)]
        _active = self
        self._started = perf_counter()
        return self

    def __exit__(self, *exc):
        global _active
        if self.cuda:
            self._cp.cuda.Device().synchronize()
        self.wall = perf_counter() - self._started
        _active = None
        super().__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._read_events()
        if self.show:
            self.print_table()
        return False

    # ------------------------------------------------------------ the engine's hook
    def forward_preprocess(self, fn, inputs):
        """An op call starts: a forward row at the top level, machinery time inside a backward or region."""
        frame = None
        if not self._depth:
            self._depth = 1
            frame = _Frame(self, tuple(tuple(t.shape) for t in inputs if t is not None))
        self._forward = 0.0
        self._time_forward(fn)
        self._call = (perf_counter(), frame)

    def forward_postprocess(self, fn, inputs, outputs):
        vars(fn).pop("forward", None)  # the call failed before its forward ran
        start, frame = self._call
        self._overhead += perf_counter() - start - self._forward  # the call minus its forward()
        if frame is not None:
            self._depth = 0
            self._finish(frame, type(fn).__name__, "forward")

    def _time_forward(self, fn):
        """Give this op object, for this one call, a forward that adds its time to the op's work."""
        forward = fn.forward

        def timed_forward(*arrays):
            del fn.forward  # used once: the op object is left as it was
            start = perf_counter()
            try:
                return forward(*arrays)
            finally:
                elapsed = perf_counter() - start
                self._forward += elapsed
                self._work += elapsed
        fn.forward = timed_forward

    def backward_preprocess(self, fn, grad_outputs):
        """A node's backward starts: a backward row of its op type, the ops it calls included."""
        self._depth += 1
        self._nodes.append(_Frame(self))

    def backward_postprocess(self, fn, grad_outputs, grad_inputs):
        self._depth -= 1
        total, work = self._finish(self._nodes.pop(), type(fn).__name__, "backward")
        self._walk_nodes[0] += total
        self._walk_nodes[1] += work

    def walk_preprocess(self, outputs):
        """A backward walk starts: what its nodes do not account for will be the engine's own row."""
        if self._depth:  # a walk inside an op (a grad() in a backward) belongs to that op
            self._walks.append(None)
            return
        self._depth += 1
        saved_nodes, self._walk_nodes = self._walk_nodes, [0.0, 0.0]
        self._walks.append((saved_nodes, _Frame(self)))

    def walk_postprocess(self, outputs):
        entry = self._walks.pop()
        if entry is None:
            return
        saved_nodes, frame = entry
        self._depth -= 1
        elapsed = perf_counter() - frame.start
        work = self._work
        self._overhead, self._work = frame.saved[0] + self._overhead, frame.saved[1] + work
        nodes_total, nodes_work = self._walk_nodes
        self._walk_nodes = saved_nodes
        engine = max(elapsed - nodes_total, 0.0)
        self.events.append(Event(ENGINE, "backward", frame.start - self._started, elapsed))
        # the engine's own time is machinery, except the gradient sums it runs between nodes
        self._add(ENGINE, "backward", engine, max(engine - (work - nodes_work), 0.0))

    # ------------------------------------------------------------ the optimizers' step hooks
    def _step_starts(self, optimizer, args, kwargs):
        """An optimizer step starts: one "update" row per optimizer type (a wrapper's step holds its inner one's)."""
        if self._depth:
            self._steps.append(None)
            return
        self._depth += 1
        self._steps.append(_Frame(self))

    def _step_ends(self, optimizer, args, kwargs):
        frame = self._steps.pop()
        if frame is not None:
            self._depth -= 1
            self._finish(frame, f"{type(optimizer).__name__}.step", "update")

    # ------------------------------------------------------------ timing
    def _start_event(self):
        if not self.cuda:
            return None
        if self.synchronize:
            self._cp.cuda.Device().synchronize()
            return None
        event = self._cp.cuda.Event()
        event.record()
        return event

    def _finish(self, frame: _Frame, name: str, phase: str, calls: int = 1) -> tuple[float, float]:
        """Close ``frame``: add its time to the row (name, phase); return (total, forward work) seconds."""
        if self.cuda and self.synchronize:
            self._cp.cuda.Device().synchronize()
        elapsed = perf_counter() - frame.start
        overhead, work = self._overhead, self._work
        self._overhead, self._work = frame.saved[0] + overhead, frame.saved[1] + work  # enclosing intervals
        self._add(name, phase, elapsed, overhead, calls)
        self.events.append(Event(name, phase, frame.start - self._started, elapsed, frame.shapes))
        if frame.event is not None:
            end = self._cp.cuda.Event()
            end.record()
            self._events.append(((name, phase), frame.event, end))
        return elapsed, work

    def _add(self, name, phase, total, overhead, calls=1):
        key = (name, phase)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = OpStats(name, phase)
        stats.calls += calls
        stats.total += total
        stats.overhead += overhead

    def _read_events(self):
        if not self._events:
            return
        self._events[-1][2].synchronize()
        for key, start, end in self._events:
            stats = self.stats[key]
            stats.gpu = (stats.gpu or 0.0) + self._cp.cuda.get_elapsed_time(start, end) / 1e3
        self._events.clear()

    @contextlib.contextmanager
    def region(self, name: str, phase: str = "region"):
        """Time a block of code as one row (ops inside it are part of it, not rows of their own)."""
        if _active is not self:
            yield
            return
        self._depth += 1
        frame = _Frame(self)
        try:
            yield
        finally:
            self._depth -= 1
            self._finish(frame, name, phase)

    # ------------------------------------------------------------ results
    def rows(self, sort_by: str = "time") -> list[OpStats]:
        """Every row, largest first by ``sort_by``: 'time', 'calls', 'overhead_us' or 'mean_us'."""
        return sorted(self.stats.values(), key=lambda s: getattr(s, sort_by), reverse=True)

    @property
    def total_time(self) -> float:
        """Time attributed to rows (seconds); GPU time in a GPU profile."""
        return sum(s.time for s in self.stats.values())

    @property
    def op_calls(self) -> int:
        """Number of op calls (forward rows)."""
        return sum(s.calls for s in self.stats.values() if s.phase == "forward")

    @property
    def overhead_us_per_op(self) -> float:
        """The framework's cost per op call in µs: forward and backward bookkeeping plus the
        engine's walk, divided by the number of op calls (the ops' own work excluded)."""
        spent = sum(s.overhead for s in self.stats.values() if s.phase in ("forward", "backward"))
        return max(spent, 0.0) / max(self.op_calls, 1) * 1e6

    def by_op(self) -> dict[str, dict[str, float]]:
        """{op: {phase: seconds}}: the time of each op type split by phase (for a stacked bar chart)."""
        out: dict[str, dict[str, float]] = {}
        for s in self.stats.values():
            out.setdefault(s.name, {})[s.phase] = s.time
        return out

    def as_dict(self) -> dict:
        return {"wall_s": self.wall, "total_s": self.total_time, "cuda": bool(self.cuda),
                "overhead_us_per_op": self.overhead_us_per_op,
                "rows": [s.as_dict() for s in self.rows()]}

    def table(self, sort_by: str = "time", top: int | None = None) -> str:
        """The rows as a text table, sorted by ``sort_by`` (largest first)."""
        rows = self.rows(sort_by)[:top]
        width = max([len(s.name) for s in rows] + [16])
        gpu = bool(self.cuda)
        head = (f"{'op':<{width}}  {'phase':<8}  {'calls':>6}  {'total ms':>9}  {'%':>5}  {'mean µs':>9}  "
                f"{'overhead µs':>11}")
        if gpu:
            head += f"  {'host ms':>8}"
        lines = [head, "-" * len(head)]
        total = self.total_time or 1.0
        for s in rows:
            overhead = f"{s.overhead_us:11.1f}" if s.phase in ("forward", "backward") else f"{'-':>11}"
            line = (f"{s.name:<{width}}  {s.phase:<8}  {s.calls:>6}  {s.time * 1e3:9.3f}  "
                    f"{100 * s.time / total:5.1f}  {s.mean_us:9.1f}  {overhead}")
            if gpu:
                line += f"  {s.total * 1e3:8.3f}"
            lines.append(line)
        lines.append("-" * len(head))
        clock = "GPU time (CUDA events)" if gpu and not self.synchronize else "host time"
        lines.append(f"{'in ops and regions':<{width}}  {'':<8}  {'':>6}  {self.total_time * 1e3:9.3f}   ({clock})")
        lines.append(f"{'wall time of the block':<{width}}  {'':<8}  {'':>6}  {self.wall * 1e3:9.3f}")
        lines.append(f"framework overhead: {self.overhead_us_per_op:.1f} µs per op call "
                     f"({self.op_calls} op calls; forward, backward and engine bookkeeping)")
        return "\n".join(lines)

    def export_chrome_trace(self, path) -> None:
        """Write the timeline as Chrome's trace-event JSON: one complete event ("ph": "X") per interval,
        times in microseconds from the start of the block, the op's phase as its category and its
        inputs' shapes as its arguments. Written to a temporary file, then renamed into place."""
        pid, tid = os.getpid(), threading.get_ident()
        events = [{"name": e.name, "cat": e.phase, "ph": "X", "ts": e.start * 1e6, "dur": e.duration * 1e6,
                   "pid": pid, "tid": tid, "args": {"shapes": [list(s) for s in e.shapes]} if e.shapes else {}}
                  for e in sorted(self.events, key=lambda e: (e.start, -e.duration))]
        path = os.fspath(path)
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def print_table(self, sort_by: str = "time", top: int | None = None) -> None:
        print(self.table(sort_by, top))

    def __str__(self):
        return self.table()
