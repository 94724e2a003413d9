"""Structured pruning: remove whole neurons and filters, and get a smaller dense network.

    small = nn.structured_prune.prune_channels(model, amount=0.5)   # half the hidden channels of each layer
    nn.utils.count_parameters(small)                                 # about a quarter of the weights left
    fine-tune small a few epochs

Unstructured pruning (:mod:`minidl.nn.prune`) zeroes single weights: the
matrices keep their shapes, and only sparse kernels could skip the zeros.
Structured pruning (Li, Kadav, Durdanovic, Samet and Graf, 2017, "Pruning
Filters for Efficient ConvNets") removes an output channel (a Linear's
neuron, a Conv2d's filter) with everything that reads it: the row of the
layer's weight and its bias, its entries in a BatchNorm between, and the
column (or, after a Flatten, the block of columns) of the next layer's
weight. What is left is an ordinary smaller network, faster with the same
dense kernels.

Which channels go: those whose weights have the smallest norm,

    score_c = Σ |W[c, ...]|        (L1, Li et al.'s choice)   or   sqrt(Σ W[c, ...]²)   (L2)

a filter of small weights produces small activations and matters little to
the next layer. The scores of every layer are computed from the original
network first, then the layers are cut (Li et al.'s "independent"
pruning). ``amount`` is the fraction of channels removed in every hidden
layer (at least one kept); the network's output layer keeps all its
channels. Removing a channel gives exactly what the original network
computes with that channel's input weights to the next layer set to zero;
fine-tuning afterwards recovers most of the loss.

Supported networks: an ``nn.Sequential`` whose Linear and Conv2d (groups=1)
layers are separated only by layers that act on each channel alone
(activations, dropout, pooling, BatchNorm1d/2d) and Flatten.
"""
from __future__ import annotations

import copy

import numpy as np

from minidl import backend
from minidl.nn.activation import SiLU
from minidl.nn.containers import Identity, Sequential
from minidl.nn.conv import Conv2d
from minidl.nn.dropout import Dropout1d, Dropout2d
from minidl.nn.layers import ELU, GELU, Dropout, Flatten, LeakyReLU, Linear, ReLU, Sigmoid, Tanh
from minidl.nn.module import Parameter
from minidl.nn.norm import BatchNorm1d, BatchNorm2d
from minidl.nn.pooling import AvgPool2d, MaxPool2d
from minidl.tensor import Tensor

__all__ = ["channel_norms", "channels_to_keep", "prune_channels"]

_NORMS = {"l1": 1, "l2": 2}
# Layers that act on each channel alone (or only reshape, as Flatten): a channel can be removed through them.
_CHANNELWISE = (ReLU, LeakyReLU, ELU, GELU, SiLU, Tanh, Sigmoid, Dropout, Dropout1d, Dropout2d, Identity, MaxPool2d,
                AvgPool2d, BatchNorm1d, BatchNorm2d, Flatten)


def channel_norms(layer, norm: str = "l1") -> np.ndarray:
    """The L1 or L2 norm of each output channel's weights: rows of a Linear's, filters of a Conv2d's."""
    if norm not in _NORMS:
        raise ValueError(f"channel_norms: norm must be 'l1' or 'l2', got {norm!r}")
    if not isinstance(layer, (Linear, Conv2d)):
        raise TypeError(f"channel_norms: expected nn.Linear or nn.Conv2d, got {type(layer).__name__}")
    rows = backend.to_numpy(layer.weight.array).astype(np.float64).reshape(layer.weight.shape[0], -1)
    return np.abs(rows).sum(axis=1) if norm == "l1" else np.sqrt((rows * rows).sum(axis=1))


def channels_to_keep(scores: np.ndarray, amount: float) -> np.ndarray:
    """Sorted indices of the channels kept: all but the ``round(amount · C)`` lowest scores (at least one)."""
    count = len(scores)
    keep = max(1, count - int(round(amount * count)))
    return np.sort(np.argsort(-scores, kind="stable")[:keep])


def _take(param, index, axis: int):
    xp = backend.xp_of(param.array)
    return Parameter(xp.ascontiguousarray(xp.take(param.array, xp.asarray(index), axis=axis)),
                     requires_grad=param.requires_grad)


def _check(model, amount, norm) -> list:
    if not isinstance(model, Sequential):
        raise TypeError(f"prune_channels: expected an nn.Sequential, got {type(model).__name__}")
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0.0 <= amount < 1.0:
        raise ValueError(f"prune_channels: amount is the fraction of channels removed per layer, in [0, 1); "
                         f"got {amount!r}")
    if norm not in _NORMS:
        raise ValueError(f"prune_channels: norm must be 'l1' or 'l2', got {norm!r}")
    layers = list(model)
    producers = [i for i, m in enumerate(layers) if isinstance(m, (Linear, Conv2d))]
    if len(producers) < 2:
        raise ValueError("prune_channels: needs at least two Linear/Conv2d layers (the last one is the output "
                         f"and keeps its channels); the model has {len(producers)}")
    for i in producers:
        if isinstance(layers[i], Conv2d) and layers[i].groups != 1:
            raise ValueError(f"prune_channels: layer {i} is a grouped Conv2d (groups={layers[i].groups}); "
                             "only groups=1 can be pruned")
    for i, j in zip(producers, producers[1:]):
        for k in range(i + 1, j):
            if not isinstance(layers[k], _CHANNELWISE):
                raise ValueError(f"prune_channels: layer {k} ({type(layers[k]).__name__}) between layers {i} and "
                                 f"{j} mixes channels, so a channel cannot be removed through it")
    return producers


def prune_channels(model, amount: float, norm: str = "l1"):
    """A smaller copy of ``model`` with ``amount`` of each hidden Linear/Conv2d layer's channels removed.

    ``model`` is unchanged. See the module docstring for the rule and the networks supported.
    """
    producers = _check(model, amount, norm)
    new = copy.deepcopy(model)
    layers = list(new)
    keeps = {i: channels_to_keep(channel_norms(layers[i], norm), amount) for i in producers[:-1]}
    for i, j in zip(producers, producers[1:]):
        keep, producer, consumer = keeps[i], layers[i], layers[j]
        producer.weight = _take(producer.weight, keep, 0)
        if producer.bias is not None:
            producer.bias = _take(producer.bias, keep, 0)
        if isinstance(producer, Linear):
            producer.out_features = len(keep)
        else:
            producer.out_channels = len(keep)
        flattened = False
        for module in layers[i + 1:j]:
            if isinstance(module, (BatchNorm1d, BatchNorm2d)):
                module.num_features = len(keep)
                for name in ("weight", "bias"):
                    if getattr(module, name) is not None:
                        setattr(module, name, _take(getattr(module, name), keep, 0))
                for name in ("running_mean", "running_var"):
                    buffer = getattr(module, name)
                    if buffer is not None:
                        module.register_buffer(name, Tensor(buffer.array[backend.xp_of(buffer.array).asarray(keep)]))
            flattened |= isinstance(module, Flatten)
        columns = keep
        if flattened:         # after a Flatten, channel c is the block of columns [c·HW, (c + 1)·HW)
            spatial = consumer.in_features // model[i].weight.shape[0]
            columns = (keep[:, None] * spatial + np.arange(spatial)[None, :]).ravel()
        consumer.weight = _take(consumer.weight, columns, 1)
        if isinstance(consumer, Linear):
            consumer.in_features = len(columns)
        else:
            consumer.in_channels = len(columns)
    return new
