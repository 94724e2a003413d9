"""Assignment 8's checks: each tangent rule's J v against its formula, through minidl.func.jvp.

A tangent rule gets one tangent per input, None for an input that carries
none (a constant); the hidden cases include such constants and broadcasting,
where a tangent must be spread to the output's shape.
"""
from __future__ import annotations

import numpy as np

import minidl
import minidl.functional as F
from minidl.func import jvp

from .core import check, compare


def _draw(case, shape, positive=False):
    x = case.rng.standard_normal(shape)
    return (np.abs(x) + 0.5 if positive else x).astype(np.dtype(case.get("dtype", "float64")))


def _tangent_of(f, primals, tangents, constants=()):
    """J v of f at the primals (Tensors), the primals listed in ``constants`` carrying no tangent."""
    moving = [i for i in range(len(primals)) if i not in constants]

    def g(*xs):
        args = list(primals)
        for i, x in zip(moving, xs):
            args[i] = x
        return f(*args)
    _, dy = jvp(g, tuple(primals[i] for i in moving), tuple(tangents[i] for i in moving))
    return dy


def _binary_hidden(rng):
    return [dict(a=(3, 4), b=(4,), dtype="float32"), dict(a=(2, 3), b=(2, 3), constant=1),
            dict(a=(4,), b=(3, 4), constant=0, dtype="float32")]


def _binary_label(p):
    const = {0: ", a constant", 1: ", b constant"}.get(p.get("constant"), "")
    return f"a {p['a']}, b {p['b']}{const}, {p.get('dtype', 'float64')}"


@check("a8.product", public=[dict(a=(3, 4), b=(3, 4)), dict(a=(2, 2), b=(2, 2))], hidden=_binary_hidden,
       hidden_count=3, label=_binary_label)
def product(case):
    a, b = _draw(case, case["a"]), _draw(case, case["b"], positive=True)
    da, db = _draw(case, case["a"]), _draw(case, case["b"])
    constant = case.get("constant")
    if constant == 0:
        da = np.zeros_like(da)
    if constant == 1:
        db = np.zeros_like(db)
    constants = () if constant is None else (constant,)
    ts = [minidl.tensor(v) for v in (a, b, da, db)]
    a64, b64, da64, db64 = (v.astype(np.float64) for v in (a, b, da, db))
    got = _tangent_of(lambda x, y: x * y, ts[:2], ts[2:], constants)
    compare("the tangent of a · b", da64 * b64 + a64 * db64, got, a.dtype, [
        ("missing term", lambda: da64 * b64 + 0 * a64), ("missing term", lambda: a64 * db64 + 0 * b64),
        ("wrong factor", lambda: da64 * a64 + db64 * b64)])
    y = a64 / b64
    got = _tangent_of(lambda x, y: x / y, ts[:2], ts[2:], constants)
    compare("the tangent of a / b", (da64 - y * db64) / b64, got, a.dtype, [
        ("sign", lambda: (da64 + y * db64) / b64), ("missing term", lambda: da64 / b64 + 0 * y),
        ("missing square", lambda: da64 - y * db64)])


@check("a8.chain", public=[dict(x=(3, 4))],
       hidden=lambda rng: [dict(x=(int(rng.integers(2, 6)),), dtype="float32"), dict(x=(2, 3, 2))], hidden_count=2,
       label=lambda p: f"x {p['x']}, {p.get('dtype', 'float64')}")
def chain(case):
    x, dx = _draw(case, case["x"], positive=True), _draw(case, case["x"])
    tx, tdx = minidl.tensor(x), minidl.tensor(dx)
    x64, dx64 = x.astype(np.float64), dx.astype(np.float64)
    _, got = jvp(lambda u: u.exp(), (tx,), (tdx,))
    y = np.exp(x64)
    compare("the tangent of exp(x)", dx64 * y, got, x.dtype, {"input used for output": lambda: dx64 * x64})
    _, got = jvp(lambda u: u.log(), (tx,), (tdx,))
    compare("the tangent of log(x)", dx64 / x64, got, x.dtype,
            {"input used for output": lambda: dx64 / np.log(x64), "sign": lambda: -dx64 / x64})
    _, got = jvp(lambda u: F.tanh(u), (tx,), (tdx,))
    t = np.tanh(x64)
    compare("the tangent of tanh(x)", dx64 * (1 - t * t), got, x.dtype,
            {"input used for output": lambda: dx64 * (1 - x64 * x64), "missing square": lambda: dx64 * (1 - t)})


def _matmul_hidden(rng):
    n = int(rng.integers(2, 5))
    return [dict(a=(2, 3, 4), b=(4, 5), dtype="float32"), dict(a=(n, n), b=(n, n), constant=1),
            dict(a=(n, n), b=(n, n)), dict(a=(4,), b=(4, 3), constant=0)]


@check("a8.matmul", public=[dict(a=(3, 4), b=(4, 5))], hidden=_matmul_hidden, hidden_count=4, label=_binary_label)
def matmul(case):
    a, b, da, db = (_draw(case, case[k]) for k in ("a", "b", "a", "b"))
    constant = case.get("constant")
    if constant == 0:
        da = np.zeros_like(da)
    if constant == 1:
        db = np.zeros_like(db)
    ts = [minidl.tensor(v) for v in (a, b, da, db)]
    a64, b64, da64, db64 = (v.astype(np.float64) for v in (a, b, da, db))
    got = _tangent_of(lambda x, y: x @ y, ts[:2], ts[2:], () if constant is None else (constant,))
    compare("the tangent of a @ b", da64 @ b64 + a64 @ db64, got, a.dtype, [
        ("missing term", lambda: da64 @ b64 + 0), ("missing term", lambda: a64 @ db64 + 0),
        ("transposed operand", lambda: da64 @ np.swapaxes(b64, -1, -2) + a64 @ db64),
        ("transposed operand", lambda: da64 @ b64 + np.swapaxes(a64, -1, -2) @ db64)])


@check("a8.softmax", public=[dict(x=(3, 5), axis=-1)],
       hidden=lambda rng: [dict(x=(4, 6), axis=0, dtype="float32"), dict(x=(2, 3, 4), axis=1)], hidden_count=2,
       label=lambda p: f"x {p['x']}, axis {p['axis']}, {p.get('dtype', 'float64')}")
def softmax(case):
    x, dx, axis = _draw(case, case["x"]), _draw(case, case["x"]), case["axis"]
    _, got = jvp(lambda u: F.softmax(u, dim=axis), (minidl.tensor(x),), (minidl.tensor(dx),))
    x64, dx64 = x.astype(np.float64), dx.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    other = 0 if axis % x.ndim else -1
    compare(f"the tangent of softmax(x) over axis {axis}", y * (dx64 - (dx64 * y).sum(axis, keepdims=True)), got,
            x.dtype, {"missing term": lambda: y * dx64,
                      "wrong axis": lambda: y * (dx64 - (dx64 * y).sum(other, keepdims=True))})
