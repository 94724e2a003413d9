"""Layers and models: ``from minidl import nn``.

    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    logits = model(x);  model.parameters();  model.state_dict();  model.eval()

Every layer keeps PyTorch's constructor signature, weight names and layouts
and default initialization (each documented in its docstring), so models
and state dicts carry over. Initializers and the textbook's bias rules are in
:mod:`minidl.nn.init`.
"""
from minidl.nn import functional, init, lora, prune, sparse, structured_prune, utils
from minidl.nn.activation import (
    CELU,
    GLU,
    SELU,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LogSigmoid,
    LogSoftmax,
    Mish,
    PReLU,
    ReLU6,
    SiLU,
    Softmin,
    Softplus,
    Softsign,
)
from minidl.nn.containers import Identity, ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from minidl.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from minidl.nn.deq import DEQ  # a deep equilibrium layer: z* = f(z*, x), implicit gradients
from minidl.nn.dropout import Dropout1d, Dropout2d
from minidl.nn.layers import (
    ELU,
    GELU,
    Dropout,
    Embedding,
    Flatten,
    LeakyReLU,
    Linear,
    ReLU,
    Residual,
    Sigmoid,
    Softmax,
    Tanh,
    Unflatten,
)
from minidl.nn.lora import LoRALinear
from minidl.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from minidl.nn.module import IncompatibleKeys, Module, Parameter, StateDictError
from minidl.nn.moe import MoE
from minidl.nn.norm import (
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
    BatchRenorm1d,
    BatchRenorm2d,
    GroupNorm,
    InstanceNorm1d,
    InstanceNorm2d,
    InstanceNorm3d,
    LayerNorm,
    RMSNorm,
)
from minidl.nn.pooling import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    MaxUnpool1d,
    MaxUnpool2d,
)
from minidl.nn.recurrent import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from minidl.nn.resample import PixelShuffle, PixelUnshuffle, Upsample
from minidl.nn.transformer import (
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__all__ = [
    "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv1d", "Conv2d", "Dropout", "ELU", "Embedding", "Flatten", "GELU",
    "GRU", "GroupNorm", "Identity", "IncompatibleKeys", "LSTM", "LayerNorm", "LeakyReLU", "Linear", "MaxPool2d",
    "Module", "ModuleList", "Parameter", "RNN", "ReLU", "Residual", "Sequential", "Sigmoid", "Softmax",
    "StateDictError", "Tanh", "init", "CELU", "GLU", "Hardsigmoid", "Hardswish", "Hardtanh", "LogSigmoid",
    "LogSoftmax", "Mish", "PReLU", "ReLU6", "SELU", "SiLU", "Softmin", "Softplus", "Softsign", "Unflatten",
    "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss", "NLLLoss",
    "SmoothL1Loss", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AvgPool1d",
    "ConvTranspose1d", "ConvTranspose2d", "MaxPool1d", "MaxUnpool1d", "MaxUnpool2d", "PixelShuffle",
    "PixelUnshuffle", "Upsample", "Dropout1d", "Dropout2d", "GRUCell", "InstanceNorm1d", "InstanceNorm2d",
    "LSTMCell", "ModuleDict", "ParameterDict", "ParameterList", "RMSNorm", "RNNCell", "functional", "utils",
    "MultiheadAttention", "TransformerEncoder", "TransformerEncoderLayer", "prune", "sparse",
    "LoRALinear", "lora", "structured_prune",
    "BatchRenorm1d", "BatchRenorm2d",
    "Conv3d", "ConvTranspose3d", "MaxPool3d", "AvgPool3d", "BatchNorm3d", "InstanceNorm3d",
    "Transformer", "TransformerDecoder", "TransformerDecoderLayer",
    "DEQ",
    "MoE",
]
