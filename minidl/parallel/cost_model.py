"""When does data parallelism pay? A ring all-reduce cost model fitted to measurements.

Ring all-reduce (Patarasuk & Yuan 2009; the algorithm behind NCCL and most
MPI libraries for large messages): N ranks in a ring; each gradient of n
bytes is cut into N chunks, which travel N−1 hops reduce-scattering and N−1
hops all-gathering. Every rank sends and receives 2(N−1)/N · n bytes, so

    T_allreduce(n, N) = α + 2(N−1)/N · n/β         (T = 0 for N = 1)

α is the fixed latency of one call (software, synchronization, the hops'
start-up; a ring's true latency grows like 2(N−1)·α_hop, folded into α here
since measurements on one machine cannot separate them) and β the bandwidth
of the slowest link. The bandwidth term *does not grow with N*: that is why
the ring made data parallelism scale.

One step of data-parallel training, without overlap of communication and
backward (see :mod:`minidl.parallel.data_parallel`):

    T_step(N) = t_fixed + t_sample · b  +  buckets·α + 2(N−1)/N · P/β

with b samples per rank, P the gradient bytes, t_fixed the per-step cost that
does not shrink with the batch (Python and kernel-launch overhead, the
optimizer update), t_sample the compute per sample.

- Strong scaling (global batch B fixed, b = B/N): compute shrinks like 1/N,
  communication does not, so efficiency T(1)/(N·T(N)) falls once
  t_sample·B/N approaches the all-reduce time, and stops at b = 1.
- Weak scaling (b fixed, global batch N·b grows): each step stays nearly as
  fast, but past the critical batch size B_crit (the gradient noise scale,
  McCandlish et al. 2018: steps to a target S = S_min·(1 + B_crit/B)) a
  larger batch no longer cuts the number of steps, so the time to train stops
  improving even though throughput keeps growing.

ZeRO (Rajbhandari et al. 2020) trades the replicas of data parallelism for
communication. :func:`zero_bytes_per_rank` is the paper's memory per rank for
stages 0–3, :func:`zero_step_payloads` what one step hands each collective
(as a communicator counts it in ``traffic``), and :func:`ring_bytes` what a
ring algorithm then puts on each rank's link:

    all-reduce of n bytes:        2(N−1)/N · n       (a reduce-scatter, then an all-gather)
    reduce-scatter of n bytes:    (N−1)/N · n        (n: the whole vector each rank hands in)
    all-gather of n bytes each:   (N−1) · n          (n: the shard each rank hands in)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_RANKS = tuple(2 ** k for k in range(11))  # 1, 2, 4, ..., 1024


@dataclass(frozen=True)
class RingAllreduce:
    """T(n, N) = α + 2(N−1)/N · n/β  (seconds; n in bytes; β in bytes per second)."""

    alpha: float
    beta: float

    def time(self, nbytes, ranks: int, messages: int = 1):
        """Seconds to all-reduce ``nbytes`` over ``ranks`` ranks in ``messages`` calls (0 for one rank)."""
        if ranks < 1:
            raise ValueError(f"RingAllreduce.time: ranks must be >= 1, got {ranks}")
        if ranks == 1:
            return 0.0 * np.asarray(nbytes, dtype=float)
        return messages * self.alpha + 2.0 * (ranks - 1) / ranks * np.asarray(nbytes, dtype=float) / self.beta

    def bus_bandwidth(self, nbytes, seconds, ranks: int):
        """NCCL-tests' "bus bandwidth" of a measurement: 2(N−1)/N · n / t (comparable across N)."""
        return 2.0 * (ranks - 1) / ranks * np.asarray(nbytes, float) / np.asarray(seconds, float)

    @classmethod
    def fit(cls, nbytes, seconds, ranks: int) -> "RingAllreduce":
        """α and β from measured all-reduce times on ``ranks`` ranks.

        Each parameter is fitted where it dominates: 1/β is the least-squares
        slope of t against 2(N−1)/N·n over the largest third of the messages
        (gradients are large messages, so β must be right there, even when
        mid-sized messages run faster out of a cache); α is the mean of
        t − 2(N−1)/N·n/β over the smallest third, kept ≥ 0.
        """
        n = np.asarray(nbytes, float)
        t = np.asarray(seconds, float)
        if ranks < 2:
            raise ValueError("RingAllreduce.fit: measurements need at least 2 ranks (one rank communicates nothing)")
        if n.shape != t.shape or n.size < 4 or not np.all(t > 0):
            raise ValueError(f"RingAllreduce.fit: need >= 4 (bytes, seconds) pairs with positive times, "
                             f"got {n.size} sizes and {t.size} times")
        order = np.argsort(n)
        x, t = 2.0 * (ranks - 1) / ranks * n[order], t[order]
        k = max(2, len(x) // 3)
        large_x, large_t = x[-k:], t[-k:]
        inverse_beta = float(np.polyfit(large_x, large_t, 1)[0])
        if inverse_beta <= 0:
            raise ValueError("RingAllreduce.fit: the times do not grow with the message size; "
                             "measure larger messages")
        alpha = max(0.0, float(np.mean(t[:k] - x[:k] * inverse_beta)))
        return cls(alpha=alpha, beta=1.0 / inverse_beta)


@dataclass(frozen=True)
class StepModel:
    """One training step's time: compute (per step + per sample) plus an unoverlapped all-reduce."""

    comm: RingAllreduce
    param_bytes: float          # P: bytes of gradient to all-reduce each step
    time_per_sample: float      # t_sample: forward + backward seconds per sample on one rank
    fixed_time: float = 0.0     # t_fixed: seconds per step that do not depend on the batch
    bucket_bytes: float = 25 * 2**20

    @property
    def buckets(self) -> int:
        return max(1, math.ceil(self.param_bytes / self.bucket_bytes))

    def compute_time(self, per_rank_batch: float) -> float:
        return self.fixed_time + self.time_per_sample * per_rank_batch

    def comm_time(self, ranks: int) -> float:
        return float(self.comm.time(self.param_bytes, ranks, self.buckets))

    def step_time(self, ranks: int, per_rank_batch: float) -> float:
        return self.compute_time(per_rank_batch) + self.comm_time(ranks)

    def strong_scaling(self, global_batch: int, ranks=DEFAULT_RANKS) -> list[dict]:
        """Fixed global batch B split over N ranks: speedup and efficiency T(1)/(N·T(N)).

        Rows stop where B/N < 1 (a rank cannot get less than one sample).
        """
        t1 = self.step_time(1, global_batch)
        rows = []
        for n in ranks:
            b = global_batch / n
            if b < 1:
                break
            t = self.step_time(n, b)
            rows.append({"ranks": n, "per_rank_batch": b, "global_batch": global_batch, "step_time": t,
                         "compute_time": self.compute_time(b), "comm_time": self.comm_time(n),
                         "samples_per_second": global_batch / t, "speedup": t1 / t, "efficiency": t1 / (n * t)})
        return rows

    def weak_scaling(self, per_rank_batch: int, ranks=DEFAULT_RANKS, critical_batch: float | None = None) -> list[dict]:
        """Fixed batch b per rank (global batch N·b): throughput efficiency T(1)/T(N).

        With ``critical_batch`` (the gradient noise scale B_crit) each row also
        has ``time_to_train_speedup``: the speedup in wall time to reach a given
        loss, counting that a batch B needs S ∝ 1 + B_crit/B steps.
        """
        t1 = self.step_time(1, per_rank_batch)
        rows = []
        for n in ranks:
            t = self.step_time(n, per_rank_batch)
            row = {"ranks": n, "per_rank_batch": per_rank_batch, "global_batch": n * per_rank_batch,
                   "step_time": t, "compute_time": self.compute_time(per_rank_batch),
                   "comm_time": self.comm_time(n), "samples_per_second": n * per_rank_batch / t,
                   "speedup": n * t1 / t, "efficiency": t1 / t}
            if critical_batch is not None:
                steps_1 = 1.0 + critical_batch / per_rank_batch
                steps_n = 1.0 + critical_batch / (n * per_rank_batch)
                row["time_to_train_speedup"] = (steps_1 * t1) / (steps_n * t)
            rows.append(row)
        return rows

    def break_even_batch(self, ranks: int) -> float:
        """Samples per rank at which compute equals the all-reduce time (below it, communication dominates)."""
        return max(0.0, (self.comm_time(ranks) - self.fixed_time) / self.time_per_sample)


def format_table(rows: list[dict], columns=("ranks", "per_rank_batch", "step_time", "comm_time",
                                             "speedup", "efficiency")) -> str:
    """A plain-text table of scaling rows (times in milliseconds)."""
    head = "  ".join(f"{c:>15}" for c in columns)
    lines = [head]
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c, float("nan"))
            if c.endswith("_time"):
                cells.append(f"{value * 1e3:>13.3f}ms")
            elif isinstance(value, float):
                cells.append(f"{value:>15.3f}")
            else:
                cells.append(f"{value:>15}")
        lines.append("  ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- ZeRO: memory and communication per rank
RING_FACTORS = {"allreduce": lambda n: 2.0 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
                "allgather": lambda n: float(n - 1), "broadcast": lambda n: (n - 1) / n,
                "send": lambda n: 1.0, "recv": lambda n: 0.0}


def ring_bytes(op: str, payload, ranks: int):
    """Bytes a ring algorithm sends from each rank for an ``op`` whose payload (what each rank hands in) is
    ``payload`` bytes; 0 for one rank. A send counts its bytes once, at the sender."""
    if op not in RING_FACTORS:
        raise ValueError(f"ring_bytes: unknown operation {op!r}; choose one of {', '.join(RING_FACTORS)}")
    if ranks < 1:
        raise ValueError(f"ring_bytes: ranks must be >= 1, got {ranks}")
    if ranks == 1 and op not in ("send", "recv"):
        return 0.0 * np.asarray(payload, float)
    return RING_FACTORS[op](ranks) * np.asarray(payload, float)


def _check_zero(where: str, stage: int, ranks: int) -> None:
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{where}: stage must be 0 (plain data parallelism), 1, 2 or 3, got {stage!r}")
    if ranks < 1:
        raise ValueError(f"{where}: ranks must be >= 1, got {ranks}")


def zero_bytes_per_rank(elements: float, ranks: int, stage: int, param_bytes: float = 2, grad_bytes: float = 2,
                        state_bytes: float = 12) -> dict:
    """Bytes of parameters, gradients and optimizer state each rank holds (the ZeRO paper, section 5.1).

    With Ψ = ``elements``, N = ``ranks`` and p, g, K the bytes per element of each
    (the paper's mixed-precision Adam: 2, 2, 12):

        stage 0:  (p + g + K) Ψ          stage 2:  p Ψ + (g + K) Ψ/N
        stage 1:  (p + g) Ψ + K Ψ/N      stage 3:  (p + g + K) Ψ/N

    Pass the padded count N·⌈Ψ/N⌉ (``ShardedDataParallel.memory_report()["padded_elements"]``)
    to match a sharded run to the byte.
    """
    _check_zero("zero_bytes_per_rank", stage, ranks)
    shard = elements / ranks
    out = {"parameter_bytes": param_bytes * (shard if stage >= 3 else elements),
           "gradient_bytes": grad_bytes * (shard if stage >= 2 else elements),
           "optimizer_bytes": state_bytes * (shard if stage >= 1 else elements)}
    out["total_bytes"] = sum(out.values())
    return out


def zero_step_payloads(elements: float, ranks: int, stage: int, param_bytes: float = 2,
                       grad_bytes: float = 2, padded: float | None = None) -> dict:
    """What one training step hands each collective on each rank, in bytes (``Communicator.traffic``).

    Stage 0: one all-reduce of the gradients (g Ψ). Stage 1 (``ZeroRedundancyOptimizer``): that
    all-reduce, then an all-gather of the updated chunks (p Ψ'/N). Stages 2 and 3
    (``ShardedDataParallel``): a reduce-scatter of the gradients (g Ψ') and an all-gather of the
    shards (p Ψ'/N), which stage 3 does twice (before each unit's forward and again before its
    backward). Ψ = ``elements``; Ψ' = ``padded``, the flat units' padded count N·Σ_u ⌈Ψ_u/N⌉
    (default Ψ), what the shards' collectives move.
    """
    _check_zero("zero_step_payloads", stage, ranks)
    padded = elements if padded is None else padded
    if stage == 0:
        return {"allreduce": grad_bytes * elements}
    if stage == 1:
        return {"allreduce": grad_bytes * elements, "allgather": param_bytes * padded / ranks}
    gathers = 2 if stage == 3 else 1
    return {"reduce_scatter": grad_bytes * padded, "allgather": gathers * param_bytes * padded / ranks}


def zero_step_bytes(elements: float, ranks: int, stage: int, param_bytes: float = 2, grad_bytes: float = 2,
                    padded: float | None = None) -> float:
    """Bytes each rank sends per step on a ring: 2(N−1)/N·gΨ for stage 0; (N−1)/N·(2gΨ + pΨ') for stage 1
    (the all-reduce, then the all-gather: 1.5× stage 0's with p = g); (N−1)/N·(g + p)Ψ' for stage 2;
    (N−1)/N·(g + 2p)Ψ' for stage 3 (the paper's 3Ψ with p = g)."""
    return float(sum(ring_bytes(op, n, ranks)
                     for op, n in zero_step_payloads(elements, ranks, stage, param_bytes, grad_bytes, padded).items()))



# ---------------------------------------------------------------- tensor and pipeline parallelism: bytes per step
def tensor_parallel_step_payloads(tokens: int, width: int, blocks: int, itemsize: int = 4) -> dict:
    """What one training step of a Megatron-split transformer hands the all-reduce, on each rank of the group.

    Each block all-reduces its attention's and its MLP's output forward (g: 2 activations of
    ``tokens × width``) and the gradients of their inputs backward (f: 2 more), so
    4 · blocks · tokens · width · itemsize bytes, whatever the tensor-parallel size N; a ring
    then sends 2(N−1)/N of that from each rank (:func:`ring_bytes`).
    """
    return {"allreduce": 4 * blocks * tokens * width * itemsize}


def pipeline_step_payloads(stage: int, stages: int, batch: int, activation_elements: int, itemsize: int = 4) -> dict:
    """Bytes stage ``stage`` sends and receives in one pipeline step (the micro-batches add up to the batch).

    Every stage but the last sends each micro-batch's activations forward (``batch ×
    activation_elements`` values in all) and every stage but the first sends their gradients
    back, as many bytes; each receives what its neighbours send it. The micro-batch count
    changes the number of messages, not their total.
    """
    one_way = batch * activation_elements * itemsize
    sends = (one_way if stage < stages - 1 else 0) + (one_way if stage > 0 else 0)
    return {"send": sends, "recv": sends}


def pipeline_bubble(stages: int, micro_batches: int) -> float:
    """The idle fraction of GPipe and 1F1B with equal stages and free messages: (p − 1)/(m + p − 1)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"pipeline_bubble: stages and micro_batches must be >= 1, got {stages}, {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)


# ---------------------------------------------------------------- parameter server: bytes per step
def expected_pull_fraction(staleness: int | None) -> float:
    """The share of steps on which a worker of :class:`~minidl.parallel.parameter_server.ParameterServer` pulls.

    Synchronous (None) or τ = 0: every step. Otherwise a worker keeps its weights with probability 1/2 each
    step, at most τ steps in a row, so the steps from one pull to the next number Σ_{k=0}^{τ} 2^{−k} = 2 − 2^{−τ}
    on average and the share is 1 / (2 − 2^{−τ}): 2/3 for τ = 1, tending to 1/2.
    """
    if staleness is None:
        return 1.0
    if staleness < 0:
        raise ValueError(f"expected_pull_fraction: staleness must be None or >= 0, got {staleness}")
    return 1.0 / (2.0 - 2.0 ** -staleness)


def parameter_server_step_payloads(param_bytes: float, workers: int, role: str = "worker",
                                   pulls: float = 1.0) -> dict:
    """Payload bytes one parameter-server step hands to ``send`` and ``recv`` on one rank (as ``comm.traffic``).

    A worker (``param_bytes`` = P, the whole model's trainable bytes) pushes its gradient, P bytes cut over
    the servers, and receives the weights, P bytes, on the steps it pulls (``pulls``: 1 synchronous, or the
    share of :func:`expected_pull_fraction`). A server (``param_bytes`` = its shard's bytes P_s) receives
    every worker's push, W · P_s, and sends the shard to the workers that pull (``pulls``: how many per step,
    W synchronous). All of it crosses the servers' links: with S servers of equal shards, a step moves
    W · P / S bytes in and out of each server, so T_comm ≈ α + W · P / (S · β): more workers load the
    servers, more servers spread the load (Li et al. 2014).
    """
    if role == "worker":
        return {"send": float(param_bytes), "recv": float(param_bytes) * float(pulls)}
    if role == "server":
        return {"send": float(param_bytes) * float(pulls), "recv": float(param_bytes) * workers}
    raise ValueError(f"parameter_server_step_payloads: role must be 'worker' or 'server', got {role!r}")


# ---------------------------------------------------------------- local SGD: bytes per step
def local_sgd_step_payloads(param_bytes: float, period: int, state_bytes: float = 0.0) -> dict:
    """Payload bytes per step of local SGD averaging every ``period`` (H) steps: one all-reduce of the weights
    (``param_bytes``, plus ``state_bytes`` when the optimizer's state is averaged too) every H steps, so
    (P + state) / H per step; :func:`ring_bytes` turns it into link bytes, 2(N−1)/N · P / H."""
    if period < 1:
        raise ValueError(f"local_sgd_step_payloads: period (H) must be >= 1, got {period}")
    return {"allreduce": (float(param_bytes) + float(state_bytes)) / period}


# ---------------------------------------------------------------- filter-wise parallelism: bytes per step
FILTER_KINDS = ("gathered", "split", "input_channel")


def filter_parallel_step_payloads(ranks: int, batch: int, layers, itemsize: int = 4) -> dict:
    """What one step of a filter-wise split CNN hands each collective, on each rank of the group.

    ``layers``: one ``(kind, input_map, output_map, input_grad)`` per split convolution, the maps
    ``(C, H, W)`` of the whole (unsplit) activations and ``kind`` one of

        "gathered"       filter-wise, output all-gathered:  all-gather B·(C_out/N)·H'·W'  forward
        "split"          filter-wise, output left split:    nothing forward
        "input_channel"  input channels split:             all-reduce B·C_out·H'·W'     forward

    Both filter-wise kinds all-reduce the input's gradient backward, B·C_in·H·W, where the input
    needs one (``input_grad``: not the image); the input-channel kind sends nothing backward (its
    input's gradient is this rank's channels). Payloads in bytes (:func:`ring_bytes` for the wire).
    """
    if ranks < 1:
        raise ValueError(f"filter_parallel_step_payloads: ranks must be >= 1, got {ranks}")
    out = {"allgather": 0, "allreduce": 0}
    for kind, (c_in, h, w), (c_out, h_out, w_out), input_grad in layers:
        if kind not in FILTER_KINDS:
            raise ValueError(f"filter_parallel_step_payloads: kind must be one of {', '.join(FILTER_KINDS)}, "
                             f"got {kind!r}")
        if kind == "gathered":
            out["allgather"] += batch * (c_out // ranks) * h_out * w_out * itemsize
        if kind == "input_channel":
            out["allreduce"] += batch * c_out * h_out * w_out * itemsize
        elif input_grad:
            out["allreduce"] += batch * c_in * h * w * itemsize
    return {op: n for op, n in out.items() if n}


# ---------------------------------------------------------------- spatial parallelism: halo bytes per step
def halo_bytes(batch: int, channels: int, width: int, halo: int, itemsize: int = 4) -> int:
    """One halo message: ``halo`` rows of a (batch, channels, ·, width) activation, p·B·C·W·itemsize bytes."""
    return halo * batch * channels * width * itemsize


def spatial_step_payloads(rank: int, ranks: int, batch: int, convs, gathered_map, image_map=None,
                          itemsize: int = 4) -> dict:
    """What one step of a CNN split into strips of rows hands each operation, on rank ``rank`` of ``ranks``.

    ``convs``: one ``(in_channels, width, halo, parameters, input_grad)`` per convolution on strips.
    Before each, a rank with k neighbours (1 at the image's edges, 2 inside; 0 alone) sends and
    receives one :func:`halo_bytes` message per neighbour, and as many back in backward where the
    input needs a gradient; the weights' gradients (``parameters`` values) are all-reduced. The strips
    of ``gathered_map`` ((C, H, W) of the whole map, before the head) are all-gathered, each rank
    handing in its B·C·(H/N)·W; ``image_map``, when the image needs a gradient, adds the all-gather of
    its strips' gradients. Payloads in bytes, as ``comm.traffic`` counts them.
    """
    if ranks < 1 or not 0 <= rank < ranks:
        raise ValueError(f"spatial_step_payloads: rank must be in [0, ranks), got rank {rank} of {ranks}")
    neighbours = (rank > 0) + (rank < ranks - 1)
    out = {"send": 0, "allreduce": 0, "allgather": 0}
    for channels, width, halo, parameters, input_grad in convs:
        out["send"] += neighbours * halo_bytes(batch, channels, width, halo, itemsize) * (2 if input_grad else 1)
        out["allreduce"] += parameters * itemsize
    for shape in (gathered_map, image_map):
        if shape is not None:
            c, h, w = shape
            out["allgather"] += batch * c * (h // ranks) * w * itemsize
    out["recv"] = out["send"]
    return {op: n for op, n in out.items() if n}


# ---------------------------------------------------------------- mixture of experts: all-to-all and expert parallelism
# An all-to-all is a pairwise exchange, not a ring: each rank keeps the 1/N of its payload addressed to
# itself and sends every other part straight to its rank, so it sends (N−1)/N of what it hands in
# (exactly, for the block form all_to_all; on average over the ranks for all_to_all_v when the rows
# spread evenly over the ranks).
RING_FACTORS.update({"all_to_all": lambda n: (n - 1) / n, "all_to_all_v": lambda n: (n - 1) / n})


def all_to_all_bytes(payload, ranks: int):
    """Bytes one rank sends in an all-to-all of ``payload`` bytes (its whole buffer): (N−1)/N · payload."""
    return ring_bytes("all_to_all", payload, ranks)


def expert_parallel_step_payloads(rows_sent: int, rows_received: int, in_features: int, out_features: int,
                                  experts: int, itemsize: int = 4, replicated_bytes: float = 0,
                                  input_grad: bool = True) -> dict:
    """What one training step of an expert-parallel MoE layer hands each collective on one rank, in bytes.

    ``rows_sent``: the (token, expert) pairs of this rank's tokens that fit (k per token when none is
    dropped); ``rows_received``: those the experts of this rank take from every rank. Per step:

        all_to_all:    8 · E                                    the per-expert counts (int64), once
        all_to_all_v:  rows_sent · in + rows_received · out     forward: tokens out, experts' outputs back
                     + rows_sent · out + rows_received · in     backward: their gradients, the other way
        allreduce:     the replicated parameters' gradients     (router and every other layer)

    times ``itemsize``; the last term of the backward only when the layer's input needs a gradient.
    With tokens spread evenly, rows_sent = rows_received = k · T_r (T_r tokens per rank), so a step
    hands 2 · k · T_r · (in + out) · itemsize to the all-to-all and sends (N−1)/N of it
    (:func:`all_to_all_bytes`).
    """
    exchanged = rows_sent * in_features + rows_received * out_features + rows_sent * out_features
    if input_grad:
        exchanged += rows_received * in_features
    payloads = {"all_to_all": 8 * experts, "all_to_all_v": exchanged * itemsize}
    if replicated_bytes:
        payloads["allreduce"] = replicated_bytes
    return payloads


def expert_parallel_step_bytes(ranks: int, **payload_args) -> float:
    """Bytes one rank sends per step (:func:`expert_parallel_step_payloads`, each through :func:`ring_bytes`)."""
    return float(sum(ring_bytes(op, n, ranks) for op, n in expert_parallel_step_payloads(**payload_args).items()))
