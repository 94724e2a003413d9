"""Filter-wise parallelism: a Conv2d's filters (output channels) split across the N ranks of a group.

A convolution Y = W ⋆ X + b with W of shape (C_out, C_in, kH, kW) computes each output channel
from one filter W[o] alone, so its filters split the way a Linear's output rows do
(tensor parallelism's column split; the systems chapter among minidl's sources, "Training
Parallelization", lists it as *filter-wise* model parallelism: "each device computes activation
outputs for a subset of filters, which get concatenated before propagating further"):

    filter-wise (output channels):  W = [W_0; ...; W_{N−1}]  rank r: filters r·C_out/N .. (r+1)·C_out/N
                                    Y_r = W_r ⋆ f(X) + b_r        every rank convolves the whole input
                                    Y = gather_c(Y_0, ..., Y_{N−1})   (all-gather along the channel axis)
    input-channel (the row split):  W = [W_0, ..., W_{N−1}]  rank r: input channels r·C_in/N .. (r+1)·C_in/N
                                    Y = g(Σ_r W_r ⋆ X_r) + b        each rank holds a partial sum (all-reduce)

with f and g the conjugate ops of :mod:`minidl.ops.distributed` (f: identity forward, all-reduce
of the input's gradient backward) and gather_c that of :mod:`minidl.ops.group_gather` (all-gather
forward, this rank's channels of the gradient backward). A filter-wise layer that keeps its output
split (``gather_output=False``) hands rank r exactly the input channels X_r that an input-channel
layer takes, and an elementwise function between them (ReLU) works on each part alone: the pair
costs one all-reduce forward and one backward, as Megatron-LM's column- then row-parallel MLP.

Per layer and step, each rank sends (payloads, as ``comm.traffic`` counts them):

    filter-wise, gathered:  all-gather  B·(C_out/N)·H'·W'  forward;  all-reduce  B·C_in·H·W  backward
    filter → input-channel: all-reduce  B·C_out₂·H''·W''   forward;  all-reduce  B·C_in₁·H·W  backward

(a backward all-reduce only where the input needs a gradient: not for the image). Each rank holds
1/N of the split weights and computes 1/N of the multiply-adds; the activations cross the wire in
every layer, so the split pays where the filters are many and large and the maps small (the deep
layers of a CNN), on a fast link.

Channel counts must divide evenly over the ranks: an uneven split is refused with the divisors to
choose from (the gathered parts are equal, as NCCL's all-gather needs).
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.nn.module import Module, Parameter
from minidl.ops.distributed import copy_to_group, sum_over_group
from minidl.ops.group_gather import gather_from_group
from minidl.parallel.tensor_parallel import SplitModel, SplitModelOptimizer
from minidl.parallel.whole_state import SplitLayer

__all__ = ["FilterParallel", "FilterParallelConv2d", "FilterParallelOptimizer", "InputChannelParallelConv2d",
           "filter_parallel", "filter_parallel_layers"]


def _group(comm, owner: str):
    if comm is None:
        from minidl.parallel.world import init
        comm = init()
    if not callable(getattr(comm, "allreduce_", None)) or not hasattr(comm, "size"):
        raise TypeError(f"{owner}: needs a communicator of minidl.parallel (parallel.init() or "
                        f"Mesh(...).group('tensor')), got {type(comm).__name__}")
    return comm


def _check_conv(owner: str, conv) -> None:
    if not isinstance(conv, nn.Conv2d):
        raise TypeError(f"{owner}.from_layer: expected an nn.Conv2d, got {type(conv).__name__}")
    if conv.groups != 1:
        raise ValueError(f"{owner}.from_layer: {conv!r} has groups={conv.groups}; only groups=1 convolutions "
                         "split by channels (a grouped one couples input and output channel slices)")


def _check_divides(owner: str, what: str, count: int, ranks: int) -> None:
    if count % ranks:
        divisors = ", ".join(str(d) for d in range(1, count + 1) if count % d == 0)
        raise ValueError(f"{owner}: {what} ({count}) does not split evenly over {ranks} ranks; run on a number "
                         f"of ranks among {divisors}, or change {what}")


def _part(total: int, ranks: int, rank: int) -> slice:
    size = total // ranks
    return slice(rank * size, (rank + 1) * size)


def _copy_conv_settings(layer, conv) -> None:
    layer.in_channels, layer.out_channels = conv.in_channels, conv.out_channels
    layer.kernel_size, layer.stride, layer.padding = conv.kernel_size, conv.stride, conv.padding
    layer.dilation = conv.dilation


def _parameter(layer, name: str):
    p = getattr(layer, name, None) if name in ("weight", "bias") else None
    if p is None:
        raise ValueError(f"{type(layer).__name__}: no parameter {name!r}")
    return p


def _check_shape(layer, name, array, want, which: str, what):
    got = tuple(np.shape(array))
    if got != tuple(want):
        raise ValueError(f"{what or type(layer).__name__ + '.' + name}: got shape {got}, but {which} has shape "
                         f"{tuple(want)} (rank {layer.comm.rank} of {layer.comm.size}); a checkpoint holds the "
                         "whole (unsplit) weights: consolidated_state_dict(model) on every rank")


class FilterParallelConv2d(SplitLayer):
    """Y_r = W_r ⋆ f(X) + b_r: this rank's filters (output channels) of a Conv2d, on the whole input.

    ``FilterParallelConv2d.from_layer(conv, comm, gather_output=True)`` keeps filters
    ``r·C_out/N .. (r+1)·C_out/N`` of ``conv`` (an ``nn.Conv2d`` with groups=1) and their biases.
    With ``gather_output`` the ranks' outputs are all-gathered along the channel axis, so every rank
    holds the whole (B, C_out, H', W') map; without it, this rank's (B, C_out/N, H', W') part, for an
    :class:`InputChannelParallelConv2d` to take next. Every other setting (stride, padding,
    dilation) is the layer's. Raises ValueError when C_out does not divide by the group's size.
    """

    @classmethod
    def from_layer(cls, conv, comm=None, gather_output: bool = True) -> "FilterParallelConv2d":
        owner = "FilterParallelConv2d"
        _check_conv(owner, conv)
        comm = _group(comm, owner)
        _check_divides(f"{owner}.from_layer({conv!r})", "out_channels", conv.out_channels, comm.size)
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.comm, layer.gather_output = comm, bool(gather_output)
        _copy_conv_settings(layer, conv)
        rows = _part(conv.out_channels, comm.size, comm.rank)
        layer.weight = Parameter(conv.weight.array[rows].copy())
        if conv.bias is not None:
            layer.bias = Parameter(conv.bias.array[rows].copy())
        else:
            layer.register_parameter("bias", None)
        return layer

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"FilterParallelConv2d({self.in_channels}, {self.out_channels}): expected input "
                             f"(N, {self.in_channels}, H, W), got shape {tuple(x.shape)}")
        y = F.conv2d(copy_to_group(x, self.comm), self.weight, self.bias, self.stride, self.padding, self.dilation)
        return gather_from_group(y, self.comm, axis=1) if self.gather_output else y

    def whole_shape(self, name: str) -> tuple:
        return (self.out_channels,) + tuple(_parameter(self, name).shape[1:])

    def gather_whole(self, name: str, array, what: str | None = None):
        """This rank's filters (the weight, its bias, or an optimizer's moment of either) -> the whole
        layer's, all-gathered in rank order (a collective of the group)."""
        _check_shape(self, name, array, _parameter(self, name).shape, "this rank's part", what)
        xp = backend.xp_of(array)
        parts = self.comm.allgather(xp.ascontiguousarray(array))
        return parts.reshape(self.whole_shape(name))

    def slice_whole(self, name: str, array, what: str | None = None):
        """The whole layer's array -> this rank's filters (no communication)."""
        _check_shape(self, name, array, self.whole_shape(name), "the whole parameter", what)
        xp = backend.xp_of(array)
        return xp.ascontiguousarray(xp.asarray(array)[_part(self.out_channels, self.comm.size, self.comm.rank)])

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels} (this rank: {self.weight.shape[0]}), "
                f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"gather_output={self.gather_output}, rank={self.comm.rank} of {self.comm.size}")


class InputChannelParallelConv2d(SplitLayer):
    """Y = g(Σ_r W_r ⋆ X_r) + b: this rank's input channels of a Conv2d's filters, summed over the group.

    The input is already split (X_r: this rank's C_in/N channels, as a :class:`FilterParallelConv2d`
    with ``gather_output=False`` leaves them); the partial convolutions are all-reduced and the bias,
    whole on every rank, added once. ``from_layer(conv, comm)`` keeps columns ``r·C_in/N .. (r+1)·C_in/N``
    of the weight. The row-parallel linear's analogue.
    """

    @classmethod
    def from_layer(cls, conv, comm=None) -> "InputChannelParallelConv2d":
        owner = "InputChannelParallelConv2d"
        _check_conv(owner, conv)
        comm = _group(comm, owner)
        _check_divides(f"{owner}.from_layer({conv!r})", "in_channels", conv.in_channels, comm.size)
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.comm = comm
        _copy_conv_settings(layer, conv)
        layer.weight = Parameter(conv.weight.array[:, _part(conv.in_channels, comm.size, comm.rank)].copy())
        if conv.bias is not None:
            layer.bias = Parameter(conv.bias.array.copy())
        else:
            layer.register_parameter("bias", None)
        return layer

    def forward(self, x):
        part = self.in_channels // self.comm.size
        if x.ndim != 4 or x.shape[1] != part:
            raise ValueError(f"InputChannelParallelConv2d({self.in_channels}, {self.out_channels}): expected this "
                             f"rank's (N, {part}, H, W) part of the input channels (in_channels / "
                             f"{self.comm.size} ranks), got shape {tuple(x.shape)}")
        y = sum_over_group(F.conv2d(x, self.weight, None, self.stride, self.padding, self.dilation), self.comm)
        return y if self.bias is None else y + self.bias.reshape(1, -1, 1, 1)

    def whole_shape(self, name: str) -> tuple:
        shape = tuple(_parameter(self, name).shape)
        return (shape[0], self.in_channels) + shape[2:] if name == "weight" else shape

    def gather_whole(self, name: str, array, what: str | None = None):
        """This rank's input channels of the weight -> the whole weight (an all-gather); the bias is whole."""
        _check_shape(self, name, array, _parameter(self, name).shape, "this rank's part", what)
        xp = backend.xp_of(array)
        if name == "bias":
            return xp.array(array, copy=True)
        parts = self.comm.allgather(xp.ascontiguousarray(array))        # (N, C_out, C_in/N, kH, kW)
        return xp.ascontiguousarray(xp.moveaxis(parts, 0, 1)).reshape(self.whole_shape(name))

    def slice_whole(self, name: str, array, what: str | None = None):
        """The whole layer's array -> this rank's input channels of the weight (the bias: a copy)."""
        _check_shape(self, name, array, self.whole_shape(name), "the whole parameter", what)
        xp = backend.xp_of(array)
        if name == "bias":
            return xp.array(array, copy=True)
        return xp.ascontiguousarray(xp.asarray(array)[:, _part(self.in_channels, self.comm.size, self.comm.rank)])

    def extra_repr(self):
        return (f"{self.in_channels} (this rank: {self.weight.shape[1]}), {self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"rank={self.comm.rank} of {self.comm.size}")


_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.Identity)


def filter_parallel(model, comm=None, pair: bool = True):
    """The ``nn.Sequential`` ``model`` with its Conv2d layers split filter-wise over ``comm`` (in place).

    With ``pair`` (Megatron's pairing), a convolution followed, through elementwise layers only
    (ReLU, GELU, Tanh, Sigmoid, LeakyReLU, Identity), by another becomes a filter-wise layer that keeps its
    output split, and that next one an :class:`InputChannelParallelConv2d`; every other convolution
    is filter-wise with its output gathered. Without ``pair`` every convolution is filter-wise and
    gathered. The layers keep their places, so state-dict keys are the plain model's.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"filter_parallel: expected an nn.Sequential, got {type(model).__name__}; split other "
                        "models layer by layer with FilterParallelConv2d.from_layer")
    comm = _group(comm, "filter_parallel")
    layers = list(model)
    i = 0
    while i < len(layers):
        if isinstance(layers[i], nn.Conv2d):
            j = i + 1
            while j < len(layers) and isinstance(layers[j], _ELEMENTWISE):
                j += 1
            paired = pair and j < len(layers) and isinstance(layers[j], nn.Conv2d)
            model[i] = FilterParallelConv2d.from_layer(layers[i], comm, gather_output=not paired)
            if paired:
                model[j] = InputChannelParallelConv2d.from_layer(layers[j], comm)
                i = j
        i += 1
    if not filter_parallel_layers(model):
        raise ValueError("filter_parallel: the model has no nn.Conv2d to split")
    return model


def filter_parallel_layers(model: Module) -> list:
    """``(name, layer)`` of every filter-wise and input-channel-split convolution of ``model``."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (FilterParallelConv2d, InputChannelParallelConv2d))]


def _split_parameters(model: Module) -> list:
    """The parameters holding one rank's part: filter-wise weights and biases, input-channel weights."""
    split = []
    for _, layer in filter_parallel_layers(model):
        split.append(layer.weight)
        if isinstance(layer, FilterParallelConv2d) and layer.bias is not None:
            split.append(layer.bias)
    return split


class FilterParallel(SplitModel):
    """A model holding filter-wise split convolutions, seen whole by checkpoints (the Trainer's protocol;
    see :class:`~minidl.parallel.tensor_parallel.SplitModel`)."""

    split_layers = staticmethod(filter_parallel_layers)
    how_to_split = "has no filter-wise split convolution; split it first (filter_parallel(model, comm))"


class FilterParallelOptimizer(SplitModelOptimizer):
    """The optimizer of a :class:`FilterParallel` model: its state whole in checkpoints, its clip the
    unsplit model's global norm (the parts' squares added over the group)."""

    split_layers = staticmethod(filter_parallel_layers)
    split_parameters = staticmethod(_split_parameters)
    layer_kinds = "filter-wise split convolution"
