"""Running an update equation fast: cache-sized chunks on the CPU, one fused kernel on the GPU.

An optimizer step over millions of parameters is memory-bound: each element
of w, g and the moments is read once and written once, and the arithmetic is
nearly free. Written naively, every line of an update (``m *= beta1``,
``v += (1 - beta2) * g * g``...) streams whole arrays through memory again,
and its temporaries do too. Two remedies, with the equation written once:

- CPU (NumPy): ``run_update`` applies the update to chunks of ``CHUNK_BYTES``
  per array. A chunk's arrays and temporaries stay in the L2 cache, so main
  memory sees each element about once per step, as a hand-fused loop would.
- GPU (CuPy): ``run_update`` traces the update function once with symbolic
  arrays and scalars, writes its lines as CUDA C, and compiles one
  ``cupy.ElementwiseKernel``: one read and one write per element. Python
  ``if`` on a hyperparameter (``if weight_decay:``) is resolved while tracing;
  a kernel is cached for each pattern of zero/non-zero hyperparameters.
  A function that cannot be traced (a reduction, a comparison of scalars)
  runs as plain CuPy calls instead.

An update function takes its arrays and hyperparameters by keyword, updates
its state arrays in place, never writes into ``g``, and may accept ``tmp``:
a scratch array shaped like ``w`` that the caller can provide.
"""
from __future__ import annotations

import inspect
import warnings
from typing import NamedTuple

import numpy as np

from minidl import backend

CHUNK_BYTES = 1 << 17  # 128 KiB per array: w, g, two moments and scratch fit in a 1-2 MiB L2


def run_update(fn, **args):
    """Call the update ``fn(**args)`` the fastest way the arrays' device allows.

    ``fn`` must be elementwise (no norms or other reductions): it may see its
    arrays a chunk at a time. ``args["w"]`` is the parameter's data.
    """
    w = args["w"]
    if backend.xp_of(w) is not np:
        return _run_fused(fn, args)
    return _run_chunked(fn, args)


def _accepts_tmp(fn) -> bool:
    cached = getattr(fn, "_accepts_tmp", None)
    if cached is None:
        cached = "tmp" in inspect.signature(fn).parameters
        try:
            fn._accepts_tmp = cached
        except AttributeError:  # a builtin or bound method: just do not cache
            pass
    return cached


def _run_chunked(fn, args):
    w = args["w"]
    arrays = {k: v for k, v in args.items() if isinstance(v, np.ndarray) and v.ndim > 0}
    chunk = max(CHUNK_BYTES // w.itemsize, 1024)
    fits = all(a.shape == w.shape and a.flags.c_contiguous for a in arrays.values())
    if w.size <= chunk or not fits:  # small, or a strided/broadcast gradient: one call
        return fn(**args)
    flat = {k: a.reshape(-1) for k, a in arrays.items()}  # views: writes reach the arrays
    scratch = np.empty(chunk, w.dtype) if _accepts_tmp(fn) and args.get("tmp") is None else None
    for start in range(0, w.size, chunk):
        stop = min(start + chunk, w.size)
        part = {k: f[start:stop] for k, f in flat.items()}
        if scratch is not None:
            part["tmp"] = scratch[:stop - start]
        fn(**{**args, **part})
    return None


# ---------------------------------------------------------------- tracing into CUDA C
class Untraceable(Exception):
    """The update uses something a fused elementwise kernel cannot express."""


_C_BINARY = {"add": "+", "subtract": "-", "multiply": "*", "true_divide": "/", "divide": "/"}
_C_CALL = {"sqrt": "sqrt", "absolute": "fabs", "maximum": "max", "minimum": "min", "power": "pow"}


class _Tracer:
    """Records the lines of an update as C statements on per-element variables."""

    def __init__(self):
        self.lines: list[str] = []
        self.written: set[str] = set()
        self.count = 0

    def local(self, code: str | None) -> "_Array":
        name = f"x{self.count}_"
        self.count += 1
        self.lines.append(f"T {name};" if code is None else f"T {name} = {code};")
        return _Array(self, name)

    def assign(self, target: "_Array", code: str) -> "_Array":
        self.lines.append(f"{target.name} = {code};")
        self.written.add(target.name)
        return target


def _code(value, as_array: bool) -> str:
    """C text of an operand; scalars combined with arrays are cast to T (NumPy's weak scalars)."""
    if isinstance(value, _Array):
        return value.name
    if isinstance(value, _Scalar):
        return f"((T){value.code})" if as_array else value.code
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise Untraceable(f"operand {value!r}")
    text = repr(float(value))
    return f"((T){text})" if as_array else text


class _Scalar:
    """A hyperparameter (or an expression of them): a kernel argument of type double."""

    def __init__(self, code: str, value: float, is_param: bool = False):
        self.code, self.value, self.is_param = code, value, is_param

    def _op(self, other, symbol, reverse=False):
        if isinstance(other, _Array):
            return NotImplemented
        if isinstance(other, _Scalar):
            other_code, other_value = other.code, other.value
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            other_code, other_value = repr(float(other)), float(other)
        else:
            return NotImplemented
        a, b = (other_code, self.code) if reverse else (self.code, other_code)
        x, y = (other_value, self.value) if reverse else (self.value, other_value)
        if symbol == "pow":
            return _Scalar(f"pow({a}, {b})", x ** y)
        value = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y,
                 "/": lambda: x / y if y else float("inf")}[symbol]()
        return _Scalar(f"({a} {symbol} {b})", value)

    def __add__(self, o): return self._op(o, "+")
    def __radd__(self, o): return self._op(o, "+", True)
    def __sub__(self, o): return self._op(o, "-")
    def __rsub__(self, o): return self._op(o, "-", True)
    def __mul__(self, o): return self._op(o, "*")
    def __rmul__(self, o): return self._op(o, "*", True)
    def __truediv__(self, o): return self._op(o, "/")
    def __rtruediv__(self, o): return self._op(o, "/", True)
    def __pow__(self, o): return self._op(o, "pow")
    def __rpow__(self, o): return self._op(o, "pow", True)
    def __neg__(self): return _Scalar(f"(-{self.code})", -self.value)

    def __bool__(self):
        if not self.is_param:  # only a hyperparameter's zero/non-zero is part of the cache key
            raise Untraceable("a branch on a computed scalar")
        return bool(self.value)

    def __float__(self):
        raise Untraceable("float() of a traced scalar")

    def __lt__(self, other):
        raise Untraceable("comparison of traced scalars")
    __le__ = __gt__ = __ge__ = __lt__


class _Array:
    """One element of an array inside the kernel; arithmetic records C statements."""

    __array_priority__ = 10_000

    def __init__(self, tracer: _Tracer, name: str):
        self.tracer, self.name = tracer, name

    def _binary(self, other, symbol, reverse=False):
        a, b = _code(self, True), _code(other, True)
        if reverse:
            a, b = b, a
        code = f"pow({a}, {b})" if symbol == "pow" else f"({a} {symbol} {b})"
        return self.tracer.local(code)

    def _inplace(self, other, symbol):
        code = f"pow({self.name}, {_code(other, True)})" if symbol == "pow" else \
            f"({self.name} {symbol} {_code(other, True)})"
        return self.tracer.assign(self, code)

    def __add__(self, o): return self._binary(o, "+")
    def __radd__(self, o): return self._binary(o, "+", True)
    def __sub__(self, o): return self._binary(o, "-")
    def __rsub__(self, o): return self._binary(o, "-", True)
    def __mul__(self, o): return self._binary(o, "*")
    def __rmul__(self, o): return self._binary(o, "*", True)
    def __truediv__(self, o): return self._binary(o, "/")
    def __rtruediv__(self, o): return self._binary(o, "/", True)
    def __pow__(self, o): return self._binary(o, "pow")
    def __iadd__(self, o): return self._inplace(o, "+")
    def __isub__(self, o): return self._inplace(o, "-")
    def __imul__(self, o): return self._inplace(o, "*")
    def __itruediv__(self, o): return self._inplace(o, "/")
    def __neg__(self): return self.tracer.local(f"(-{self.name})")
    def __abs__(self): return self.tracer.local(f"fabs({self.name})")

    def __bool__(self):
        raise Untraceable("a branch on array values")

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if method != "__call__" or kwargs:
            raise Untraceable(f"numpy.{ufunc.__name__}.{method} with {sorted(kwargs)}")
        codes = [_code(x, True) for x in inputs]
        name = ufunc.__name__
        if name in _C_BINARY:
            code = f"({codes[0]} {_C_BINARY[name]} {codes[1]})"
        elif name in _C_CALL:
            code = f"{_C_CALL[name]}({', '.join(codes)})"
        elif name == "square":
            code = f"({codes[0]} * {codes[0]})"
        elif name == "negative":
            code = f"(-{codes[0]})"
        else:
            raise Untraceable(f"numpy.{name}")
        if out is None:
            return self.tracer.local(code)
        target = out[0] if isinstance(out, tuple) else out
        if not isinstance(target, _Array):
            raise Untraceable("out= into a real array")
        return self.tracer.assign(target, code)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ == "empty_like":
            return self.tracer.local(None)
        if func.__name__ == "zeros_like":
            return self.tracer.local("((T)0.0)")
        if func.__name__ == "copyto" and isinstance(args[0], _Array) and len(args) == 2 and not kwargs:
            return self.tracer.assign(args[0], _code(args[1], True))
        raise Untraceable(f"numpy.{func.__name__}")


_kernels: dict = {}


def trace(fn, args: dict):
    """(in_params, out_params, body, array names, scalar names) of the fused kernel for ``fn(**args)``."""
    tracer = _Tracer()
    symbolic, arrays, scalars = {}, [], []
    for key, value in args.items():
        if hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
            symbolic[key] = _Array(tracer, key)
            arrays.append(key)
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            symbolic[key] = _Scalar(key, float(value), is_param=True)
            scalars.append(key)
        else:  # flags, None: fixed while tracing
            symbolic[key] = value
    fn(**symbolic)
    if "g" in tracer.written:
        raise Untraceable("the update writes into the gradient g")
    outs = [k for k in arrays if k in tracer.written]
    ins = [f"T {k}" for k in arrays if k not in tracer.written] + [f"float64 {k}" for k in scalars]
    body = "\n".join(tracer.lines)
    return ", ".join(ins), ", ".join(f"T {k}" for k in outs), body, \
        [k for k in arrays if k not in tracer.written] + scalars, outs


class FusedKernel(NamedTuple):
    """What ``run_update`` hands to ``cupy.ElementwiseKernel`` for one update and one hyperparameter pattern.

    ``definition`` is the constructor's arguments (in_params, out_params,
    operation, name); the kernel is then called with the arrays and scalars
    named ``in_names`` (scalars as Python floats: CuPy passes them as double)
    followed by the arrays ``out_names``, which it updates in place.
    """

    in_params: str
    out_params: str
    operation: str
    name: str
    in_names: list
    out_names: list

    @property
    def definition(self) -> tuple:
        return self.in_params, self.out_params, self.operation, self.name


def _without_scratch(args):
    return {k: v for k, v in args.items() if not (k == "tmp" and v is None)}


def fused_kernel(fn, args) -> FusedKernel:
    """The fused kernel of ``fn(**args)`` on the GPU (raises ``Untraceable`` when there is none).

    Every array must share one dtype (the kernel's ``T``); the tests compile
    exactly this definition with NVRTC, for every optimizer and hyperparameter pattern.
    """
    args = _without_scratch(args)
    dtypes = {str(v.dtype) for v in args.values() if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0}
    if len(dtypes) != 1:
        raise Untraceable(f"mixed dtypes {sorted(dtypes)}")
    in_params, out_params, body, in_names, out_names = trace(fn, args)
    return FusedKernel(in_params, out_params, body, f"minidl_{fn.__name__}", in_names, out_names)


def _cache_key(fn, args):
    parts = []
    for key, value in sorted(args.items()):
        if hasattr(value, "shape") and getattr(value, "ndim", 0) > 0:
            parts.append((key, "array", str(value.dtype)))
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            parts.append((key, "scalar", bool(value)))
        else:
            parts.append((key, "fixed", repr(value)))
    return fn, tuple(parts)


# The message when NVRTC or the CUDA headers are missing (CuPy installed without its toolkit libraries).
_COMPILER_HINT = ("if NVRTC or CUDA's headers are missing, pip install 'minidl[gpu]' installs them "
                  "with CuPy's CUDA 12 libraries")


def _run_fused(fn, args):
    args = _without_scratch(args)
    key = _cache_key(fn, args)
    entry = _kernels.get(key)
    if entry is None:
        try:
            spec = fused_kernel(fn, args)
        except Exception:  # noqa: BLE001 - anything the tracer cannot follow runs unfused
            entry = _kernels[key] = False
        else:
            kernel = backend.cupy_module().ElementwiseKernel(*spec.definition)
            entry = _kernels[key] = (kernel, spec.in_names, spec.out_names, False)
    if entry is False:
        return fn(**args)
    kernel, in_names, out_names, compiled = entry
    inputs = [args[k] if hasattr(args[k], "shape") else float(args[k]) for k in in_names]
    if compiled:
        kernel(*inputs, *[args[k] for k in out_names])
        return None
    try:  # the first call compiles; a compiler error leaves the arrays untouched
        kernel(*inputs, *[args[k] for k in out_names])
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"minidl.optim: the fused kernel for {fn.__name__} did not compile ({exc}); "
                      f"running it as separate CuPy operations ({_COMPILER_HINT})")
        _kernels[key] = False
        return fn(**args)
    _kernels[key] = (kernel, in_names, out_names, True)
    return None
