"""Pipeline parallelism: a Sequential cut into stages, one per rank, fed micro-batches.

Rank s holds layers ``boundaries[s] .. boundaries[s+1]`` of the model: 1/p of
the weights when the cut is even. A global batch is split into m
micro-batches; the activations of each go forward from stage to stage (a send
and a receive between neighbours) and its gradients come back the same way.
The gradient of the mean loss is the mean of the micro-batches' mean-loss
gradients (equal micro-batches), accumulated in each stage's parameters, so
one optimizer step per global batch trains as one process does.

Two schedules (the order of each stage's forward F_k and backward B_k):

    GPipe (Huang et al. 2019):    F_0 F_1 … F_{m−1}  B_0 B_1 … B_{m−1}
    1F1B (PipeDream-Flush, Narayanan et al. 2021):
        w = min(p − 1 − s, m) forwards to fill the pipe, then one forward and
        one backward in turn, then the w backwards left

Both leave each stage idle while the pipe fills and drains. With a forward
taking t_f and a backward t_b on every stage and free communication, a step
takes (m + p − 1)(t_f + t_b) of which each stage computes m(t_f + t_b), so the
idle fraction, the *bubble*, is

    bubble = (p − 1) / (m + p − 1)

for both schedules: more micro-batches shrink it. What 1F1B changes is memory:
GPipe holds the activations of all m micro-batches at once on every stage,
1F1B at most p − s (a stage starts a backward as soon as it can, releasing a
micro-batch's activations), so m can grow without the memory growing.

Stages of unequal cost: the pipe moves at the pace of its slowest stage, so a step takes about
(m + p − 1)·max_s(t_s) and every other stage waits the difference. Cutting by layer count is right
for equal layers (a transformer's blocks); otherwise :func:`balanced_boundaries` cuts the layers'
costs (measured by :func:`layer_costs`, or any numbers: parameters, FLOPs) into p contiguous stages
whose largest cost is the least possible, and ``Pipeline(..., costs=...)`` uses it.

Messages: a stage posts a send together with the receive that follows it
from the same neighbour (``Communicator.sendrecv_``): in 1F1B's steady state
two neighbours each send and then receive from the other, which blocking
sends alone would deadlock once a message is too large to buffer.
"""
from __future__ import annotations

import contextlib
import time

import numpy as np

from minidl.autocast_mode import get_autocast_dtype, is_autocast_enabled
from minidl.autograd import backward as autograd_backward
from minidl.autograd import enable_grad, no_grad
from minidl.backend import using
from minidl.nn.containers import Sequential
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer, sum_numbers_
from minidl.parallel.whole_state import (
    gather_owned_state,
    gather_owned_weights,
    local_state_dict,
    owned_state,
    parameter_layers,
)
from minidl.tensor import Tensor

SCHEDULES = ("gpipe", "1f1b")
_DTYPES = ("float64", "float32", "float16", "int64", "int32")  # what a stage may hand the next


def schedule(kind: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The ops of ``stage``, in order: ("F", k) a forward, ("B", k) a backward of micro-batch k."""
    if kind not in SCHEDULES:
        raise ValueError(f"pipeline schedule: unknown {kind!r}; choose one of {', '.join(SCHEDULES)}")
    m = micro_batches
    if kind == "gpipe":
        return [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    warmup = min(stages - 1 - stage, m)
    ops = [("F", k) for k in range(warmup)]
    for k in range(m - warmup):
        ops += [("F", warmup + k), ("B", k)]
    return ops + [("B", k) for k in range(m - warmup, m)]


def simulate(kind: str, stages: int, micro_batches: int, forward_time=1.0,
             backward_time=2.0) -> list[list[tuple[str, int, float, float]]]:
    """The ideal timeline of a schedule: every forward takes ``forward_time``, every backward
    ``backward_time`` (a number, or one per stage for stages of unequal cost), messages are free.
    Per stage: (kind, micro-batch, start, end)."""
    forward, backward = (_per_stage(t, stages, name) for t, name in ((forward_time, "forward_time"),
                                                                       (backward_time, "backward_time")))
    ops = [schedule(kind, s, stages, micro_batches) for s in range(stages)]
    done, position, free = {}, [0] * stages, [0.0] * stages
    timelines = [[] for _ in range(stages)]
    remaining = sum(len(o) for o in ops)
    while remaining:
        progressed = False
        for s in range(stages):
            if position[s] == len(ops[s]):
                continue
            op, k = ops[s][position[s]]
            needs = (s - 1, "F", k) if op == "F" else (s + 1, "B", k)
            ready = 0.0
            if (op == "F" and s > 0) or (op == "B" and s < stages - 1):
                if needs not in done:
                    continue
                ready = done[needs]
            elif op == "B":  # the last stage: its own forward of k
                ready = done[(s, "F", k)]
            start = max(free[s], ready)
            end = start + (forward[s] if op == "F" else backward[s])
            done[(s, op, k)] = free[s] = end
            timelines[s].append((op, k, start, end))
            position[s] += 1
            remaining -= 1
            progressed = True
        if not progressed:  # pragma: no cover - every schedule above makes progress
            raise RuntimeError(f"pipeline schedule {kind!r} cannot proceed")
    return timelines


def _per_stage(time_, stages: int, name: str) -> list[float]:
    times = [float(time_)] * stages if np.ndim(time_) == 0 else [float(t) for t in time_]
    if len(times) != stages or any(not np.isfinite(t) or t < 0 for t in times):
        raise ValueError(f"simulate: {name} must be a number ≥ 0 or one per stage ({stages}), got {time_!r}")
    return times


def bubble_fraction(timelines) -> float:
    """Idle time over total time, all stages together: 1 − Σ busy / (stages · makespan)."""
    start = min(t[2] for line in timelines for t in line)
    end = max(t[3] for line in timelines for t in line)
    busy = sum(t[3] - t[2] for line in timelines for t in line)
    return 1.0 - busy / (len(timelines) * (end - start))


def draw_timeline(timelines, ax=None, title: str | None = None):
    """The schedule as every course draws it: one row per stage, forwards light, backwards dark, idle blank."""
    import matplotlib.pyplot as plt
    ax = ax if ax is not None else plt.subplots(figsize=(8, 0.5 + 0.45 * len(timelines)))[1]
    origin = min(t[2] for line in timelines for t in line)
    for s, line in enumerate(timelines):
        for op, k, start, end in line:
            ax.barh(s, end - start, left=start - origin, color="#9ecae1" if op == "F" else "#3182bd",
                    edgecolor="white")
            ax.text((start + end) / 2 - origin, s, str(k), ha="center", va="center", fontsize=7,
                    color="black" if op == "F" else "white")
    ax.set_yticks(range(len(timelines)), [f"stage {s}" for s in range(len(timelines))])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    ax.set_title(title or f"bubble {bubble_fraction(timelines):.0%}")
    return ax


def message_plan(kind: str, stage: int, stages: int, micro_batches: int) -> list[tuple[str, int, str, str]]:
    """The schedule of ``stage`` with its messages: (op, micro-batch, before, after).

    before: None, "recv" (the activation from the previous stage for F, the gradient from the next
    for B) or "sendrecv" (that receive together with the held result of the previous op, which goes
    to the same neighbour); after: None, "send" (the output to the next stage for F, the input's
    gradient to the previous for B) or "hold" (sent with the next op's receive, from the same peer).
    """
    ops = schedule(kind, stage, stages, micro_batches)
    plan, held_for = [], None
    for op, k in ops:
        source = stage - 1 if op == "F" else stage + 1
        before = None
        if (op == "F" and stage > 0) or (op == "B" and stage < stages - 1):
            before = "sendrecv" if held_for == source else "recv"
        if held_for is not None and before != "sendrecv":  # a held result whose peer this op does not hear from
            plan[-1] = plan[-1][:3] + ("send",)
        held_for = None
        dest = stage + 1 if op == "F" else stage - 1
        after = None
        if 0 <= dest < stages and not (op == "F" and stage == stages - 1):
            after, held_for = "hold", dest
        plan.append((op, k, before, after))
    if held_for is not None:
        plan[-1] = plan[-1][:3] + ("send",)
    return plan


def _as_tensor(x):
    return x if isinstance(x, Tensor) else Tensor(x)


def _array(x):
    """The array of a batch (a loader's Tensor, or an array): the pipeline slices and sends arrays."""
    return x.array if isinstance(x, Tensor) else x


def _as_groups(params) -> list:
    """An optimizer's ``params`` argument (tensors, or parameter-group dicts) as a list of group dicts."""
    groups = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    return [{**g, "params": [g["params"]] if isinstance(g["params"], Tensor) else list(g["params"])} for g in groups]


def _holders(model: Sequential, boundaries) -> dict:
    """``{id(tensor): (stage, ...)}``: the stages whose layers hold each parameter and buffer of ``model``
    (a tied one: several), in stage order."""
    holders = {}
    for stage in range(len(boundaries) - 1):
        for i in range(boundaries[stage], boundaries[stage + 1]):
            for t in list(model[i].parameters()) + list(model[i].buffers()):
                if stage not in holders.setdefault(id(t), ()):
                    holders[id(t)] += (stage,)
    return holders


def equal_boundaries(layers: int, stages: int) -> list[int]:
    """Stage s gets layers s·L/p .. (s+1)·L/p; the layer count must divide by the stages."""
    if stages < 1 or layers % stages:
        valid = ", ".join(str(d) for d in range(1, layers + 1) if layers % d == 0)
        raise ValueError(f"Pipeline: {layers} layers do not divide into {stages} stages of equal length; choose a "
                         f"number of stages among {valid}, or give boundaries=[0, ..., {layers}] yourself")
    return [s * layers // stages for s in range(stages + 1)]


def balanced_boundaries(costs, stages: int) -> list[int]:
    """The cut of layers of ``costs`` (one non-negative number per layer) into ``stages`` contiguous,
    non-empty stages whose largest total cost is the least possible: the pipe's pace.

    Dynamic programming over prefixes: with C(i, j) the cost of layers i..j−1,

        best(s, j) = min over i < j of max(best(s − 1, i), C(i, j)),    best(1, j) = C(0, j)

    the least largest stage of j layers in s stages; the cut is traced back from best(stages, L).
    O(stages · L²). Ties go to the later boundary, so of equally good cuts the earlier stages take more
    layers (with equal costs that divide evenly, the cut is :func:`equal_boundaries`').
    """
    costs = [float(c) for c in costs]
    layers = len(costs)
    if any(not np.isfinite(c) or c < 0 for c in costs):
        raise ValueError(f"balanced_boundaries: every layer's cost must be a finite number ≥ 0, got {costs}")
    if isinstance(stages, bool) or not isinstance(stages, (int, np.integer)) or not 1 <= stages <= layers:
        raise ValueError(f"balanced_boundaries: {layers} layers make 1 to {layers} non-empty stages, "
                         f"got stages={stages!r}")
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    best = np.full((stages + 1, layers + 1), np.inf)
    cut = np.zeros((stages + 1, layers + 1), dtype=int)
    best[1, 1:] = prefix[1:]
    for s in range(2, stages + 1):
        for j in range(s, layers + 1):
            for i in range(s - 1, j):
                value = max(best[s - 1, i], prefix[j] - prefix[i])
                if value <= best[s, j]:  # ties: the latest i
                    best[s, j], cut[s, j] = value, i
    bounds = [layers]
    for s in range(stages, 1, -1):
        bounds.append(int(cut[s, bounds[-1]]))
    return [0] + bounds[::-1]


def layer_costs(model: Sequential, x, repeats: int = 3, comm=None) -> list[float]:
    """Seconds of one forward and one backward through each layer of ``model`` on the input ``x`` (a
    micro-batch): each layer's input is the previous layer's output, the backward given ones as the
    output's gradient; the median of ``repeats`` runs per layer. Measured times differ from rank to
    rank, and every rank must cut the same way: with ``comm``, rank 0's numbers are broadcast (a
    collective), so each rank's ``balanced_boundaries`` agree."""
    if not isinstance(model, Sequential):
        raise TypeError(f"layer_costs: the model must be an nn.Sequential, got {type(model).__name__}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"layer_costs: repeats must be a positive int, got {repeats!r}")
    costs = []
    inp = _as_tensor(x)
    for layer in model:
        times = []
        for _ in range(repeats):
            leaf = Tensor(inp.array, requires_grad=inp.dtype.kind == "f")
            start = time.perf_counter()
            out = layer(leaf)
            if out.requires_grad:
                autograd_backward([out], [Tensor(out.xp.ones(out.shape, out.dtype))])
            _synchronize(out)
            times.append(time.perf_counter() - start)
        model.zero_grad()
        costs.append(float(np.median(times)))
        with no_grad():
            inp = layer(inp)
    if comm is not None:
        costs = list(comm.broadcast_(np.array(costs, dtype=np.float64), root=0))
    return [float(c) for c in costs]


def _synchronize(t) -> None:
    if t.xp is not np:  # a GPU's kernels run after the call returns: wait for them
        t.xp.cuda.get_current_stream().synchronize()


class Pipeline(ParallelModule):
    """``Pipeline(model, comm, micro_batches, schedule="1f1b", boundaries=None)``: this rank's stage of ``model``.

    ``model`` is an ``nn.Sequential`` built the same way on every rank; rank s
    keeps ``model[boundaries[s]:boundaries[s+1]]`` (``self.stage``) and
    ``parameters()`` are that stage's. ``boundaries`` defaults to an equal
    number of layers per stage; ``costs`` (one number per layer, the same on
    every rank) cuts by :func:`balanced_boundaries` instead. One training step
    on the global batch:

        opt.zero_grad()
        loss = pipe.train_step(x, y, F.cross_entropy)   # every rank passes the batch; returns the mean loss
        opt.step()                                      # each rank updates its own stage

    ``timeline`` holds the last step's (op, micro-batch, start, end) in
    seconds (``gather_timeline()`` collects every stage's, for
    :func:`draw_timeline` and :func:`bubble_fraction`); ``peak_in_flight``
    the most micro-batches whose activations this stage held at once.

    The Trainer drives it through the protocol of :mod:`minidl.parallel.protocol`, as it drives
    the data-parallel wrappers: ``train_step`` and ``eval_step`` (``runs_own_step``), with a
    :class:`PipelineOptimizer` for the stage's optimizer. A parameter that several stages hold
    (a tied embedding and output layer: the same Parameter in two layers) gets the sum of its
    stages' gradients (:meth:`sync_gradients`, over a group of those stages split from ``comm``
    at construction, a collective: every rank builds the pipeline). Checkpoints are whole:
    ``whole`` is the module whose parameters the layers hold (a GPT cut by
    :func:`minidl.models.gpt.pipeline_layers`; default ``model``), and
    :meth:`consolidated_state_dict` is its state dict, each tensor from the first stage that
    holds it (a split layer's gathered whole over its tensor group first);
    :meth:`load_state_dict` takes such a whole state (from any layout, or one process).
    """

    def __init__(self, model: Sequential, comm, micro_batches: int, schedule: str = "1f1b", boundaries=None,
                 costs=None, whole=None):
        super().__init__()
        if not isinstance(model, Sequential):
            raise TypeError(f"Pipeline: the model must be an nn.Sequential (its layers are cut into stages), "
                            f"got {type(model).__name__}")
        if schedule not in SCHEDULES:
            raise ValueError(f"Pipeline: unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
            raise ValueError(f"Pipeline: micro_batches must be a positive int, got {micro_batches!r}")
        layers = len(model)
        if costs is not None:
            if boundaries is not None:
                raise ValueError("Pipeline: give boundaries= (the cut) or costs= (cut by balanced_boundaries), "
                                 "not both")
            if len(costs) != layers:
                raise ValueError(f"Pipeline: costs= has {len(costs)} numbers for the {layers} layers of the "
                                 "model; give one per layer (layer_costs(model, x) measures them)")
            boundaries = balanced_boundaries(costs, comm.size)
        if boundaries is None:
            boundaries = equal_boundaries(layers, comm.size)
        boundaries = [int(b) for b in boundaries]
        if (len(boundaries) != comm.size + 1 or boundaries[0] != 0 or boundaries[-1] != layers
                or any(a >= b for a, b in zip(boundaries, boundaries[1:]))):
            raise ValueError(f"Pipeline: boundaries must be {comm.size + 1} increasing layer indices from 0 to "
                             f"{layers} (one stage per rank, none empty), got {boundaries}")
        self.comm, self.micro_batches, self.schedule_kind = comm, micro_batches, schedule
        self.boundaries = boundaries
        self.stage_index, self.stages = comm.rank, comm.size
        self.stage = Sequential(*[model[i] for i in range(boundaries[comm.rank], boundaries[comm.rank + 1])])
        self.timeline, self.peak_in_flight = [], 0
        self._shapes = {}
        # Held in a tuple, not as a submodule: the other stages' parameters are not this rank's to train
        # or move (Module registers a Module attribute as a submodule, and a tuple as a plain value).
        self._whole_model = (model if whole is None else whole,)
        self._holders = _holders(model, boundaries)
        self._shared = self._shared_groups()

    def _shared_groups(self) -> list:
        """(parameter, group of its holders) for each parameter of this stage that other stages hold too,
        in the whole model's order; the groups split from ``comm`` in that order on every rank."""
        groups, out = {}, []
        for p in self.whole.parameters():
            holders = self._holders.get(id(p), ())
            if len(holders) < 2:
                continue
            if holders not in groups:  # a collective: every rank reaches it in the same order
                mine = self.stage_index in holders
                groups[holders] = self.comm if len(holders) == self.stages else \
                    self.comm.split(0 if mine else 1, key=self.comm.rank)
            if self.stage_index in holders:
                out.append((p, groups[holders]))
        return out

    def saves(self, tensor) -> bool:
        """Whether this stage is the first that holds ``tensor`` (a parameter or buffer of the model): the
        one whose value the checkpoint keeps and whose gradient the global norm counts."""
        holders = self._holders.get(id(tensor), ())
        return bool(holders) and holders[0] == self.stage_index

    @property
    def whole(self):
        """The module whose parameters the layers hold (``whole=``, default the Sequential cut into stages)."""
        return self._whole_model[0]

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.stages - 1

    def forward(self, x):
        return self.stage(x)

    # ------------------------------------------------------------ one training step
    @property
    def runs_own_step(self) -> bool:
        return True

    def train_step(self, x, y, loss_fn, *, loss_scale: float = 1.0, autocast=None):
        """Forward and backward of the global batch (x, y) in micro-batches; gradients accumulate in the
        stage's parameters. Returns the mean loss of the batch (the same number on every rank): a float
        on the CPU, a 0-d array on a GPU (summed and all-reduced there: the step never waits for the host).

        The gradients are those of ``loss_scale`` times the batch's mean loss (each micro-batch's mean
        loss over m): ``loss_scale`` = 1/k for k accumulated batches, times a loss scaler's S under
        fp16. ``autocast()``, when given, is entered around each micro-batch's forward and loss
        (mixed precision), never around a backward."""
        with using(self._stage_device()):  # CuPy makes arrays and runs kernels on the current GPU: the stage's
            return self._train_step(x, y, loss_fn, loss_scale, autocast)

    def _train_step(self, x, y, loss_fn, loss_scale, autocast):
        x, y = _array(x), _array(y)
        m = self.micro_batches
        n = len(x)
        if n % m:
            valid = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
            raise ValueError(f"Pipeline.train_step: a batch of {n} does not split into {m} equal micro-batches; "
                             f"choose micro_batches among {valid}")
        size = n // m
        xs = [x[k * size:(k + 1) * size] for k in range(m)]
        ys = [y[k * size:(k + 1) * size] for k in range(m)]
        forward_mode = autocast if autocast is not None else contextlib.nullcontext
        with forward_mode():
            (in_shape, in_dtype), (out_shape, out_dtype) = self._message_shapes(xs[0])
        xp = self._xp()
        inputs, outputs, losses = {}, {}, []
        held = None  # the last result, when it goes out together with the next receive
        self.timeline, self.peak_in_flight = [], 0
        for op, k, before, after in message_plan(self.schedule_kind, self.stage_index, self.stages, m):
            source = self.stage_index - 1 if op == "F" else self.stage_index + 1
            received = None
            if before is not None:
                received = xp.empty(in_shape if op == "F" else out_shape, in_dtype if op == "F" else out_dtype)
                if before == "sendrecv":
                    self.comm.sendrecv_(held, source, received, source)
                    held = None
                else:
                    self.comm.recv_(received, source)
            start = time.perf_counter()
            if op == "F":
                inp = Tensor(received, requires_grad=True) if received is not None else _as_tensor(xs[k])
                with forward_mode():
                    out = self.stage(inp)
                    if self.is_last:
                        loss = loss_fn(out, ys[k])
                        losses.append(loss.array)  # summed on the device: no host wait per micro-batch
                        out = loss / m if loss_scale == 1.0 else loss * (loss_scale / m)
                inputs[k], outputs[k] = inp, out
                self.peak_in_flight = max(self.peak_in_flight, len(outputs))
                result = None if self.is_last else out.array
            else:
                out = outputs.pop(k)
                autograd_backward([out], None if received is None else [Tensor(received)])
                inp = inputs.pop(k)
                result = None if self.is_first else inp.grad.array
            self.timeline.append((op, k, start, time.perf_counter()))
            if after == "send":
                self.comm.send(xp.ascontiguousarray(result), self.stage_index + (1 if op == "F" else -1))
            elif after == "hold":
                held = xp.ascontiguousarray(result)
        # the mean loss, shared by an all-reduce on the device (the step waits for the host at no point)
        total = (xp.stack(losses).astype(np.float64).sum() / m).reshape(1) if self.is_last else xp.zeros(1)
        sum_numbers_(self.comm, total)
        return float(total[0]) if xp is np else total[0]

    def eval_step(self, x, y, loss_fn) -> float:
        """The mean of ``loss_fn(outputs, y)`` over the batch (x, y), forward only, the batch whole: each
        stage receives the activations of the one before (the first: ``x``), runs its layers and sends
        them on; the last stage's loss is shared by an all-reduce (the same number on every rank)."""
        with using(self._stage_device()):
            return self._eval_step(x, y, loss_fn)

    def _eval_step(self, x, y, loss_fn) -> float:
        x, y = _array(x), _array(y)
        with no_grad():
            (in_shape, in_dtype), _ = self._message_shapes(x)
            inp = x if self.is_first else self._xp().empty(in_shape, in_dtype)
            if not self.is_first:
                self.comm.recv_(inp, self.stage_index - 1)
            out = self.stage(_as_tensor(inp))
            if self.is_last:
                loss = float(loss_fn(out, y).array)
            else:
                self.comm.send(out.xp.ascontiguousarray(out.array), self.stage_index + 1)
                loss = 0.0
        total = np.array([loss])
        self.comm.host_allreduce_(total)
        return float(total[0])

    # ------------------------------------------------------------ between backward and step
    def sync_gradients(self) -> None:
        """Sum the gradient of every parameter several stages hold over those stages (their group: the
        first and the last stage for a tied embedding, Megatron-LM's embedding group), so each holder
        steps with the gradient one process's backward gives it through the tie. A collective of each
        such group; a stage that holds no shared parameter does nothing."""
        for p, group in self._shared:
            grad = p.grad.array.copy() if p.grad is not None else p.xp.zeros(p.shape, p.dtype)
            group.allreduce_(grad)
            p.grad = Tensor(grad)

    # ------------------------------------------------------------ whole state (minidl.parallel.whole_state)
    def consolidated_state_dict(self) -> dict:
        """The whole model's state dict (``whole``'s keys, in its order), each entry from the first stage that
        holds it, a split layer's gathered whole over its tensor group first (a collective of the pipeline
        and of each tensor group; every rank gets it)."""
        layers = parameter_layers(self.stage)
        local = self.whole.state_dict()
        mine = {}
        for key, t in self.whole._state_items():
            if key in local and key not in mine and self.saves(t):
                layer = layers.get(id(t))
                mine[key] = t.array if layer is None else layer[0].gather_whole(layer[1], t.array, f"parameter {key!r}")
        merged = gather_owned_weights(mine, self.comm)
        return {key: merged[key] if key in merged else value for key, value in local.items()}

    def check_state_dict(self, state, strict: bool = True):
        """What ``load_state_dict(state, strict)`` would raise or return; no change, no communication."""
        return self.whole.check_state_dict(local_state_dict(self.whole, state), strict)

    def load_state_dict(self, state, strict: bool = True):
        """Load a whole state (as :meth:`consolidated_state_dict` or one process gives it) into ``whole``:
        this stage takes its parameters (a split layer its slices), the others' stay unused. All or nothing."""
        return self.whole.load_state_dict(local_state_dict(self.whole, state), strict)

    @contextlib.contextmanager
    def whole_module(self):
        """``with pipe.whole_module() as model:`` the whole model (``whole``) holding every stage's current
        weights, gathered (a collective: every rank enters it), to read them or run it in this process
        (TensorBoard's histograms); a tensor-split model's forward stays a collective of its groups."""
        self.load_state_dict(self.consolidated_state_dict())
        yield self.whole

    def stage_groups(self, params) -> list:
        """The parameter groups of an optimizer of this stage: ``params`` (the whole model's parameters or
        parameter groups, as one process's optimizer takes them) with only this stage's parameters, in
        their order, each group's hyperparameters kept (a group may be left empty)."""
        groups = _as_groups(params)
        mine = {id(p) for p in self.stage.parameters()}
        return [{**g, "params": [p for p in g["params"] if id(p) in mine]} for g in groups]

    def gather_timeline(self) -> list:
        """Every stage's timeline of the last step, times from the earliest start (a collective).

        Times are ``time.perf_counter()``, one clock for every process of a machine; across
        machines the clocks differ, and so would the picture."""
        lines = self.comm.allgather_object(self.timeline)
        origin = min(t[2] for line in lines for t in line)
        return [[(op, k, start - origin, end - origin) for op, k, start, end in line] for line in lines]

    def _xp(self):
        params = list(self.stage.parameters())
        return params[0].xp if params else np

    def _device(self) -> str:
        return self._stage_device().partition(":")[0]

    def _stage_device(self) -> str:
        """The device of this stage's parameters ("cuda:1"): its buffers and messages are made there."""
        return next((p.device for p in self.stage.parameters()), "cpu")

    def _message_shapes(self, first_micro_batch):
        """(shape, dtype) of what this stage receives and what it sends, found once per input shape by
        passing a header (ndim, shape, dtype) down the pipe, each stage running its layers on zeros."""
        mode = str(get_autocast_dtype(self._device())) if is_autocast_enabled(self._device()) else None
        key = (tuple(np.shape(first_micro_batch)), str(getattr(first_micro_batch, "dtype", "")), mode)
        if key in self._shapes:
            return self._shapes[key]
        header = np.zeros(9, np.int64)
        if self.is_first:
            probe = first_micro_batch
            in_shape = (tuple(np.shape(first_micro_batch)), np.dtype(first_micro_batch.dtype))
        else:
            self.comm.recv_(header, self.stage_index - 1)
            in_shape = (tuple(int(d) for d in header[1:1 + header[0]]), np.dtype(_DTYPES[header[8]]))
            probe = self._xp().zeros(in_shape[0], in_shape[1])
        with no_grad():
            out = self.stage(Tensor(probe) if not isinstance(probe, Tensor) else probe)
        out_shape = (tuple(out.shape), np.dtype(out.dtype))
        if not self.is_last:
            if out.ndim > 7 or str(out.dtype) not in _DTYPES:
                raise ValueError(f"Pipeline: stage {self.stage_index} hands the next an array of shape "
                                 f"{tuple(out.shape)} and dtype {out.dtype}; up to 7 axes of {', '.join(_DTYPES)}")
            header[:] = 0
            header[0], header[1:1 + out.ndim], header[8] = out.ndim, out.shape, _DTYPES.index(str(out.dtype))
            self.comm.send(header, self.stage_index + 1)
        self._shapes[key] = (in_shape, out_shape)
        return in_shape, out_shape

    def extra_repr(self) -> str:
        return (f"stage {self.stage_index} of {self.stages}: layers {self.boundaries[self.stage_index]}.."
                f"{self.boundaries[self.stage_index + 1] - 1}, micro_batches={self.micro_batches}, "
                f"schedule={self.schedule_kind}")


class PipelineOptimizer(ParallelOptimizer):
    """``PipelineOptimizer(optimizer, pipe, params)``: the optimizer of one stage of ``pipe``, seen whole.

    ``params`` is what one process's optimizer takes over the whole model (its parameters, or its
    parameter groups); ``optimizer`` is built over ``pipe.stage_groups(params)`` (the same groups with
    this stage's parameters only), perhaps wrapped: a :class:`~minidl.parallel.DistributedOptimizer` for
    data-parallel copies of the pipeline, a
    :class:`~minidl.parallel.tensor_parallel.TensorParallelOptimizer` for stages split over tensor groups.
    It answers the protocol of :mod:`minidl.parallel.protocol` for the pipeline:

    - ``synchronize()``: the wrapped optimizer's (the replicas' all-reduce), then the shared parameters'
      gradients summed over their stages (:meth:`Pipeline.sync_gradients`); once per step.
    - ``clip_grad_norm_(c)``: ‖g‖² = Σ_stages Σ ‖g_p‖² over the parameters the stage saves (a shared one
      counted on its first stage only; a split one's slices added over its tensor group by the wrapped
      optimizer's ``grad_squares``), one all-reduce over the stages; every gradient of the stage scaled
      by min(1, c/(‖g‖ + 1e-6)), the rule of :func:`minidl.nn.utils.clip_grad_norm_`.
    - ``reduce_found_inf``: an overflow on any stage skips the step on every stage (fp16 loss scaling).
    - ``consolidated_state_dict()`` / ``load_state_dict``: the state of one process's optimizer over
      ``params``, each parameter's entry at its position there, gathered from the stages (a shared
      parameter's from its first stage: :func:`minidl.parallel.whole_state.gather_owned_state`), and
      cut back (:func:`~minidl.parallel.whole_state.owned_state`).
    """

    def __init__(self, optimizer, pipe: Pipeline, params):
        if not isinstance(pipe, Pipeline):
            raise TypeError(f"PipelineOptimizer: pipe must be a Pipeline, got {type(pipe).__name__}")
        self.optimizer, self.pipe = optimizer, pipe
        groups = _as_groups(params)
        position = {id(p): i for i, p in enumerate(p for g in groups for p in g["params"])}
        own = self._own_params()
        missing = [i for i, p in enumerate(own) if id(p) not in position]
        if missing:
            raise ValueError(f"PipelineOptimizer: {len(missing)} of the stage optimizer's {len(own)} parameters are "
                             "not among params (the whole model's); build it over pipe.stage_groups(params)")
        if len(optimizer.param_groups) != len(groups):
            raise ValueError(f"PipelineOptimizer: the stage optimizer has {len(optimizer.param_groups)} parameter "
                             f"groups, params {len(groups)}; build it over pipe.stage_groups(params)")
        self.positions = [position[id(p)] for p in own]   # each stage parameter's place in the whole optimizer
        self.group_sizes = [len(g["params"]) for g in groups]
        self.saved = [pipe.saves(p) for p in own]         # a shared parameter's state: from its first stage
        self._synchronized = False

    def synchronize(self) -> None:
        if not self._synchronized:
            super().synchronize()
            self.pipe.sync_gradients()
            self._synchronized = True

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
            self._synchronized = False
        self.synchronize()
        self.optimizer.step()
        self._synchronized = False
        return loss

    def zero_grad(self, set_to_none: bool = True):
        self._synchronized = False
        self.optimizer.zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm: float) -> float:
        from minidl.parallel.data_parallel import scale_to_norm_
        max_norm = float(max_norm)
        if not max_norm > 0:
            raise ValueError(f"PipelineOptimizer.clip_grad_norm_: max_norm must be > 0, got {max_norm}")
        self.synchronize()
        squares = sum_numbers_(self.pipe.comm, self.grad_squares(self._own_params()))  # a GPU's: no host read
        return scale_to_norm_(self._own_params(), squares, max_norm)

    def grad_squares(self, params) -> float:
        """Σ ‖g‖² of ``params`` this stage saves (a shared parameter on its first stage only), as the wrapped
        optimizer adds them (over a tensor group); the sum over the stages is :meth:`clip_grad_norm_`'s."""
        return super().grad_squares([p for p in params if self.pipe.saves(p)])

    def reduce_found_inf(self, found_inf: bool) -> bool:
        flags = np.array([1.0 if found_inf else 0.0])
        self.pipe.comm.host_allreduce_(flags)
        return super().reduce_found_inf(bool(flags[0] > 0))

    def state_dict(self) -> dict:
        """This stage's state, at its own positions (see :meth:`consolidated_state_dict`)."""
        return self.optimizer.state_dict()

    def consolidated_state_dict(self) -> dict:
        return gather_owned_state(super().consolidated_state_dict(), self.positions, self.pipe.comm,
                                  self.group_sizes, self.saved)

    def _local(self, state_dict) -> dict:
        return owned_state(state_dict, self.positions, [len(g["params"]) for g in self.optimizer.param_groups],
                           "PipelineOptimizer.load_state_dict")

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        self.optimizer.check_state_dict(self._local(state_dict))

    def load_state_dict(self, state_dict) -> None:
        """Load the state of one process's optimizer over ``params`` (or :meth:`consolidated_state_dict`'s)."""
        self.optimizer.load_state_dict(self._local(state_dict))

    def __repr__(self):
        return f"PipelineOptimizer(stage {self.pipe.stage_index} of {self.pipe.stages}: {self.optimizer!r})"
