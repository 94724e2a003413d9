"""cupy.cuda on the stand-in: devices, streams, events, the memory pool and the runtime calls minidl makes."""
from __future__ import annotations

import threading as _threading
import time as _time
import types as _types

from tests import cupy_standin as _cp

DEVICE_COUNT = 2  # GPUs the stand-in pretends to have: two, so that placement on cuda:1 is tested


class Device:
    """cupy.cuda.Device: a context manager that makes device ``id`` current."""

    def __init__(self, device=None):
        self.id = _cp._current_device[0] if device is None else int(device)
        if not 0 <= self.id < DEVICE_COUNT:
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")
        self._previous = []

    def use(self):
        _cp._current_device[0] = self.id

    def __enter__(self):
        self._previous.append(_cp._current_device[0])
        self.use()
        return self

    def __exit__(self, *exc):
        _cp._current_device[0] = self._previous.pop()

    def synchronize(self):
        _cp.syncs.add("Device.synchronize()")

    @property
    def compute_capability(self):
        return "90"

    @property
    def mem_info(self):
        return (80 * 2**30 - _cp._pool.used, 80 * 2**30)

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


def get_device_id():
    return _cp._current_device[0]


class MemoryPointer:
    def __init__(self, ptr, size):
        self.ptr, self.size = ptr, size
        self.device_id = _cp._current_device[0]


class Stream:
    """cupy.cuda.Stream: work on the stand-in runs at once, so only synchronize() has an effect (counted)."""

    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else id(self)

    def synchronize(self):
        _cp.syncs.add("Stream.synchronize()")

    def use(self):
        _stream[0] = self
        return self

    def __enter__(self):
        self._previous = _stream[0]
        _stream[0] = self
        return self

    def __exit__(self, *exc):
        _stream[0] = self._previous

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        pass

    @property
    def done(self):
        return True


Stream.null = Stream(null=True)
_stream = [Stream.null]


def get_current_stream(device_id=-1):
    return _stream[0]


class Event:
    """cupy.cuda.Event: records the host clock (the stand-in's work has finished when it returns)."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self._time = None

    def record(self, stream=None):
        self._time = _time.perf_counter()

    def synchronize(self):
        _cp.syncs.add("Event.synchronize()")

    @property
    def done(self):
        return True


def get_elapsed_time(start_event, end_event):
    """Milliseconds between two recorded events (a synchronization on a GPU)."""
    _cp.syncs.add("cuda.get_elapsed_time()")
    if start_event._time is None or end_event._time is None:
        raise runtime.CUDARuntimeError("cudaErrorInvalidResourceHandle: an event was not recorded")
    return (end_event._time - start_event._time) * 1e3


class MemoryPool:
    """cupy.cuda.MemoryPool: bytes held by live stand-in arrays."""

    def __init__(self):
        self._peak = 0

    def used_bytes(self):
        return _cp._pool.used

    def total_bytes(self):
        return _cp._pool.used

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        pass

    def n_free_blocks(self):
        return 0

    def set_limit(self, size=None, fraction=None):
        self._limit = size

    def get_limit(self):
        return getattr(self, "_limit", 0)


_default_pool = MemoryPool()


class MemoryHook:
    """cupy.cuda.MemoryHook: called when the pool hands out a block (malloc) and takes it back (free).

    ``with hook:`` registers it for this thread under its ``name``, as CuPy does. The stand-in's
    pool calls ``malloc_postprocess`` and ``free_postprocess`` with CuPy's keyword arguments; it
    never allocates from a device, so the ``alloc`` methods are never called.
    """

    name = "MemoryHook"

    def __enter__(self):
        hooks = memory_hook.get_memory_hooks()
        if self.name in hooks:
            raise KeyError(f"memory hook {self.name} already exists")
        hooks[self.name] = self
        return self

    def __exit__(self, *_):
        del memory_hook.get_memory_hooks()[self.name]

    def alloc_preprocess(self, **kwargs):
        pass

    def alloc_postprocess(self, **kwargs):
        pass

    def malloc_preprocess(self, **kwargs):
        pass

    def malloc_postprocess(self, **kwargs):
        pass

    def free_preprocess(self, **kwargs):
        pass

    def free_postprocess(self, **kwargs):
        pass


_hooks_here = _threading.local()


def _get_memory_hooks():
    """This thread's registered hooks, by name (cupy.cuda.memory_hook.get_memory_hooks)."""
    hooks = getattr(_hooks_here, "hooks", None)
    if hooks is None:
        hooks = _hooks_here.hooks = {}
    return hooks


memory_hook = _types.SimpleNamespace(MemoryHook=MemoryHook, get_memory_hooks=_get_memory_hooks)
_pinned_pool = MemoryPool()


class _CUDARuntimeError(RuntimeError):
    pass


def _properties(device):
    if not 0 <= int(device) < DEVICE_COUNT:
        raise _CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {device}")
    return {"name": b"CuPy stand-in (NumPy)", "totalGlobalMem": 80 * 2**30, "multiProcessorCount": 132,
            "major": 9, "minor": 0, "clockRate": 1_980_000, "memoryClockRate": 2_619_000,
            "memoryBusWidth": 5120, "l2CacheSize": 50 * 2**20}


def _device_synchronize():
    _cp.syncs.add("runtime.deviceSynchronize()")


runtime = _types.SimpleNamespace(
    CUDARuntimeError=_CUDARuntimeError,
    getDeviceCount=lambda: DEVICE_COUNT,
    getDevice=get_device_id,
    setDevice=lambda device: Device(device).use(),
    getDeviceProperties=_properties,
    deviceSynchronize=_device_synchronize,
    runtimeGetVersion=lambda: 12080,
    driverGetVersion=lambda: 12080,
    memGetInfo=lambda: (80 * 2**30 - _cp._pool.used, 80 * 2**30),
    is_hip=False,
)

# No NCCL on the stand-in: minidl's data parallelism runs on its local communicator here.
nccl = _types.SimpleNamespace(available=False)


def is_available():
    return DEVICE_COUNT > 0
