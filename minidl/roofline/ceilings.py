"""The machine's two ceilings, measured: peak FLOP/s and memory bandwidth.

- **Peak FLOP/s**: a large float32 matrix product (n×n by n×n, 2n³ FLOPs),
  the most arithmetic-dense work there is; BLAS (cuBLAS on the GPU) runs it
  close to the hardware's limit.
- **Bandwidth**, STREAM's way: *copy* (b ← a: 2 arrays moved) and *triad*
  (a ← b + s·c: 3 arrays moved), on arrays far larger than the last-level
  cache so that every byte comes from main memory. NumPy runs an elementwise
  call on one core, so on the CPU each is also run split across threads and
  the better figure kept: the machine's ceiling, not one core's.
- **Cache bandwidth**: the same copy on arrays that fit in the L2 cache, the
  ceiling of ops whose working set never leaves the cache.

The **machine balance** is peak FLOP/s ÷ bandwidth (FLOP/byte): an op
doing fewer FLOPs per byte than this cannot reach the peak however well it
is written; it is memory-bound.

    ceilings = measure("cpu")          # or "cuda"; quick=True for small, fast, rougher figures
    ceilings.balance, ceilings.roof(intensity)
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from time import perf_counter

import numpy as np

from minidl import backend

TRIAD_CHUNK = 1 << 16  # elements per chunk of the CPU triad: three 256 KiB pieces stay in L2


@dataclass
class Ceilings:
    """Measured ceilings of one device (FLOP/s and bytes/s)."""

    device: str
    peak_flops: float
    copy_bandwidth: float
    triad_bandwidth: float
    cache_bandwidth: float
    gemm_size: int
    stream_bytes: int  # bytes per array in the bandwidth runs
    threads: int
    cache_bytes: int = 0  # bytes moved by the in-cache copy (both arrays): data this small stays in cache

    @property
    def bandwidth(self) -> float:
        """The memory ceiling: the better of copy and triad (bytes/s)."""
        return max(self.copy_bandwidth, self.triad_bandwidth)

    @property
    def balance(self) -> float:
        """Machine balance, FLOP/byte: the intensity where the two roofs meet."""
        return self.peak_flops / self.bandwidth

    def roof(self, intensity: float, cache: bool = False) -> float:
        """Attainable FLOP/s at an arithmetic intensity: min(peak, intensity × bandwidth).

        ``cache=True``: the in-cache roof, min(peak, intensity × cache bandwidth), the
        ceiling of an op whose data stay in the cache.
        """
        bandwidth = max(self.cache_bandwidth, self.bandwidth) if cache else self.bandwidth
        return min(self.peak_flops, intensity * bandwidth)

    def best(self, other: "Ceilings") -> "Ceilings":
        """The higher of each rate from two measurements of the same device (a busy moment only lowers them)."""
        return Ceilings(self.device, max(self.peak_flops, other.peak_flops),
                        max(self.copy_bandwidth, other.copy_bandwidth),
                        max(self.triad_bandwidth, other.triad_bandwidth),
                        max(self.cache_bandwidth, other.cache_bandwidth),
                        self.gemm_size, self.stream_bytes, self.threads, max(self.cache_bytes, other.cache_bytes))

    def as_dict(self) -> dict:
        return {**asdict(self), "bandwidth": self.bandwidth, "balance": self.balance}

    @classmethod
    def from_dict(cls, data: dict) -> "Ceilings":
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})

    def summary(self) -> str:
        return (f"{self.device}: peak {self.peak_flops / 1e9:.1f} GFLOP/s (float32 GEMM {self.gemm_size}³), "
                f"bandwidth {self.bandwidth / 1e9:.1f} GB/s (copy {self.copy_bandwidth / 1e9:.1f}, "
                f"triad {self.triad_bandwidth / 1e9:.1f}; in cache {self.cache_bandwidth / 1e9:.1f}), "
                f"balance {self.balance:.1f} FLOP/byte")


# ---------------------------------------------------------------- timing
def synchronizer(device: str):
    """A function that waits until the device has finished its queued work (no-op on the CPU)."""
    if backend.parse_device(device)[0] == "cpu":
        return lambda: None
    cp = backend.cupy_module()
    return lambda: cp.cuda.Device().synchronize()


def best_time(fn, repeat: int = 5, number: int = 1, warmup: int = 1, sync=None) -> float:
    """Fastest of ``repeat`` timings of ``number`` calls, in seconds per call.

    On the GPU pass ``sync`` (see :func:`synchronizer`): the clock stops only
    after the device has finished, not when the calls have been queued.
    """
    sync = sync or (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    best = math.inf
    for _ in range(repeat):
        start = perf_counter()
        for _ in range(number):
            fn()
        sync()
        best = min(best, (perf_counter() - start) / number)
    return best


def _timer(device, repeat, number=1):
    sync = synchronizer(device)
    return lambda fn: best_time(fn, repeat=repeat, number=number, sync=sync)


# ---------------------------------------------------------------- the three measurements
def measure_gemm(n: int, device: str = "cpu", repeat: int = 5, timer=None) -> float:
    """FLOP/s of an n×n by n×n float32 matrix product (2n³ FLOPs)."""
    xp = backend.xp_for(device)
    a = xp.ones((n, n), np.float32)
    b = xp.ones((n, n), np.float32)
    out = xp.empty((n, n), np.float32)
    seconds = (timer or _timer(device, repeat))(lambda: xp.matmul(a, b, out=out))
    return 2 * n ** 3 / seconds


def _split(n: int, parts: int) -> list[slice]:
    bounds = np.linspace(0, n, parts + 1).astype(int)
    return [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _on_threads(work, n: int, threads: int, pool):
    """Run work(piece) over ``threads`` contiguous pieces of range(n), in parallel when a pool is given."""
    if pool is None or threads == 1:
        return work(slice(0, n))
    list(pool.map(work, _split(n, threads)))


def measure_copy(nbytes: int, device: str = "cpu", repeat: int = 5, threads: int = 1, timer=None) -> float:
    """Bytes/s of b ← a for arrays of ``nbytes`` each: 2·nbytes moved per copy (STREAM's count)."""
    xp = backend.xp_for(device)
    n = max(nbytes // 4, 1)
    a = xp.ones(n, np.float32)
    b = xp.empty(n, np.float32)
    pool = ThreadPoolExecutor(threads) if xp is np and threads > 1 else None
    try:
        seconds = (timer or _timer(device, repeat))(
            lambda: _on_threads(lambda s: xp.copyto(b[s], a[s]), n, threads, pool))
    finally:
        if pool is not None:
            pool.shutdown()
    return 2 * n * 4 / seconds


def measure_triad(nbytes: int, device: str = "cpu", repeat: int = 5, threads: int = 1, timer=None) -> float:
    """Bytes/s of a ← b + s·c for arrays of ``nbytes`` each: 3·nbytes moved (STREAM's count).

    NumPy needs two calls for it (a = s·c, then a += b); done chunk by chunk,
    each chunk of a is still in the cache for the second call, so main memory
    sees the three arrays once each. On the GPU it is one fused kernel.
    """
    xp = backend.xp_for(device)
    n = max(nbytes // 4, 1)
    a = xp.empty(n, np.float32)
    b = xp.ones(n, np.float32)
    c = xp.ones(n, np.float32)
    s = np.float32(3.0)
    if xp is np:
        def work(piece):
            for start in range(piece.start, piece.stop, TRIAD_CHUNK):
                part = slice(start, min(start + TRIAD_CHUNK, piece.stop))
                np.multiply(c[part], s, out=a[part])
                a[part] += b[part]
        pool = ThreadPoolExecutor(threads) if threads > 1 else None
        run = lambda: _on_threads(work, n, threads, pool)  # noqa: E731
    else:
        pool = None
        kernel = xp.ElementwiseKernel("T b, T c, T s", "T a", "a = b + s * c", "minidl_triad")
        run = lambda: kernel(b, c, s, a)  # noqa: E731
    try:
        seconds = (timer or _timer(device, repeat))(run)
    finally:
        if pool is not None:
            pool.shutdown()
    return 3 * n * 4 / seconds


# ---------------------------------------------------------------- all of them
SIZES = {  # (GEMM n, bytes per array in the bandwidth runs, repeats)
    ("cpu", False): (2048, 256 << 20, 5),
    ("cpu", True): (1024, 64 << 20, 3),
    ("cuda", False): (8192, 1 << 30, 10),
    ("cuda", True): (2048, 128 << 20, 5),
}
CACHE_BYTES = {"cpu": 512 << 10, "cuda": 8 << 20}  # per array in the in-cache copy: two fit in L2


def measure(device: str = "cpu", quick: bool = False, gemm_size: int | None = None,
            stream_bytes: int | None = None, repeat: int | None = None) -> Ceilings:
    """Measure peak GEMM FLOP/s, copy and triad bandwidth (and in-cache copy) on ``device``."""
    kind = backend.parse_device(device)[0]
    default_n, default_bytes, default_repeat = SIZES[(kind, bool(quick))]
    n, nbytes, repeat = gemm_size or default_n, stream_bytes or default_bytes, repeat or default_repeat
    threads = (os.cpu_count() or 1) if kind == "cpu" else 1
    thread_counts = sorted({1, threads})
    peak = measure_gemm(n, device, max(2 * repeat, 6))  # the peak is the one figure everything is judged by
    copy = max(measure_copy(nbytes, device, repeat, t) for t in thread_counts)
    triad = max(measure_triad(nbytes, device, repeat, t) for t in thread_counts)
    cache_timer = _timer(device, repeat, number=50 if kind == "cpu" else 200)
    cache_array = min(CACHE_BYTES[kind], nbytes)
    cache = measure_copy(cache_array, device, timer=cache_timer)
    return Ceilings(device=kind, peak_flops=peak, copy_bandwidth=copy, triad_bandwidth=triad,
                    cache_bandwidth=cache, gemm_size=n, stream_bytes=nbytes, threads=threads,
                    cache_bytes=2 * cache_array)
