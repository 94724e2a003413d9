"""Checkmate: the rematerialization schedule of least cost for any graph, by an integer program.

Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization" (MLSys 2020). The chain schedules of
:mod:`minidl.checkpoint.schedule` cannot cut inside a skip connection; the
textbook names Checkmate's mixed-integer program with a hardware cost model as
the way to plan checkpoints on any graph. Here the graph is a
:class:`~minidl.checkpoint.graph.LayerGraph` of layers, and the program's
nodes are its n layers' forward computations F_0 … F_{n−1} followed by their
backward computations B_{n−1} … B_0 (N = 2n nodes, in that topological order):

- F_i reads the outputs of layer i's inputs and keeps layer i's output and its
  graph (what its backward reads, its inputs excepted): M(F_i) bytes;
- B_i reads F_i, the outputs of layer i's inputs, and the gradients that the
  backward nodes of layer i's consumers computed for it (the caller's gradient
  for the last layer); it keeps the gradients of layer i's inputs, M(B_i), and
  adds its parameters' gradients to what the step holds to its end (P_i).

**The program** (stages t = 0 … N−1; stage t computes node t for the first time,
"frontier-advancing", and may recompute any earlier node first):

- R[t, i] = 1: node i is (re)computed in stage t;  S[t, i] = 1: node i's result
  is held from stage t−1 into stage t;  FREE[t, i, k] = 1: after node k in stage
  t, node i's result (i a dependency of k, or k itself) is freed;
- R[t, t] = 1; R[t, i] = S[t, i] = 0 for i > t; R[t, i] + S[t, i] ≤ 1;
- dependencies: R[t, k] ≤ R[t, i] + S[t, i] for every edge i → k;
- S[t+1, i] ≤ R[t, i] + S[t, i] (only what exists can be kept);
- FREE[t, i, k] = 1 exactly when R[t, k] = 1, S[t+1, i] = 0 and no later user of
  i is computed in stage t; with h the count of those hazards,
  1 − FREE ≤ h and κ(1 − FREE) ≥ h (κ: the most hazards there can be);
- memory after computing node k in stage t:

      U[t, 0] = c_t + Σ_i M_i S[t, i] + M_0 R[t, 0],
      U[t, k] = U[t, k−1] − Σ_{i ∈ deps(k−1) ∪ {k−1}} M_i FREE[t, i, k−1] + M_k R[t, k],

  with c_t the parameter gradients made before stage t, and the budget held
  while node k runs, its temporaries w_k included: U[t, k] + w_k R[t, k] ≤ budget;
- minimize Σ_t Σ_i C_i R[t, i], C_i the node's cost.

Two rules of this engine are added: a backward node runs once (it accumulates
parameter gradients), and the last layer's output, which the caller holds, is
kept to the end. The cost C_i is a hardware cost model: by default the
measured seconds, or FLOPs from ``cost(layer_index, layer, inputs)`` (the
roofline's per-op counts, :mod:`minidl.roofline.opcosts`). The program is
solved by ``scipy.optimize.milp`` (HiGHS); :func:`exhaustive_schedule`
enumerates every R of a small graph (each S then follows: keep exactly what a
later stage reads) and is the reference the tests hold the solver to.

**Running it**: :meth:`CheckmateSchedule.run` executes the stages. Each layer
runs on its inputs' values, recording its own graph under
:class:`~minidl.autograd.saved_tensors_hooks` that hand its inputs back by
reference to the values the schedule holds (so freeing a value frees it);
each backward node backpropagates one layer's graph. The step's values and
gradients are the ones the program counts, so the predicted peak
(:meth:`CheckmateSchedule.peak_bytes`) is what ``memory.track`` measures, to
the Python objects around the arrays (a few hundred bytes a node).
"""
from __future__ import annotations

import itertools
import math
import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from minidl import autograd, backend
from minidl.autograd import Function, enable_grad, no_grad, saved_tensors_hooks
from minidl.checkpoint.graph import LayerGraph
from minidl.checkpoint.replay import BufferGuard, RngState, first_draws_recorded
from minidl.tensor import Tensor

__all__ = ["GraphProfile", "CheckmateSchedule", "profile_graph", "checkmate_schedule", "exhaustive_schedule",
           "plain_schedule"]


def _scipy_optimize():
    try:
        import scipy.optimize as optimize
        import scipy.sparse as sparse
    except ImportError:  # pragma: no cover - SciPy is in the extras the tests install
        raise ImportError("checkmate_schedule needs SciPy's scipy.optimize.milp: pip install 'minidl[plan]' "
                          "(or pip install scipy)") from None
    return optimize, sparse


# ---------------------------------------------------------------- the problem
@dataclass
class GraphProfile:
    """The program's data for a LayerGraph of n layers: nodes F_0 … F_{n−1}, B_{n−1} … B_0 (module docstring).

    Per node (N = 2n): ``deps`` (node indices), ``sizes`` M (bytes kept), ``workspace`` w (bytes
    of temporaries while it runs), ``permanent`` P (gradient bytes it adds to the step's end),
    ``costs`` C. ``seed_bytes``: the caller's gradient of the output.
    """

    num_layers: int
    deps: list
    sizes: list
    workspace: list
    permanent: list
    costs: list
    names: list

    @property
    def num_nodes(self) -> int:
        return 2 * self.num_layers

    def users(self) -> list:
        found = [[] for _ in range(self.num_nodes)]
        for k, deps in enumerate(self.deps):
            for i in deps:
                found[i].append(k)
        return found

    def pinned(self) -> int:
        """The node kept from its stage to the end: the last layer's forward (the caller holds its output)."""
        return self.num_layers - 1

    def baseline_cost(self) -> float:
        return float(sum(self.costs))


def _backward_node(num_layers, i):
    return 2 * num_layers - 1 - i


def _problem_structure(graph: LayerGraph, reads):
    """deps of every node: F_i reads its inputs' outputs; B_i reads F_i, the inputs' outputs its graph
    kept (``reads[i]``: a Linear keeps its input, a tanh only its output, an add nothing), and the
    gradients its consumers' backward nodes computed for it."""
    n = len(graph)
    consumers = graph.consumers()
    deps = []
    for i in range(n):
        deps.append(sorted({j for j in graph.inputs[i] if j >= 0}))
    for node in range(n, 2 * n):
        i = 2 * n - 1 - node
        grads_in = {_backward_node(n, k) for k in consumers[i]}
        deps.append(sorted({j for j in reads[i] if j >= 0} | {i} | grads_in))
    return deps


# ---------------------------------------------------------------- executing nodes
class _Feed(Function):
    """A layer's input handed in by reference: y = the value held for it; the gradient is caught, not passed on.

    Its own input is a one-element anchor (so that the op is recorded); the value is given to forward
    through ``self.value`` and not kept, so the layer's graph does not hold it either.
    """

    saved_inputs = ()

    def __init__(self, value):
        self.value, self.grad = value, None

    def forward(self, anchor):
        value, self.value = self.value, None
        return value

    def backward(self, gy):
        self.grad = gy.array
        return Tensor(gy.xp.zeros((), gy.dtype))


def _root(array):
    while getattr(array, "base", None) is not None:
        array = array.base
    return array


class _Step:
    """The values one step holds: forward results (a layer's output and graph), backward results (gradients)."""

    def __init__(self, graph, x, device):
        self.graph, self.x, self.device = graph, x, device
        self.held = {}  # node -> result
        self.rng = {}  # layer -> the random state before its first forward (replayed by recomputations)
        self.param_grads = {}  # id(parameter) -> (parameter, gradient array)
        self.input_grad = None
        self.seed = None
        self.forward_calls = [0] * len(graph)

    def value(self, j):
        return self.x.array if j < 0 else self.held[j].output.array

    def forward(self, i):
        graph = self.graph
        layer, sources = graph.layers[i], graph.inputs[i]
        feeds, by_buffer = [], {}
        for j in sources:
            feed = _Feed(self.value(j))
            dtype = feed.value.dtype if backend.is_floating(feed.value.dtype) else np.float32
            # the model's input gets a gradient only when it asks for one
            anchor = Tensor(backend.xp_of(feed.value).zeros((), dtype),
                            requires_grad=j >= 0 or self.x.requires_grad)
            feeds.append((j, feed, anchor))
            by_buffer[id(_root(feed.value))] = j

        reads = set()

        def pack(t):
            j = by_buffer.get(id(_root(t.array)))
            if j is None:
                return t.array
            reads.add(j)
            return ("input", j, sources)

        def unpack(packed):
            if isinstance(packed, tuple) and len(packed) == 3 and packed[0] == "input":
                return self.value(packed[1])
            return packed
        first = i not in self.rng
        replay = None if first else self.rng[i]
        now = replay.now() if replay else None
        state = RngState()
        try:
            if now is not None:
                replay.restore()
            with enable_grad(), saved_tensors_hooks(pack, unpack), \
                    first_draws_recorded(state) if first else BufferGuard():
                inputs = [feed(anchor) for _, feed, anchor in feeds]
                output = layer(*inputs)
        finally:
            if now is not None:
                now.restore()  # the random stream goes on as if nothing had been recomputed
        if first:
            self.rng[i] = state if state else None
        self.forward_calls[i] += 1
        self.held[i] = _Forward(output, feeds, reads)

    def backward(self, i):
        graph, n = self.graph, len(self.graph)
        node = _backward_node(n, i)
        forward = self.held[i]
        if i == n - 1:
            gy = self.seed
        else:
            gy = None
            for k in graph.consumers()[i]:
                g = self.held[_backward_node(n, k)].get(i)
                if g is not None:
                    gy = g if gy is None else gy + g
        params = [p for p in graph.layers[i].parameters() if p.requires_grad]
        targets = params + [anchor for _, _, anchor in forward.feeds]
        if forward.output.requires_grad and gy is not None:
            grads = autograd.grad([forward.output], targets, grad_outputs=[Tensor(gy)], retain_graph=True,
                                  allow_unused=True)
        else:
            grads = [None] * len(targets)
        for p, g in zip(params, grads):
            if g is None:
                continue
            entry = self.param_grads.get(id(p))
            self.param_grads[id(p)] = (p, g.array if entry is None else entry[1] + g.array)
        # A gradient handed on by reference (an add's) would share its buffer with the consumer's result it
        # came from, and keep it alive after the program frees that node: such a gradient is copied, so that
        # each node owns the bytes it is charged for. The caller's gradient is held to the end anyway.
        borrowed = set() if gy is None or gy is self.seed else {id(_root(gy))}
        result = {}
        for j, feed, _ in forward.feeds:
            g, feed.grad = feed.grad, None
            if g is None:
                continue
            if id(_root(g)) in borrowed:
                g = g.copy()
            if j < 0:
                self.input_grad = g if self.input_grad is None else self.input_grad + g
            else:
                result[j] = g if j not in result else result[j] + g
        self.held[node] = result


class _Forward:
    """A layer's output with its graph; the feeds of its inputs; the inputs its graph reads back (by index)."""

    __slots__ = ("output", "feeds", "reads")

    def __init__(self, output, feeds, reads):
        self.output, self.feeds, self.reads = output, feeds, reads


def _compute(step, node):
    n = len(step.graph)
    if node < n:
        step.forward(node)
    else:
        step.backward(2 * n - 1 - node)


# ---------------------------------------------------------------- profiling
def _result_arrays(step, node):
    """The arrays node's result holds: a layer's output and what its graph keeps (inputs and parameters
    aside), or the gradients a backward node computed."""
    n = len(step.graph)
    result = step.held[node]
    if node >= n:
        return list(result.values())
    arrays, stack, visited = [result.output.array], [result.output.creator], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for value in (fn.packed.values if fn.packed is not None else ()):
            if not isinstance(value.packed, tuple) and value.packed is not None:
                arrays.append(value.packed)
        stack.extend(x.creator for x in fn.inputs)
    return arrays


def _buffers(step):
    """The buffers alive in a step before a node runs: everything held, the gradients, the seed."""
    found = {id(_root(a)) for node in step.held for a in _result_arrays(step, node)}
    found |= {id(_root(g)) for _, g in step.param_grads.values()}
    for array in (step.input_grad, step.seed, step.x.array):
        if array is not None:
            found.add(id(_root(array)))
    return found


def _new_bytes(arrays, known):
    """Bytes of the distinct buffers among ``arrays`` not in ``known`` (a gradient handed on as it is, or a
    parameter a graph keeps, costs nothing new)."""
    total, seen = 0, set(known)
    for array in arrays:
        root = _root(array)
        if id(root) not in seen:
            seen.add(id(root))
            total += root.nbytes
    return total


def profile_graph(graph: LayerGraph, sample_input, cost=None, backward_cost=None) -> GraphProfile:
    """One plain step, node by node: each node's kept bytes, temporaries (tracemalloc), gradient bytes, cost.

    ``cost(i, layer, inputs)``: the forward cost of layer i (e.g. FLOPs from
    :mod:`minidl.roofline.opcosts`); ``backward_cost`` likewise (default twice
    the forward's, the rule of thumb for matrix products). Without ``cost``
    both are the measured seconds. Parameter gradients, BatchNorm statistics
    and the random state are left as they were.
    """
    if not isinstance(graph, LayerGraph):
        raise TypeError(f"profile_graph: expected a LayerGraph, got {type(graph).__name__}; build one with "
                        "LayerGraph.add or LayerGraph.from_sequential")
    if not isinstance(sample_input, Tensor):
        raise TypeError(f"profile_graph: sample_input must be a Tensor, got {type(sample_input).__name__}")
    n = len(graph)
    step = _Step(graph, sample_input, sample_input.device)
    param_buffers = {id(_root(p.array)) for p in graph.parameters()}
    sizes, workspace, permanent, seconds = [0] * (2 * n), [0] * (2 * n), [0] * (2 * n), [0.0] * (2 * n)
    costs, reads = [0.0] * (2 * n), []
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    rng = RngState.of([sample_input.device])
    try:
        with BufferGuard():
            for node in range(2 * n):
                if node == n:
                    out = step.held[n - 1].output
                    step.seed = out.xp.ones(out.shape, out.dtype)
                grads_before = sum(g.nbytes for _, g in step.param_grads.values())
                input_grad_before = 0 if step.input_grad is None else step.input_grad.nbytes
                known = _buffers(step) | param_buffers
                tracemalloc.reset_peak()
                before = tracemalloc.get_traced_memory()[0]
                start = time.perf_counter()
                _compute(step, node)
                seconds[node] = time.perf_counter() - start
                after, peak = tracemalloc.get_traced_memory()
                workspace[node] = max(0, peak - after)
                if node < n:
                    reads.append(set(step.held[node].reads))
                else:
                    grads_now = sum(g.nbytes for _, g in step.param_grads.values())
                    input_grad_now = 0 if step.input_grad is None else step.input_grad.nbytes
                    permanent[node] = grads_now - grads_before + input_grad_now - input_grad_before
                # What the result holds: its new arrays, and the Python objects around them (the layer's
                # graph nodes, the tensors), which tracemalloc sees as well (a few hundred bytes each).
                sizes[node] = max(_new_bytes(_result_arrays(step, node), known), after - before - permanent[node])
                if cost is not None and node < n:
                    layer, sources = graph.layers[node], graph.inputs[node]
                    inputs = [Tensor(step.value(j)) for j in sources]
                    costs[node] = float(cost(node, layer, inputs))
    finally:
        rng.restore()
        if not was_tracing:
            tracemalloc.stop()
    for node in range(n, 2 * n):
        i = 2 * n - 1 - node
        if cost is None:
            costs[node] = seconds[node]
        elif backward_cost is not None:
            layer, sources = graph.layers[i], graph.inputs[i]
            costs[node] = float(backward_cost(i, layer, [Tensor(step.value(j)) for j in sources]))
        else:
            costs[node] = 2.0 * costs[i]
    if cost is None:
        costs[:n] = seconds[:n]
    return GraphProfile(n, _problem_structure(graph, reads), sizes, workspace, permanent, costs, list(graph.names))


# ---------------------------------------------------------------- schedules
@dataclass
class CheckmateSchedule:
    """R and S (stage × node 0/1 arrays) of a schedule for a profiled graph; its modeled memory and cost."""

    R: np.ndarray
    S: np.ndarray
    profile: GraphProfile
    solver: str = ""

    @classmethod
    def from_recomputations(cls, R, profile: GraphProfile) -> "CheckmateSchedule":
        """The schedule computing what R says, holding the least (each result kept exactly until a later
        stage that reads it without computing it again)."""
        R = np.asarray(R, dtype=bool)
        N = profile.num_nodes
        if R.shape != (N, N) or not R[np.arange(N), np.arange(N)].all() or np.triu(R, 1).any():
            raise ValueError(f"CheckmateSchedule.from_recomputations: R must be a lower-triangular {N}×{N} array "
                             "of 0/1 with ones on the diagonal (stage t computes node t)")
        return cls(R, _least_keep(profile, R), profile, solver="given")

    def events(self):
        """The stages as the executor runs them: per stage, a list of (node computed, nodes freed after it)
        and the nodes dropped at the stage's end (held into it but kept no further)."""
        p, R, S = self.profile, self.R, self.S
        N, users, deps = p.num_nodes, p.users(), p.deps
        pinned = p.pinned()
        stages = []
        for t in range(N):
            keep_next = S[t + 1] if t + 1 < N else np.zeros(N, dtype=bool)
            if t + 1 >= N and pinned <= t:
                keep_next = keep_next.copy()
                keep_next[pinned] = True
            resident = set(np.flatnonzero(S[t]).tolist())
            steps = []
            for k in range(t + 1):
                if not R[t, k]:
                    continue
                resident.add(k)
                freed = []
                for i in [*deps[k], k]:
                    if i in resident and not keep_next[i] and not any(R[t, j] for j in users[i] if k < j <= t):
                        freed.append(i)
                        resident.discard(i)
                steps.append((k, freed))
            dropped = sorted(i for i in resident if not keep_next[i])
            stages.append((steps, dropped))
        return stages

    def memory_timeline(self):
        """(peak bytes, [(stage, node, bytes while it runs)]) by the program's memory equations."""
        p = self.profile
        permanent, timeline, peak = 0, [], 0
        for t, (steps, dropped) in enumerate(self.events()):
            held = permanent + sum(p.sizes[i] for i in np.flatnonzero(self.S[t]))
            for k, freed in steps:
                held += p.sizes[k] + p.permanent[k]
                during = held + p.workspace[k]
                timeline.append((t, k, during))
                peak = max(peak, during)
                held -= sum(p.sizes[i] for i in freed)
            permanent += sum(p.permanent[k] for k, _ in steps)
        return peak, timeline

    def peak_bytes(self) -> int:
        """The modeled peak of the step above its start: values, graphs, gradients and one node's temporaries."""
        return int(self.memory_timeline()[0])

    def cost(self) -> float:
        """Σ C_i R[t, i]: the step's cost under the profile's cost model."""
        return float((self.R * np.asarray(self.profile.costs)[None, :]).sum())

    def recompute_cost(self) -> float:
        """The cost beyond the plain step's (every node computed once)."""
        return self.cost() - self.profile.baseline_cost()

    def forward_calls(self) -> list:
        """How many times each layer's forward runs in one step."""
        return self.R[:, :self.profile.num_layers].sum(axis=0).astype(int).tolist()

    def run(self, graph: LayerGraph, input: Tensor) -> Tensor:
        """The graph's output computed by this schedule; its ``.backward()`` runs the backward stages."""
        if not isinstance(graph, LayerGraph) or len(graph) != self.profile.num_layers:
            raise ValueError(f"CheckmateSchedule.run: the schedule is for a LayerGraph of {self.profile.num_layers} "
                             f"layers, got a {type(graph).__name__}"
                             + (f" of {len(graph)}" if isinstance(graph, LayerGraph) else ""))
        params = [p for p in graph.parameters() if p.requires_grad]
        step = _Step(graph, input.detach(), input.device)
        stages = self.events()
        n = self.profile.num_layers
        with no_grad():
            for steps, dropped in stages[:n]:
                _run_stage(step, steps, dropped)
        output = step.held[n - 1].output.array
        if not autograd.is_grad_enabled() or not (input.requires_grad or params):
            step.held.clear()
            return Tensor(output)
        node = _Schedule(step, stages[n:], params)
        return node(input, *params)

    def describe(self) -> str:
        """One line a stage: the nodes it computes (F3: layer 3's forward, B3: its backward)."""
        n, lines = self.profile.num_layers, []
        for t, (steps, _) in enumerate(self.events()):
            names = [f"F{k}" if k < n else f"B{2 * n - 1 - k}" for k, _ in steps]
            lines.append(f"stage {t}: " + " ".join(names))
        return "\n".join(lines)

    def __repr__(self):
        return (f"CheckmateSchedule({self.profile.num_layers} layers, modeled peak {self.peak_bytes()} bytes, "
                f"recompute cost {self.recompute_cost():.4g}, {self.solver})")


def _run_stage(step, steps, dropped):
    for k, freed in steps:
        _compute(step, k)
        for i in freed:
            del step.held[i]
    for i in dropped:
        step.held.pop(i, None)


class _Schedule(Function):
    """The backward stages of a schedule, recorded as one node: its backward runs them."""

    saved_inputs = ()

    def __init__(self, step, stages, params):
        self.step, self.stages, self.params = step, stages, params

    def forward(self, x, *params):
        n = len(self.step.graph)
        return self.step.held[n - 1].output.array

    def backward(self, gy):
        step, self.step = self.step, None
        if step is None:
            raise RuntimeError("CheckmateSchedule: backward through the schedule twice; run it again "
                               "(its values are freed as its backward goes)")
        step.seed = gy.array
        with no_grad():
            for steps, dropped in self.stages:
                _run_stage(step, steps, dropped)
        grads = {id(p): Tensor(g) for p, g in step.param_grads.values()}
        gx = None if step.input_grad is None else Tensor(step.input_grad)
        step.held.clear()
        return (gx, *[grads.get(id(p)) for p in self.params])


# ---------------------------------------------------------------- solving
def _fixed(profile):
    """(may_compute, must_keep): may_compute[t, i] False where R is fixed at 0; the pinned node's S fixed at 1."""
    N, n = profile.num_nodes, profile.num_layers
    may = np.tril(np.ones((N, N), dtype=bool))
    for t in range(N):
        for k in range(n, N):
            if k != t:
                may[t, k] = False  # a backward node runs once, in its own stage
    keep = np.zeros((N, N), dtype=bool)
    pinned = profile.pinned()
    keep[pinned + 1:, pinned] = True
    may[pinned + 1:, pinned] = False
    return may, keep


def checkmate_schedule(profile: GraphProfile, budget: float, time_limit: float = 60.0) -> CheckmateSchedule:
    """The schedule of least cost whose modeled peak stays within ``budget`` bytes: the program of the
    module docstring, solved by ``scipy.optimize.milp``. A budget no schedule meets is a ValueError."""
    optimize, sparse = _scipy_optimize()
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.integer, np.floating)) or not budget > 0:
        raise ValueError(f"checkmate_schedule: budget is a number of bytes and must be positive, got {budget!r}")
    N = profile.num_nodes
    deps, users, M = profile.deps, profile.users(), np.asarray(profile.sizes, dtype=np.float64)
    may, keep = _fixed(profile)
    pinned = profile.pinned()
    index = {}

    def var(name, *key):
        return index.setdefault((name, *key), len(index))
    for t in range(N):
        for i in range(t + 1):
            var("R", t, i)
            if i < t:
                var("S", t, i)
    for t in range(N):
        for k in range(t + 1):
            for i in [*deps[k], k]:
                var("F", t, i, k)
            var("U", t, k)
    nvar = len(index)
    lower, upper = np.zeros(nvar), np.ones(nvar)
    integrality = np.ones(nvar)
    scale = float(max(M.max(), 1.0))  # memory in units of the largest result: the program stays well scaled
    rows, cols, vals, lo, hi = [], [], [], [], []

    def constraint(terms, low, high):
        r = len(lo)
        for c, v in terms:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    def S(t, i):
        return None if i >= t or t >= N else index[("S", t, i)]

    perm = np.concatenate([[0.0], np.cumsum(profile.permanent)])  # made by nodes < t (each in its own stage)
    for t in range(N):
        constraint([(index[("R", t, t)], 1)], 1, 1)
        for i in range(t):
            r, s = index[("R", t, i)], index[("S", t, i)]
            if not may[t, i]:
                upper[r] = 0
            if keep[t, i]:
                lower[s] = 1
            constraint([(r, 1), (s, 1)], -np.inf, 1)
            if t + 1 < N:
                constraint([(index[("S", t + 1, i)], 1), (r, -1), (s, -1)], -np.inf, 0)
        if t + 1 < N:
            constraint([(index[("S", t + 1, t)], 1), (index[("R", t, t)], -1)], -np.inf, 0)
        for k in range(t + 1):
            for i in deps[k]:
                terms = [(index[("R", t, k)], 1), (index[("R", t, i)], -1)]
                if S(t, i) is not None:
                    terms.append((S(t, i), -1))
                constraint(terms, -np.inf, 0)
        for k in range(t + 1):
            rk = index[("R", t, k)]
            for i in [*deps[k], k]:
                f = index[("F", t, i, k)]
                later = [index[("R", t, j)] for j in users[i] if k < j <= t]
                kept_next = t + 1 < N and i <= t and S(t + 1, i) is not None
                hazards = [(rk, -1)] + ([(S(t + 1, i), 1)] if kept_next else []) + [(j, 1) for j in later]
                constant = 1.0  # the (1 − R[t, k]) term's 1
                if t + 1 >= N and i == pinned:
                    constant += 1.0  # the pinned node is never freed
                kappa = 3 + len(later)
                # 1 − FREE ≤ h:   −FREE − h_var ≤ constant − 1
                constraint([(f, -1)] + [(c, -v) for c, v in hazards], -np.inf, constant - 1)
                # κ(1 − FREE) ≥ h:   −κ FREE − h_var ≥ constant − κ
                constraint([(f, -kappa)] + [(c, -v) for c, v in hazards], constant - kappa, np.inf)
        # memory: U[t, k] (scaled), and the budget while k runs
        for k in range(t + 1):
            u = index[("U", t, k)]
            integrality[u], lower[u], upper[u] = 0, 0, np.inf
            own = (M[k] + profile.permanent[k]) / scale
            terms = [(u, 1), (index[("R", t, k)], -own)]
            if k == 0:
                terms += [(S(t, i), -M[i] / scale) for i in range(t) if S(t, i) is not None]
                constraint(terms, perm[t] / scale, perm[t] / scale)
            else:
                terms += [(index[("U", t, k - 1)], -1)]
                terms += [(index[("F", t, i, k - 1)], M[i] / scale) for i in [*deps[k - 1], k - 1]]
                constraint(terms, 0, 0)
            # whole bytes: the solver's feasibility tolerance (1e-7 of a unit) stays below one byte
            constraint([(u, 1), (index[("R", t, k)], profile.workspace[k] / scale)], -np.inf,
                       math.floor(budget) / scale)
    costs = np.zeros(nvar)
    C = np.asarray(profile.costs, dtype=np.float64)
    c_scale = float(max(C.max(), 1e-300))
    for (name, *key), column in index.items():
        if name == "R":
            costs[column] = C[key[1]] / c_scale
    A = sparse.csr_array((vals, (rows, cols)), shape=(len(lo), nvar))
    result = optimize.milp(costs, constraints=optimize.LinearConstraint(A, lo, hi), integrality=integrality,
                           bounds=optimize.Bounds(lower, upper),
                           options={"time_limit": time_limit, "mip_rel_gap": 1e-9})
    if result.x is None:
        raise ValueError(f"checkmate_schedule: no schedule fits a budget of {int(budget)} bytes ({result.message}); "
                         f"the plain step needs {_plain(profile).peak_bytes()} bytes: raise the budget")
    x = np.round(result.x).astype(int)
    R, Smat = np.zeros((N, N), dtype=bool), np.zeros((N, N), dtype=bool)
    for (name, *key), column in index.items():
        if name == "R":
            R[key[0], key[1]] = x[column]
        elif name == "S":
            Smat[key[0], key[1]] = x[column]
    status = "optimal" if result.status == 0 else f"time limit ({result.message})"
    return CheckmateSchedule(R, Smat, profile, solver=f"milp, {status}")


def _least_keep(profile, R):
    """The smallest S for a given R: hold node i into stage t exactly when a later stage reads it before
    computing it again (and the pinned node from its stage on)."""
    N = profile.num_nodes
    users = profile.users()
    _, keep = _fixed(profile)
    S = np.zeros((N, N), dtype=bool)
    need = np.zeros(N, dtype=bool)  # need[i]: node i must be held at the start of the stage after t
    for t in range(N - 1, -1, -1):
        for i in range(t):
            used = any(R[t, k] for k in users[i] if k <= t)
            S[t, i] = keep[t, i] or (not R[t, i] and (used or need[i]))
        need = S[t].copy()
    return S


def _plain(profile):
    N = profile.num_nodes
    R = np.zeros((N, N), dtype=bool)
    R[np.arange(N), np.arange(N)] = True
    return CheckmateSchedule(R, _least_keep(profile, R), profile, solver="plain")


def exhaustive_schedule(profile: GraphProfile, budget: float, limit: int = 1 << 16) -> CheckmateSchedule:
    """The least-cost schedule within ``budget`` by trying every R (the least S following from each):
    the independent reference for :func:`checkmate_schedule` on graphs of a few layers. Ties in cost are
    broken by the lower peak. More than ``limit`` R matrices is a ValueError."""
    N = profile.num_nodes
    may, _ = _fixed(profile)
    free = [(t, i) for t in range(N) for i in range(t) if may[t, i]]
    if 2 ** len(free) > limit:
        raise ValueError(f"exhaustive_schedule: {2 ** len(free)} choices of R for {profile.num_layers} layers exceed "
                         f"the limit of {limit}; use checkmate_schedule for this graph")
    best, best_key = None, None
    base = np.zeros((N, N), dtype=bool)
    base[np.arange(N), np.arange(N)] = True
    for bits in itertools.product((False, True), repeat=len(free)):
        R = base.copy()
        for (t, i), b in zip(free, bits):
            R[t, i] = b
        schedule = CheckmateSchedule(R, _least_keep(profile, R), profile, solver="exhaustive")
        peak = schedule.peak_bytes()
        if peak > budget:
            continue
        key = (schedule.cost(), peak)
        if best_key is None or key < best_key:
            best, best_key = schedule, key
    if best is None:
        raise ValueError(f"exhaustive_schedule: no schedule fits a budget of {int(budget)} bytes")
    return best


def plain_schedule(profile: GraphProfile) -> CheckmateSchedule:
    """Every node computed once, each result kept until its last use: the plain step in the program's terms."""
    return _plain(profile)
