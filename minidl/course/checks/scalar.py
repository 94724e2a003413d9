"""Assignment 1's checks: the scalar engine's ops and its walk, against the chain rule by hand.

The op checks call one result's ``_backward`` directly, with gradients already
in its children, so they need no walk; the walk's check builds its graphs by
hand (Values whose ``_backward`` the check writes), so it needs no op. Each
task is checked on its own, whatever state the others are in.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.course import scalar

from .core import Mismatch, check, compare


def _close(what, expected, got, mistakes=None):
    compare(what, np.float64(expected), got, np.float64, mistakes, exact_dtype=False)


def _local(op, a, b=None, upstream=1.0, before=(0.0, 0.0), same=False):
    """Run ``op``'s forward and its local backward; return (out, the children's grads)."""
    va = scalar.Value(a)
    vb = va if same else (scalar.Value(b) if b is not None else None)
    va.grad = before[0]
    if vb is not None and not same:
        vb.grad = before[1]
    out = op(va) if vb is None else op(va, vb)
    if not isinstance(out, scalar.Value):
        raise Mismatch(f"the result is a {type(out).__name__}, not a Value")
    for child, name in ((va, "the first operand"), (vb, "the second operand")):
        if child is not None and not any(c is child for c in out.children):
            raise Mismatch(f"the result does not list {name} among its children, so the walk never reaches it")
    out.grad = upstream
    out._backward()
    return out, va, vb


def _ops_hidden(rng):
    return [dict(a=float(rng.uniform(-3, 3)), b=float(rng.uniform(-3, 3)), upstream=float(rng.uniform(0.5, 2)),
                 before=(float(rng.uniform(-1, 1)), float(rng.uniform(-1, 1)))) for _ in range(3)] + \
        [dict(a=float(rng.uniform(0.5, 2)), same=True, upstream=float(rng.uniform(0.5, 2)))]


def _ops_label(p):
    if p.get("same"):
        return f"x = {p['a']:.3g} used twice (x + x and x · x), upstream {p['upstream']:.3g}"
    return f"a = {p['a']:.3g}, b = {p['b']:.3g}, upstream {p.get('upstream', 1.0):.3g}" + \
        (f", grads already {p['before'][0]:.3g} and {p['before'][1]:.3g}" if p.get("before") else "")


@check("a1.add_mul", public=[dict(a=2.0, b=-3.0), dict(a=0.5, b=4.0, upstream=2.0)], hidden=_ops_hidden,
       hidden_count=4, label=_ops_label)
def add_mul(case):
    a, b, g = case["a"], case.get("b"), case.get("upstream", 1.0)
    if case.get("same"):
        out, x, _ = _local(lambda u, v: u + v, a, same=True, upstream=g)
        _close("x + x", 2 * a, out.data)
        _close("the gradient of x in x + x", 2 * g, x.grad,
               {"gradient overwritten, not accumulated": g})
        out, x, _ = _local(lambda u, v: u * v, a, same=True, upstream=g)
        _close("x · x", a * a, out.data)
        _close("the gradient of x in x · x", 2 * a * g, x.grad,
               {"gradient overwritten, not accumulated": a * g})
        return
    before = case.get("before", (0.0, 0.0))
    out, va, vb = _local(lambda u, v: u + v, a, b, g, before)
    _close("a + b", a + b, out.data)
    _close("the gradient of a in a + b", before[0] + g, va.grad, {"gradient overwritten, not accumulated": g})
    _close("the gradient of b in a + b", before[1] + g, vb.grad, {"gradient overwritten, not accumulated": g})
    out, va, vb = _local(lambda u, v: u * v, a, b, g, before)
    _close("a · b", a * b, out.data)
    _close("the gradient of a in a · b", before[0] + b * g, va.grad,
           {"gradient overwritten, not accumulated": b * g, "wrong factor": before[0] + a * g})
    _close("the gradient of b in a · b", before[1] + a * g, vb.grad,
           {"gradient overwritten, not accumulated": a * g, "wrong factor": before[1] + b * g})
    out = scalar.Value(a) * 3.0  # a plain number is wrapped into a Value
    _close("a · 3 (a number on the right)", 3 * a, out.data)


def _nonlinear_hidden(rng):
    return [dict(x=float(rng.uniform(0.3, 2)), n=float(rng.choice([3, -1, 0.5])), upstream=float(rng.uniform(0.5, 2)),
                 before=float(rng.uniform(-1, 1))),
            dict(x=float(rng.uniform(-2, -0.3)), n=2, upstream=float(rng.uniform(0.5, 2)), before=0.5)]


@check("a1.nonlinear", public=[dict(x=0.5, n=2), dict(x=1.5, n=3, upstream=2.0)], hidden=_nonlinear_hidden,
       hidden_count=2, label=lambda p: f"x = {p['x']:.3g}, power {p['n']:g}, upstream {p.get('upstream', 1.0):.3g}"
                                       + (f", grad already {p['before']:.3g}" if p.get("before") else ""))
def nonlinear(case):
    x, n, g, before = case["x"], case["n"], case.get("upstream", 1.0), case.get("before", 0.0)
    overwritten = "gradient overwritten, not accumulated"

    def run(op):
        out, v, _ = _local(op, x, upstream=g, before=(before, 0.0))
        return out, v
    out, v = run(lambda u: u ** n)
    _close(f"x ** {n:g}", x ** n, out.data)
    _close(f"the gradient of x in x ** {n:g}", before + n * x ** (n - 1) * g, v.grad,
           {"power not lowered": before + n * x ** n * g, overwritten: n * x ** (n - 1) * g})
    out, v = run(lambda u: u.exp())
    _close("exp(x)", math.exp(x), out.data)
    _close("the gradient of x in exp(x)", before + math.exp(x) * g, v.grad,
           {"input used for output": before + x * g, overwritten: math.exp(x) * g})
    out, v = run(lambda u: u.tanh())
    t = math.tanh(x)
    _close("tanh(x)", t, out.data)
    _close("the gradient of x in tanh(x)", before + (1 - t * t) * g, v.grad,
           [("input used for output", before + (1 - x * x) * g), (overwritten, (1 - t * t) * g),
            ("missing term", before + (1 - t) * g)])
    out, v = run(lambda u: u.relu())
    _close("relu(x)", max(x, 0.0), out.data)
    _close("the gradient of x in relu(x)", before + (g if x > 0 else 0.0), v.grad,
           {overwritten: g if x > 0 else 0.0, "sign": before - (g if x > 0 else 0.0)})


# ---------------------------------------------------------------- 1.3 the walk, on graphs built by hand
def _graph(rng, size, chain=False):
    """A random DAG as (children, local derivatives) per node; node 0... are leaves, the last is the output."""
    leaves = 2 if chain else 3
    structure = [((), ()) for _ in range(leaves)]
    for i in range(leaves, size):
        if chain:
            kids = (i - 1,) if i > leaves else (0, 1)
        else:
            count = int(rng.integers(1, 4))
            kids = tuple(int(k) for k in rng.choice(i, size=min(count, i), replace=False))
            if i == size - 1:
                kids = tuple(sorted(set(kids) | {i - 1, i - 2}))
        structure.append((kids, tuple(float(d) for d in rng.uniform(-1.5, 1.5, len(kids)))))
    return structure


def _expected(structure):
    """The gradients of the output with respect to every node: reverse accumulation in creation order."""
    grads = [0.0] * len(structure)
    grads[-1] = 1.0
    for i in range(len(structure) - 1, -1, -1):
        for k, d in zip(*structure[i]):
            grads[k] += d * grads[i]
    return grads


def _preorder(structure):
    """What a walk without a topological order gives: each node passes on its gradient, then its children go."""
    grads = [0.0] * len(structure)
    grads[-1] = 1.0
    stack = [len(structure) - 1]
    while stack:
        i = stack.pop()
        for k, d in zip(*structure[i]):
            grads[k] += d * grads[i]
        stack.extend(reversed(structure[i][0]))
    return grads


def _without_seen(structure):
    """A topological walk that forgets which nodes it has seen: a node reached along two paths runs twice."""
    order, stack = [], [(len(structure) - 1, False)]
    while stack:
        i, done = stack.pop()
        if done:
            order.append(i)
        else:
            stack.append((i, True))
            stack.extend((k, False) for k in reversed(structure[i][0]))  # the children in their order
    grads = [0.0] * len(structure)
    grads[-1] = 1.0
    for i in reversed(order):
        for k, d in zip(*structure[i]):
            grads[k] += d * grads[i]
    return grads


def _build(structure):
    nodes = []
    for kids, derivatives in structure:
        children = tuple(nodes[k] for k in kids)
        v = scalar.Value(0.1 * len(nodes), children, "f")

        def _backward(v=v, children=children, derivatives=derivatives):
            for child, d in zip(children, derivatives):
                child.grad += d * v.grad
        v._backward = _backward
        nodes.append(v)
    return nodes


@check("a1.walk", public=[dict(nodes=6, seed=1), dict(nodes=10, seed=2), dict(nodes=5, chain=True, seed=3)],
       hidden=lambda rng: [dict(nodes=int(rng.integers(12, 30)), seed=int(rng.integers(1 << 30))) for _ in range(2)]
       + [dict(nodes=5000, chain=True, seed=0)], hidden_count=3,
       label=lambda p: f"a {'chain' if p.get('chain') else 'graph'} of {p['nodes']} Values")
def walk(case):
    structure = _graph(np.random.default_rng(case["seed"]), case["nodes"], bool(case.get("chain")))
    nodes = _build(structure)
    nodes[-1].backward()
    got = np.array([v.grad for v in nodes])
    expected = np.array(_expected(structure))
    compare("the gradients of the nodes, in the order they were made", expected, got, np.float64,
            {"order not topological": lambda: np.array(_preorder(structure)),
             "node visited twice": lambda: np.array(_without_seen(structure)),
             "missing seed": np.zeros(len(nodes))}, exact_dtype=False)
