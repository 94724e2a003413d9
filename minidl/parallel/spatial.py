"""Spatial parallelism: every image of the batch cut along its height into N strips, one per rank.

The systems chapter among minidl's sources ("Training Parallelization") lists it as *spatial*
model parallelism: "the input images get divided spatially, so each device processes over a
certain region ... The output regions then combine to form the full output". Rank r holds rows
r·H/N .. (r+1)·H/N of every image (a strip of h = H/N rows) and convolves only those. A convolution
with a kernel of kH rows (stride 1, 'same' padding p = d·(kH−1)/2 rows, d the dilation) computes
output row i from input rows i−p .. i+p, so the strip's first and last p output rows need p rows
that live on the neighbours: the *halo*. Before each convolution every rank swaps halos:

    to rank r−1: its own first p rows        from rank r−1: that rank's last p rows  (above the strip)
    to rank r+1: its own last p rows         from rank r+1: that rank's first p rows (below the strip)

(``sendrecv_``: neither waits for the other), pads p zero rows only at the image's true edges (the
top of rank 0, the bottom of rank N−1), and convolves the (h + 2p)-row block with no padding along
the height: out comes its own h output rows, exactly those of the whole image. Backward is the
transpose: the gradient of the 2p borrowed rows goes back to their owners, who add it to the
gradient of their own first and last rows.

The weights are replicated: each rank's strip contributes its part of every weight's gradient,
so the convolution uses them through f (:func:`minidl.ops.distributed.copy_to_group`: identity
forward, all-reduce of the gradient backward) and every rank ends the backward with the whole
gradient. A layer that needs the whole feature map (the Flatten → Linear head of a CNN) gets it
from an all-gather of the strips along the height (:func:`minidl.ops.group_gather.gather_from_group`),
and runs on every rank alike, its gradients equal everywhere; the gather's backward keeps each
rank's rows of the map's gradient.

Per convolution of an input (B, C, H, W) and step, a rank with two neighbours sends

    halo:  2 · p · B · C · W values forward (and as many back, where the input needs a gradient)

against B · C · (H/N) · W of its own input: the halo is 2p/h of the strip, so spatial splits pay on
large images (h ≫ p: high-resolution segmentation, 3-D volumes), where a single image's activations
do not fit one device, and stop paying once the strips thin to a few halos. A strip thinner than its
halo (h < p) would need rows of ranks further away: it is refused.

Supported: ``nn.Conv2d`` with stride 1 along the height, an odd kernel height, and 'same' padding
along the height (``padding='same'`` or p = d·(kH−1)/2); width, groups and dilation as the layer
has them (the width is not split). The height must divide evenly over the ranks.
"""
from __future__ import annotations

import minidl.functional as F
from minidl import nn
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.nn.module import Module, WrapsModule
from minidl.ops.distributed import copy_to_group
from minidl.ops.group_gather import gather_from_group, split_to_group
from minidl.parallel.protocol import ParallelModule
from minidl.tensor import as_tensor

__all__ = ["HaloExchange", "SpatialConv2d", "SpatialParallel", "halo_exchange", "halo_rows"]

_ELEMENTWISE = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.Identity)


def _swap(comm, down, up):
    """Send ``down`` to rank+1 and ``up`` to rank−1 (each None where there is no such rank); return
    (what rank−1 sent down, what rank+1 sent up), None at the image's edges. Two phases, each a chain
    along the ranks, so no rank waits for one that is waiting for it."""
    r, n = comm.rank, comm.size
    like = down if down is not None else up
    above = xp_of(like).empty_like(like) if r > 0 else None
    below = xp_of(like).empty_like(like) if r < n - 1 else None
    if 0 < r < n - 1:                                    # rows flow down: r → r+1
        comm.sendrecv_(down, r + 1, above, r - 1)
    elif r < n - 1:
        comm.send(down, r + 1)
    elif r > 0:
        comm.recv_(above, r - 1)
    if 0 < r < n - 1:                                    # rows flow up: r → r−1
        comm.sendrecv_(up, r - 1, below, r + 1)
    elif r > 0:
        comm.send(up, r - 1)
    elif r < n - 1:
        comm.recv_(below, r + 1)
    return above, below


def _rows(x, start, stop):
    return xp_of(x).ascontiguousarray(x[:, :, start:stop])


class HaloExchange(Function):
    """(B, C, h, W) strip → (B, C, h + 2p, W): the neighbours' p rows above and below (zeros at the
    image's edges); backward returns the borrowed rows' gradient to their owners (:class:`HaloReturn`)."""

    def __init__(self, comm, halo: int):
        self.comm, self.halo = comm, halo

    def forward(self, x):
        p, h = self.halo, x.shape[2]
        above, below = _swap(self.comm, down=_rows(x, h - p, h), up=_rows(x, 0, p))
        xp = xp_of(x)
        edge = xp.zeros(x.shape[:2] + (p,) + x.shape[3:], x.dtype)
        return xp.concatenate([edge if above is None else above, x, edge if below is None else below], axis=2)

    def backward(self, gy):
        return (HaloReturn(self.comm, self.halo)(gy),)


class HaloReturn(Function):
    """(B, C, h + 2p, W) gradient → (B, C, h, W): the own rows', plus what the neighbours computed for this
    rank's first and last p rows (the transpose of :class:`HaloExchange`, whose op its backward is)."""

    def __init__(self, comm, halo: int):
        self.comm, self.halo = comm, halo

    def forward(self, gy):
        p = self.halo
        h = gy.shape[2] - 2 * p
        from_above, from_below = _swap(self.comm, down=_rows(gy, p + h, h + 2 * p), up=_rows(gy, 0, p))
        gx = gy[:, :, p:p + h].copy()
        if from_above is not None:
            gx[:, :, :p] += from_above
        if from_below is not None:
            gx[:, :, h - p:] += from_below
        return gx

    def backward(self, g):
        return (HaloExchange(self.comm, self.halo)(g),)


def halo_exchange(x, halo: int, comm):
    """This rank's strip ``x`` (B, C, h, W) with ``halo`` rows of each neighbour added above and below
    (zeros at the image's edges): (B, C, h + 2·halo, W). A collective of ``comm`` (point to point)."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"halo_exchange: expected a strip (B, C, h, W), got shape {tuple(x.shape)}")
    if halo > x.shape[2]:
        raise ValueError(f"halo_exchange: this rank's strip has {x.shape[2]} rows, thinner than the halo of "
                         f"{halo} rows its neighbours need; use fewer ranks or a taller image")
    return HaloExchange(comm, int(halo))(x) if halo else x


def halo_rows(conv) -> int:
    """The halo p an ``nn.Conv2d`` needs from each neighbour (its 'same' padding along the height), after
    checking that it can run on strips: stride 1 along the height, an odd kernel height, 'same' padding
    there. Raises ValueError naming what to change."""
    (kh, kw), (sh, _), (dh, _) = conv.kernel_size, conv.stride, conv.dilation
    owner = f"SpatialConv2d.from_layer({conv!r})"
    if sh != 1:
        raise ValueError(f"{owner}: stride {sh} along the height; a spatial split needs stride 1 there (strided "
                         "strips would start at different phases); downsample after gathering")
    if kh % 2 == 0:
        raise ValueError(f"{owner}: kernel height {kh} is even; a halo needs an odd kernel (the same rows above "
                         "and below each output row)")
    p = dh * (kh - 1) // 2
    if conv.padding == "same":
        if kw % 2 == 0:
            raise ValueError(f"{owner}: padding='same' with an even kernel width {kw} pads unevenly; use an odd "
                             "kernel or integer padding")
    elif conv.padding == "valid" or conv.padding[0] != p:
        got = 0 if conv.padding == "valid" else conv.padding[0]
        raise ValueError(f"{owner}: padding {got} along the height; a spatial split needs 'same' "
                         f"padding there ({p} = dilation·(kernel−1)/2) so that every strip keeps its rows; "
                         f"use padding={p} or padding='same'")
    return p


class SpatialConv2d(Module):
    """A Conv2d run on this rank's strip of rows: halo exchange, then the convolution with no padding along
    the height (zeros came from the exchange at the image's edges), the weights used through f.

    ``SpatialConv2d.from_layer(conv, comm)`` shares ``conv``'s weight and bias (the same Parameter
    objects: the weights are replicated). Input: this rank's (B, C_in, h, W) strip; output: its
    (B, C_out, h, W') strip of the whole image's output.
    """

    @classmethod
    def from_layer(cls, conv, comm) -> "SpatialConv2d":
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"SpatialConv2d.from_layer: expected an nn.Conv2d, got {type(conv).__name__}")
        halo = halo_rows(conv)
        layer = cls.__new__(cls)
        Module.__init__(layer)
        layer.comm, layer.halo, layer.in_channels = comm, halo, conv.in_channels
        kw, dw = conv.kernel_size[1], conv.dilation[1]
        layer.width_padding = dw * (kw - 1) // 2 if conv.padding == "same" else conv.padding[1]
        layer.stride, layer.dilation, layer.groups = conv.stride, conv.dilation, conv.groups
        layer.weight = conv.weight
        if conv.bias is not None:
            layer.bias = conv.bias
        else:
            layer.register_parameter("bias", None)
        return layer

    def forward(self, strip):
        if strip.ndim != 4 or strip.shape[1] != self.in_channels:
            raise ValueError(f"SpatialConv2d: expected this rank's strip (B, {self.in_channels}, h, W), got "
                             f"shape {tuple(strip.shape)}")
        if strip.shape[2] < self.halo:
            raise ValueError(f"SpatialConv2d: rank {self.comm.rank}'s strip has {strip.shape[2]} rows, thinner "
                             f"than the halo of {self.halo} rows each neighbour needs (kernel height "
                             f"{self.weight.shape[2]}); use at most H // {self.halo} ranks, or a taller image")
        x = halo_exchange(strip, self.halo, self.comm)
        bias = None if self.bias is None else copy_to_group(self.bias, self.comm)
        return F.conv2d(x, copy_to_group(self.weight, self.comm), bias, self.stride, (0, self.width_padding),
                        self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.weight.shape[0]}, kernel_size={tuple(self.weight.shape[2:])}, "
                f"halo={self.halo}, rank={self.comm.rank} of {self.comm.size}")


class SpatialParallel(WrapsModule, ParallelModule):
    """An ``nn.Sequential`` CNN run on strips of rows: ``SpatialParallel(model, comm)``.

    The leading run of ``model``'s layers made of Conv2d and elementwise layers (ReLU, GELU, Tanh,
    Sigmoid, LeakyReLU, Identity) runs on this rank's strip, each Conv2d turned into a
    :class:`SpatialConv2d` in place (the same parameters, the same state-dict keys); the strips are then
    all-gathered along the height, and the layers from the first other one (Flatten) on run on the
    whole map, alike on every rank. ``forward(x)`` takes the whole batch (B, C, H, W), the same on
    every rank, and cuts this rank's rows (whose gradient, if x needs one, is gathered back whole).

    Every parameter's gradient is whole on every rank after backward and the loss is the whole
    batch's, so the optimizer needs no wrapper and a checkpoint is ``state_dict()`` (the protocol's
    defaults: :mod:`minidl.parallel.protocol`).
    """

    def __init__(self, module, comm=None):
        super().__init__()
        if not isinstance(module, nn.Sequential):
            raise TypeError(f"SpatialParallel: expected an nn.Sequential, got {type(module).__name__}; build the "
                            "strip-wise part from SpatialConv2d, halo_exchange and gather_from_group by hand")
        if comm is None:
            from minidl.parallel.world import init
            comm = init()
        if not callable(getattr(comm, "sendrecv_", None)) or not hasattr(comm, "size"):
            raise TypeError(f"SpatialParallel: needs a communicator of minidl.parallel, got {type(comm).__name__}")
        layers = list(module)
        cut = 0
        while cut < len(layers) and isinstance(layers[cut], (nn.Conv2d, SpatialConv2d) + _ELEMENTWISE):
            if isinstance(layers[cut], nn.Conv2d):
                module[cut] = SpatialConv2d.from_layer(layers[cut], comm)
            cut += 1
        if not any(isinstance(layer, SpatialConv2d) for layer in list(module)[:cut]):
            raise ValueError("SpatialParallel: the model does not start with convolutions (through elementwise "
                             f"layers only); its first layer is {type(layers[0]).__name__ if layers else 'none'}")
        self.module, self.comm, self.cut = module, comm, cut

    def forward(self, x):
        x = as_tensor(x)
        if x.ndim != 4 or x.shape[2] % self.comm.size:
            raise ValueError(f"SpatialParallel: expected images (B, C, H, W) whose height divides by the "
                             f"{self.comm.size} ranks, got shape {tuple(x.shape)}; crop or pad the height to a "
                             f"multiple of {self.comm.size}")
        layers = list(self.module)
        h = split_to_group(x, self.comm, axis=2)
        for layer in layers[:self.cut]:
            h = layer(h)
        h = gather_from_group(h, self.comm, axis=2)
        for layer in layers[self.cut:]:
            h = layer(h)
        return h
