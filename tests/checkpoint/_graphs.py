"""Networks with skip connections for the graph planner's tests and notebook 32: as an nn.Sequential of
Residual blocks (what the chain schedules see) and as a LayerGraph sharing its modules (what Checkmate sees)."""
import numpy as np

import minidl as mdl
from minidl import nn
from minidl.checkpoint.graph import Add, LayerGraph
from minidl.roofline import opcosts


def residual_stack(blocks=2, width=256, batch=256, seed=0):
    """A Linear stem, then ``blocks`` × Residual(Linear, ReLU, Linear, ReLU); float32 input and output gradient."""
    mdl.manual_seed(seed)

    def block():
        return nn.Residual(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()))
    model = nn.Sequential(nn.Linear(width, width), *[block() for _ in range(blocks)])
    rng = np.random.default_rng(seed)
    x = mdl.tensor(rng.standard_normal((batch, width)).astype(np.float32))
    gy = mdl.tensor(rng.standard_normal((batch, width)).astype(np.float32))
    return model, LayerGraph.from_sequential(model), x, gy


def unet_like(width=128, batch=256, seed=0):
    """Down, bottleneck and up paths whose encoder outputs are added back into the decoder (U-Net's skips)."""
    mdl.manual_seed(seed)
    graph = LayerGraph()
    graph.add("enc1", nn.Linear(width, width))
    graph.add("act1", nn.Tanh(), "enc1")
    graph.add("enc2", nn.Linear(width, width), "act1")
    graph.add("act2", nn.Tanh(), "enc2")
    graph.add("mid", nn.Linear(width, width), "act2")
    graph.add("dec2", nn.Linear(width, width), "mid")
    graph.add("skip2", Add(), "dec2", "act2")
    graph.add("dec1", nn.Linear(width, width), "skip2")
    graph.add("skip1", Add(), "dec1", "act1")
    rng = np.random.default_rng(seed)
    x = mdl.tensor(rng.standard_normal((batch, width)).astype(np.float32))
    gy = mdl.tensor(rng.standard_normal((batch, width)).astype(np.float32))
    return graph, x, gy


def flops(layer, shape, phase="forward"):
    """The roofline's FLOP count of one layer on an input of ``shape`` (Residual: the sum of its body's)."""
    if isinstance(layer, nn.Residual):
        return sum(flops(inner, shape, phase) for inner in layer.body)
    if isinstance(layer, nn.Linear):
        cost = opcosts.linear(shape[0], layer.in_features, layer.out_features)
    elif isinstance(layer, nn.ReLU):
        cost = opcosts.relu(shape)
    elif isinstance(layer, nn.Tanh):
        cost = opcosts.exp(shape)  # one elementary function an element, as exp
    elif isinstance(layer, Add):
        cost = opcosts.add(shape)
    else:
        raise TypeError(f"flops: no cost for {type(layer).__name__}")
    return getattr(cost, phase).flops


def flop_costs():
    """profile_graph's cost and backward_cost arguments from :func:`flops`."""
    return dict(cost=lambda i, layer, inputs: flops(layer, inputs[0].shape),
                backward_cost=lambda i, layer, inputs: flops(layer, inputs[0].shape, "backward"))
