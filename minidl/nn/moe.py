"""A mixture of experts: a router sends each token to k of E small MLPs, within a capacity.

    moe = nn.MoE(64, 256, num_experts=8, k=1, capacity_factor=1.25)   # Switch Transformer routing
    y = x + moe(x)                      # the residual carries the tokens the experts dropped
    loss = task_loss + 0.01 * moe.aux_loss
    moe.dropped_tokens                  # (token, choice) pairs over capacity in the last forward

Routing (Fedus et al. 2021, "Switch Transformers", section 2.1; Lepikhin et al. 2020, "GShard",
section 2.2 and Algorithm 1). For a token x (a row of the input, all leading axes flattened) the
router is a Linear map to E logits without a bias, and

    p(x) = softmax(x W_rᵀ)                            the router's probabilities over the experts
    e_1, …, e_k                                       the k largest p_i(x) (ties: the lower index)
    top-1 (Switch):  y = p_{e_1}(x) · E_{e_1}(x)      the gate is the probability itself
    top-2 (GShard):  y = Σ_j g_j · E_{e_j}(x),  g_j = p_{e_j}(x) / (p_{e_1}(x) + p_{e_2}(x))

so Switch's gate is not renormalized (its size still trains the router) and GShard's two gates add
up to one. Each expert E_i is an MLP, Linear(in, hidden) → activation → Linear(hidden, out).

Capacity. The T tokens are cut into G equal ``groups`` in order (GShard's groups: one per device in
an expert-parallel run); in each group every expert takes at most

    capacity = ⌈C · (T/G) · k / E⌉                    (C: ``capacity_factor``)

assignments, first come first served in token order, first choices before second choices (a
token's second choice queues after every first choice of its group, as GShard's
``position_in_expert_2`` does). An assignment over capacity is dropped: its expert never sees the
token and its gate is 0; a top-2 token that keeps one of its two experts keeps that expert's gate
g_j as it was (not renormalized again). A token that loses every choice gets **zero** from this layer,
as in Switch, so a caller that wants it passed on unchanged adds the residual, ``x + moe(x)``.
``dropped_tokens`` counts the dropped assignments of the last forward (for k = 1: the tokens).

Load balance (Switch, eq. 4–6). For each group, with f_i the fraction of its tokens whose first choice
is expert i and P_i the mean of p_i(x) over them,

    aux = E · Σ_i f_i · P_i                           (1 when both are uniform; at least 1 otherwise)

and ``aux_loss`` is its mean over the groups. f is a count (no gradient); the gradient reaches the
router through P, pushing probability away from the busy experts. GShard's top-2 loss uses the same
f (first choices) and P.

The routing is computed on arrays, without gradients: which expert a token goes to is a discrete
choice. Gradients flow through the gates (to the router), the experts' inputs and their weights. A
small change of the input that does not move the argmax leaves the routing as it is, which is what
makes a finite-difference check of this layer meaningful.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import minidl.functional as F
from minidl import backend
from minidl.nn.containers import ModuleList
from minidl.nn.layers import Linear, ReLU
from minidl.nn.module import Module
from minidl.tensor import Tensor

__all__ = ["Expert", "MoE", "Routing", "expert_capacity", "route"]


def expert_capacity(tokens: int, k: int, num_experts: int, capacity_factor: float) -> int:
    """⌈C · tokens · k / E⌉: the assignments one expert takes from ``tokens`` tokens (of one group)."""
    return int(math.ceil(capacity_factor * tokens * k / num_experts))


@dataclass
class Routing:
    """Where each (token, choice) pair goes: ``experts``, ``slots`` (its place in the expert's queue of its
    group) and ``kept`` (slot < capacity), arrays of shape (T, k); ``capacity`` per expert and group."""

    experts: object
    slots: object
    kept: object
    capacity: int

    @property
    def dropped(self) -> int:
        return int(self.kept.size - int(self.kept.sum()))


def route(probs, k: int, capacity_factor: float, groups: int = 1) -> Routing:
    """The top-``k`` experts of every row of ``probs`` (T, E) and which of them fit (see the module docstring).

    Per group of T/G rows: each choice's slot is the number of earlier assignments to the same expert
    in the group, counting every first choice before any second choice (a cumulative sum over a one-hot
    matrix, GShard's Algorithm 1).
    """
    xp = backend.xp_of(probs)
    tokens, num_experts = probs.shape
    per_group = tokens // groups
    capacity = expert_capacity(per_group, k, num_experts, capacity_factor)
    experts = xp.argsort(-probs, axis=1, kind="stable")[:, :k]
    slots = xp.empty_like(experts)
    eye = xp.eye(num_experts, dtype=np.int64)
    for g in range(groups):
        rows = slice(g * per_group, (g + 1) * per_group)
        filled = xp.zeros(num_experts, np.int64)      # assignments already queued at each expert
        for j in range(k):
            onehot = eye[experts[rows, j]]             # (T/G, E)
            queue = xp.cumsum(onehot, axis=0) - 1 + filled
            slots[rows, j] = xp.take_along_axis(queue, experts[rows, j:j + 1], axis=1)[:, 0]
            filled = filled + onehot.sum(axis=0)
    return Routing(experts, slots, slots < capacity, capacity)


class Expert(Module):
    """One expert: ``fc2(activation(fc1(x)))``, Linear(in, hidden) → activation → Linear(hidden, out)."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int, activation=ReLU,
                 device=None, dtype=None):
        super().__init__()
        self.fc1 = Linear(in_features, hidden_features, device=device, dtype=dtype)
        self.act = activation()
        self.fc2 = Linear(hidden_features, out_features, device=device, dtype=dtype)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def combine(rows, tokens, weights, num_tokens: int):
    """y[t] = Σ over the rows i of token t: weights[i] · rows[i]  (a scatter-add; a token with no row: y[t] = 0).

    With no row at all the result is still made by the scatter-add, so the graph reaches ``rows`` (an
    expert-parallel layer's exchange must run its backward on every rank)."""
    out = Tensor(rows.xp.zeros((num_tokens, rows.shape[1]), rows.dtype))
    index = rows.xp.ascontiguousarray(rows.xp.broadcast_to(tokens[:, None], rows.shape))
    return F.scatter_add(out, 0, index, rows * weights.unsqueeze(1))


class MoE(Module):
    """A mixture-of-experts layer: ``router`` (Linear(in, E), no bias) and ``experts`` (E :class:`Expert`).

    Args:
        in_features, hidden_features: each expert's input and hidden widths.
        out_features: each expert's output width (default ``in_features``: a residual block).
        num_experts: E.  k: 1 (Switch) or 2 (GShard).
        capacity_factor: C in capacity = ⌈C · tokens · k / E⌉ (per group).
        groups: G, the equal groups the tokens are cut into for the capacity and the auxiliary loss
            (an expert-parallel run over N ranks equals this layer with G = N on the global batch).
        activation: the experts' activation, a Module class (``nn.ReLU``, ``nn.GELU``).

    Input (..., in_features) → output (..., out_features). After each forward: ``aux_loss`` (a Tensor, the
    load-balancing loss), ``dropped_tokens`` (int) and ``routing`` (:class:`Routing`). See the module docstring.
    """

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 num_experts: int = 4, k: int = 1, capacity_factor: float = 1.25, groups: int = 1,
                 activation=ReLU, device=None, dtype=None):
        super().__init__()
        out_features = in_features if out_features is None else out_features
        for name, value in (("in_features", in_features), ("hidden_features", hidden_features),
                            ("out_features", out_features), ("num_experts", num_experts), ("groups", groups)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"MoE: {name} must be an int >= 1, got {value!r}")
        if k not in (1, 2) or k > num_experts:
            raise ValueError(f"MoE: k must be 1 (Switch) or 2 (GShard) and at most num_experts={num_experts}, "
                             f"got k={k!r}")
        if not float(capacity_factor) > 0:
            raise ValueError(f"MoE: capacity_factor must be > 0, got {capacity_factor!r} (1.0 to 1.25 is usual)")
        self.in_features, self.hidden_features, self.out_features = in_features, hidden_features, out_features
        self.num_experts, self.k, self.capacity_factor, self.groups = num_experts, k, float(capacity_factor), groups
        self.router = Linear(in_features, num_experts, bias=False, device=device, dtype=dtype)
        self.experts = ModuleList([Expert(in_features, hidden_features, out_features, activation, device, dtype)
                                   for _ in range(num_experts)])
        self.aux_loss, self.dropped_tokens, self.routing = None, 0, None

    def gate(self, x, groups: int):
        """Route the rows of ``x`` (T, in) in ``groups`` groups: ``(routing, gates, aux)``, gates (T, k) the
        weight of each choice (0 where dropped), aux the mean over the groups of E · Σ_i f_i P_i."""
        tokens = x.shape[0]
        if tokens % groups:
            raise ValueError(f"MoE: {tokens} tokens do not cut into {groups} equal groups; give a token count "
                             f"that divides by groups={groups}")
        probs = F.softmax(self.router(x), dim=-1)                     # p(x), (T, E)
        routing = route(probs.array, self.k, self.capacity_factor, groups)
        chosen = F.gather(probs, 1, routing.experts)                  # p_{e_j}(x), (T, k)
        if self.k == 2:
            chosen = chosen / chosen.sum(dim=1, keepdim=True)        # GShard: g_j = p_{e_j} / (p_{e_1} + p_{e_2})
        gates = chosen * Tensor(routing.kept.astype(probs.dtype))
        xp, E = probs.xp, self.num_experts
        first = xp.eye(E, dtype=probs.dtype)[routing.experts[:, 0]]  # the first choices, one-hot
        f = first.reshape(groups, tokens // groups, E).mean(axis=1)   # f_i per group (a count: no gradient)
        P = probs.reshape(groups, tokens // groups, E).mean(dim=1)    # P_i per group
        aux = (P * Tensor(f)).sum(dim=1).mean() * E
        return routing, gates, aux

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"MoE({self.in_features} → {self.out_features}): input of shape {tuple(x.shape)} "
                             f"has {x.shape[-1]} features, expected {self.in_features}")
        lead = tuple(x.shape[:-1])
        x = x.reshape(-1, self.in_features)
        routing, gates, self.aux_loss = self.gate(x, self.groups)
        self.routing, self.dropped_tokens = routing, routing.dropped
        flat_gates = gates.reshape(-1)
        xp, outputs, tokens, weights = x.xp, [], [], []
        for e in range(self.num_experts):
            t, j = xp.nonzero(routing.kept & (routing.experts == e))
            if not len(t):
                continue
            outputs.append(self.experts[e](F.index_select(x, 0, t)))
            tokens.append(t)
            weights.append(F.index_select(flat_gates, 0, t * self.k + j))
        if not outputs:
            return Tensor(xp.zeros(lead + (self.out_features,), x.dtype))
        y = combine(F.cat(outputs), xp.concatenate(tokens), F.cat(weights), x.shape[0])
        return y.reshape(lead + (self.out_features,))

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, num_experts={self.num_experts}, "
                f"k={self.k}, capacity_factor={self.capacity_factor}, groups={self.groups}")
