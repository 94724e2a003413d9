"""Arrays and devices: NumPy on the CPU, CuPy on the GPU, behind one ``xp``.

Every layer above asks this module for the array module of a device or of an
array instead of importing numpy or cupy itself, so the same code runs on
both. This is the only module of minidl that imports cupy, and it does so
lazily: a CPU-only machine never needs it installed.

    xp = backend.xp_of(array)          # numpy or cupy, whichever owns array
    xp = backend.xp_for("cuda:0")      # the module for a device string

Where NumPy and CuPy spell one operation differently (an unbuffered
scatter-add, the error function, NCCL), this module offers one function that
picks the right spelling, so no other module needs ``import cupyx``:

    backend.scatter_add(target, index, values)   target[index] += values, repeats add up
    backend.erf(x)                               the error function, elementwise
    backend.nccl()                               the cupy.cuda.nccl module
    backend.matmul, backend.sum, backend.mean  16-bit floats accumulated in float32
"""
from __future__ import annotations

import contextlib
import importlib
import operator
import warnings

import numpy as np

from minidl import array_kernels

_cupy = None  # the cupy module once a GPU has been asked for; None before
_cupyx = None  # its companion cupyx module, imported with it on first use


def _use_cupy_module(cupy, cupyx=None):
    """Test hook, never called by users: make ``cupy`` (and ``cupyx``) the GPU array module.

    The test suite passes its CuPy stand-in here to run every GPU code path
    without a GPU; ``_use_cupy_module(None)`` forgets it again, so the next
    GPU request imports the real CuPy. GPU random generators start afresh and
    pending GPU range checks (:func:`check_range`) are dropped.
    Returns the (cupy, cupyx) pair that was in use, to put back afterwards.
    """
    global _cupy, _cupyx
    previous = (_cupy, _cupyx)
    _cupy, _cupyx = cupy, cupyx
    _gpu_rngs.clear()
    _gpu_bit_generators.clear()
    _deferred.clear()
    return previous


def _cupyx_module():
    """``cupyx``, the home of CuPy's extras (scatter_add, scipy.special), next to the cupy in use."""
    global _cupyx
    if _cupyx is None:
        cupy_module()
        import cupyx
        _cupyx = cupyx
    return _cupyx


def cupy_module():
    """Import CuPy on first use, with an error that says how to get it."""
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                "device 'cuda' needs CuPy, which is not installed: pip install 'minidl[gpu]' (CuPy for "
                "CUDA 12) or 'minidl[gpu-cuda13]' (CUDA 13), or use device='cpu'"
            ) from exc
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"device 'cuda': CuPy is installed but no GPU can be used ({exc}); a GPU needs an "
                "NVIDIA driver and CuPy's CUDA libraries (pip install 'minidl[gpu]'), or use device='cpu'"
            ) from exc
        if count == 0:  # pragma: no cover
            raise RuntimeError("device 'cuda': no GPU found on this machine; use device='cpu'")
        _cupy = cupy
    return _cupy


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one GPU (never raises)."""
    try:
        cupy_module()
    except RuntimeError:
        return False
    return True


def parse_device(device) -> tuple[str, int]:
    """'cpu' -> ('cpu', 0); 'cuda' -> ('cuda', 0); 'cuda:1' -> ('cuda', 1)."""
    if device is None:
        return "cpu", 0
    text = str(device)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return "cpu", 0
    if kind in ("cuda", "gpu") and (not index or index.isdigit()):
        return "cuda", int(index or 0)
    raise ValueError(f"unknown device {device!r}: expected 'cpu', 'cuda' or 'cuda:N'")


def xp_for(device):
    """The array module (numpy or cupy) for a device string."""
    kind, _ = parse_device(device)
    return np if kind == "cpu" else cupy_module()


def xp_of(array):
    """The array module that owns ``array``; NumPy unless it is a CuPy array."""
    if _cupy is not None and isinstance(array, _cupy.ndarray):
        return _cupy
    return np


def is_device_array(value) -> bool:
    """True for a CuPy array (CuPy arrays have no ``__array_namespace__``: ask the module in use)."""
    return _cupy is not None and isinstance(value, _cupy.ndarray)


class device(str):  # noqa: N801 - PyTorch's name: torch.device
    """A device name with PyTorch's attributes: ``mdl.device("cuda:1").type == "cuda"``, ``.index == 1``.

    It is a ``str`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``), so it goes wherever minidl takes a
    device name and equals that name; ``device("cuda", 1)`` is PyTorch's two-argument form.
    ``index`` is None where the name gives none (``"cpu"``, ``"cuda"``: the current GPU, 0).
    """

    def __new__(cls, name, index=None):
        if isinstance(name, device) and index is None:
            return name
        text = str(name) if index is None else f"{name}:{operator.index(index)}"
        kind, number = parse_device(text)
        numbered = kind == "cuda" and ":" in text
        self = super().__new__(cls, f"cuda:{number}" if numbered else kind)
        self.type, self.index = kind, number if numbered else None
        return self

    def __repr__(self) -> str:
        return f"device(type='{self.type}'" + ("" if self.index is None else f", index={self.index}") + ")"


_devices: dict = {}  # name -> device object, so that Tensor.device builds each one once


def device_object(name: str) -> device:
    """The :class:`device` for a name that :func:`device_of` returned (cached)."""
    made = _devices.get(name)
    if made is None:
        made = _devices[name] = device(name)
    return made


def using_array(array):
    """:func:`using` for the device ``array`` lives on: a null context for a NumPy array (no parsing)."""
    if _cupy is None or not isinstance(array, _cupy.ndarray):
        return contextlib.nullcontext()
    return _cupy.cuda.Device(array.device.id)


def device_of(array) -> str:
    """'cpu' for NumPy arrays, 'cuda:N' for CuPy arrays."""
    if _cupy is not None and isinstance(array, _cupy.ndarray):
        return f"cuda:{array.device.id}"
    return "cpu"


def using(device):
    """A context in which new arrays and kernels go to ``device``'s GPU (changes nothing for the CPU).

    CuPy allocates every new array, and launches every kernel, on the *current* GPU. Work
    on arrays of ``cuda:1`` must run with GPU 1 current: otherwise it runs on GPU 0 (or
    fails, without peer access) and its results land there. minidl's ops, backward walk
    and optimizer steps enter this context when their arrays live on another GPU.
    """
    kind, index = parse_device(device)
    if kind == "cpu":
        return contextlib.nullcontext()
    return cupy_module().cuda.Device(index)


def to_device(array, device):
    """Copy ``array`` to ``device`` (no copy when it is already there)."""
    kind, index = parse_device(device)
    if kind == "cpu":
        if _cupy is not None and isinstance(array, _cupy.ndarray):
            if _deferred:
                raise_deferred()
            return _cupy.asnumpy(array)
        return np.asarray(array)
    cp = cupy_module()
    with cp.cuda.Device(index):
        return cp.asarray(array)


# ---------------------------------------------------------------- checks without a synchronization
# A range check of a GPU array (class indices against the class count) would cost a host
# synchronization per call. Instead its min and max stay on the device and are read, with
# any other value, at the next host read: the error comes a little later, as CUDA's own
# device-side asserts do, and a training step makes no synchronization of its own.
_deferred: list = []  # (device float64 [bad, min, max], describe(min, max) -> message)
_MAX_DEFERRED = 256  # read them back after this many, so an unread loop keeps no growing list


def check_range(array, low, high, describe) -> None:
    """Raise ValueError(describe(min, max)) when an element of ``array`` lies outside [low, high].

    A NumPy array is checked now. A GPU array is checked without a
    synchronization: the ValueError is raised at the next read to the host
    (``Tensor.item()``, ``numpy()``, :func:`fetch`, the Trainer's log).
    """
    if array.size == 0:
        return
    low_seen, high_seen = array.min(), array.max()
    if xp_of(array) is np:
        if low_seen < low or high_seen > high:
            raise ValueError(describe(low_seen.item(), high_seen.item()))
        return
    xp = xp_of(array)
    bad = (low_seen < low) | (high_seen > high)
    _deferred.append((xp.stack([bad.astype(np.float64), low_seen.astype(np.float64),
                                high_seen.astype(np.float64)]), describe))
    if len(_deferred) >= _MAX_DEFERRED:
        raise_deferred()


def _raise_failed(checks, values) -> None:
    for (_, describe), (bad, low_seen, high_seen) in zip(checks, values.reshape(-1, 3)):
        if bad:
            low_seen, high_seen = float(low_seen), float(high_seen)
            as_int = lambda v: int(v) if v.is_integer() else v  # noqa: E731 - indices print as ints
            raise ValueError(describe(as_int(low_seen), as_int(high_seen)))


def raise_deferred() -> None:
    """Read back the pending GPU range checks (one synchronization) and raise the first that failed."""
    if _deferred:
        fetch()


def fetch(*arrays) -> list:
    """NumPy copies of small GPU arrays and of every pending range check, in one device-to-host copy.

    Raises the ValueError of a failed :func:`check_range` first. The arrays are
    returned as float64 (the Trainer reads its losses this way, once per log interval).
    """
    checks = _deferred[:]
    _deferred.clear()
    parts = [c for c, _ in checks] + list(arrays)
    if not parts:
        return []
    values = np.concatenate([_host_float64(group) for group in _by_device(parts)])
    _raise_failed(checks, values[:3 * len(checks)])
    out, at = [], 3 * len(checks)
    for array in arrays:
        size = int(np.prod(array.shape))
        out.append(values[at:at + size].reshape(array.shape))
        at += size
    return out


def _by_device(parts) -> list[list]:
    """``parts`` in runs of consecutive arrays on one device (one run, and one copy, on one GPU)."""
    runs = []
    for part in parts:
        device = device_of(part)
        if runs and runs[-1][0] == device:
            runs[-1][1].append(part)
        else:
            runs.append((device, [part]))
    return [group for _, group in runs]


def _host_float64(group) -> np.ndarray:
    """The arrays of ``group`` (one device) raveled into one float64 NumPy array: one copy from a GPU."""
    xp = xp_of(group[0])
    if xp is np:
        return np.concatenate([np.ravel(p).astype(np.float64) for p in group])
    with using(device_of(group[0])):
        return to_numpy(xp.concatenate([xp.ravel(p).astype(np.float64) for p in group]))


def to_numpy(array) -> np.ndarray:
    """A NumPy array with the values of ``array`` (copied from the GPU if needed)."""
    return to_device(array, "cpu")


# ---------------------------------------------------------------- CPU threads
_thread_limit = None  # threadpoolctl's limiter while set_num_threads is in force


def set_num_threads(count: int) -> None:
    """Use ``count`` threads in the CPU's BLAS (the matrix products), as ``torch.set_num_threads``.

    Through threadpoolctl, which finds OpenBLAS, MKL or BLIS behind NumPy. On a machine
    busy with other work, fewer threads than cores is often faster.
    """
    global _thread_limit
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ValueError(f"set_num_threads: count must be a positive int, got {count!r}")
    _thread_limit = blas_threads(count)
    map_blas_workspace()  # threads that start now have workspaces of their own


def map_blas_workspace() -> None:
    """Have the CPU's BLAS map the first pages of its packing workspace: one product of zeros,
    (768 × 640)·(640 × 640) in float32, about 20 ms at one thread; run once when minidl is imported
    and again by :func:`set_num_threads`.

    OpenBLAS copies (packs) a product's operands into a workspace that it maps when it is first
    needed and that the operating system backs page by page, when a product first writes there;
    and its kernels prefetch a little past the block they packed. A prefetch into a page that
    is not backed yet is dropped, but only after the processor has walked the page tables —
    on every such prefetch, since a missing page is never cached — and on a virtual machine that
    walk goes through the guest's tables and the host's. A program whose products all stopped
    just short of such a page paid it in every product for as long as it ran. On the project's
    2-core VM (AMD EPYC, OpenBLAS 0.3.31, one thread): (512 × 256)·(256 × 64) took 1.7 ms instead
    of 0.47 ms, (2048 × 256)·(256 × 256) 28.8 ms instead of 8.6 ms, and the makemore transformer's
    training step 86 ms instead of 58 ms. This product fills the first 1.4 MB of OpenBLAS's
    workspace there (its whole block of A and 240 pages of B's panel), more than any of the real
    programs in ``benchmarks/programs`` packs; a larger product maps its own pages.
    """
    np.matmul(np.zeros((768, 640), np.float32), np.zeros((640, 640), np.float32))


def blas_threads(count: int):
    """A context in which the CPU's BLAS uses at most ``count`` threads (threadpoolctl), restored after.

    For work made of small products, such as sampling one token at a time: threads that
    cannot share a small product out only wait for each other, and on a machine busy
    with other work they wait for the cores too (``minidl gpt sample``: 8 ms per token
    with one thread against 18–118 ms with two, on a 2-core machine running one other job).
    """
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=int(count), user_api="blas")


def get_num_threads() -> int:
    """The number of threads the CPU's BLAS uses (the largest, if NumPy loaded several BLAS libraries)."""
    from threadpoolctl import threadpool_info
    counts = [lib["num_threads"] for lib in threadpool_info() if lib.get("user_api") == "blas"]
    return max(counts, default=1)


# ---------------------------------------------------------------- random numbers
# One seed drives every random source: NumPy's generator for the CPU and one
# CuPy generator per GPU, created from the same seed on first use.
_gpu_seed = None  # the GPUs' seed: manual_seed's, or seed_gpus' alone (PyTorch's torch.cuda.manual_seed)
_cpu_rng = np.random.default_rng()
_gpu_rngs: dict[int, object] = {}
_gpu_bit_generators: dict[int, object] = {}  # the XORWOW behind each GPU generator: its state is saved


def manual_seed(seed: int) -> None:
    """Seed every random source minidl uses (CPU now, each GPU on first use)."""
    global _cpu_rng
    _cpu_rng = np.random.default_rng(int(seed))
    seed_gpus(seed)


def seed_gpus(seed: int) -> None:
    """Seed the GPUs' generators only (each created from the seed on first use); the CPU's stream goes on."""
    global _gpu_seed
    _gpu_seed = int(seed)
    _gpu_rngs.clear()
    _gpu_bit_generators.clear()


def rng(device="cpu"):
    """The generator for a device: ``numpy.random.Generator`` or CuPy's.

    Every random draw in minidl asks here first, so this is the random
    generator's hook point: see :func:`rng_hook`.
    """
    kind, index = parse_device(device)
    if kind == "cpu":
        generator = _cpu_rng
    else:
        if index not in _gpu_rngs:
            cp = cupy_module()
            with cp.cuda.Device(index):
                seed = None if _gpu_seed is None else _gpu_seed + index
                bits = cp.random.XORWOW(seed)  # what cp.random.default_rng(seed) builds, kept for its state
                _gpu_bit_generators[index], _gpu_rngs[index] = bits, cp.random.Generator(bits)
        generator = _gpu_rngs[index]
    if _rng_hooks:  # the common case costs this one check
        for hook in _rng_hooks:
            hook(device, generator)
    return generator


_rng_hooks: tuple = ()  # the active rng_hook functions, outermost first


@contextlib.contextmanager
def rng_hook(hook):
    """Inside the block, ``hook(device, generator)`` runs each time a generator is asked for.

    It runs before the caller draws, so a hook can record the generator's
    state first (gradient checkpointing does, to draw the same dropout masks
    again when it recomputes). Hooks nest; each is removed when its block ends.
    """
    global _rng_hooks
    _rng_hooks = _rng_hooks + (hook,)
    try:
        yield hook
    finally:
        _rng_hooks = tuple(h for h in _rng_hooks if h is not hook)


def get_rng_state() -> dict:
    """The CPU generator's state, for checkpoints that must resume exactly."""
    return _cpu_rng.bit_generator.state


def set_rng_state(state: dict) -> None:
    _cpu_rng.bit_generator.state = state


def get_gpu_rng_states() -> dict:
    """``{GPU index: state}`` of every GPU generator drawn from so far, as NumPy int8 arrays.

    The state is the cuRAND state array CuPy's XORWOW keeps on the device
    (one synchronization to copy it); writing it back with
    :func:`set_gpu_rng_states` continues the random stream exactly.
    """
    states = {index: _state_array(bits) for index, bits in sorted(_gpu_bit_generators.items())}
    return {index: to_numpy(state).copy() for index, state in states.items() if state is not None}


def check_gpu_rng_states(states) -> dict:
    """Raise ValueError saying what is wrong with ``states`` for :func:`set_gpu_rng_states`; change nothing.

    Returns the states as NumPy arrays. Without a usable GPU the states are
    not checked against a generator (and ``set_gpu_rng_states`` skips them).
    """
    if not isinstance(states, dict):
        raise ValueError(f"the GPU random states must be a dict {{GPU index: int8 array}}, got {type(states).__name__}")
    out = {}
    for index, state in states.items():
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise ValueError(f"the GPU random states are keyed by GPU index (an int >= 0), got {index!r}")
        if not (hasattr(state, "dtype") and hasattr(state, "shape")) or state.dtype != np.int8 or len(state.shape) != 1:
            raise ValueError(f"the random state of GPU {index} must be a 1-D int8 array, got "
                             f"{getattr(state, 'dtype', type(state).__name__)} of shape {getattr(state, 'shape', '?')}")
        out[int(index)] = to_numpy(state)
    if out and gpu_available():
        for index, state in out.items():
            if index >= cupy_module().cuda.runtime.getDeviceCount():
                raise ValueError(f"the checkpoint holds a random state for GPU {index}, which this machine lacks")
            own = _state_array(_gpu_bit_generator(index))
            size = state.size if own is None else own.size
            if state.size != size:
                raise ValueError(f"the random state of GPU {index} has {state.size} bytes but this GPU's generator "
                                 f"has {size} (saved on another GPU model?)")
    return out


def set_gpu_rng_states(states: dict) -> None:
    """Restore what :func:`get_gpu_rng_states` returned; skipped on a machine without a usable GPU."""
    states = check_gpu_rng_states(states)
    if not states or not gpu_available():
        return
    cp = cupy_module()
    for index, state in states.items():
        own = _state_array(_gpu_bit_generator(index))
        if own is not None:
            with cp.cuda.Device(index):
                own[...] = cp.asarray(state)


def _gpu_bit_generator(index: int):
    rng(f"cuda:{index}")
    return _gpu_bit_generators[index]


def _state_array(bits):
    """The device int8 array holding a CuPy bit generator's cuRAND states (``XORWOW._state``)."""
    state = getattr(bits, "_state", None)
    if state is None:  # pragma: no cover - a CuPy that keeps its generator state elsewhere
        warnings.warn("minidl: this CuPy's random generator does not expose its state (XORWOW._state): "
                      "checkpoints hold no GPU random state, so a resumed run's dropout masks differ")
    return state


# ---------------------------------------------------------------- one name, two spellings
def scatter_add(target, index, values) -> None:
    """``target[index] += values`` in place, adding every repeat of an index.

    Plain ``target[index] += values`` keeps only one of the repeats; NumPy arrays go to
    :func:`minidl.array_kernels.scatter_add` (the index sorted once, each run of equal
    indices summed by ``np.add.reduceat``: ``np.add.at`` loops over the index element by
    element, about 5 times slower on an embedding's gradient), CuPy's to ``cupyx.scatter_add``.
    """
    if xp_of(target) is np:
        array_kernels.scatter_add(target, index, values)
    else:
        _cupyx_module().scatter_add(target, index, values)


_optional = {}  # {module name: the module once imported, or False once its import failed (tried once only)}


def _optional_module(name: str):
    """The module ``name``, or None when it cannot be imported; the import is tried once per process."""
    if name not in _optional:
        try:
            _optional[name] = importlib.import_module(name)
        except ImportError:
            _optional[name] = False
    return _optional[name] or None


def scipy_special():
    """SciPy's ``scipy.special`` module, or None without SciPy; the import is tried once per process.

    SciPy is an optional accelerator: the error function is faster through it in float64,
    and complex arguments need it. Nothing in minidl requires it.
    """
    return _optional_module("scipy.special")


def scipy_sparse():
    """SciPy's ``scipy.sparse`` module, or None without SciPy (tried once): the compiled CSR product
    :mod:`minidl.ops.sparse` uses when it is there."""
    return _optional_module("scipy.sparse")


def erf(x):
    """The error function erf(x) = (2/√π) ∫₀ˣ e^(−t²) dt, elementwise, in x's dtype.

    NumPy arrays: :func:`minidl.array_kernels.erf`, a polynomial on whole arrays (float64 to
    2 ulps, float32 to 6, faster than SciPy's there); float64 goes through SciPy's
    ``scipy.special.erf`` when SciPy is installed (three times faster there), and complex
    arguments need it. CuPy arrays use ``cupyx.scipy.special.erf``.
    """
    if xp_of(x) is np:
        if x.dtype == np.float64 or x.dtype.kind == "c":
            special = scipy_special()
            if special is not None:
                return special.erf(x)
        return array_kernels.erf(x)
    special = getattr(getattr(_cupyx_module(), "scipy", None), "special", None)
    if special is None:  # the real cupyx loads its SciPy part on import
        import cupyx.scipy.special as special
    return special.erf(x)


# ---------------------------------------------------------------- 16-bit floats
def is_bfloat16(dtype) -> bool:
    """True for bfloat16, which NumPy lacks: the ml_dtypes package adds it as a 'V' (void) kind."""
    return dtype.kind == "V" and dtype.name == "bfloat16"


def is_floating(dtype) -> bool:
    """Floating or complex, bfloat16 included: the dtypes that can carry gradients."""
    return dtype.kind in "fc" or is_bfloat16(dtype)


def bfloat16(what: str = "bfloat16", error: type = TypeError, instead: str = ", or use float16"):
    """The bfloat16 dtype from the ml_dtypes package; without it, ``error`` says how to get it.

    The one place minidl looks bfloat16 up. The message reads "``what`` needs
    the ml_dtypes package ... (how to install it)``instead``": each caller names
    what asked for it, the exception its users expect, and what to do otherwise.
    """
    try:
        import ml_dtypes
    except ImportError:
        raise error(f"{what} needs the ml_dtypes package, which is not installed: NumPy has no bfloat16 "
                    f"type (pip install ml_dtypes, or pip install 'minidl[bf16]'){instead}") from None
    return np.dtype(ml_dtypes.bfloat16)


def sixteen_bit_name(dtype) -> str | None:
    """'float16' or 'bfloat16' for any spelling of a 16-bit float; None for anything else.

    Spellings: ``mdl.float16``, ``np.float16``, ``"float16"``, ``"half"``, ``"fp16"``;
    ``mdl.bfloat16`` (ml_dtypes'), ``"bfloat16"``, ``"bf16"``. The one parser of these
    names (autocast's dtype, checkpointing's storage dtype); it needs no ml_dtypes.
    """
    if dtype is None:
        return None
    try:
        name = np.dtype(dtype).name
    except (TypeError, ValueError):  # "bf16", "fp16", or "bfloat16" before ml_dtypes is loaded
        name = str(dtype)
    name = {"fp16": "float16", "half": "float16", "bf16": "bfloat16"}.get(name, name)
    return name if name in ("float16", "bfloat16") else None


def matmul(a, b):
    """``a @ b``; 16-bit floats on the CPU as a GPU's tensor cores multiply them: float32
    products and sums, the result rounded to the inputs' dtype.

    NumPy has no 16-bit GEMM: its float16 ``@`` is a plain loop dozens of times slower than
    BLAS, and ml_dtypes' bfloat16 ``@`` returns float32. So the operands go to float32, BLAS
    multiplies, and the result is rounded back. CuPy's float16 ``@`` is cuBLAS's, with
    float32 accumulation already.
    """
    if a.dtype.itemsize != 2 or a.dtype != b.dtype or a.dtype.kind in "iub" or xp_of(a) is not np:
        return a @ b
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)


def sum(x, axis=None, keepdims=False):  # noqa: A001 - numpy's name
    """``x.sum(axis, keepdims)``; 16-bit floats accumulated in float32 and the total rounded back.

    NumPy sums float16 in float32 already, but a bfloat16 sum from ml_dtypes adds in bfloat16:
    the running total stops growing at 256 when adding ones. Summing in float32 is what GPUs do.
    """
    if x.dtype.itemsize != 2 or x.dtype.kind in "iub":
        return x.sum(axis=axis, keepdims=keepdims)
    return x.sum(axis=axis, keepdims=keepdims, dtype=np.float32).astype(x.dtype)


def mean(x, axis=None, keepdims=False):
    """``x.mean(axis, keepdims)``, accumulated in float32 for 16-bit floats as :func:`sum`."""
    if x.dtype.itemsize != 2 or x.dtype.kind in "iub":
        return x.mean(axis=axis, keepdims=keepdims)
    return x.mean(axis=axis, keepdims=keepdims, dtype=np.float32).astype(x.dtype)


def nccl():
    """CuPy's NCCL binding, the ``cupy.cuda.nccl`` module, with an error that says how to get it.

    Raises RuntimeError when there is no usable GPU, when CuPy is missing, or
    when this CuPy build has no NCCL.
    """
    module = getattr(cupy_module().cuda, "nccl", None)
    if module is None:
        try:
            from cupy.cuda import nccl as module
        except ImportError:  # pragma: no cover - depends on the machine
            module = None
    if not getattr(module, "available", False):  # pragma: no cover - no binding, or one built without NCCL
        raise RuntimeError(
            "NCCL is not available: this CuPy build has no NCCL; install a CuPy wheel for CUDA 12 "
            "(pip install 'minidl[gpu]') or use the MPI backend: init('mpi')")
    return module


map_blas_workspace()  # once per process, before any product of the user's (see its docstring)
