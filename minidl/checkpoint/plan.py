"""Where to cut a network into checkpoint segments, and what 16-bit storage costs.

The textbook warns that uniform segments are not good practice: layers
differ in how much activation memory they hold and in how long they take.
:func:`balanced_segments` measures every layer in one dry run and places the
boundaries by those numbers; :func:`choose_segments` picks the number of
segments too (√L, or the least memory within a time budget);
:func:`storage_report` measures what storing the segment inputs in 16 bits
saves and how far the gradients move.

The memory model, for segments starting at s₀ = 0 < s₁ < … < s_{k−1}
(checkpoint_sequential runs the last one normally): while segment j is
recomputed (or, for the last one, when backward starts) the graph holds the
inputs of the segments before it and every activation of segment j,

    peak = max_j ( Σ_{i<j} in(s_i) + Σ_{l ∈ segment j} act(l) ),

where in(l) is the size of layer l's input and act(l) the bytes layer l's
ops hold for backward (its input included). The extra time is one more
forward pass of every layer before the last segment:

    slowdown = 1 + Σ_{l < s_{k−1}} forward(l) / Σ_l (forward(l) + backward(l)).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from minidl import autograd, backend, memory
from minidl.checkpoint.replay import BufferGuard, RngState
from minidl.checkpoint.segments import checkpoint_sequential, layer_list, uniform_boundaries
from minidl.nn.containers import Sequential
from minidl.tensor import Tensor

__all__ = ["SegmentPlan", "profile_layers", "balanced_segments", "choose_segments", "flatten_layers",
           "sqrt_segments", "storage_report"]


@dataclass
class SegmentPlan:
    """Segment starts for ``checkpoint_sequential`` and the per-layer measurements behind them.

    Pass the plan itself as ``segments``. ``peak_bytes()`` and ``slowdown()``
    evaluate the model in this module's docstring for these boundaries or any others.
    """

    boundaries: list
    input_bytes: list
    layer_bytes: list
    forward_seconds: list
    backward_seconds: list

    @property
    def num_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def segments(self) -> int:
        return len(self.boundaries)

    def segment_bytes(self, boundaries=None) -> list:
        """Σ act(l) over each segment's layers."""
        starts = list(self.boundaries if boundaries is None else boundaries) + [self.num_layers]
        return [int(sum(self.layer_bytes[a:b])) for a, b in zip(starts, starts[1:])]

    def peak_bytes(self, boundaries=None) -> int:
        """Modeled peak activation memory of checkpoint_sequential with these segment starts."""
        starts = list(self.boundaries if boundaries is None else boundaries)
        held, peak = 0, 0
        for start, seg in zip(starts, self.segment_bytes(starts)):
            peak = max(peak, held + seg)
            held += self.input_bytes[start]
        return int(peak)

    def plain_bytes(self) -> int:
        """Modeled activation memory without checkpointing (one segment)."""
        return int(sum(self.layer_bytes))

    def slowdown(self, boundaries=None) -> float:
        """Modeled step time relative to the plain run: 1 + recomputed forward time / step time."""
        starts = self.boundaries if boundaries is None else boundaries
        step = sum(self.forward_seconds) + sum(self.backward_seconds)
        return 1.0 + sum(self.forward_seconds[:starts[-1]]) / step if step > 0 else 1.0

    def uniform(self, segments: int | None = None) -> list:
        """PyTorch's uniform segment starts for the same number of layers."""
        return uniform_boundaries(self.num_layers, segments or self.segments)

    def __repr__(self):
        return (f"SegmentPlan({self.segments} segments of {self.num_layers} layers, starts {self.boundaries}, "
                f"modeled peak {memory.format_bytes(self.peak_bytes())} of "
                f"{memory.format_bytes(self.plain_bytes())}, slowdown {self.slowdown():.2f}x)")


def flatten_layers(model) -> list:
    """The chain of layers of a Sequential with nested Sequentials opened up.

    Any other module stays whole, in particular a ``checkpoint_atomic`` one
    (``nn.Residual``): a segment boundary inside it would cut the skip
    connection from the input it adds back.
    """
    layers = []
    for layer in layer_list(model, "flatten_layers"):
        if type(layer) is Sequential and not layer.checkpoint_atomic:
            layers.extend(flatten_layers(layer))
        else:
            layers.append(layer)
    return layers


def _synchronize(device):
    if device != "cpu":
        backend.cupy_module().cuda.get_current_stream().synchronize()


def profile_layers(model, sample_input) -> SegmentPlan:
    """One dry run, layer by layer: input bytes, bytes held for backward, forward and backward seconds.

    Parameter gradients, BatchNorm statistics and the random state are left
    as they were. Returns a one-segment plan holding the measurements.
    """
    layers = layer_list(model, "profile_layers")
    if not isinstance(sample_input, Tensor):
        raise TypeError(f"profile_layers: sample_input must be a Tensor, got {type(sample_input).__name__}")
    device = sample_input.device
    inputs, held, forward, backward = [], [], [], []
    rng = RngState.of([device])
    try:
        with BufferGuard():
            x = sample_input
            for layer in layers:
                inp = Tensor(x.array, requires_grad=x.dtype.kind == "f")
                with memory.track(allocator=False) as m:  # tracemalloc would slow the timed forward
                    start = time.perf_counter()
                    y = layer(inp)
                    _synchronize(device)
                    middle = time.perf_counter()
                inputs.append(int(inp.array.nbytes))
                held.append(m.current_bytes)
                forward.append(middle - start)
                targets = [inp] + [p for p in layer.parameters() if p.requires_grad]
                if y.requires_grad:  # gradients returned, not accumulated: .grad stays untouched
                    autograd.grad([y], targets, grad_outputs=[Tensor(y.xp.ones_like(y.array))], allow_unused=True)
                    _synchronize(device)
                backward.append(time.perf_counter() - middle)
                x = y.detach()
    finally:
        rng.restore()
    return SegmentPlan([0], inputs, held, forward, backward)


# ---------------------------------------------------------------- boundary search
def _starts_under(limit, prefix, inputs, segments, last_max):
    """Segment starts with modeled peak ≤ limit, or None.

    Dynamic programming over (segments placed, layers covered), keeping the
    smallest Σ in(s_i) of the starts so far (smaller never hurts later
    segments). ``segments=None``: any number of segments; the last one must
    start at or before ``last_max`` (the time budget).
    """
    L = len(inputs)
    rounds = L if segments is None else segments
    best = np.full(L + 1, np.inf)
    best[0] = 0.0
    parents, finish = [], None
    for c in range(rounds):
        new, parent = np.full(L + 1, np.inf), np.full(L + 1, -1)
        for e in np.flatnonzero(np.isfinite(best[:L])):
            held = best[e]
            may_end = (segments is None or c == segments - 1) and e <= last_max
            if may_end and held + prefix[L] - prefix[e] <= limit and held + inputs[e] < new[L]:
                new[L], parent[L] = held + inputs[e], e
            if segments is not None and c == segments - 1:
                continue
            last_end = int(np.searchsorted(prefix, limit - held + prefix[e], side="right")) - 1
            last_end = min(last_end, L - 1 if segments is None else L - (segments - 1 - c))
            if last_end > e:
                window, owners = new[e + 1:last_end + 1], parent[e + 1:last_end + 1]
                better = held + inputs[e] < window
                window[better], owners[better] = held + inputs[e], e
        parents.append(parent)
        if np.isfinite(new[L]):
            finish = len(parents)
            if segments is None:
                break
        best = new
    if finish is None:
        return None
    starts, end = [], L
    for parent in reversed(parents[:finish]):
        end = int(parent[end])
        starts.append(end)
    return starts[::-1]


def _best_starts(plan: SegmentPlan, segments=None, last_max=None) -> list:
    """The starts with the least modeled peak: bisection on the peak, each step one DP."""
    act = np.asarray(plan.layer_bytes, dtype=np.float64)
    prefix = np.concatenate([[0.0], np.cumsum(act)])
    inputs = np.asarray(plan.input_bytes, dtype=np.float64)
    last_max = plan.num_layers - 1 if last_max is None else last_max
    low, high = int(act.max(initial=0)), int(prefix[-1] + inputs.sum())
    while low < high:
        middle = (low + high) // 2
        if _starts_under(middle, prefix, inputs, segments, last_max) is None:
            low = middle + 1
        else:
            high = middle
    return _starts_under(low, prefix, inputs, segments, last_max)


def _check_count(segments, num_layers, where):
    if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) or not 1 <= segments <= num_layers:
        raise ValueError(f"{where}: segments must be an integer between 1 and the number of layers "
                         f"({num_layers}), got {segments!r}")


def balanced_segments(model, sample_input, segments: int, profile: SegmentPlan | None = None) -> SegmentPlan:
    """Segment starts that balance measured activation memory instead of layer counts.

    One dry run (:func:`profile_layers`, or pass ``profile``) measures each
    layer; then the boundaries minimizing the modeled peak are found exactly
    (each segment's activations plus the inputs kept before it: segments come
    out about equal in memory, and boundaries prefer narrow layers). Only
    top-level layers are boundaries, so a Residual block is never cut.
    """
    profile = profile or profile_layers(model, sample_input)
    _check_count(segments, profile.num_layers, "balanced_segments")
    starts = _best_starts(profile, int(segments))
    return SegmentPlan(starts, profile.input_bytes, profile.layer_bytes, profile.forward_seconds,
                       profile.backward_seconds)


def sqrt_segments(num_layers: int) -> int:
    """The √L rule: the number of segments that minimizes k + L/k for equal layers."""
    return max(1, min(num_layers, round(math.sqrt(num_layers))))


def choose_segments(model, sample_input, time_budget: float | None = None,
                    profile: SegmentPlan | None = None) -> SegmentPlan:
    """Pick the number of segments and their starts.

    Without ``time_budget``: √L balanced segments. With it (the allowed step
    time relative to no checkpointing, e.g. 1.25): the least modeled memory
    whose modeled slowdown stays within the budget, the segment count free.
    """
    profile = profile or profile_layers(model, sample_input)
    if time_budget is None:
        return balanced_segments(model, sample_input, sqrt_segments(profile.num_layers), profile)
    if not time_budget >= 1:
        raise ValueError(f"choose_segments: time_budget is the allowed step time relative to the plain run "
                         f"and must be at least 1, got {time_budget!r}")
    step = sum(profile.forward_seconds) + sum(profile.backward_seconds)
    spent, last_max = 0.0, 0
    for index, seconds in enumerate(profile.forward_seconds[:-1]):  # recomputing layers 0..index
        spent += seconds
        if 1 + spent / step > time_budget:
            break
        last_max = index + 1
    starts = _best_starts(profile, None, last_max)
    return SegmentPlan(starts, profile.input_bytes, profile.layer_bytes, profile.forward_seconds,
                       profile.backward_seconds)


# ---------------------------------------------------------------- 16-bit storage, measured
def storage_report(model, sample_input, segments, storage_dtype="float16", loss_fn=None) -> dict:
    """Measure one checkpointed step with full-precision and with 16-bit segment inputs.

    Returns the peak activation bytes of each, the bytes saved, and the
    gradient error over all parameters: ``relative_grad_error`` = ‖g₁₆ − g‖/‖g‖
    and ``max_relative_grad_error`` = max|g₁₆ − g| / max|g|. The recomputation
    starts from inputs rounded to 16 bits (relative error 2⁻¹¹ in float16); a
    ReLU unit within that distance of zero flips its mask, which changes that
    example's whole contribution to a weight gradient: the largest elementwise
    errors come from such flips. ``loss_fn(output)`` gives the scalar loss (default: mean of
    squares). Gradients, BatchNorm statistics and the random state are left
    as they were; both runs draw the same dropout masks.
    """
    layers = layer_list(model, "storage_report")
    loss_fn = loss_fn or (lambda out: (out * out).mean())
    params = list({id(p): p for layer in layers for p in layer.parameters() if p.requires_grad}.values())
    kept = [p.grad for p in params]
    rng = RngState.of([sample_input.device])
    runs = {}
    try:
        with BufferGuard():
            for dtype in (None, storage_dtype):
                rng.restore()
                for p in params:
                    p.grad = None
                with memory.track() as m:
                    loss = loss_fn(checkpoint_sequential(layers, segments, sample_input, storage_dtype=dtype))
                    loss.backward()
                runs[dtype] = (m.peak_bytes, [backend.to_numpy(p.grad.array) for p in params if p.grad is not None])
    finally:
        rng.restore()
        for p, g in zip(params, kept):
            p.grad = g
    (full, exact), (small, rounded) = runs[None], runs[storage_dtype]
    exact = [g.astype(np.float64) for g in exact]
    differences = [a.astype(np.float64) - b for a, b in zip(rounded, exact)]
    scale = max((float(np.abs(g).max()) for g in exact), default=0.0) or 1.0
    norm = math.sqrt(sum(float((g * g).sum()) for g in exact)) or 1.0
    return {"storage_dtype": str(storage_dtype), "peak_bytes": full, "peak_bytes_16bit": small,
            "saved_bytes": full - small, "saved_fraction": (full - small) / full if full else 0.0,
            "relative_grad_error": math.sqrt(sum(float((d * d).sum()) for d in differences)) / norm,
            "max_relative_grad_error": max((float(np.abs(d).max()) for d in differences), default=0.0) / scale}
