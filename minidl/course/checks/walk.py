"""Assignment 3's checks: the walk's order by its contract, gradients summed and accumulated, and a
backward that can itself be differentiated.

The order is checked by calling the task's function directly on graphs of
minidl's ops (every reachable node once, each before the nodes that made its
inputs); accumulation and the second derivative through backward walks, against
values derived by hand.
"""
from __future__ import annotations

import numpy as np

import minidl

from .core import Mismatch, check, compare, unchanged


def _random_graph(rng, size, chain=False):
    """A graph of minidl's ops on leaves; returns (output, every Function made, in creation order)."""
    leaves = [minidl.tensor(rng.standard_normal(4), requires_grad=True) for _ in range(3)]
    values = list(leaves)
    for i in range(size):
        if chain:
            values.append(values[-1] * 1.0001 if i % 2 else values[-1].tanh())
            continue
        a, b = (values[int(k)] for k in rng.integers(0, len(values), 2))
        kind = int(rng.integers(0, 3))
        values.append(a + b if kind == 0 else a * b if kind == 1 else a.tanh())
    out = values[-1]
    for v in values[-4:-1]:
        out = out + v
    return out.sum(), values


def _reachable(out):
    seen, stack = {}, [out.creator]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        stack.extend(x.creator for x in fn.inputs)
    return seen


@check("a3.order", public=[dict(nodes=6, seed=1), dict(nodes=12, seed=2)],
       hidden=lambda rng: [dict(nodes=int(rng.integers(15, 40)), seed=int(rng.integers(1 << 30))),
                           dict(nodes=3000, chain=True, seed=0)], hidden_count=2,
       label=lambda p: f"a {'chain' if p.get('chain') else 'graph'} of {p['nodes']} ops")
def order(case):
    out, _ = _random_graph(np.random.default_rng(case["seed"]), case["nodes"], bool(case.get("chain")))
    topological_order = case.function("topological_order")
    got = topological_order(dict.fromkeys([out.creator]))
    if not isinstance(got, list):
        raise Mismatch(f"the order is a {type(got).__name__}, expected a list of Functions")
    expected = _reachable(out)
    ids = [id(fn) for fn in got]
    if len(ids) != len(set(ids)):
        twice = next(fn for fn in got if ids.count(id(fn)) > 1)
        raise Mismatch(f"{type(twice).__name__} appears {ids.count(id(twice))} times in the order",
                       ["node visited twice"])
    missing = [fn for key, fn in expected.items() if key not in set(ids)]
    if missing or len(ids) != len(expected):
        raise Mismatch(f"the order holds {len(ids)} Functions, the graph {len(expected)}"
                       + (f"; missing: {type(missing[0]).__name__}" if missing else ""))
    position = {key: i for i, key in enumerate(ids)}
    for fn in got:
        for x in fn.inputs:
            if x.creator is not None and position[id(x.creator)] < position[id(fn)]:
                raise Mismatch(f"{type(x.creator).__name__} (position {position[id(x.creator)]}) comes before "
                               f"{type(fn).__name__} (position {position[id(fn)]}), which uses its output: its "
                               "backward would run before that use had sent its gradient", ["order not topological"])
    if got[0] is not out.creator:
        raise Mismatch(f"the order starts with {type(got[0]).__name__}, not with the output's creator "
                       f"{type(out.creator).__name__}", ["order not topological"])


def _accumulate_hidden(rng):
    return [dict(n=int(rng.integers(5, 9)), dtype="float32"), dict(n=int(rng.integers(5, 9)))]


@check("a3.accumulate", public=[dict(n=4)], hidden=_accumulate_hidden, hidden_count=2,
       label=lambda p: f"vectors of {p['n']}, {p.get('dtype', 'float64')}")
def accumulate(case):
    n, dtype = case["n"], np.dtype(case.get("dtype", "float64"))

    def draw():
        return case.rng.standard_normal(n).astype(dtype)
    x0, a, b, c, g = draw(), draw(), draw(), draw(), draw()
    t = np.tanh(x0.astype(np.float64))
    a64, b64, c64, g64 = (v.astype(np.float64) for v in (a, b, c, g))
    # a node used twice: h's two uses are summed before tanh's backward runs
    x = minidl.tensor(x0, requires_grad=True)
    h = x.tanh()
    h.retain_grad()
    (h * minidl.tensor(a) + h * minidl.tensor(b)).sum().backward()
    overwritten = "gradient overwritten, not accumulated"
    compare("h.grad for h = tanh(x) used twice (h·a + h·b)", a64 + b64, h.grad, dtype,
            [(overwritten, a64), (overwritten, b64)])
    compare("x.grad for h = tanh(x) used twice (h·a + h·b)", (a64 + b64) * (1 - t * t), x.grad, dtype,
            [(overwritten, a64 * (1 - t * t)), (overwritten, b64 * (1 - t * t))])
    # the same gradient Tensor reaches h twice (h + h): summing must not write into it
    x = minidl.tensor(x0, requires_grad=True)
    h = x.tanh()
    gt = minidl.tensor(g)
    (h + h).backward(gt)
    compare("x.grad for h + h, h = tanh(x)", 2 * g64 * (1 - t * t), x.grad, dtype,
            {overwritten: g64 * (1 - t * t)})
    unchanged("the gradient handed to backward (h + h hands it to h twice)", g, gt)
    # a leaf used twice, and two backward walks: x.grad is the sum of everything
    x = minidl.tensor(x0, requires_grad=True)
    (x * minidl.tensor(a) + x * minidl.tensor(b)).sum().backward()
    compare("x.grad for x·a + x·b", a64 + b64, x.grad, dtype, [(overwritten, a64), (overwritten, b64)])
    (x * minidl.tensor(c)).sum().backward()
    compare("x.grad after a second backward adds x·c", a64 + b64 + c64, x.grad, dtype, [(overwritten, c64)])
    # two leaves may receive the same gradient Tensor: accumulating into one must not change the other
    x, y = minidl.tensor(x0, requires_grad=True), minidl.tensor(x0, requires_grad=True)
    gt = minidl.tensor(g)
    (x + y).backward(gt)
    (x * minidl.tensor(c)).backward(minidl.tensor(np.ones(n, dtype)))
    compare("x.grad after x + y, then x·c", g64 + c64, x.grad, dtype)
    unchanged("y.grad (x + y gave x and y the same gradient; only x's second use adds to x)", g, y.grad)
    unchanged("the gradient handed to backward", g, gt)
    # with create_graph=True, .grad is a Tensor with a graph, and accumulating extends that graph
    x = minidl.tensor(x0, requires_grad=True)
    (x * x).sum().backward(create_graph=True)
    (x * x * x).sum().backward(create_graph=True)
    x64 = x0.astype(np.float64)
    compare("x.grad after x² and x³ with create_graph=True", 2 * x64 + 3 * x64 ** 2, x.grad, dtype)
    if not x.grad.requires_grad:
        raise Mismatch("x.grad after backward(create_graph=True) does not require grad: its graph was lost",
                       ["in-place write into a saved input"])
    (second,) = minidl.grad(x.grad.sum(), [x])
    compare("the derivative of x.grad (2x + 3x²) with respect to x", 2 + 6 * x64, second, dtype,
            {"in-place write into a saved input": 2 + 0 * x64})


@check("a3.double_backward", public=[dict(n=5)],
       hidden=lambda rng: [dict(n=int(rng.integers(6, 10)), dtype="float32"), dict(n=int(rng.integers(6, 10)))],
       hidden_count=2, label=lambda p: f"vectors of {p['n']}, {p.get('dtype', 'float64')}")
def double_backward(case):
    n, dtype = case["n"], np.dtype(case.get("dtype", "float64"))
    x0, w0, v0 = (case.rng.standard_normal(n).astype(dtype) for _ in range(3))
    x, w = minidl.tensor(x0, requires_grad=True), minidl.tensor(w0, requires_grad=True)
    (gx,) = minidl.grad((w * x.tanh()).sum(), [x], create_graph=True)  # w·(1 − tanh²x), through TanhGrad
    hx, hw = minidl.grad((minidl.tensor(v0) * gx).sum(), [x, w], allow_unused=True)
    x64, w64, v64 = (a.astype(np.float64) for a in (x0, w0, v0))
    t = np.tanh(x64)
    compare("the second derivative along x: v·w·(−2 tanh x)(1 − tanh² x)", v64 * w64 * -2 * t * (1 - t * t), hx,
            dtype, {"input used for output": v64 * w64 * -2 * x64 * (1 - t * t),
                    "missing term": np.zeros(n)})
    compare("the derivative along w (the incoming gradient's path): v·(1 − tanh² x)", v64 * (1 - t * t), hw, dtype,
            {"missing term": np.zeros(n)})
