"""A strict CuPy stand-in for the tests: a test double, never used by minidl at run time.

No machine that runs the tests has a GPU, yet every CuPy line of minidl must run
on every CI run. This package imitates the ``cupy`` module closely enough for
minidl's device code, on NumPy arrays, and keeps CuPy's rules so that what
passes here also passes on a GPU:

- ``ndarray`` is its own type (not ``numpy.ndarray``); ``np.asarray(x)``,
  ``np.array(x)`` and every other implicit conversion raise CuPy's TypeError;
- a NumPy array as an operand (``x + numpy_array``, ``cupy.exp(numpy_array)``)
  raises TypeError, as CuPy does; only ``cupy.asarray``/``cupy.array`` (the
  host-to-device copies) accept one;
- reductions give 0-d arrays, never Python numbers;
- every device-to-host synchronization is counted in :data:`syncs`:
  ``float()``, ``int()``, ``bool()``, ``complex()``, ``.item()``, ``.get()``,
  ``.tolist()``, ``cupy.asnumpy``, ``repr``/``str``, a boolean-mask index and the
  functions whose output size depends on the data (``nonzero``, ``unique``...),
  ``Device/Stream/Event.synchronize`` and ``cuda.get_elapsed_time``;
- only names that exist in real CuPy are offered (``names.py``;
  ``tests/test_cupy_standin.py`` checks them against the installed CuPy).

Tests switch minidl to it with ``backend._use_cupy_module(standin, standin.cupyx)``
(the ``device`` fixture of ``tests/conftest.py`` does that for its "cuda" case
when no GPU is present).
"""
from __future__ import annotations

import builtins
import inspect as _inspect
import operator
import sys
import weakref

import numpy as _np

from tests.cupy_standin import names as _names

__version__ = "14.2.0+standin"
STANDIN = True  # real CuPy has no such name: lets a test tell the two apart


# ---------------------------------------------------------------- synchronizations
class SyncCounter:
    """Counts device-to-host synchronizations; ``where`` says which minidl line asked for each."""

    def __init__(self):
        self.count = 0
        self.where: list[str] = []

    def reset(self):
        self.count = 0
        self.where = []

    def add(self, what: str):
        self.count += 1
        frame = sys._getframe(2)
        while frame is not None and (_HERE in frame.f_code.co_filename
                                     or frame.f_code.co_filename.startswith("<")):
            frame = frame.f_back
        place = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        self.where.append(f"{what} at {place}")


syncs = SyncCounter()
_HERE = __file__.rsplit("__init__.py", 1)[0]  # frames inside the stand-in are not where a sync was asked for


def _implicit_conversion(*_args, **_kwargs):
    raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                    "Please use `.get()` to construct a NumPy array explicitly.")


def _unsupported(value):
    return TypeError(f"Unsupported type {type(value)}")


# ---------------------------------------------------------------- memory accounting
class _Pool:
    """The device memory in use: one entry per NumPy buffer that a stand-in array keeps alive."""

    def __init__(self):
        self.live: dict[int, list] = {}  # id(root buffer) -> [nbytes, arrays on it, root, owner, device]
        self.used = 0
        self.peak = 0

    def hold(self, wrapper, array):
        root = array
        while isinstance(root.base, _np.ndarray):
            root = root.base
        key = id(root)
        entry = self.live.get(key)
        if entry is None:
            entry = self.live[key] = [root.nbytes, 0, root, None, wrapper._dev]
            self.used += root.nbytes
            self.peak = builtins.max(self.peak, self.used)
            for hook in cuda.memory_hook.get_memory_hooks().values():  # as CuPy's pool calls them
                hook.malloc_postprocess(device_id=wrapper._dev, size=root.nbytes, mem_size=root.nbytes,
                                        mem_ptr=key, pmem_id=key)
        if entry[3] is None and array is root:
            entry[3] = weakref.ref(wrapper)
        entry[1] += 1
        weakref.finalize(wrapper, self.release, key)

    def owner(self, array):
        """The one device array that owns ``array``'s buffer (``ndarray.base`` of every view of it)."""
        root = array
        while isinstance(root.base, _np.ndarray):
            root = root.base
        entry = self.live[id(root)]
        owner = entry[3]() if entry[3] is not None else None
        if owner is None:  # the owning array is gone but views remain: one stable stand-in for it
            owner = object.__new__(ndarray)
            owner._a, owner._dev = root, _current_device[0]
            entry[3] = lambda: owner
        return owner

    def release(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.used -= entry[0]
            del self.live[key]
            for hook in cuda.memory_hook.get_memory_hooks().values():
                hook.free_postprocess(device_id=entry[4], mem_size=entry[0], mem_ptr=key, pmem_id=key)


_pool = _Pool()


# ---------------------------------------------------------------- the array type
_current_device = [0]


# CuPy's dtypes: booleans, integers, float16/32/64, complex64/128 (no float128, objects, strings or dates)
_DTYPES = frozenset("?bBhHiIlLqQefdFD")


def _wrap(array, device=None) -> "ndarray":
    """``array`` as a device array of GPU ``device`` (default: the current one, where kernels put results)."""
    if array.dtype.char not in _DTYPES:
        raise ValueError(f"Unsupported dtype {array.dtype}")
    out = object.__new__(ndarray)
    out._a = array
    out._dev = _current_device[0] if device is None else device
    _pool.hold(out, array)
    return out


def _result(value):
    """Wrap what NumPy returned as CuPy would: arrays and scalars become (0-d) device arrays."""
    if isinstance(value, _np.ndarray):
        return _wrap(value)
    if isinstance(value, _np.generic):
        return _wrap(_np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_result(v) for v in value)
    if isinstance(value, list):
        return [_result(v) for v in value]
    return value


def _here(array):
    """The NumPy array behind a device array that a kernel on the current device reads or writes.

    Raises CuPy's ValueError when the array lives on another GPU (as CuPy does where the GPUs
    have no peer access; with peer access the kernel runs on the current GPU and its result
    lands there, not on the array's GPU: wrong either way).
    """
    if array._dev != _current_device[0]:
        raise ValueError(f"The device where the array resides ({array._dev}) is different from the current "
                         f"device ({_current_device[0]}). Peer access is unavailable between these devices.")
    return array._a


def _arg(value):
    """A stand-in array (or a list/tuple of them) as the NumPy array behind it; NumPy arrays refused."""
    kind = type(value)
    if kind is ndarray:
        return _here(value)
    if kind is _np.ndarray:
        raise _unsupported(value)
    if kind is tuple or kind is list:
        return kind(_arg(v) for v in value)
    return value


_SCALARS = (int, float, bool, complex, _np.generic)


def _operand(value):
    """The other operand of an operator: a device array or a scalar; None for NotImplemented."""
    if type(value) is ndarray:
        return _here(value)
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (_np.ndarray, list, tuple)):
        raise _unsupported(value)
    return None


def _index(key, shape=None):
    """A key for the NumPy array behind; with ``shape``, integer arrays wrap around as CuPy's do
    (CuPy does not check bounds in integer-array indexing: index n of an axis of n reads element 0)."""
    if type(key) is tuple:
        keys = tuple(_index(k) for k in key)
    else:
        keys = (_index_part(key),)
    if shape is None:
        return keys if type(key) is tuple else keys[0]
    used = builtins.sum(1 for k in keys if k is not None and k is not Ellipsis and not (
        isinstance(k, _np.ndarray) and k.dtype == _np.bool_)) + builtins.sum(
        k.ndim for k in keys if isinstance(k, _np.ndarray) and k.dtype == _np.bool_)
    axis, out = 0, []
    for k in keys:
        if k is Ellipsis:
            axis += len(shape) - used
        elif k is None:
            pass
        elif isinstance(k, _np.ndarray) and k.dtype == _np.bool_:
            axis += k.ndim
        else:
            if isinstance(k, _np.ndarray) and k.dtype.kind in "iu" and axis < len(shape) and shape[axis]:
                k = k % shape[axis]
            axis += 1
        out.append(k)
    return tuple(out) if type(key) is tuple else out[0]


def _is_basic(key) -> bool:
    """Whether ``key`` is basic indexing (integers, slices, None, ...): CuPy then makes a view, no kernel."""
    keys = key if type(key) is tuple else (key,)
    return builtins.all(k is None or k is Ellipsis or type(k) is slice
                        or (isinstance(k, (int, _np.integer)) and not isinstance(k, (bool, _np.bool_))) for k in keys)


def _view(array, result) -> "ndarray":
    """A view of ``array`` (a view launches no kernel: it stays on ``array``'s GPU, whichever is current)."""
    if isinstance(result, _np.generic):
        result = _np.asarray(result)
    return _wrap(result, array._dev)


def _index_part(key):
    if type(key) is ndarray:
        if key._a.dtype == _np.bool_ and key._a.ndim > 0:
            syncs.add("boolean-mask index (the output size is read back)")
        return key._a
    if type(key) is list:
        return _np.asarray(key)
    return key


class ndarray:
    """A device array: NumPy memory behind CuPy's rules (see the package docstring)."""

    __slots__ = ("_a", "_dev", "__weakref__")
    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        array = _np.empty(shape, dtype, order=order)
        self._a = array
        self._dev = _current_device[0]
        _pool.hold(self, array)

    # NumPy must never see the data without an explicit copy
    __array__ = _implicit_conversion

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        function = _functions.get(ufunc.__name__)
        if function is None or (method != "__call__" and not isinstance(function, _Ufunc)):
            return NotImplemented
        return function(*inputs, **kwargs) if method == "__call__" else getattr(function, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        function = _functions.get(func.__name__)
        if function is None:
            return NotImplemented
        return function(*args, **kwargs)

    # ---------------------------------------------------------- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _view(self, self._a.T))
    mT = property(lambda self: _view(self, _np.swapaxes(self._a, -1, -2)))
    real = property(lambda self: _view(self, self._a.real))
    imag = property(lambda self: _wrap(self._a.imag))

    @property
    def base(self):
        return None if not isinstance(self._a.base, _np.ndarray) else _pool.owner(self._a)

    @property
    def device(self):
        from tests.cupy_standin import cuda
        return cuda.Device(self._dev)

    @property
    def data(self):
        from tests.cupy_standin import cuda
        return cuda.MemoryPointer(self._a.ctypes.data, self._a.nbytes)

    # ---------------------------------------------------------- device to host: counted
    def get(self, stream=None, order="C", out=None):
        syncs.add("ndarray.get()")
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order)

    def item(self, *args):
        syncs.add("ndarray.item()")
        return self._a.item(*args)

    def tolist(self):
        syncs.add("ndarray.tolist()")
        return self._a.tolist()

    def __float__(self):
        syncs.add("float(ndarray)")
        return float(self._a)

    def __int__(self):
        syncs.add("int(ndarray)")
        return int(self._a)

    def __bool__(self):
        syncs.add("bool(ndarray)")
        return builtins.bool(self._a)

    def __complex__(self):
        syncs.add("complex(ndarray)")
        return complex(self._a)

    def __repr__(self):
        syncs.add("repr(ndarray)")
        return repr(self._a).replace("array(", "array(", 1)

    def __str__(self):
        syncs.add("str(ndarray)")
        return str(self._a)

    def tobytes(self, order="C"):
        syncs.add("ndarray.tobytes()")
        return self._a.tobytes(order)

    # ---------------------------------------------------------- host to device
    def set(self, arr, stream=None):
        if type(arr) is not _np.ndarray:
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        self._a[...] = arr

    # ---------------------------------------------------------- the container protocol
    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    def __getitem__(self, key):
        if _is_basic(key):  # a view, on this array's GPU
            return _view(self, self._a[_index(key, self._a.shape)])
        return _result(_here(self)[_index(key, self._a.shape)])  # a gather: a kernel on the current GPU

    def __setitem__(self, key, value):
        if type(value) is ndarray:
            value = _here(value)
        elif isinstance(value, (_np.ndarray, list, tuple)):
            raise _unsupported(value)
        _here(self)[_index(key, self._a.shape)] = value  # a kernel on the current GPU

    def __copy__(self):
        return _wrap(self._a.copy())

    def __deepcopy__(self, memo):
        return _wrap(self._a.copy())

    def __reduce__(self):  # pickling copies to the host, as CuPy's does
        syncs.add("pickle")
        return (_wrap_host_copy, (_np.array(self._a),))

    def scatter_add(self, slices, value):
        _scatter_add(self, slices, value)


def _wrap_host_copy(array):
    return _wrap(array)


def _binary(symbol):
    op = getattr(operator, symbol if symbol not in ("and", "or") else f"{symbol}_")

    def forward(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return _result(op(_here(self), other))

    def reflected(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        return _result(op(other, _here(self)))

    def inplace(self, other):
        other = _operand(other)
        if other is None:
            return NotImplemented
        getattr(operator, f"i{symbol}")(_here(self), other)
        return self

    return forward, reflected, inplace


for _symbol in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul",
                "and", "or", "xor", "lshift", "rshift"):
    _forward, _reflected, _inplace = _binary(_symbol)
    setattr(ndarray, f"__{_symbol}__", _forward)
    setattr(ndarray, f"__r{_symbol}__", _reflected)
    setattr(ndarray, f"__i{_symbol}__", _inplace)
for _symbol in ("lt", "le", "gt", "ge", "eq", "ne"):
    setattr(ndarray, f"__{_symbol}__", _binary(_symbol)[0])
setattr(ndarray, "__divmod__", lambda self, other: _result(divmod(self._a, _operand(other))))
for _symbol in ("neg", "pos", "abs", "invert"):
    setattr(ndarray, f"__{_symbol}__", (lambda op: lambda self: _result(op(_here(self))))(getattr(operator, _symbol)))


# Functions whose output size depends on the data: CuPy reads a count back to the host.
_SYNCING = {"nonzero", "flatnonzero", "argwhere", "unique", "extract", "compress", "intersect1d",
            "setdiff1d", "union1d", "setxor1d", "trim_zeros", "histogram", "bincount"}


def _signature(spec):
    """An inspect.Signature from a parameter list as names.py keeps it (``"a, axis=_, *, dtype=_"``)."""
    namespace = {"_": None}
    exec(f"def f({spec}): pass", namespace)  # noqa: S102 - our own parameter lists
    return _inspect.signature(namespace["f"])


def _checked_call(where, signature, keywords=None):
    """A function raising CuPy's TypeError for arguments real CuPy's signature does not take.

    ``keywords``: for a function declared with ``**kwargs`` that reads its keywords one by
    one and refuses the rest (``cupy.einsum``), the names it reads (names.KEYWORDS).
    """
    if signature is None:
        return lambda args, kwargs: None
    named = frozenset(p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                                                     p.KEYWORD_ONLY))

    def check(args, kwargs):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{where}(): {exc} (real CuPy's parameters: {signature})") from None
        if keywords is not None:
            extra = sorted(set(kwargs) - named - set(keywords))
            if extra:
                raise TypeError(f"{where}(): Did not understand the following kwargs: {extra} (real CuPy "
                                f"reads only {sorted(keywords)} from its **kwargs)")
    return check


_UFUNC_KEYWORDS = frozenset({"out", "dtype", "casting", "where"})


def _ufunc_check(name, nin, nout):
    def check(args, kwargs):
        extra = set(kwargs) - _UFUNC_KEYWORDS
        if extra or len(args) > nin + nout:
            raise TypeError(f"cupy.{name}(): CuPy's ufuncs take {nin} inputs (and up to {nout} outputs) and only "
                            f"the keywords {sorted(_UFUNC_KEYWORDS)}; got {len(args)} arguments and {sorted(kwargs)}")
    return check


# Methods that give a view without running a kernel: allowed on an array of another GPU.
_VIEWS = {"reshape", "view", "transpose", "swapaxes", "squeeze"}


def _method(name):
    spec = _names.NDARRAY_SIGNATURES.get(name)
    check = _checked_call(f"cupy.ndarray.{name}", None if spec is None else _signature(spec))

    syncing = name in _SYNCING
    view = name in _VIEWS

    def method(self, *args, **kwargs):
        check(args, kwargs)
        if syncing:
            syncs.add(f"ndarray.{name}() (the output size is read back)")
        out = kwargs.get("out")
        if type(out) is ndarray:
            kwargs["out"] = _here(out)
        if view:  # a view stays on the array's GPU; a reshape that must copy runs a kernel on the current one
            result = getattr(self._a, name)(*_arg(args), **{k: _arg(v) for k, v in kwargs.items()})
            if _np.shares_memory(result, self._a):
                return _view(self, result)
            _here(self)
            return _result(result)
        result = getattr(_here(self), name)(*_arg(args), **{k: _arg(v) for k, v in kwargs.items()})
        return out if type(out) is ndarray else _result(result)
    method.__name__ = name
    return method


for _name in _names.NDARRAY_METHODS:
    if not hasattr(ndarray, _name) and callable(getattr(_np.ndarray, _name, None)):
        setattr(ndarray, _name, _method(_name))


# ---------------------------------------------------------------- module functions
# Functions that return a Python bool in NumPy and a 0-d array in CuPy.
_TO_ARRAY = {"allclose", "array_equal", "array_equiv"}
# Host-to-device copies: the only functions that accept NumPy arrays.
_FROM_HOST = {"array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray"}


def _function(name, numpy_function):
    syncing, to_array = name in _SYNCING, name in _TO_ARRAY
    if name in _names.UFUNCS:
        check = _ufunc_check(name, *_names.UFUNCS[name])
    else:
        spec = _names.SIGNATURES.get(name)
        check = _checked_call(f"cupy.{name}", None if spec is None else _signature(spec), _names.KEYWORDS.get(name))

    def function(*args, **kwargs):
        check(args, kwargs)
        out = kwargs.get("out")
        if syncing or (name == "where" and len(args) == 1):
            syncs.add(f"cupy.{name} (the output size is read back)")
        result = numpy_function(*_arg(args), **{k: _arg(v) for k, v in kwargs.items()})
        if type(out) is ndarray:
            return out
        if to_array:
            result = _np.asarray(result)
        return _result(result)

    function.__name__ = function.__qualname__ = name
    function.__doc__ = f"cupy.{name} on the stand-in (NumPy's {name})."
    return function


def _from_host(name, numpy_function):
    spec = _names.SIGNATURES.get(name)
    check = _checked_call(f"cupy.{name}", None if spec is None else _signature(spec))

    def function(obj, dtype=None, *args, **kwargs):
        check((obj, dtype, *args), kwargs)
        if type(obj) is ndarray:  # already on the device: a device-side copy or the array itself
            result = numpy_function(obj._a, dtype, *args, **kwargs)
            if result is obj._a:
                return obj
            return _wrap(_np.array(result) if name == "array" else result)
        if isinstance(obj, (list, tuple)):
            obj = _host_sequence(obj)
        # a host-to-device copy: the device memory never aliases the host's
        return _wrap(_np.array(numpy_function(obj, dtype, *args, **kwargs), copy=True))

    function.__name__ = function.__qualname__ = name
    return function


def _host_sequence(value):
    if isinstance(value, (list, tuple)):
        return [_host_sequence(v) for v in value]
    if type(value) is ndarray:
        syncs.add("a device array inside a host list")
        return value._a
    return value


class _Ufunc:
    """A CuPy ufunc: called elementwise; ``at`` for add/maximum/minimum (CuPy's scatter ops), ``reduce``
    and ``accumulate`` for add/multiply, ``reduceat`` for add, ``outer`` for all; the rest raise as in CuPy."""

    _AT = {"add": _np.add, "maximum": _np.maximum, "minimum": _np.minimum}

    def __init__(self, name, numpy_ufunc):
        self.__name__ = name
        self._ufunc = numpy_ufunc
        self._call = _function(name, numpy_ufunc)
        self.nin, self.nout, self.nargs = numpy_ufunc.nin, numpy_ufunc.nout, numpy_ufunc.nargs

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def _only(self, method, names):
        if self.__name__ not in names:
            raise NotImplementedError(f"`cupy_{self.__name__}.{method}` is not supported yet")

    def at(self, a, indices, b=None):
        self._only("at", self._AT)
        if type(a) is not ndarray:
            raise _unsupported(a)
        self._ufunc.at(a._a, _index(indices, a._a.shape), _arg(b))

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        self._only("reduce", ("add", "multiply"))
        return (array.sum if self.__name__ == "add" else array.prod)(axis, dtype, out, keepdims)

    def accumulate(self, array, axis=0, dtype=None, out=None):
        self._only("accumulate", ("add", "multiply"))
        return (array.cumsum if self.__name__ == "add" else array.cumprod)(axis, dtype, out)

    def reduceat(self, array, indices, axis=0, dtype=None, out=None):
        self._only("reduceat", ("add",))
        return _result(_np.add.reduceat(_arg(array), _arg(indices), axis, dtype))

    def outer(self, A, B, **kwargs):
        return self(A.reshape(A.shape + (1,) * B.ndim), B.reshape((1,) * A.ndim + B.shape), **kwargs)


_functions: dict = {}
for _name in _names.MODULE_NAMES:
    _value = getattr(_np, _name, None)
    if _value is None or _name in ("ndarray", "random", "linalg", "lib", "fft"):
        continue
    if _name in _FROM_HOST:
        _functions[_name] = _from_host(_name, _value)
    elif _name in _names.UFUNCS and isinstance(_value, _np.ufunc):
        _functions[_name] = _Ufunc(_name, _value)
    elif isinstance(_value, type) or not callable(_value):  # dtypes, finfo/iinfo, constants
        globals()[_name] = _value
        continue
    else:
        _functions[_name] = _function(_name, _value)
    globals()[_name] = _functions[_name]

newaxis = None
del _name, _value, _symbol, _forward, _reflected, _inplace


def asnumpy(a, stream=None, order="C", out=None):
    """Copy to the host: a synchronization (NumPy values pass through)."""
    if type(a) is ndarray:
        return a.get(stream=stream, order=order, out=out)
    return _np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if builtins.any(type(a) is ndarray for a in args) else _np


def get_default_memory_pool():
    from tests.cupy_standin import cuda
    return cuda._default_pool


def get_default_pinned_memory_pool():
    from tests.cupy_standin import cuda
    return cuda._pinned_pool


def _scatter_add(a, slices, value):
    """cupyx.scatter_add: ``a[slices] += value`` with every repeat added."""
    _np.add.at(a._a, _index(slices, a._a.shape), value._a if type(value) is ndarray else value)


# the submodules need ndarray above; they are attributes of the module, as in cupy
from tests.cupy_standin import cuda, cupyx, fft, lib, linalg, random  # noqa: E402, F401
from tests.cupy_standin.kernels import ElementwiseKernel  # noqa: E402, F401


def reset():
    """Forget counted synchronizations and the memory peak (each test starts clean)."""
    syncs.reset()
    _pool.peak = _pool.used
    cuda._default_pool._peak = _pool.used
