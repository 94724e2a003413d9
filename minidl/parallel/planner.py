"""Which layout? Every way minidl can split a training step over a machine, predicted and ranked.

    from minidl.parallel.planner import Machine, ModelSpec, plan
    model = ModelSpec.gpt(n_layer=4, n_embd=128, n_head=4, block_size=128, vocab_size=65)
    machine = Machine(devices=4, memory=16e9, bandwidth=25e9, latency=10e-6, flops=100e12)
    table = plan(model, batch=32, machine=machine)
    print(table)                      # step time, peak memory per rank, bytes per step; the recommendation
    table.rows                        # the layouts that fit, fastest first (Estimate objects)

For each layout the planner sums, per rank (docs/parallelism.md, "Choosing a layout"):

    step time  = compute + bubble + communication
        compute        F·B / (D·R)             F FLOPs per sample (forward + backward), B the global batch,
                                               D devices, R FLOP/s per device (every layout splits the work)
        bubble         compute·(p − 1)/m       a pipeline of p stages in m micro-batches (GPipe, 1F1B)
        communication  Σ_ops messages·α + ring_bytes(op, payload)/β     α latency, β link bandwidth
    peak memory = parameters + gradients + optimizer state     ZeRO's formulas on the rank's share
                + activations                                   saved for backward, of the micro-batches
                                                                a stage holds at once
                + buffers                                       what a step holds briefly (below)
    bytes per step = Σ_ops ring_bytes(op, payload)              what each rank puts on its link

The communication and the state come from :mod:`minidl.parallel.cost_model` (``zero_bytes_per_rank``,
``zero_step_payloads``, ``tensor_parallel_step_payloads``, ``pipeline_step_payloads``, ``ring_bytes``; the
bubble term makes the step's idle share ``pipeline_bubble(p, m)``). The buffers are the step's transients, the
part of the peak the steady state does not show: the collective's piece in flight (its send and receive
buffers, two buckets), plus the largest thing a scheme makes whole for a moment: ZeRO-1 the rank's updated
chunk of the weights it hands the all-gather (pΨ/N), ZeRO-2 one unit's whole gradient before its
reduce-scatter (g·Ψ_u), ZeRO-3 one unit's whole weights and gradient (p + g)·Ψ_u, a pipeline one micro-batch's
activations sent and one received, and the largest weight's gradient twice (a micro-batch's, then its sum with
the earlier ones, a new array).

**Adding a scheme** is one entry in :data:`SCHEMES`: a function ``(model, batch, machine, options) ->
list[Estimate]`` that returns one :class:`Estimate` per way it fits the machine's devices, its bytes
taken from its own ``cost_model`` payload function. :func:`plan` then predicts, filters and ranks it
with the others; the CLI (``minidl plan``) and the notebook print it without change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from minidl.parallel.cost_model import (
    pipeline_step_payloads,
    ring_bytes,
    tensor_parallel_step_payloads,
    zero_bytes_per_rank,
    zero_step_payloads,
)

__all__ = ["Estimate", "Machine", "ModelSpec", "Plan", "SCHEMES", "estimate", "plan"]

DEFAULT_BUCKET_BYTES = 25 * 2**20   # DataParallel's and ShardedDataParallel's default piece


# ---------------------------------------------------------------- the machine and the model, as numbers
@dataclass(frozen=True)
class Machine:
    """D devices of ``memory`` bytes and ``flops`` FLOP/s each, joined by links of ``bandwidth`` bytes/s
    with ``latency`` seconds per message (a ring all-reduce runs at the slowest link's β)."""

    devices: int
    memory: float
    bandwidth: float
    latency: float
    flops: float
    name: str = "machine"

    def __post_init__(self):
        for key in ("devices", "memory", "bandwidth", "flops"):
            if not getattr(self, key) > 0:
                raise ValueError(f"Machine: {key} must be positive, got {getattr(self, key)!r}")
        if self.latency < 0:
            raise ValueError(f"Machine: latency must be >= 0 seconds, got {self.latency!r}")

    @classmethod
    def from_ceilings(cls, ceilings, devices: int = 2, ram: float | None = None, latency: float = 20e-6) -> "Machine":
        """One computer as ``devices`` MPI ranks, from :mod:`minidl.roofline`'s measured ``ceilings`` (its
        ``peak_flops`` and ``copy_bandwidth``): the cores and the memory bus are shared by the ranks, so each
        gets 1/devices of them; ranks talk through shared memory, so a message moves at about the copy
        bandwidth; ``ram`` (default: this computer's) is shared likewise. A rough machine, for a first look.

            from minidl.roofline.ceilings import measure
            machine = Machine.from_ceilings(measure("cpu", quick=True), devices=2)
        """
        if ram is None:
            import os
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return cls(devices=devices, memory=ram / devices, bandwidth=ceilings.copy_bandwidth / devices,
                   latency=latency, flops=ceilings.peak_flops / devices, name=f"this computer as {devices} ranks")


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs of a model.

    ``layers``: each layer's parameter tensors' element counts, in forward order (the units ZeRO-3
    gathers, the places a pipeline may cut); ``activation_bytes``: bytes saved for backward per sample,
    the whole model; ``boundary_bytes``: what one layer hands the next per sample (a pipeline's message);
    ``flops``: forward + backward FLOPs per sample; ``tensor_ranks``: the tensor-parallel sizes the model
    splits into (() for none) with ``tensor_bytes`` the all-reduce payload per sample (Megatron's
    4·blocks·tokens·width), ``tensor_messages`` its all-reduces per step and ``tensor_activation_bytes``
    the part of ``activation_bytes`` the split divides (the rest each rank holds whole), ``tensor_parameters``
    the parameters it divides (the rest, embeddings, LayerNorms, the row-parallel biases, whole);
    ``itemsize`` the bytes of a weight and of a gradient, ``state_bytes`` the optimizer's per element
    (Adam: 2·itemsize)."""

    name: str
    layers: tuple
    activation_bytes: float
    boundary_bytes: float
    flops: float
    itemsize: int = 4
    state_bytes: float = 8
    tensor_ranks: tuple = ()
    tensor_bytes: float = 0.0
    tensor_messages: int = 0
    tensor_activation_bytes: float = 0.0
    tensor_parameters: int = 0

    @property
    def parameters(self) -> int:
        """Ψ: every parameter element."""
        return int(sum(sum(layer) for layer in self.layers))

    @property
    def largest_layer(self) -> int:
        return int(max(sum(layer) for layer in self.layers))

    @classmethod
    def mlp(cls, sizes, itemsize: int = 4, state_bytes: float | None = None) -> "ModelSpec":
        """An MLP ``sizes[0] → … → sizes[-1]`` (Linear layers with biases, ReLU between, cross-entropy):
        each Linear saves its input, each ReLU its output, the loss its logits and their softmax, so
        (Σ_{i<k} d_i + Σ_{0<i<k} d_i + 2·d_k) values per sample; 6 FLOPs per weight per sample."""
        sizes = [int(s) for s in sizes]
        if len(sizes) < 2 or min(sizes) < 1:
            raise ValueError(f"ModelSpec.mlp: sizes must be at least 2 positive widths, got {sizes}")
        layers = tuple((a * b, b) for a, b in zip(sizes[:-1], sizes[1:]))
        saved = sum(sizes[:-1]) + sum(sizes[1:-1]) + 2 * sizes[-1]
        weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
        return cls(f"MLP {'→'.join(map(str, sizes))}", layers, saved * itemsize, max(sizes[1:-1] or sizes) * itemsize,
                   6.0 * weights, itemsize, 2 * itemsize if state_bytes is None else state_bytes)

    @classmethod
    def gpt(cls, n_layer: int, n_embd: int, n_head: int, block_size: int, vocab_size: int, itemsize: int = 4,
            state_bytes: float | None = None) -> "ModelSpec":
        """minidl's GPT (:mod:`minidl.models.gpt`: learned positions, pre-LayerNorm blocks, the head tied to the
        token embedding) on sequences of ``block_size`` tokens.

        Parameters: V·w + T·w, then per block 12w² + 13w, then 2w. FLOPs: 6 per parameter per token, plus
        attention's scores and mixing, 12·L·T·w per token (Kaplan et al. 2020; Narayanan et al. 2021).
        Activations, in values saved for backward per token, as ``minidl.memory.track`` counts them on this
        GPT: 27w + heads·T per block (the LayerNorms' and the residual's rows, Q, K, V, the attention's
        probabilities, the 4w-wide MLP before and after its GELU), then 5w + 3V (the final LayerNorm, the
        logits and the loss's softmax). A tensor-parallel split divides 9w + heads·T of each block's (the
        heads' and the MLP's hidden columns; Korthikanti et al. 2022 count the same split for Megatron's
        layers) and leaves the rest whole on each rank; of the parameters it divides each block's 12w² + 7w
        (Q, K, V, the projection's and the MLP's weights, the column-parallel biases). It splits over any
        ``tensor`` dividing ``n_head``."""
        w, t, v = int(n_embd), int(block_size), int(vocab_size)
        if min(n_layer, w, n_head, t, v) < 1 or w % n_head:
            raise ValueError(f"ModelSpec.gpt: need positive sizes and n_embd divisible by n_head, got "
                             f"n_layer={n_layer}, n_embd={w}, n_head={n_head}, block_size={t}, vocab_size={v}")
        block = (w, w, 3 * w * w, 3 * w, w * w, w, w, w, 4 * w * w, 4 * w, 4 * w * w, w)
        layers = ((v * w, t * w), *([block] * n_layer), (w, w))
        params = sum(sum(layer) for layer in layers)
        flops = 6.0 * params * t + 12.0 * n_layer * t * t * w
        per_token = n_layer * (27 * w + n_head * t) + 5 * w + 3 * v
        split_per_token = n_layer * (9 * w + n_head * t)
        return cls(f"GPT {n_layer}×{w} ({n_head} heads, {t} tokens)", layers, per_token * t * itemsize,
                   t * w * itemsize, flops, itemsize, 2 * itemsize if state_bytes is None else state_bytes,
                   tuple(n for n in range(2, n_head + 1) if n_head % n == 0),
                   tensor_parallel_step_payloads(t, w, n_layer, itemsize)["allreduce"], 4 * n_layer,
                   split_per_token * t * itemsize, n_layer * (12 * w * w + 7 * w))


# ---------------------------------------------------------------- one layout's prediction
@dataclass
class Estimate:
    """One layout on one machine: its step time's parts (seconds), its memory per rank's parts (bytes) and the
    payload each communicator is handed per step (``payloads[axis][op]``, as ``Communicator.traffic``
    counts it), with ``wire_bytes`` what a ring then sends from each rank."""

    layout: str
    sizes: dict
    compute: float
    bubble: float
    communication: float
    memory: dict
    payloads: dict
    wire_bytes: float
    options: dict = field(default_factory=dict)

    @property
    def step_time(self) -> float:
        return self.compute + self.bubble + self.communication

    @property
    def peak_bytes(self) -> float:
        """The step peak per rank: held state + activations + the step's transient buffers."""
        return float(sum(self.memory.values()))

    @property
    def bottleneck(self) -> str:
        parts = {"compute": self.compute, "the pipeline bubble": self.bubble, "communication": self.communication}
        return max(parts, key=parts.get)


def _padded(sizes, ranks: int) -> int:
    """Σ N·⌈Ψ_u/N⌉ over units of ``sizes`` elements: what sharded collectives move (zeros pad each unit)."""
    return int(sum(ranks * math.ceil(n / ranks) for n in sizes))


def _buckets(tensors, itemsize: int, bucket_bytes: int) -> list:
    """Element counts of ZeRO-1/2's units: runs of consecutive tensors of about ``bucket_bytes``, cut from the
    last back (as :func:`minidl.parallel.sharded.gradient_buckets` cuts them)."""
    runs, used = [], None
    for n in reversed(tensors):
        if used is not None and (used + n) * itemsize > bucket_bytes:
            runs.append(used)
            used = None
        used = n if used is None else used + n
    return runs + ([used] if used is not None else [])


def _stages(layers, stages: int) -> list:
    """Cut the layers into ``stages`` contiguous runs of about equal parameters (each at least one layer)."""
    sizes = np.array([sum(layer) for layer in layers], float)
    ends = np.cumsum(sizes)
    cuts = [int(np.searchsorted(ends, ends[-1] * k / stages)) + 1 for k in range(1, stages)]
    cuts = [min(max(c, k + 1), len(layers) - stages + k + 1) for k, c in enumerate(cuts)]
    for k in range(1, len(cuts)):
        cuts[k] = max(cuts[k], cuts[k - 1] + 1)
    bounds = [0, *cuts, len(layers)]
    return [layers[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _axis_time(payload: dict, ranks: int, machine: Machine, messages: int) -> tuple[float, float]:
    """(seconds, wire bytes) of one axis's collectives: messages·α + Σ ring_bytes/β."""
    wire = float(sum(ring_bytes(op, n, ranks) for op, n in payload.items()))
    if ranks == 1 or not payload:
        return 0.0, 0.0
    return messages * machine.latency + wire / machine.bandwidth, wire


def estimate(model: ModelSpec, batch: int, machine: Machine, *, data: int = 1, tensor: int = 1, pipeline: int = 1,
             zero: int = 0, micro_batches: int | None = None, schedule: str = "1f1b",
             bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Estimate:
    """One layout's prediction: ``data`` replicas (with ZeRO ``zero``) × ``pipeline`` stages × ``tensor`` ranks.

    Raises ValueError when the layout does not fit the machine's devices or the batch (the planner skips those).
    """
    if data * tensor * pipeline != machine.devices:
        raise ValueError(f"estimate: data {data} × tensor {tensor} × pipeline {pipeline} must equal the machine's "
                         f"{machine.devices} devices")
    if batch % data:
        raise ValueError(f"estimate: a batch of {batch} does not split over {data} replicas")
    if tensor > 1 and tensor not in model.tensor_ranks:
        raise ValueError(f"estimate: {model.name} does not split over {tensor} tensor-parallel ranks "
                         f"(it splits over {list(model.tensor_ranks) or 'none'})")
    if pipeline > len(model.layers):
        raise ValueError(f"estimate: {len(model.layers)} layers cannot make {pipeline} pipeline stages")
    if zero and (tensor > 1 or pipeline > 1 or data == 1):
        raise ValueError("estimate: ZeRO shards whole models over the data axis alone (as parallel.prepare does)")
    p = g = model.itemsize
    replica_batch = batch // data
    m = 1
    if pipeline > 1:
        m = micro_batches or max(d for d in range(1, min(replica_batch, 4 * pipeline) + 1) if replica_batch % d == 0)
        if replica_batch % m:
            raise ValueError(f"estimate: {replica_batch} samples per replica do not split into {m} micro-batches")
    stages = _stages(model.layers, pipeline)
    stage = max(stages, key=lambda s: sum(map(sum, s)))                  # the stage that holds the most
    stage_params = sum(map(sum, stage))
    if tensor > 1:  # the split part of the stage's parameters divided, the rest whole on every rank
        stage_params -= model.tensor_parameters / model.parameters * stage_params * (1 - 1 / tensor)
    compute = model.flops * batch / (machine.devices * machine.flops)
    bubble = compute * (pipeline - 1) / m if pipeline > 1 else 0.0
    # the state: ZeRO's formulas on what this rank's replica holds
    state = zero_bytes_per_rank(stage_params, data, zero, p, g, model.state_bytes)
    memory = {"parameters": state["parameter_bytes"], "gradients": state["gradient_bytes"],
              "optimizer": state["optimizer_bytes"]}
    # activations: a stage's share of the model's, for the micro-batches it holds at once
    held = m if schedule == "gpipe" else min(m, pipeline)
    per_sample = model.activation_bytes - model.tensor_activation_bytes * (1 - 1 / tensor)
    memory["activations"] = per_sample * replica_batch / m * held / pipeline
    payloads, wire, comm = {}, 0.0, 0.0
    buffers = 0.0
    tensors = [n for layer in model.layers for n in layer]
    if data > 1:
        units = [sum(layer) for layer in model.layers]
        padded = (_padded(units, data) if zero == 3 else
                  _padded(_buckets(tensors, g, bucket_bytes), data) if zero in (1, 2) else None)
        payload = zero_step_payloads(stage_params, data, zero, p, g, padded)
        messages = sum(max(1, math.ceil(n / bucket_bytes)) for n in payload.values())
        seconds, sent = _axis_time(payload, data, machine, messages)
        payloads["data"], wire, comm = payload, wire + sent, comm + seconds
        buffers += 2 * min(bucket_bytes, g * stage_params)
        buffers += {0: 0.0, 1: p * stage_params / data, 2: g * _largest(tensors, g, bucket_bytes),
                    3: (p + g) * model.largest_layer}[zero]
    if tensor > 1:
        payload = {"allreduce": model.tensor_bytes * replica_batch}
        seconds, sent = _axis_time(payload, tensor, machine, model.tensor_messages * m)
        payloads["tensor"], wire, comm = payload, wire + sent, comm + seconds
        buffers += 2 * model.tensor_bytes / max(model.tensor_messages, 1) * replica_batch / m
    if pipeline > 1:
        payload = pipeline_step_payloads(1, pipeline, replica_batch, model.boundary_bytes / tensor, 1)
        seconds, sent = _axis_time(payload, pipeline, machine, 2 * m)
        payloads["pipeline"], wire, comm = payload, wire + sent, comm + seconds
        buffers += 2 * model.boundary_bytes * replica_batch / m / tensor
        if m > 1:  # each micro-batch's gradient of a weight made, then added into the sum (a new array)
            buffers += 2 * g * max(n for layer in stage for n in layer) / tensor
    memory["buffers"] = buffers
    return Estimate(_name(data, tensor, pipeline, zero, m, schedule), {"data": data, "tensor": tensor,
                    "pipeline": pipeline}, compute, bubble, comm, memory, payloads, wire,
                    {"zero": zero, "micro_batches": m if pipeline > 1 else None,
                     "schedule": schedule if pipeline > 1 else None, "bucket_bytes": bucket_bytes})


def _largest(tensors, itemsize: int, bucket_bytes: int) -> int:
    """Elements of ZeRO-2's largest unit (a bucket of consecutive gradients)."""
    return max(_buckets(tensors, itemsize, bucket_bytes))


def _name(data, tensor, pipeline, zero, m, schedule) -> str:
    parts = []
    if data > 1:
        parts.append(f"ZeRO-{zero} ×{data}" if zero else f"data ×{data}")
    if pipeline > 1:
        parts.append(f"pipeline ×{pipeline} ({'GPipe' if schedule == 'gpipe' else '1F1B'}, m={m})")
    if tensor > 1:
        parts.append(f"tensor ×{tensor}")
    return " · ".join(parts) or "one device"


# ---------------------------------------------------------------- the schemes: one entry each
def _try(model, batch, machine, **kwargs) -> list:
    try:
        return [estimate(model, batch, machine, **kwargs)]
    except ValueError:  # the layout does not fit these devices, this batch or this model
        return []


def _pairs(devices: int) -> list:
    return [(a, devices // a) for a in range(2, devices // 2 + 1) if devices % a == 0]


def _one(model, batch, machine, o):
    return _try(model, batch, machine, bucket_bytes=o["bucket_bytes"]) if machine.devices == 1 else []


def _data(zero):
    def scheme(model, batch, machine, o):
        if machine.devices == 1:
            return []
        return _try(model, batch, machine, data=machine.devices, zero=zero, bucket_bytes=o["bucket_bytes"])
    return scheme


def _tensor(model, batch, machine, o):
    return _try(model, batch, machine, tensor=machine.devices) if machine.devices > 1 else []


def _pipeline(schedule):
    def scheme(model, batch, machine, o):
        if machine.devices == 1:
            return []
        return _try(model, batch, machine, pipeline=machine.devices, micro_batches=o["micro_batches"],
                    schedule=schedule)
    return scheme


def _mesh(first, second):
    def scheme(model, batch, machine, o):
        return [e for a, b in _pairs(machine.devices)
                for e in _try(model, batch, machine, **{first: a, second: b}, micro_batches=o["micro_batches"],
                              bucket_bytes=o["bucket_bytes"])]
    return scheme


#: name → ``(model, batch, machine, options) -> list[Estimate]``; a new scheme is one more entry here.
SCHEMES = {
    "one device": _one,
    "data parallel": _data(0),
    "ZeRO-1": _data(1),
    "ZeRO-2": _data(2),
    "ZeRO-3": _data(3),
    "tensor": _tensor,
    "pipeline GPipe": _pipeline("gpipe"),
    "pipeline 1F1B": _pipeline("1f1b"),
    "data × tensor": _mesh("data", "tensor"),
    "data × pipeline": _mesh("data", "pipeline"),
    "pipeline × tensor": _mesh("pipeline", "tensor"),
}


# ---------------------------------------------------------------- the table
@dataclass
class Plan:
    """The layouts that fit, fastest first (``rows``), those that do not (``dropped``), and the recommendation."""

    model: ModelSpec
    batch: int
    machine: Machine
    rows: list
    dropped: list

    @property
    def recommended(self) -> Estimate | None:
        return self.rows[0] if self.rows else None

    @property
    def reason(self) -> str:
        """One sentence: why the first row, naming its bottleneck and what the others lose on."""
        if not self.rows:
            need = min(self.dropped, key=lambda e: e.peak_bytes) if self.dropped else None
            least = f"; the least any layout needs is {_gb(need.peak_bytes)} ({need.layout})" if need else ""
            return f"No layout fits {_gb(self.machine.memory)} per device{least}."
        best = self.rows[0]
        why = f"{best.layout} is the fastest layout that fits {_gb(self.machine.memory)} per device"
        if len(self.rows) > 1:
            runner = self.rows[1]
            if runner.step_time - best.step_time <= 1e-9 * best.step_time:  # a tie: the smaller peak goes first
                why += (f" (as fast as {runner.layout}, {_ms(best.step_time)} a step, and "
                        f"{_gb(runner.peak_bytes - best.peak_bytes)} lighter per rank)")
            else:
                why += (f" ({_ms(best.step_time)} a step against {_ms(runner.step_time)} for {runner.layout}, "
                        f"which spends {_ms(_cost(runner, best))} more on {_differs(runner, best)})")
        faster = [e for e in self.dropped if e.step_time < best.step_time]
        if faster:
            fast = min(faster, key=lambda e: e.step_time)
            why += f"; {fast.layout} would be faster but needs {_gb(fast.peak_bytes)}"
        part = {"compute": best.compute, "the pipeline bubble": best.bubble,
                "communication": best.communication}[best.bottleneck]
        return why + f"; its bottleneck is {best.bottleneck} ({_ms(part)} of {_ms(best.step_time)})."

    def __str__(self) -> str:
        head = (f"{self.model.name}, batch {self.batch}, on {self.machine.devices} devices of "
                f"{_gb(self.machine.memory)}, {_rate(self.machine.flops, 'FLOP/s')}, "
                f"links {_rate(self.machine.bandwidth, 'B/s')} + "
                f"{self.machine.latency * 1e6:.3g} µs")
        cols = (f"{'layout':<38} {'step':>10} {'compute':>10} {'bubble':>10} {'comm':>10} {'peak/rank':>10} "
                f"{'sent/step':>10}")
        lines = [head, cols]
        for e in self.rows:
            lines.append(f"{e.layout:<38} {_ms(e.step_time):>10} {_ms(e.compute):>10} {_ms(e.bubble):>10} "
                         f"{_ms(e.communication):>10} {_gb(e.peak_bytes):>10} {_gb(e.wire_bytes):>10}")
        for e in self.dropped:
            lines.append(f"{e.layout:<38} {'does not fit: needs ' + _gb(e.peak_bytes):>54}")
        lines.append(f"recommended: {self.reason}")
        return "\n".join(lines)

    __repr__ = __str__


def _differs(slow: Estimate, fast: Estimate) -> str:
    parts = {"compute": slow.compute - fast.compute, "the pipeline bubble": slow.bubble - fast.bubble,
             "communication": slow.communication - fast.communication}
    return max(parts, key=parts.get)


def _cost(slow: Estimate, fast: Estimate) -> float:
    return slow.step_time - fast.step_time


def _rate(value: float, unit: str) -> str:
    for prefix, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 or seconds == 0 else f"{seconds * 1e6:.3g} µs"


def _gb(nbytes: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes:.3g} B"


def plan(model, batch: int, machine: Machine, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
         micro_batches: int | None = None, schemes: dict | None = None) -> Plan:
    """Every layout of ``schemes`` (default :data:`SCHEMES`) that fits ``machine``'s devices, predicted for a
    global batch of ``batch`` samples; those whose step peak fits ``machine.memory`` ranked by step time (then
    by peak memory), the rest listed as dropped. ``model``: a :class:`ModelSpec`."""
    if not isinstance(model, ModelSpec):
        raise TypeError(f"plan: model must be a ModelSpec (ModelSpec.mlp, ModelSpec.gpt or your own), got "
                        f"{type(model).__name__}")
    if not isinstance(machine, Machine):
        raise TypeError(f"plan: machine must be a Machine, got {type(machine).__name__}")
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"plan: batch must be a positive number of samples, got {batch!r}")
    options = {"bucket_bytes": bucket_bytes, "micro_batches": micro_batches}
    every = [e for scheme in (schemes or SCHEMES).values() for e in scheme(model, int(batch), machine, options)]
    fits = sorted((e for e in every if e.peak_bytes <= machine.memory), key=lambda e: (e.step_time, e.peak_bytes))
    dropped = sorted((e for e in every if e.peak_bytes > machine.memory), key=lambda e: e.peak_bytes)
    return Plan(model, int(batch), machine, fits, dropped)
