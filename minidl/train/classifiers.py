"""The named classifiers of ``minidl train --model NAME``, built for an input shape and a class count.

    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)

``mlp``: Flatten, then Linear-ReLU blocks (128 and 64 units by default), then a
Linear layer to the class scores. Hidden layers start from Kaiming-normal
weights (the ReLU rule, Var(w) = 2 / fan_in) and zero biases; the last layer
keeps the small default initialization, so the initial loss is close to ln K.

``cnn``: two blocks of 3x3 convolution (padding 1), ReLU and 2x2 max pooling
(a block pools only while the image is at least 4 pixels wide), then a small
MLP head. It needs images ``(channels, height, width)``.
"""
from __future__ import annotations

import numpy as np

from minidl import nn
from minidl.nn import init

MODELS = ("mlp", "cnn")


def _check_shape(input_shape) -> tuple:
    shape = tuple(int(s) for s in input_shape)
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(f"build_model: input_shape must be the shape of one sample (positive sizes), "
                         f"got {input_shape!r}")
    return shape


def mlp(input_shape, num_classes: int, hidden=(128, 64), dropout: float = 0.0) -> nn.Sequential:
    """Flatten → [Linear → ReLU (→ Dropout)] per hidden width → Linear to ``num_classes`` scores."""
    shape = _check_shape(input_shape)
    width = int(np.prod(shape))
    layers = [nn.Flatten()] if len(shape) > 1 else []
    for units in hidden:
        linear = nn.Linear(width, int(units))
        init.kaiming_normal_(linear.weight, nonlinearity="relu")
        init.zeros_(linear.bias)
        layers += [linear, nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = int(units)
    layers.append(nn.Linear(width, int(num_classes)))
    return nn.Sequential(*layers)


def cnn(input_shape, num_classes: int, channels=(16, 32), hidden: int = 64, dropout: float = 0.0) -> nn.Sequential:
    """[Conv3x3 → ReLU → MaxPool2x2] per entry of ``channels``, Flatten, Linear → ReLU → Linear."""
    shape = _check_shape(input_shape)
    if len(shape) != 3:
        kinds = {1: "1-D feature vectors", 2: "2-D arrays without a channel axis"}
        kind = kinds.get(len(shape), f"{len(shape)}-D samples")
        hint = ("use --model mlp (or nn.Linear layers) for feature vectors" if len(shape) == 1 else
                "add a channel axis, e.g. x[:, None] for (N, H, W) images" if len(shape) == 2 else
                "give images of shape (channels, height, width)")
        raise ValueError(f"model 'cnn' needs images of shape (channels, height, width), but each sample has "
                         f"shape {shape} ({kind}); {hint}")
    c, h, w = shape
    if min(h, w) < 3:
        raise ValueError(f"model 'cnn': images of {h}x{w} pixels are too small for 3x3 convolutions; "
                         "use --model mlp")
    layers = []
    for out_channels in channels:
        conv = nn.Conv2d(c, int(out_channels), 3, padding=1)
        init.kaiming_normal_(conv.weight, nonlinearity="relu")
        init.zeros_(conv.bias)
        layers += [conv, nn.ReLU()]
        c = int(out_channels)
        if min(h, w) >= 4:
            layers.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
    head = nn.Linear(c * h * w, int(hidden))
    init.kaiming_normal_(head.weight, nonlinearity="relu")
    init.zeros_(head.bias)
    layers += [nn.Flatten(), head, nn.ReLU()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(int(hidden), int(num_classes)))
    return nn.Sequential(*layers)


def build_model(name: str, input_shape, num_classes: int, **options) -> nn.Sequential:
    """The model called ``name`` ("mlp" or "cnn") for samples of ``input_shape`` and ``num_classes`` classes."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise ValueError(f"build_model: num_classes must be an int >= 2, got {num_classes!r}")
    builders = {"mlp": mlp, "cnn": cnn}
    if name not in builders:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    return builders[name](input_shape, int(num_classes), **options)
