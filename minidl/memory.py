"""Memory of a training step, measured twice: what the graph holds, and what the allocator gives out.

Two figures, side by side, because they answer different questions::

    with minidl.memory.track() as m:
        loss = model(x).sum()
        loss.backward()
    m.peak_bytes            # saved for backward: the most bytes the graph's nodes held at once
    m.allocator_peak_bytes  # the allocator: the most bytes in use above the block's start
    print(m.report())

**Saved for backward** (``peak_bytes``, ``current_bytes``): the model of
activation memory that gradient checkpointing trades for recomputation. Every
op recorded in the graph keeps what its backward needs: its input tensors
(``fn.inputs``) and whatever forward stored on the node (a dropout mask, a
batch norm's statistics). The tracker is a
:class:`minidl.autograd.FunctionHook`: after each op call inside the block it
registers the arrays the op's node holds, if the call recorded one (outside
the block nothing is installed, so tracking costs nothing otherwise). Each
array is counted once by the buffer it lives in (a view and its base are one
buffer), however many nodes hold it. The count goes down when the node lets
go of them: when the engine releases it after its backward, or when it is
garbage-collected without a backward (a token stored among the node's saved
values is freed with them, and that is the signal). Parameters
(``nn.Parameter``) are held by the nodes that use them too, but they exist
whether or not a graph is built, so they are left out unless
``include_parameters=True``. Any other tensor a node holds counts, a user's
input included. What this figure does not see: gradients, the temporaries of
each backward formula, a node's output while nothing but its consumers'
walk holds it, and anything held outside the graph.

**The allocator** (``allocator_peak_bytes``): what the process actually
holds at its worst moment, above the level at the block's start. On the CPU
it is Python's :mod:`tracemalloc`, which sees every NumPy buffer
(``host_peak_bytes``; the tracker starts tracing when it is off and stops it
again at the end; if it was already tracing, its peak is reset at the start,
tracemalloc having a single peak). A buffer allocated before tracing started
and freed inside the block is not subtracted, so then the figure errs high.
On the GPU it is CuPy's memory pool: the pool has no peak counter, so the
tracker registers a ``cupy.cuda.MemoryHook`` that adds every block the pool
hands out and subtracts every block it takes back (exactly the changes of
``pool.used_bytes()``, on every device); ``pool_start_bytes`` and
``pool_peak_bytes`` are the pool's level at the start and its highest.
``allocator_peak_bytes`` is the pool's rise when the graph's arrays are on a
GPU, tracemalloc's otherwise. ``track(allocator=False)`` measures the graph
only (tracemalloc slows every allocation, which matters when timing).

Ops recorded before the block started are not counted. Not thread-safe:
track one computation at a time.
"""
from __future__ import annotations

import tracemalloc
import weakref

import numpy as np

from minidl import backend
from minidl.autograd import Function, FunctionHook, SavedEdge
from minidl.tensor import Parameter, Tensor

__all__ = ["MemoryTracker", "track", "saved_arrays", "format_bytes"]


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (binary units, as memory is allocated)."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop always returns


def _is_array(value) -> bool:
    if isinstance(value, np.ndarray):
        return True
    cp = backend._cupy
    return cp is not None and isinstance(value, cp.ndarray)


def _buffer(array):
    """(key, bytes) of the buffer that holds ``array``: a view counts as its base."""
    root = array
    while _is_array(root.base):
        root = root.base
    return id(root), int(root.nbytes)


def saved_arrays(fn: Function, include_parameters: bool = False) -> list:
    """The arrays a recorded node holds for backward: its inputs' data and arrays stored on it.

    A node recorded under :class:`minidl.autograd.saved_tensors_hooks` holds what ``pack``
    returned instead: the arrays found in it (in Tensors, tuples and lists) are counted, and
    the inputs it packed are not (the node keeps only their edge in the graph, or a leaf),
    nor the inputs that are edges without values.
    """
    arrays, packed_inputs, packed_names = [], set(), set()
    if fn.packed is not None:
        for key, packed, *_ in fn.packed.values:
            if type(key) is str:
                packed_names.add(key)  # held packed; the array itself is dropped from the node
            elif type(key) is int:
                packed_inputs.add(key)
                if not include_parameters and isinstance(fn.inputs[key], Parameter):
                    continue
            _arrays_in(packed, arrays)
    for i, x in enumerate(fn.inputs or ()):
        if type(x) is SavedEdge and not x.ready:
            continue  # an edge to the op that made x, without x's values
        if i not in packed_inputs and (include_parameters or not isinstance(x, Parameter)):
            arrays.append(x.array)
    for name, value in vars(fn).items():
        if name in ("inputs", "packed") or name in packed_names:
            continue
        if isinstance(value, Tensor):
            value = value.array
        if _is_array(value):
            arrays.append(value)
        elif isinstance(value, (tuple, list)):
            arrays.extend(v.array if isinstance(v, Tensor) else v for v in value
                          if _is_array(v) or (isinstance(v, Tensor)))
    return arrays


def _arrays_in(value, arrays: list, depth: int = 0):
    """Append the arrays in a packed value (an array, a Tensor, tuples and lists of them)."""
    if isinstance(value, Tensor):
        value = value.array
    if _is_array(value):
        arrays.append(value)
    elif isinstance(value, (tuple, list)) and depth < 4:
        for item in value:
            _arrays_in(item, arrays, depth + 1)


class MemoryTracker:
    """The figures of one tracked block; made and filled by :func:`track`.

    Saved for backward (bytes; only ops recorded inside the block count):
    ``current_bytes``, ``peak_bytes``; ``by_device`` maps 'cpu' / 'cuda:N'
    to the peak on that device; ``nodes`` counts the ops recorded;
    ``timeline`` lists ``current_bytes`` after every change when
    ``timeline=True``.

    The allocator (bytes above the block's start, None when not measured):
    ``host_peak_bytes`` (tracemalloc), ``pool_start_bytes`` and
    ``pool_peak_bytes`` (CuPy's pool, absolute), ``allocator_peak_bytes``
    (the one of the two for the device the graph lived on). Filled when the
    block ends.
    """

    def __init__(self, include_parameters: bool = False, timeline: bool = False, allocator: bool = True):
        self.include_parameters, self.allocator = include_parameters, allocator
        self.current_bytes = 0
        self.peak_bytes = 0
        self.nodes = 0
        self.by_device: dict[str, int] = {}
        self._current_by_device: dict[str, int] = {}
        self.timeline = [] if timeline else None
        self.pool_start_bytes = self.pool_peak_bytes = None
        self.host_peak_bytes = None
        self._counts: dict[int, list] = {}  # buffer key -> [holders, bytes, device]
        self._holders: dict[int, tuple] = {}  # id(token) -> (weakref to the node's token, its buffer keys)
        self.active = False

    @property
    def allocator_peak_bytes(self):
        """The allocator's peak above the block's start: CuPy's pool for a graph on a GPU, else tracemalloc's."""
        on_gpu = any(device != "cpu" for device in self.by_device)
        if on_gpu and self.pool_peak_bytes is not None:
            return self.pool_peak_bytes - self.pool_start_bytes
        return self.host_peak_bytes

    # ------------------------------------------------------------ bookkeeping
    def _register(self, fn: Function):
        keys = []
        for array in saved_arrays(fn, self.include_parameters):
            key, nbytes = _buffer(array)
            keys.append(key)
            entry = self._counts.get(key)
            if entry is None:
                device = backend.device_of(array)
                self._counts[key] = [1, nbytes, device]
                self._change(nbytes, device)
            else:
                entry[0] += 1
        # The token lives among the node's saved values, so it is freed exactly when they are:
        # by release() after the node's backward, or with the node when its graph is dropped.
        token = fn._memory_token = _Token()
        key = id(token)
        self._holders[key] = (weakref.ref(token, lambda _, key=key: self._forget(key)), keys)
        self.nodes += 1
        self._sample()

    def _forget(self, key: int):
        """A node's arrays are no longer held: on release, or when the node is collected."""
        entry = self._holders.pop(key, None)
        if entry is None:
            return
        for key in entry[1]:
            count = self._counts[key]
            count[0] -= 1
            if count[0] == 0:
                del self._counts[key]
                self._change(-count[1], count[2])
        self._sample()

    def _change(self, nbytes: int, device: str):
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        now = self._current_by_device.get(device, 0) + nbytes
        self._current_by_device[device] = now
        self.by_device[device] = max(self.by_device.get(device, 0), now)

    def _sample(self):
        if self.timeline is not None:
            self.timeline.append(self.current_bytes)

    # ------------------------------------------------------------ results
    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20

    def report(self) -> str:
        """A few lines: the bytes saved for backward (peak, now, per device), then the allocator's peak."""
        lines = [f"saved for backward (arrays held by graph nodes): peak {format_bytes(self.peak_bytes)}, "
                 f"now {format_bytes(self.current_bytes)}, {self.nodes} ops recorded"]
        if len(self.by_device) > 1:
            lines += [f"  {device}: peak {format_bytes(peak)}" for device, peak in sorted(self.by_device.items())]
        if not self.include_parameters:
            lines.append("  (parameters are not counted: they are held whether or not a graph is built)")
        if self.host_peak_bytes is not None:
            lines.append(f"allocator, host (tracemalloc): peak {format_bytes(self.host_peak_bytes)} above the start "
                         "(every buffer: activations, gradients, temporaries)")
        if self.pool_peak_bytes is not None:
            lines.append(f"allocator, GPU (CuPy memory pool): {format_bytes(self.pool_start_bytes)} in use at the "
                         f"start, peak {format_bytes(self.pool_peak_bytes)} "
                         f"(+{format_bytes(self.pool_peak_bytes - self.pool_start_bytes)})")
        return "\n".join(lines)

    def __repr__(self):
        allocator = self.allocator_peak_bytes
        return (f"<MemoryTracker saved peak={format_bytes(self.peak_bytes)} "
                f"current={format_bytes(self.current_bytes)} nodes={self.nodes}"
                + ("" if allocator is None else f" allocator peak={format_bytes(allocator)}") + ">")


class _Token:
    """Stored on a node the tracker counts; its weak reference fires when the node's saved values go."""

    __slots__ = ("__weakref__",)


_active: MemoryTracker | None = None  # the one tracker active now


class _PoolRise:
    """Bytes in use in CuPy's memory pool, relative to when it was registered, and their highest value.

    Made from ``cupy.cuda.MemoryHook`` (see :func:`_pool_meter`): the pool calls
    ``malloc_postprocess`` for every block it hands out and ``free_postprocess`` for every
    block it takes back, with the block's rounded size (what ``used_bytes()`` counts).
    """

    name = "minidl.memory.track"

    def __init__(self):
        self.used = self.peak = 0

    def malloc_postprocess(self, mem_size=0, mem_ptr=0, **_):
        if mem_ptr:  # 0: the allocation failed
            self.used += mem_size
            if self.used > self.peak:
                self.peak = self.used

    def free_postprocess(self, mem_size=0, **_):
        self.used -= mem_size


_pool_hook_class = None


def _pool_meter():
    """A fresh :class:`_PoolRise` that CuPy accepts as a memory hook (its class made once per CuPy module)."""
    global _pool_hook_class
    base = backend._cupy.cuda.MemoryHook
    if _pool_hook_class is None or not issubclass(_pool_hook_class, base):
        _pool_hook_class = type("PoolRise", (_PoolRise, base), {})
    return _pool_hook_class()


class track(FunctionHook):
    """Context manager: the bytes saved for backward by ops recorded inside it, and the allocator's peak.

    ``with track() as m: ...`` then ``m.peak_bytes``, ``m.current_bytes``,
    ``m.allocator_peak_bytes``, ``m.report()``. ``include_parameters=True``
    counts parameters held by the graph too; ``timeline=True`` keeps
    ``m.timeline``, the bytes after every change; ``allocator=False`` leaves
    tracemalloc and CuPy's pool unwatched. One tracker at a time: nesting
    raises RuntimeError.
    """

    def __init__(self, include_parameters: bool = False, timeline: bool = False, allocator: bool = True):
        self.tracker = MemoryTracker(include_parameters, timeline, allocator)
        self._pool = self._started_tracing = None

    def __enter__(self) -> MemoryTracker:
        global _active
        if _active is not None:
            raise RuntimeError("minidl.memory.track(): a tracker is already active; "
                               "nest the measured code inside the one tracker instead")
        tracker = self.tracker
        if tracker.allocator:
            if backend._cupy is not None:
                tracker.pool_start_bytes = backend._cupy.get_default_memory_pool().used_bytes()
                self._pool = _pool_meter().__enter__()
            self._started_tracing = not tracemalloc.is_tracing()
            if self._started_tracing:
                tracemalloc.start()
            tracemalloc.reset_peak()
            self._host_start = tracemalloc.get_traced_memory()[0]
        super().__enter__()
        _active = tracker
        tracker.active = True
        return tracker

    def __exit__(self, *exc):
        global _active
        super().__exit__(*exc)
        _active = None
        tracker = self.tracker
        tracker.active = False
        if tracker.allocator:
            tracker.host_peak_bytes = max(0, tracemalloc.get_traced_memory()[1] - self._host_start)
            if self._started_tracing:
                tracemalloc.stop()
            if self._pool is not None:
                self._pool.__exit__()
                tracker.pool_peak_bytes = tracker.pool_start_bytes + self._pool.peak
                self._pool = None
        return False

    def forward_postprocess(self, fn, inputs, outputs):
        if outputs is not None and "inputs" in vars(fn):  # recorded: the node now holds its inputs
            self.tracker._register(fn)
