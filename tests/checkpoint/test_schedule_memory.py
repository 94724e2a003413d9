"""Schedules measured with the process's allocator (tracemalloc), not with the memory model.

Two chains: the issue's 6 × (Linear(256, 256), ReLU), batch 2048, float32, and the GPT of
bench_memory_strategies.py as a chain of layers (``pipeline_layers``: embedding, 4 blocks, tied
head; 8 sequences of 128 tokens). Each schedule's step is measured by ``memory.track``, which
gives both figures at once: the bytes saved for backward (the model's figure, loss nodes
included) and the allocator's peak above the step's start.
"""
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl import memory
from minidl.checkpoint import SegmentPlan, optimal_schedule, profile_layers, segment_schedule, smallest_peak

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_schedule import gpt_chain, relu_chain  # noqa: E402  (the chains the benchmark's tables measure)


def sizes_only(model, x):
    """The chain's measured sizes, with each layer's bytes standing for its time: the schedules then do not
    depend on the machine's timings (which only break ties between schedules of equal peak here)."""
    p = profile_layers(model, x)
    return SegmentPlan([0], p.input_bytes, p.layer_bytes, [float(b) for b in p.layer_bytes], [0.0] * p.num_layers)


def measured_step(model, run, x, loss_fn):
    """One step from no gradients, under the tracker: (allocator peak, bytes saved for backward at peak)."""
    for p in model.parameters():
        p.grad = None
    with memory.track() as m:
        loss = loss_fn(run(x))
        loss.backward()
    return m.allocator_peak_bytes, m.peak_bytes


def own_excess(layer, x):
    """The most one layer's own step needs beyond what it saves: its output, its gradients, its temporaries."""
    if x.dtype.kind == "f":
        x = mdl.tensor(x.array, requires_grad=True)
    grad = mdl.tensor(np.ones(layer(x).shape, dtype=np.float32))
    real, saved = measured_step(layer, layer, x, lambda out: (out * grad).sum())
    for p in layer.parameters():
        p.grad = None
    return real - saved


@pytest.mark.parametrize("make", [relu_chain, gpt_chain], ids=["relu_chain", "gpt_chain"])
def test_every_schedule_really_holds_what_it_models(make):
    model, x, loss_fn = make()
    profile = sizes_only(model, x)
    L, least = profile.num_layers, smallest_peak(profile)
    inputs, h = [], x
    with mdl.no_grad():
        for layer in model:
            inputs.append(h)
            h = layer(h)
    activation = max(profile.input_bytes[1:] + [h.array.nbytes])  # the largest array passed between layers
    state = sum(p.array.nbytes for p in model.parameters())  # their gradients (no optimizer here)
    with memory.track(allocator=False) as loss_nodes:  # what the loss saves: the tracker's constant excess
        loss_fn(mdl.tensor(h.array, requires_grad=True))
    # The margin: what a step holds outside the graph, which no model of the schedule counts.
    # - the most any single layer needs beyond what it saves (measured here, layer by layer: its output, its
    #   parameters' gradients, its temporaries; the GPT's GELU works in six arrays of the hidden width);
    # - six activations in flight: the gradient entering the current layer and the one leaving it, the
    #   recomputed output a checkpoint's inner walk starts from and its gradient, and the outermost
    #   checkpoint's output and gradient, which the walk that called it holds through its whole backward.
    margin = max(own_excess(layer, inp) for layer, inp in zip(model, inputs)) + 6 * activation
    schedules = {"plain": None, "per layer": segment_schedule(profile, list(range(L)))}
    for factor in (1, 1.5, 2, 3):
        schedules[f"{factor} × smallest peak"] = optimal_schedule(model, x, int(factor * least), profile=profile)
    real = {}
    for label, schedule in schedules.items():
        run = model if schedule is None else (lambda v, s=schedule: s.run(model, v))
        real[label], saved = measured_step(model, run, x, loss_fn)
        modeled = profile.plain_bytes() if schedule is None else schedule.peak_bytes()
        assert real[label] >= saved - x.array.nbytes, label  # what is saved is really held (x was there before)
        assert real[label] <= modeled + loss_nodes.peak_bytes + state + margin, label
    assert real["1 × smallest peak"] <= real["plain"]


def test_a_deep_recursion_does_not_grow_with_its_depth():
    """The smallest peak of the ReLU chain keeps only x₀ and recomputes from it at every one of its ten
    levels of nesting: before nested checkpoints were recomputed one after another, each level kept three
    activations alive (68 MiB against a plain step's 32.6); now it stays within a few activations of the
    one layer it records at a time."""
    model, x, loss_fn = relu_chain()
    profile = sizes_only(model, x)
    schedule = optimal_schedule(model, x, smallest_peak(profile), profile=profile)
    depth, node = 0, schedule.root
    while hasattr(node, "left"):  # a split: its left part is recomputed from x₀, one level deeper
        depth, node = depth + 1, node.left
    assert depth == 10  # x₀ kept, every other input recomputed (the first two layers taped together)
    real, saved = measured_step(model, lambda v: schedule.run(model, v), x, loss_fn)
    activation = x.array.nbytes  # 2 MiB: every array between layers has x's shape
    state = sum(p.array.nbytes for p in model.parameters())
    assert real <= saved + state + 6 * activation  # 10 levels × 3 activations would be 60 MiB more
