"""Tensor parallelism (Megatron-LM): one layer's weight split across the N ranks of a group.

A Linear layer Y = X Wᵀ + b, W of shape (out, in), can be split two ways
(Shoeybi et al. 2019, "Megatron-LM", section 3):

    column-parallel:  W = [W_0; W_1; ...; W_{N−1}]  by output rows    Y_r = X W_rᵀ + b_r
                      every rank needs all of X; it gets its own slice Y_r of the output features
    row-parallel:     W = [W_0, W_1, ..., W_{N−1}]  by input columns  Y = Σ_r X_r W_rᵀ + b
                      rank r needs only its slice X_r of the input features; the partial
                      products are summed over the group (an all-reduce)

A column-parallel layer followed by a row-parallel one needs no communication
between them: the slice Y_r the first produces is the slice X_r the second
takes, and an elementwise function between them (GELU) works on each slice
alone. So an MLP costs one all-reduce forward (after the second layer) and one
backward (of the input's gradient, before the first):

    MLP(X)  = g( GELU( f(X) A_rᵀ ) B_rᵀ ) + b       A column-, B row-parallel

with f and g the conjugate ops of :mod:`minidl.ops.distributed` (f: identity
forward, all-reduce backward; g: all-reduce forward, identity backward).
Attention splits the same way by heads: each rank computes the Q, K, V of
its h/N heads (a column-parallel QKV product), attends with them alone, and
the output projection is row-parallel.

Each rank holds 1/N of the split weights. Per layer, forward and backward each
all-reduce one activation of B·T × C values: the price is paid in every
layer, on the critical path, which is why tensor groups stay within a machine.

Parameters are made by the unsplit layer and then sliced, so a tensor-parallel
model built after ``manual_seed(s)`` (or converted from a model built so)
holds exactly the numbers of the plain model, and trains to the same numbers.
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.nn.module import Module, Parameter, WrapsModule
from minidl.ops.distributed import copy_to_group, sum_over_group
from minidl.optim.wrapper import WrapsOptimizer
from minidl.parallel.protocol import ParallelModule, ParallelOptimizer, grad_squares, sum_numbers_
from minidl.parallel.whole_state import (  # noqa: F401 - the whole-state conversions, also reachable from here
    SplitLayer,
    consolidate_optimizer_state,
    consolidated_state_dict,
    local_optimizer_state,
    local_state_dict,
    parameter_layers,
)


def _group(comm):
    if comm is None:
        from minidl.parallel.world import init
        comm = init()
    if not callable(getattr(comm, "allreduce_", None)) or not hasattr(comm, "size"):
        raise TypeError(f"tensor parallelism needs a communicator of minidl.parallel (parallel.init() or "
                        f"Mesh(...).group('tensor')), got {type(comm).__name__}")
    return comm


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_divides(layer: str, what: str, size: int, ranks: int) -> None:
    """Raise ValueError when ``size`` (``what`` of ``layer``) does not split evenly over ``ranks`` ranks."""
    if size % ranks:
        raise ValueError(f"{layer}: {what} ({size}) does not divide among the {ranks} ranks of the tensor "
                         f"group; choose a tensor-parallel size among {_divisors(size)}, or change {what}")


def _slice(total: int, ranks: int, rank: int) -> slice:
    part = total // ranks
    return slice(rank * part, (rank + 1) * part)


def _column_rows(out_features: int, stacked: int, ranks: int, rank: int):
    """The rows rank ``rank`` keeps of a weight that stacks ``stacked`` equal matrices (Q, K, V) by rows."""
    block = out_features // stacked
    rows = _slice(block, ranks, rank)
    return [slice(j * block + rows.start, j * block + rows.stop) for j in range(stacked)]


def _own_parameter(array) -> Parameter:
    return Parameter(array.copy())  # a contiguous array of its own: the full weight can be freed


class ColumnParallelLinear(SplitLayer):
    """Y_r = f(X) W_rᵀ + b_r: this rank's rows of the weight, so its slice of the output features.

    ``ColumnParallelLinear(in_features, out_features, comm)`` draws the whole
    ``nn.Linear(in_features, out_features)`` (the same random numbers as the
    unsplit layer) and keeps rows ``r·out/N .. (r+1)·out/N`` of its weight and
    bias. ``stacked=s`` is for a weight that stacks s matrices by rows (GPT's
    Q, K and V in one product): rank r keeps its rows of each.
    ``from_linear(linear, comm)`` splits an existing layer.
    """

    def __init__(self, in_features: int, out_features: int, comm=None, bias: bool = True, stacked: int = 1,
                 device=None, dtype=None):
        super().__init__()
        comm = _group(comm)
        _check_column(in_features, out_features, stacked, comm.size)
        self._take(nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype), comm, stacked)

    @classmethod
    def from_linear(cls, linear: nn.Linear, comm=None, stacked: int = 1) -> "ColumnParallelLinear":
        comm = _group(comm)
        _check_column(linear.in_features, linear.out_features, stacked, comm.size)
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer._take(linear, comm, stacked)
        return layer

    def _take(self, linear, comm, stacked):
        self.comm, self.stacked = comm, stacked
        self.in_features, self.out_features = linear.in_features, linear.out_features
        rows = _column_rows(linear.out_features, stacked, comm.size, comm.rank)
        xp = linear.weight.xp
        self.weight = _own_parameter(xp.concatenate([linear.weight.array[r] for r in rows]))
        if linear.bias is not None:
            self.bias = _own_parameter(xp.concatenate([linear.bias.array[r] for r in rows]))
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"ColumnParallelLinear({self.in_features}, {self.out_features}): input of shape "
                             f"{tuple(x.shape)} has {x.shape[-1]} features, expected {self.in_features}")
        return F.linear(copy_to_group(x, self.comm), self.weight, self.bias)

    def full_parameters(self) -> dict:
        """The unsplit layer's ``{"weight", "bias"}`` arrays, gathered from the group (a collective)."""
        return {name: self.gather_whole(name, getattr(self, name).array) for name in ("weight", "bias")
                if getattr(self, name) is not None}

    def whole_shape(self, name: str) -> tuple:
        """The shape parameter ``name`` ("weight" or "bias") has in the unsplit layer."""
        return (self.out_features,) + tuple(_parameter(self, name).shape[1:])

    def gather_whole(self, name: str, array, what: str | None = None):
        """This rank's ``array`` shaped like parameter ``name`` (the weight, or Adam's moment of it) -> the
        array of the unsplit layer: an all-gather, so a collective of the group.

        Rank r holds rows r·k/N .. (r+1)·k/N of each of the ``stacked`` blocks of k rows; the gathered
        (N, s·k/N, ...) array is put back block by block, each block's slices in rank order.
        """
        _check_local_shape(self, name, array, what)
        xp = backend.xp_of(array)
        parts = self.comm.allgather(xp.ascontiguousarray(array))  # (N, s·k/N, ...)
        n, rest = parts.shape[0], parts.shape[2:]
        per = parts.shape[1] // self.stacked
        # (rank, stacked block, rows) → (stacked block, rank, rows)
        return parts.reshape((n, self.stacked, per) + rest).swapaxes(0, 1).reshape((self.out_features,) + rest)

    def slice_whole(self, name: str, array, what: str | None = None):
        """An array shaped like the unsplit layer's parameter ``name`` -> this rank's rows of it, as
        :meth:`from_linear` cuts them (no communication). Raises ValueError when ``array`` does not have
        the whole shape (see :func:`local_state_dict`)."""
        _check_whole_shape(self, name, array, what)
        xp = backend.xp_of(array)
        rows = _column_rows(self.out_features, self.stacked, self.comm.size, self.comm.rank)
        return xp.concatenate([xp.asarray(array)[r] for r in rows])

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.weight.shape[0]}), rank={self.comm.rank} of {self.comm.size}"
                + (f", stacked={self.stacked}" if self.stacked > 1 else ""))


def _check_column(in_features, out_features, stacked, ranks):
    layer = f"ColumnParallelLinear({in_features}, {out_features})"
    if out_features % stacked:
        raise ValueError(f"{layer}: out_features ({out_features}) must hold {stacked} stacked blocks")
    check_divides(layer, "out_features" if stacked == 1 else f"out_features / {stacked}",
                  out_features // stacked, ranks)


def _parameter(layer, name: str):
    p = getattr(layer, name, None) if name in ("weight", "bias") else None
    if p is None:
        raise ValueError(f"{type(layer).__name__}: no parameter {name!r} (it has "
                         f"{', '.join(n for n in ('weight', 'bias') if getattr(layer, n, None) is not None)})")
    return p


def _split_ways(shape: tuple, whole: tuple) -> int | None:
    """k when ``shape`` is ``whole`` with one axis divided by k > 1 (one rank's slice of a k-way split)."""
    if len(shape) != len(whole):
        return None
    differ = [(got, want) for got, want in zip(shape, whole) if got != want]
    if len(differ) != 1 or not differ[0][0] or differ[0][1] % differ[0][0]:
        return None
    k = differ[0][1] // differ[0][0]
    return k if k > 1 else None


def _check_local_shape(layer, name, array, what):
    want, got = tuple(_parameter(layer, name).shape), tuple(np.shape(array))
    if got != want:
        raise ValueError(f"{what or type(layer).__name__ + '.' + name}: this rank's array has shape {got}, but the "
                         f"parameter it stands for has shape {want} on this rank (rank {layer.comm.rank} of "
                         f"{layer.comm.size}); gather arrays shaped like this rank's slice")


def _check_whole_shape(layer, name, array, what):
    whole, mine, got = layer.whole_shape(name), tuple(_parameter(layer, name).shape), tuple(np.shape(array))
    if got == whole:
        return
    ways = _split_ways(got, whole)
    looks = (f" (the shape of one rank's slice of a {ways}-way split: a state saved by each rank of a "
             "tensor-parallel model)" if ways else "")
    raise ValueError(f"{what or type(layer).__name__ + '.' + name}: got shape {got}{looks}, but the whole "
                     f"(unsplit) parameter has shape {whole} and this rank's slice (rank {layer.comm.rank} of "
                     f"{layer.comm.size}) has shape {mine}. Load a consolidated state, whose arrays are whole: "
                     "tensor_parallel.consolidated_state_dict(model) on every rank of the split model (a "
                     "checkpoint of minidl gpt train holds one), not model.state_dict() of one rank")


class RowParallelLinear(SplitLayer):
    """Y = g(X_r W_rᵀ) + b: this rank's columns of the weight, summed over the group.

    The input is already split (``X_r``: this rank's ``in/N`` features, as a
    column-parallel layer leaves them); the bias is whole and added once,
    after the all-reduce. Built like :class:`ColumnParallelLinear`: the whole
    ``nn.Linear`` drawn, then columns ``r·in/N .. (r+1)·in/N`` kept.
    """

    def __init__(self, in_features: int, out_features: int, comm=None, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        comm = _group(comm)
        check_divides(f"RowParallelLinear({in_features}, {out_features})", "in_features", in_features, comm.size)
        self._take(nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype), comm)

    @classmethod
    def from_linear(cls, linear: nn.Linear, comm=None) -> "RowParallelLinear":
        comm = _group(comm)
        check_divides(f"RowParallelLinear({linear.in_features}, {linear.out_features})", "in_features",
                      linear.in_features, comm.size)
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer._take(linear, comm)
        return layer

    def _take(self, linear, comm):
        self.comm = comm
        self.in_features, self.out_features = linear.in_features, linear.out_features
        columns = _slice(linear.in_features, comm.size, comm.rank)
        self.weight = _own_parameter(linear.weight.array[:, columns])
        if linear.bias is not None:
            self.bias = _own_parameter(linear.bias.array)
        else:
            self.register_parameter("bias", None)

    def forward(self, x):
        part = self.in_features // self.comm.size
        if x.shape[-1] != part:
            raise ValueError(f"RowParallelLinear({self.in_features}, {self.out_features}): input of shape "
                             f"{tuple(x.shape)} has {x.shape[-1]} features; this rank takes its slice of "
                             f"{part} (in_features / {self.comm.size} ranks)")
        y = sum_over_group(F.linear(x, self.weight), self.comm)
        return y if self.bias is None else y + self.bias

    def full_parameters(self) -> dict:
        """The unsplit layer's ``{"weight", "bias"}`` arrays, gathered from the group (a collective)."""
        return {name: self.gather_whole(name, getattr(self, name).array) for name in ("weight", "bias")
                if getattr(self, name) is not None}

    def whole_shape(self, name: str) -> tuple:
        """The shape parameter ``name`` ("weight" or "bias") has in the unsplit layer."""
        shape = tuple(_parameter(self, name).shape)
        return (self.out_features, self.in_features) if name == "weight" else shape

    def gather_whole(self, name: str, array, what: str | None = None):
        """This rank's ``array`` shaped like parameter ``name`` -> the array of the unsplit layer.

        The weight's column slices are all-gathered (a collective of the group) and laid side by side
        in rank order; the bias is whole on every rank: a copy, no communication.
        """
        _check_local_shape(self, name, array, what)
        xp = backend.xp_of(array)
        if name == "bias":
            return xp.array(array, copy=True)
        parts = self.comm.allgather(xp.ascontiguousarray(array))  # (N, out, in/N)
        return parts.swapaxes(0, 1).reshape(self.out_features, self.in_features)

    def slice_whole(self, name: str, array, what: str | None = None):
        """An array shaped like the unsplit layer's parameter ``name`` -> this rank's columns of it (the
        bias: a copy of it whole); no communication. Raises ValueError when ``array`` does not have the
        whole shape (see :func:`local_state_dict`)."""
        _check_whole_shape(self, name, array, what)
        xp = backend.xp_of(array)
        if name == "bias":
            return xp.array(array, copy=True)
        return xp.ascontiguousarray(xp.asarray(array)[:, _slice(self.in_features, self.comm.size, self.comm.rank)])

    def extra_repr(self):
        return (f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), "
                f"out_features={self.out_features}, rank={self.comm.rank} of {self.comm.size}")


class ParallelMLP(Module):
    """y = B_r-row-parallel( activation( A_r-column-parallel(x) ) ): one all-reduce forward, one backward.

    ``ParallelMLP(in_features, hidden_features, comm)`` draws ``fc =
    nn.Linear(in, hidden)`` then ``proj = nn.Linear(hidden, in)``, in that order,
    as an unsplit MLP built the same way; ``from_layers(fc, proj, comm)`` splits
    existing ones. The activation must work elementwise (GELU, ReLU, tanh).
    """

    def __init__(self, in_features: int, hidden_features: int, comm=None, activation=F.gelu, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        comm = _group(comm)
        check_divides(f"ParallelMLP({in_features}, {hidden_features})", "hidden_features", hidden_features,
                      comm.size)
        fc = nn.Linear(in_features, hidden_features, bias=bias, device=device, dtype=dtype)
        proj = nn.Linear(hidden_features, in_features, bias=bias, device=device, dtype=dtype)
        self.fc, self.proj = ColumnParallelLinear.from_linear(fc, comm), RowParallelLinear.from_linear(proj, comm)
        self.activation = activation

    @classmethod
    def from_layers(cls, fc: nn.Linear, proj: nn.Linear, comm=None, activation=F.gelu) -> "ParallelMLP":
        comm = _group(comm)
        check_divides(f"ParallelMLP({fc.in_features}, {fc.out_features})", "hidden_features", fc.out_features,
                      comm.size)
        mlp = cls.__new__(cls)
        Module.__init__(mlp)
        mlp.fc, mlp.proj = ColumnParallelLinear.from_linear(fc, comm), RowParallelLinear.from_linear(proj, comm)
        mlp.activation = activation
        return mlp

    def forward(self, x):
        return self.proj(self.activation(self.fc(x)))


class ParallelCausalSelfAttention(Module):
    """Causal self-attention with its heads split over the group: h/N heads per rank.

    ``forward(x, T)`` takes the residual stream as rows, x of shape (B·T, C)
    with T positions per sequence (as minidl's GPT keeps it), and returns the
    same shape. ``qkv`` is column-parallel with Q, K and V stacked (rank r
    holds the Q, K, V rows of its heads), ``proj`` row-parallel (the columns of
    its heads): one all-reduce forward, one backward.
    """

    def __init__(self, embed_dim: int, num_heads: int, comm=None, bias: bool = True, device=None, dtype=None):
        super().__init__()
        comm = _group(comm)
        _check_heads(embed_dim, num_heads, comm.size)
        qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias, device=device, dtype=dtype)
        proj = nn.Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self._take(qkv, proj, num_heads, comm)

    @classmethod
    def from_layers(cls, qkv: nn.Linear, proj: nn.Linear, num_heads: int, comm=None):
        comm = _group(comm)
        _check_heads(proj.in_features, num_heads, comm.size)
        if qkv.out_features != 3 * proj.in_features:
            raise ValueError(f"ParallelCausalSelfAttention: qkv must have 3 × {proj.in_features} outputs "
                             f"(Q, K, V stacked), got {qkv.out_features}")
        attention = cls.__new__(cls)
        Module.__init__(attention)
        attention._take(qkv, proj, num_heads, comm)
        return attention

    def _take(self, qkv, proj, num_heads, comm):
        self.comm, self.embed_dim, self.num_heads = comm, proj.in_features, num_heads
        self.qkv = ColumnParallelLinear.from_linear(qkv, comm, stacked=3)
        self.proj = RowParallelLinear.from_linear(proj, comm)

    def forward(self, x, T):  # noqa: N803 - x holds B·T positions, T per sequence
        rows = x.shape[0]
        heads, width = self.num_heads // self.comm.size, self.embed_dim // self.num_heads
        local = heads * width
        q, k, v = self.qkv(x).split(local, dim=1)
        q, k, v = (t.reshape(rows // T, T, heads, width).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(rows, local))


def _check_heads(embed_dim, num_heads, ranks):
    layer = f"ParallelCausalSelfAttention(embed_dim={embed_dim}, num_heads={num_heads})"
    if embed_dim % num_heads:
        raise ValueError(f"{layer}: embed_dim must be divisible by num_heads")
    check_divides(layer, "num_heads", num_heads, ranks)


def tensor_parallel_layers(model: Module):
    """``(name, layer)`` of every column- and row-parallel layer of ``model``."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, (ColumnParallelLinear,
                                                                               RowParallelLinear))]


class SplitModel(WrapsModule, ParallelModule):
    """A model holding layers split over a group (each rank keeps a part of their weights), seen whole by
    checkpoints: the base of :class:`TensorParallel` and of filter-wise parallelism's wrapper.

    ``forward``, the parameters and ``state_dict()`` are the wrapped model's (this rank's parts, keyed as
    the plain model). What a checkpoint holds is the state of one process:
    :meth:`consolidated_state_dict` gathers the whole weights (a collective of each group), and
    :meth:`load_state_dict` / :meth:`check_state_dict` take whole weights, from a run split any way or
    from one process, and cut this rank's parts (:func:`local_state_dict`: a state of one rank's parts
    is refused, naming the parameter and the shapes; nothing changes). The protocol of
    :mod:`minidl.parallel.protocol`, so the Trainer and :func:`minidl.train.run_state.save_checkpoint`
    and ``load_checkpoint`` need nothing more. A subclass names its split layers (``split_layers``)
    and what to do when a model has none (``how_to_split``).
    """

    split_layers = None  # model -> [(name, layer)] of its split layers
    how_to_split = ""

    def __init__(self, module: Module):
        super().__init__()
        name = type(self).__name__
        if not isinstance(module, Module):
            raise TypeError(f"{name}: expected a minidl Module, got {type(module).__name__}")
        if not type(self).split_layers(module):
            raise ValueError(f"{name}: {type(module).__name__} {self.how_to_split}")
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def consolidated_state_dict(self) -> dict:
        """The whole weights, keyed as the plain model's state dict (a collective of each group)."""
        return consolidated_state_dict(self.module)

    def check_state_dict(self, state, strict: bool = True):
        """What ``load_state_dict(state, strict)`` would raise or return; no change, no communication."""
        return self.module.check_state_dict(local_state_dict(self.module, state), strict)

    def load_state_dict(self, state, strict: bool = True):
        """Load whole weights (as one process saves them): this rank keeps its parts. All or nothing."""
        return self.module.load_state_dict(local_state_dict(self.module, state), strict)


class SplitModelOptimizer(ParallelOptimizer):
    """The optimizer of a :class:`SplitModel`, whose checkpoint state is one process's.

    ``step``, ``zero_grad``, the groups and the state are the wrapped optimizer's (it may itself be a
    :class:`~minidl.parallel.DistributedOptimizer`: a data × split mesh). :meth:`consolidated_state_dict`
    holds each parameter's state in the unsplit shapes (:func:`consolidate_optimizer_state`, a
    collective); :meth:`load_state_dict` takes such a state, saved by any split or by one process.
    :meth:`clip_grad_norm_` clips to the unsplit model's global norm, which the Trainer calls for its
    ``max_grad_norm``. A subclass names the model's split layers and split parameters.
    """

    split_layers = None  # model -> [(name, layer)] of its split layers
    split_parameters = None  # model -> the parameters that hold one rank's part
    layer_kinds = "split"  # how the error names the layers a model must hold

    def __init__(self, optimizer, model: Module):
        if not type(self).split_layers(model):
            raise ValueError(f"{type(self).__name__}: the model ({type(model).__name__}) has no "
                             f"{self.layer_kinds} layer")
        self.optimizer, self.model = optimizer, model

    def step(self, closure=None):
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True):
        self.optimizer.zero_grad(set_to_none)

    def clip_grad_norm_(self, max_norm: float):
        """Clip by the unsplit model's global gradient norm; returns the norm before clipping. Data-parallel
        gradients are all-reduced first (``synchronize``), so the norm is the global batch's."""
        from minidl.parallel.data_parallel import scale_to_norm_
        self.synchronize()
        max_norm = float(max_norm)
        if not max_norm > 0:
            raise ValueError(f"{type(self).__name__}.clip_grad_norm_: max_norm must be > 0, got {max_norm}")
        params = self._params()
        return scale_to_norm_(params, self.grad_squares(params), max_norm)

    def grad_squares(self, params):
        """Σ ‖g‖² of ``params`` as the unsplit model holds them: the parts' squares added over the group,
        the whole parameters' once (:func:`unsplit_grad_squares`, a collective of the group)."""
        return unsplit_grad_squares(params, type(self).split_parameters(self.model), self._group())

    def reduce_found_inf(self, found_inf: bool) -> bool:
        """Whether any rank of the group (each unscales its own parts) or of the wrapped optimizer's
        data group found an inf or NaN (a collective)."""
        flags = np.array([1.0 if found_inf else 0.0])
        self._group().host_allreduce_(flags)
        return super().reduce_found_inf(bool(flags[0] > 0))

    def _group(self):
        return type(self).split_layers(self.model)[0][1].comm

    def _params(self) -> list:
        return [p for group in self.param_groups for p in group["params"]]

    def state_dict(self) -> dict:
        """This rank's state (its parts); see :meth:`consolidated_state_dict`."""
        return self.optimizer.state_dict()

    def consolidated_state_dict(self) -> dict:
        """The state one process keeps, every array in its parameter's whole shape (a collective)."""
        inner = getattr(self.optimizer, "consolidated_state_dict", None)
        state = inner() if callable(inner) else self.optimizer.state_dict()
        return consolidate_optimizer_state(self.model, state, self._params())

    def check_state_dict(self, state_dict) -> None:
        """Raise ValueError saying what is wrong when ``load_state_dict(state_dict)`` would fail; change nothing."""
        local = local_optimizer_state(self.model, state_dict, self._params())
        inner = self.optimizer
        if not isinstance(inner, WrapsOptimizer) or "check_state_dict" in vars(type(inner)):
            inner.check_state_dict(local)  # a wrapper with a format of its own (Lookahead) checks as it loads

    def load_state_dict(self, state_dict) -> None:
        """Load a state as :meth:`consolidated_state_dict` gives it (whole shapes; any split saved it)."""
        self.optimizer.load_state_dict(local_optimizer_state(self.model, state_dict, self._params()))

    def __repr__(self):
        return f"{type(self).__name__}({self.optimizer!r})"


class TensorParallel(SplitModel):
    """A model holding column- and row-parallel layers (a split GPT, or a DataParallel copy of one), seen
    whole by checkpoints (see :class:`SplitModel`)."""

    split_layers = staticmethod(tensor_parallel_layers)
    how_to_split = ("has no column- or row-parallel layer; split it first (minidl.models.gpt.tensor_parallel "
                    "for a GPT)")


class TensorParallelOptimizer(SplitModelOptimizer):
    """The optimizer of a :class:`TensorParallel` model (see :class:`SplitModelOptimizer`); its clip is
    :func:`clip_grad_norm_` of this module."""

    split_layers = staticmethod(tensor_parallel_layers)
    split_parameters = staticmethod(lambda model: split_parameters(model))  # defined below
    layer_kinds = "column- or row-parallel"

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip by the unsplit model's global gradient norm; returns the norm before clipping. Data-parallel
        gradients are all-reduced first (``synchronize``), so the norm is the global batch's."""
        self.synchronize()
        return clip_grad_norm_(self.model, max_norm)


def split_parameters(model: Module) -> list:
    """The parameters of ``model`` that hold one rank's slice: the column-parallel weights and biases and
    the row-parallel weights (a row-parallel bias is whole on every rank, as are all other parameters)."""
    split = []
    for _, layer in tensor_parallel_layers(model):
        split.append(layer.weight)
        if isinstance(layer, ColumnParallelLinear) and layer.bias is not None:
            split.append(layer.bias)
    return split


def clip_grad_norm_(model: Module, max_norm: float):
    """Clip the gradients of a tensor-parallel ``model`` to the global norm of the unsplit model's.

    The whole model's gradient is the replicated parameters' (equal on every rank of the group) and the
    slices of the split ones, so

        total² = Σ_replicated ‖g‖² + Σ_ranks Σ_split ‖g_r‖²     (one all-reduce of one number)

    and every gradient is scaled by min(1, max_norm / (total + 1e-6)), the rule of
    :func:`minidl.nn.utils.clip_grad_norm_`, which on one rank would see only its slices. A collective:
    every rank of the group calls it. Returns the total norm: a float on the CPU, a 0-d array on a GPU
    (the norm, its all-reduce and the scaling stay on the device: no host read).
    """
    from minidl.parallel.data_parallel import scale_to_norm_
    layers = tensor_parallel_layers(model)
    if not layers:
        raise ValueError("tensor_parallel.clip_grad_norm_: the model has no column- or row-parallel layer; "
                         "use minidl.nn.utils.clip_grad_norm_ for a plain model")
    max_norm = float(max_norm)
    if not max_norm > 0:
        raise ValueError(f"tensor_parallel.clip_grad_norm_: max_norm must be > 0, got {max_norm}")
    params = list(model.parameters())
    return scale_to_norm_(params, unsplit_grad_squares(params, split_parameters(model), layers[0][1].comm), max_norm)


def unsplit_grad_squares(params, split, comm):
    """Σ ‖g‖² over the gradients of ``params`` as the unsplit model holds them: the whole (replicated)
    parameters' once, the ``split`` ones' slices added over ``comm``, the tensor group (one all-reduce
    of one number). The same number on every rank of the group, a 1-element float64 array on the
    gradients' device (:func:`~minidl.parallel.protocol.grad_squares`: no host read)."""
    split = {id(p) for p in split}
    device = next((p.device for p in params if p.grad is not None), "cpu")
    sliced = sum_numbers_(comm, grad_squares([p for p in params if id(p) in split], device))
    whole = grad_squares([p for p in params if id(p) not in split], device)
    with backend.using_array(sliced):
        return sliced + whole
