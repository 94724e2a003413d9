"""The schedule that recomputes least under a memory budget: Revolve's binomial rule and a dynamic program.

``checkpoint_sequential`` keeps the inputs of a few segments and recomputes
each segment once; :mod:`minidl.checkpoint.plan` chooses where they start.
The textbook names the next step: a segment may itself be checkpointed
inside its recomputation, and so on recursively. For a chain of layers
0 … L−1 (x_l the input of layer l) a *schedule* for the layers [a, b), run
with x_a given and backpropagated at once, is one of

- a **tape** ``[a, b)``: run the layers recording the graph (the plain run);
- a **split** at a < m < b: run layers a … m−1 without a graph (x_a is kept
  by a checkpoint node), run the schedule of [m, b) and backpropagate it;
  then recompute [a, m) from x_a by *its* schedule and backpropagate it.

With in(l) the bytes of x_l, act(l) the bytes layer l holds for backward
(its input included) and f(l) its forward time, as :func:`profile_layers`
measures them, the peak held for backward and the forward time spent are

    peak(tape a..b)     = Σ_{a≤l<b} act(l)
    peak(split a|m|b)   = max( in(a) + peak([m, b)),  peak([a, m)) )
    time(tape a..b)     = Σ_{a≤l<b} f(l)
    time(split a|m|b)   = Σ_{a≤l<m} f(l) + time([m, b)) + time([a, m))

(x_a is counted once: the recomputed graph is built on the kept tensor.)
Segments are the special case whose left parts are tapes: the starts
s₀ < s₁ < … give ``split(s₀|s₁|L, tape, split(s₁|s₂|L, tape, …))``, and
these equations become the planner's.

:func:`optimal_schedule` finds the schedule of least time whose peak fits a
budget, by dynamic programming over (a, b, bytes left):

    T(a, b, M) = min( Σ_{[a,b)} f        if Σ_{[a,b)} act ≤ M,
                      min_{a<m<b} Σ_{[a,m)} f + T(m, b, M − in(a)) + T(a, m, M) ).

For a homogeneous chain with one-layer tapes this is Griewank's problem,
solved in closed form by Revolve (Griewank and Walther, ACM TOMS 26, 2000):
with s kept states and r the least integer with L ≤ β(s, r) = C(s + r, s),
reversing L steps costs t(L, s) = r·L − β(s + 1, r − 1) forward steps beside
the L recorded ones (:func:`revolve_forward_steps`, :func:`binomial_schedule`).
A schedule runs on the model through nested :func:`~minidl.checkpoint.checkpoint`
calls, so its gradients are the plain run's and the memory tracker sees what
the equations predict.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import reduce

import numpy as np

from minidl import memory
from minidl.checkpoint.plan import SegmentPlan, profile_layers
from minidl.checkpoint.segments import checkpoint, layer_list

__all__ = ["Tape", "Split", "Schedule", "optimal_schedule", "smallest_peak", "segment_schedule",
           "binomial_schedule", "revolve_forward_steps", "count_forward_calls"]


@dataclass(frozen=True)
class Tape:
    """Run layers [start, stop) recording the graph."""

    start: int
    stop: int


@dataclass(frozen=True)
class Split:
    """Keep x_start, run [start, middle) without a graph, then ``right`` on [middle, stop); recompute by ``left``."""

    start: int
    middle: int
    stop: int
    left: object
    right: object


def _peak(node, inputs, act) -> int:
    if isinstance(node, Tape):
        return int(sum(act[node.start:node.stop]))
    return max(inputs[node.start] + _peak(node.right, inputs, act), _peak(node.left, inputs, act))


def _calls(node, counts):
    """Add to counts[l] the forward calls of layer l the schedule makes."""
    if isinstance(node, Tape):
        for layer in range(node.start, node.stop):
            counts[layer] += 1
        return
    for layer in range(node.start, node.middle):
        counts[layer] += 1
    _calls(node.right, counts)
    _calls(node.left, counts)


def _runner(node, layers, preserve_rng_state):
    if isinstance(node, Tape):
        chain = layers[node.start:node.stop]

        def run_tape(x):
            for layer in chain:
                x = layer(x)
            return x
        return run_tape
    left = _runner(node.left, layers, preserve_rng_state)
    right = _runner(node.right, layers, preserve_rng_state)

    def run_split(x):
        return right(checkpoint(left, x, preserve_rng_state=preserve_rng_state))
    return run_split


@dataclass
class Schedule:
    """A recursive checkpointing schedule of a chain and the measurements it was planned with.

    ``run(model, x)`` computes the model's output with it (backpropagate as
    usual); ``peak_bytes()``, ``forward_calls()`` and ``slowdown()`` evaluate
    the equations of this module's docstring.
    """

    root: object
    profile: SegmentPlan

    @property
    def num_layers(self) -> int:
        return self.profile.num_layers

    def peak_bytes(self) -> int:
        """Modeled peak of the bytes held for backward (what ``memory.track`` measures, loss nodes aside)."""
        return _peak(self.root, self.profile.input_bytes, self.profile.layer_bytes)

    def forward_calls(self) -> list:
        """How many times each layer's forward runs in one step (1 for every layer in the plain run)."""
        counts = [0] * self.num_layers
        _calls(self.root, counts)
        return counts

    def recomputations(self) -> int:
        """Layer forward calls beyond the plain run's L."""
        return sum(self.forward_calls()) - self.num_layers

    def slowdown(self) -> float:
        """Modeled step time relative to the plain run: 1 + recomputed forward time / step time."""
        f, step = self.profile.forward_seconds, sum(self.profile.forward_seconds) + sum(self.profile.backward_seconds)
        extra = sum((c - 1) * t for c, t in zip(self.forward_calls(), f))
        return 1.0 + extra / step if step > 0 else 1.0

    def run(self, model, input, preserve_rng_state: bool = True):
        """The model's output computed by this schedule; ``.backward()`` recomputes as it says."""
        layers = layer_list(model, "Schedule.run")
        if len(layers) != self.num_layers:
            raise ValueError(f"Schedule.run: the schedule is for {self.num_layers} layers, the model has "
                             f"{len(layers)}")
        return _runner(self.root, layers, preserve_rng_state)(input)

    def describe(self) -> str:
        """The tree, one node a line: 'tape 3..5' or 'split 0|3|8'."""
        lines = []

        def walk(node, depth):
            if isinstance(node, Tape):
                lines.append(f"{'  ' * depth}tape {node.start}..{node.stop - 1}")
            else:
                lines.append(f"{'  ' * depth}split {node.start}|{node.middle}|{node.stop}")
                walk(node.right, depth + 1)
                walk(node.left, depth + 1)
        walk(self.root, 0)
        return "\n".join(lines)

    def __repr__(self):
        return (f"Schedule({self.num_layers} layers, modeled peak {memory.format_bytes(self.peak_bytes())} of "
                f"{memory.format_bytes(self.profile.plain_bytes())}, {self.recomputations()} layer "
                f"recomputations, slowdown {self.slowdown():.2f}x)")


# ---------------------------------------------------------------- the schedules
def segment_schedule(profile: SegmentPlan, starts=None) -> Schedule:
    """``checkpoint_sequential``'s segments (the profile's boundaries, or ``starts``) as a schedule."""
    starts = list(profile.boundaries if starts is None else starts)
    L = profile.num_layers
    node = Tape(starts[-1], L)
    for a, b in reversed(list(zip(starts, starts[1:]))):
        node = Split(a, b, L, Tape(a, b), node)
    return Schedule(node, profile)


def _tape_limit(longest_tape, L, where):
    if longest_tape is None:
        return L
    if isinstance(longest_tape, bool) or not isinstance(longest_tape, (int, np.integer)) or longest_tape < 1:
        raise ValueError(f"{where}: longest_tape must be a positive integer (layers recorded at once) or None, "
                         f"got {longest_tape!r}")
    return int(longest_tape)


def _least_peak(profile: SegmentPlan, longest: int):
    """The schedule of least modeled peak (the least forward time among those): (its tree, its peak).

    P(a, b) = min( Σ_{[a,b)} act if b − a ≤ longest,  min_m max(in(a) + P(m, b), P(a, m)) ),
    ties broken by the forward time of the schedules the minimum is taken over.
    """
    inputs, act, f, L = profile.input_bytes, profile.layer_bytes, profile.forward_seconds, profile.num_layers
    act_prefix, f_prefix = [0, *np.cumsum(act).tolist()], [0.0, *np.cumsum(f).tolist()]
    best = {}  # (a, b) -> (peak, forward time, tree)
    for length in range(1, L + 1):
        for a in range(0, L - length + 1):
            b = a + length
            found = (act_prefix[b] - act_prefix[a], f_prefix[b] - f_prefix[a], Tape(a, b)) if length <= longest \
                else (math.inf, math.inf, None)
            for m in range(a + 1, b):
                (left, left_time, left_tree), (right, right_time, right_tree) = best[a, m], best[m, b]
                peak = max(inputs[a] + right, left)
                time = f_prefix[m] - f_prefix[a] + right_time + left_time
                if (peak, time) < found[:2]:
                    found = (peak, time, Split(a, m, b, left_tree, right_tree))
            best[a, b] = found
    peak, _, tree = best[0, L]
    return tree, int(peak)


def smallest_peak(profile: SegmentPlan, longest_tape: int | None = None) -> int:
    """The least modeled peak any schedule reaches, time no object (exact, in bytes).

    P(a, b) = min( Σ_{[a,b)} act if b − a ≤ longest_tape,  min_m max(in(a) + P(m, b), P(a, m)) ).
    :func:`optimal_schedule` accepts this budget at any resolution.
    """
    return _least_peak(profile, _tape_limit(longest_tape, profile.num_layers, "smallest_peak"))[1]


def _forward_time(node, f) -> float:
    """Forward seconds of one step by this schedule (the time the dynamic program minimizes)."""
    counts = [0] * len(f)
    _calls(node, counts)
    return float(np.dot(counts, f))


def optimal_schedule(model, sample_input, budget: int, profile: SegmentPlan | None = None,
                     longest_tape: int | None = None, resolution: int = 2048) -> Schedule:
    """The schedule of least recomputation time whose modeled peak stays within ``budget`` bytes.

    One dry run measures the layers (:func:`profile_layers`, or pass
    ``profile``), then the dynamic program of this module's docstring runs
    over bytes counted in units of the greatest common divisor of the
    measured sizes: exact when the budget is at most ``resolution`` such
    units (the usual case: sizes are multiples of one row of activations);
    otherwise sizes are rounded up to ``budget / resolution`` and the result
    fits the budget but may recompute a little more than the exact optimum.
    Rounding up can leave no schedule under a budget near the smallest peak;
    the schedule of least peak (exact, as :func:`smallest_peak` finds it)
    then stands in, and it is also taken whenever it is faster, so every
    budget from :func:`smallest_peak` up is met at any resolution.
    ``longest_tape`` limits how many layers are recorded at once (1 is
    Revolve's setting). A budget below :func:`smallest_peak` is an error.
    """
    profile = profile or profile_layers(model, sample_input)
    L = profile.num_layers
    longest = _tape_limit(longest_tape, L, "optimal_schedule")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real) or not budget > 0:
        raise ValueError(f"optimal_schedule: budget is a number of bytes and must be positive, got {budget!r}")
    least_tree, least = _least_peak(profile, longest)
    if budget < least:
        raise ValueError(f"optimal_schedule: no schedule fits a budget of {int(budget)} bytes "
                         f"({memory.format_bytes(budget)}); the smallest feasible peak of this chain is {least} "
                         f"bytes ({memory.format_bytes(least)}): raise the budget to at least that")
    sizes = [int(v) for v in (*profile.input_bytes, *profile.layer_bytes) if v > 0]
    unit = reduce(math.gcd, sizes, 0) or 1
    if budget // unit > resolution:
        unit = math.ceil(budget / resolution)
    slots = int(budget // unit)
    inputs = [math.ceil(v / unit) for v in profile.input_bytes]
    act = np.array([math.ceil(v / unit) for v in profile.layer_bytes])
    act_prefix = np.concatenate([[0], np.cumsum(act)])
    f = np.asarray(profile.forward_seconds, dtype=np.float64)
    f_prefix = np.concatenate([[0.0], np.cumsum(f)])
    budgets = np.arange(slots + 1)
    cost, choice = {}, {}  # (a, b) -> time for every budget 0..slots; the split point (0: tape)
    for length in range(1, L + 1):
        for a in range(0, L - length + 1):
            b = a + length
            best = np.full(slots + 1, np.inf)
            pick = np.zeros(slots + 1, dtype=np.int32)
            if length <= longest:
                fits = budgets >= act_prefix[b] - act_prefix[a]
                best[fits] = f_prefix[b] - f_prefix[a]
            for m in range(a + 1, b):
                right = np.full(slots + 1, np.inf)
                if inputs[a] <= slots:
                    right[inputs[a]:] = cost[m, b][:slots + 1 - inputs[a]]
                total = (f_prefix[m] - f_prefix[a]) + right + cost[a, m]
                better = total < best
                best[better], pick[better] = total[better], m
            cost[a, b], choice[a, b] = best, pick

    def build(a, b, left):
        m = int(choice[a, b][left])
        if m == 0:
            return Tape(a, b)
        return Split(a, m, b, build(a, m, left), build(m, b, left - inputs[a]))

    if not np.isfinite(cost[0, L][slots]):  # only when sizes were rounded up to fit the resolution
        return Schedule(least_tree, profile)
    if _forward_time(least_tree, f) < cost[0, L][slots]:  # rounding cost more than the least peak's schedule
        return Schedule(least_tree, profile)
    return Schedule(build(0, L, slots), profile)


# ---------------------------------------------------------------- Revolve: the homogeneous chain
def _beta(s: int, r: int) -> int:
    return math.comb(s + r, s) if r >= 0 and s >= 0 else 0


def revolve_forward_steps(steps: int, snapshots: int) -> int:
    """Griewank's t(L, s): the least forward steps (beside the L recorded ones) to reverse L steps with s states kept.

    r is the least integer with L ≤ β(s, r) = C(s + r, s); then t = r·L − β(s + 1, r − 1).
    """
    if steps < 1 or snapshots < 1:
        raise ValueError(f"revolve_forward_steps: steps and snapshots must be at least 1, got {steps}, {snapshots}")
    r = 0
    while _beta(snapshots, r) < steps:
        r += 1
    return r * steps - _beta(snapshots + 1, r - 1)


def binomial_schedule(num_layers: int, snapshots: int, profile: SegmentPlan | None = None) -> Schedule:
    """Revolve's schedule for a chain of equal layers: at most ``snapshots`` inputs kept, one layer recorded.

    Each split places its checkpoint where Griewank's closed form says the
    rest costs least: m − a + t(b − m, s − 1) + t(m − a, s) = t(b − a, s).
    Its peak is (s kept inputs) + one layer's activations; its forward calls
    are L + t(L, s). ``profile`` (same number of layers) gives the sizes and
    times the schedule's equations use; without one every layer counts 1.
    """
    if not isinstance(num_layers, (int, np.integer)) or not isinstance(snapshots, (int, np.integer)) \
            or num_layers < 1 or snapshots < 1:
        raise ValueError(f"binomial_schedule: num_layers and snapshots must be positive integers, got "
                         f"{num_layers!r} and {snapshots!r}")
    if profile is None:
        profile = SegmentPlan([0], [1] * num_layers, [1] * num_layers, [1.0] * num_layers, [0.0] * num_layers)
    elif profile.num_layers != num_layers:
        raise ValueError(f"binomial_schedule: the profile is for {profile.num_layers} layers, not {num_layers}")

    def t(steps, s):
        return 0 if steps <= 1 else (math.inf if s < 1 else revolve_forward_steps(steps, s))

    def build(a, b, s):
        if b - a == 1:
            return Tape(a, b)
        target = t(b - a, s)
        for m in range(b - 1, a, -1):  # the farthest optimal checkpoint: the shortest stack of kept inputs
            if (m - a) + t(b - m, s - 1) + t(m - a, s) == target:
                return Split(a, m, b, build(a, m, s), build(m, b, s - 1))
        raise AssertionError("no split attains Griewank's bound")  # pragma: no cover - the recursion guarantees one

    return Schedule(build(0, num_layers, snapshots), profile)


# ---------------------------------------------------------------- measuring
class count_forward_calls:
    """Inside: ``calls[l]`` counts the forward calls of layer l of the model (a forward hook on each)."""

    def __init__(self, model):
        self.layers = layer_list(model, "count_forward_calls")
        self.calls = [0] * len(self.layers)

    def __enter__(self):
        def hook_for(index):
            def hook(module, inputs, output):
                self.calls[index] += 1
            return hook
        self.handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(self.layers)]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False
