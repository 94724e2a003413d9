"""cupy.ElementwiseKernel on the stand-in: the kernel body run as NumPy array expressions.

The stand-in cannot compile CUDA C (the NVRTC tests do that, from CuPy's own
generated source). It runs the body instead, translated line by line into
array statements: the restricted C that minidl's kernels are written in
(``T x = expr;``, ``x = expr;``, ``(T)`` casts, ``sqrt``/``fabs``/``pow``/``max``/
``min``/``exp``/``log``, double-typed scalar parameters) means the same thing
evaluated on whole arrays as on one element per thread. Anything else raises.
"""
from __future__ import annotations

import re

import numpy as _np

from tests import cupy_standin as _cp

_STATEMENT = re.compile(r"^(?:(?P<type>[A-Za-z_]\w*)\s+)?(?P<name>[A-Za-z_]\w*)\s*(?:=\s*(?P<expr>.+))?$")
_CALLS = {"sqrt": "_np.sqrt", "fabs": "_np.abs", "pow": "_np.power", "max": "_np.maximum",
          "min": "_np.minimum", "exp": "_np.exp", "log": "_np.log", "tanh": "_np.tanh", "abs": "_np.abs"}
_TYPES = {"float16": _np.float16, "float32": _np.float32, "float64": _np.float64, "float": _np.float32,
          "double": _np.float64, "int32": _np.int32, "int64": _np.int64, "bool": _np.bool_}


def _parse_params(text):
    params = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        words = part.split()
        if len(words) != 2:
            raise ValueError(f"ElementwiseKernel: cannot parse the parameter {part!r}")
        params.append((words[0], words[1]))
    return params


_CAST = re.compile(r"\(\s*(T|float16|float32|float64|float|double|int32|int64|bool)\s*\)\s*(?=[-\w(.])")


def _casts_as_calls(expr: str) -> str:
    """``(T)x``, ``(T)-1.0``, ``(T)(a + b)`` -> ``_cast['T'](...)`` (the cast binds to the next operand)."""
    while True:
        match = _CAST.search(expr)
        if match is None:
            return expr
        start = end = match.end()
        if expr[start] == "(":
            depth = 0
            for end in range(start, len(expr)):
                depth += {"(": 1, ")": -1}.get(expr[end], 0)
                if depth == 0:
                    break
            end += 1
        else:
            operand = re.match(r"-?[\w.]+(?:[eE][-+]?\d+)?", expr[start:])
            end = start + operand.end()
        expr = f"{expr[:match.start()]}_cast[{match[1]!r}]({expr[start:end]}){expr[end:]}"


class ElementwiseKernel:
    """cupy.ElementwiseKernel(in_params, out_params, operation, name): outputs are written in place."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, **kwargs):
        self.in_params, self.out_params = _parse_params(in_params), _parse_params(out_params)
        self.operation, self.name, self.preamble = operation, name, preamble
        self._code = compile(self._translate(operation), f"<ElementwiseKernel {name}>", "exec")

    def _translate(self, operation):
        lines = []
        for statement in filter(None, (s.strip() for s in operation.replace("\n", " ").split(";"))):
            match = _STATEMENT.match(statement)
            if match is None:
                raise ValueError(f"ElementwiseKernel {self.name}: the stand-in cannot run {statement!r}")
            if match["expr"] is None:  # a declaration without a value
                continue
            expr = _casts_as_calls(match["expr"])
            for c_name, numpy_name in _CALLS.items():
                expr = re.sub(rf"\b{c_name}\s*\(", f"{numpy_name}(", expr)
            lines.append(f"{match['name']} = _cast_to(_cast, {match['name']!r}, {expr})"
                         if match["type"] else f"{match['name']} = {expr}")
        return "\n".join(lines) or "pass"

    def __call__(self, *args, size=None, block_size=None):
        params = self.in_params + self.out_params
        if len(args) != len(params):
            if len(args) == len(self.in_params):
                raise ValueError(f"ElementwiseKernel {self.name}: the stand-in needs the outputs passed in")
            raise TypeError(f"Wrong number of arguments for {self.name!r}: expected {len(params)}, got {len(args)}")
        dtype = None
        for (type_name, _), value in zip(params, args):
            if isinstance(value, _np.ndarray):
                raise TypeError(f"Unsupported type {type(value)}")
            if type(value) is _cp.ndarray and type_name not in _TYPES:
                if dtype is not None and value.dtype != dtype:
                    raise TypeError(f"ElementwiseKernel {self.name}: type T is {dtype} and {value.dtype}")
                dtype = value.dtype
        if dtype is None:
            raise TypeError(f"ElementwiseKernel {self.name}: the type T cannot be inferred (no array argument)")
        cast = {"T": _np.dtype(dtype).type, **_TYPES}
        namespace = {"_np": _np, "_cast": {k: (lambda t: lambda x: t(x) if _np.ndim(x) == 0 else
                                                _np.asarray(x).astype(t, copy=False))(v)
                                           for k, v in cast.items()},
                     "_cast_to": lambda casts, name, x: casts["T"](x) if _np.ndim(x) == 0 else x}
        for (type_name, name), value in zip(params, args):
            if type(value) is _cp.ndarray:
                namespace[name] = _cp._here(value)  # a kernel runs on the current GPU only
            else:
                namespace[name] = cast[type_name](value)
        outs = [(name, value) for (_, name), value in zip(self.out_params, args[len(self.in_params):])]
        with _np.errstate(all="ignore"):
            exec(self._code, namespace)  # noqa: S102 - our own translation of a kernel body
        for name, value in outs:
            result = namespace[name]
            if result is not value._a:
                value._a[...] = result
        return outs[0][1] if len(outs) == 1 else tuple(v for _, v in outs)
