"""Assignment 6's checks: segment starts exactly, the memory model against its formula, and
checkpoint_sequential against a plain run: the same output and gradients, segments − 1
rematerialized segments in the graph, and less activation memory held, measured.
"""
from __future__ import annotations

import math

import numpy as np

import minidl
from minidl import memory, nn
from minidl.checkpoint import plan as plan_module
from minidl.checkpoint import segments as segment_module

from .core import Mismatch, check, compare, equal


@check("a6.boundaries", public=[dict(layers=8, segments=2), dict(layers=9, segments=3)],
       hidden=lambda rng: [dict(layers=int(rng.integers(10, 40)), segments=int(s)) for s in (3, 4, 7)]
       + [dict(layers=int(rng.integers(2, 5)) ** 2 + 2, segments=2)], hidden_count=4,
       label=lambda p: f"{p['layers']} layers in {p['segments']} segments")
def boundaries(case):
    layers, segments = case["layers"], case["segments"]
    size = layers // segments
    expected = [i * size for i in range(segments)]
    got = segment_module.uniform_boundaries(layers, segments)
    equal(f"uniform_boundaries({layers}, {segments})", expected, list(got) if got is not None else got, {
        "segments misplaced": lambda: [i * math.ceil(layers / segments) for i in range(segments)]})
    rule = max(1, min(layers, round(math.sqrt(layers))))
    equal(f"sqrt_segments({layers})", rule, plan_module.sqrt_segments(layers),
          {"rounded down": max(1, int(math.sqrt(layers)))})


def _plan_case(rng, layers):
    return dict(layers=layers, starts=sorted({0} | {int(s) for s in rng.choice(np.arange(1, layers), 2, False)}),
                seed=int(rng.integers(1 << 30)))


@check("a6.model", public=[dict(layers=4, starts=[0, 2], seed=1), dict(layers=6, starts=[0, 2, 4], seed=2)],
       hidden=lambda rng: [_plan_case(rng, int(rng.integers(5, 12))) for _ in range(3)], hidden_count=3,
       label=lambda p: f"{p['layers']} layers, segments starting at {p['starts']}")
def model(case):
    rng = np.random.default_rng(case["seed"])
    n, starts = case["layers"], list(case["starts"])
    inputs = [int(v) for v in rng.integers(100, 1000, n)]
    acts = [int(v) for v in rng.integers(500, 5000, n)]
    forward, backward = list(rng.uniform(1, 3, n)), list(rng.uniform(2, 6, n))
    plan = plan_module.SegmentPlan(starts, inputs, acts, forward, backward)
    bounds = starts + [n]
    seg = [sum(acts[a:b]) for a, b in zip(bounds, bounds[1:])]
    peak = max(sum(inputs[s] for s in starts[:j]) + seg[j] for j in range(len(starts)))
    equal("the modeled peak", peak, plan.peak_bytes(), {
        "missing term": max(seg), "segments misplaced":
            max(sum(inputs[s] for s in starts[:j + 1]) + seg[j] for j in range(len(starts)))})
    step = sum(forward) + sum(backward)
    compare("the modeled slowdown", np.float64(1 + sum(forward[:starts[-1]]) / step), np.float64(plan.slowdown()),
            np.float64, {"last segment checkpointed": 1 + sum(forward) / step,
                         "missing term": 1 + sum(forward[:starts[-1]]) / sum(forward)}, exact_dtype=False)


def _network(depth, width, seed):
    minidl.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])


def _rematerialized(out) -> int:
    """How many checkpointed segments the graph of ``out`` holds."""
    seen, stack, count = set(), [out.creator], 0
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        count += isinstance(fn, segment_module.CheckpointFunction)
        stack.extend(x.creator for x in fn.inputs or ())
    return count


@check("a6.sequential", public=[dict(depth=4, segments=2), dict(depth=6, segments=3)],
       hidden=lambda rng: [dict(depth=int(rng.integers(5, 9)), segments=int(rng.integers(3, 5))),
                           dict(depth=7, segments=[0, 3, 5], dtype="float64"), dict(depth=5, segments=1)],
       hidden_count=3, label=lambda p: f"{p['depth']} Linear+Tanh blocks, segments {p['segments']}, "
                                       f"{p.get('dtype', 'float32')}")
def sequential(case):
    depth, segments = case["depth"], case["segments"]
    dtype = np.dtype(case.get("dtype", "float32"))
    net = _network(depth, 16, 3)
    if dtype != np.float32:
        net = net.to(dtype)
    x_array = case.rng.standard_normal((8, 16)).astype(dtype)
    x = minidl.tensor(x_array, requires_grad=True)
    with memory.track() as plain_memory:
        plain = net(x)
    plain.sum().backward()
    expected_grads = [p.grad.numpy().copy() for p in net.parameters()] + [x.grad.numpy().copy()]
    net.zero_grad()
    x = minidl.tensor(x_array, requires_grad=True)
    with memory.track() as held:
        out = segment_module.checkpoint_sequential(net, segments, x)
    if not isinstance(out, minidl.Tensor):
        raise Mismatch(f"checkpoint_sequential returned a {type(out).__name__}, not a Tensor")
    compare("the output", plain.numpy().astype(np.float64), out, dtype)
    count = len(segments) if isinstance(segments, list) else segments
    found = _rematerialized(out)
    if found != count - 1:
        names = ["last segment checkpointed"] if found == count else ["nothing checkpointed"] if found == 0 else []
        raise Mismatch(f"the graph holds {found} rematerialized segment{'s' if found != 1 else ''}, expected "
                       f"{count - 1} (every segment but the last)", names)
    if count > 1 and held.peak_bytes >= plain_memory.peak_bytes:
        raise Mismatch(f"the checkpointed forward held {held.peak_bytes} bytes for backward, no fewer than the plain "
                       f"one ({plain_memory.peak_bytes})", ["nothing checkpointed"])
    out.sum().backward()
    got = [p.grad for p in net.parameters()] + [x.grad]
    names = [f"the gradient of parameter {i}" for i in range(len(got) - 1)] + ["the gradient of the input"]
    for name, e, g in zip(names, expected_grads, got):
        compare(name, e.astype(np.float64), g, dtype)
