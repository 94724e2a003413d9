"""Whole models to int8: post-training quantization with calibration, and quantization-aware training.

    int8 = quant.quantize_model(model, x_train[:512], method="percentile")   # PTQ
    qat = quant.prepare_qat(model); train(qat, epochs=2); int8 = quant.convert(qat)   # QAT
    quant.model_size_bytes(model), quant.model_size_bytes(int8)              # 4 bytes a weight → 1

Post-training quantization (PTQ) leaves the trained weights as they are:
a calibration pass runs a few batches through the float model and records
the range of every Linear's and Conv2d's input (min-max or percentiles), and
each of those layers is replaced by its int8 version with those input
parameters and its weights quantized per output channel. Quantization-aware
training (QAT) instead fine-tunes the float weights with every forward pass
fake-quantized (:func:`minidl.functional.fake_quantize`), so that the
weights settle where rounding hurts least; :func:`convert` then makes the
int8 model from the trained weights and the input ranges observed during
training. Other layers (ReLU, pooling, Flatten) stay as they are and run on
the float outputs of the int8 layers.
"""
from __future__ import annotations

import copy

import numpy as np

from minidl import nn
from minidl.autograd import no_grad
from minidl.quant.layers import FakeQuantConv2d, FakeQuantLinear, QuantizedConv2d, QuantizedLinear
from minidl.quant.qparams import MinMaxObserver, PercentileObserver, qrange
from minidl.tensor import Tensor

__all__ = ["convert", "model_size_bytes", "prepare_qat", "quantize_model"]


def _targets(model, owner: str) -> list:
    """(name, layer) of every Linear and Conv2d, refusing what the int8 layers do not do."""
    found = []
    for name, module in model.named_modules():
        if type(module) is nn.Linear:
            found.append((name, module))
        elif type(module) is nn.Conv2d:
            if module.groups != 1 or isinstance(module.padding, str):
                raise ValueError(f"{owner}: Conv2d {name!r} has groups={module.groups}, padding={module.padding!r}; "
                                 "int8 convolution supports groups=1 and numeric padding")
            found.append((name, module))
    if not found:
        raise ValueError(f"{owner}: the model has no nn.Linear or nn.Conv2d layer to quantize")
    return found


def _replace(model, name: str, new):
    if name == "":
        return new
    nn.utils.replace_module(model, name, new)
    return model


def _batches(calibration, owner: str) -> list:
    """The calibration inputs as a list of arrays: one array (cut into 256-sample batches), or batches."""
    if isinstance(calibration, Tensor):
        calibration = calibration.numpy()
    if isinstance(calibration, np.ndarray):
        batches = [calibration[i:i + 256] for i in range(0, len(calibration), 256)] if calibration.ndim else []
    else:
        batches = [b[0] if isinstance(b, (tuple, list)) else b for b in (calibration or [])]
    batches = [b for b in batches if len(b)]
    if not batches:
        raise ValueError(f"{owner}: no calibration data (got {type(calibration).__name__} with 0 samples); pass "
                         "a few hundred training inputs, e.g. x_train[:512], or a DataLoader")
    return batches


def quantize_model(model, calibration, method: str = "minmax", percentile: float = 99.99,
                   input_dtype: str = "uint8"):
    """An int8 copy of ``model`` (post-training quantization); ``model`` itself is unchanged.

    ``calibration``: an array of inputs, or an iterable of batches (arrays,
    Tensors or (x, y) pairs, as a DataLoader gives). ``method``: ``"minmax"``
    (the full range of each layer's input) or ``"percentile"`` (the
    ``100 − percentile`` and ``percentile`` percentiles, averaged over
    batches). Activations are asymmetric ``input_dtype`` (uint8 or int8), per
    tensor; weights symmetric int8, per output channel.
    """
    if method not in ("minmax", "percentile"):
        raise ValueError(f"quantize_model: method must be 'minmax' or 'percentile', got {method!r}")
    qrange(input_dtype)
    batches = _batches(calibration, "quantize_model")
    model = copy.deepcopy(model)
    targets = _targets(model, "quantize_model")
    observers = {name: (PercentileObserver(percentile, dtype=input_dtype) if method == "percentile"
                        else MinMaxObserver(dtype=input_dtype)) for name, _ in targets}
    handles = [layer.register_forward_hook(lambda m, inputs, out, o=observers[name]: o.update(inputs[0].numpy()))
               for name, layer in targets]
    was_training = model.training
    model.eval()
    with no_grad():
        for batch in batches:
            model(batch)
    for handle in handles:
        handle.remove()
    for name, layer in targets:
        s_x, z_x = observers[name].qparams()
        bias = None if layer.bias is None else layer.bias.array
        new = (QuantizedLinear(layer.weight.array, bias, s_x, z_x, input_dtype) if isinstance(layer, nn.Linear) else
               QuantizedConv2d(layer.weight.array, bias, s_x, z_x, layer.stride, layer.padding, layer.dilation,
                               input_dtype))
        model = _replace(model, name, new)
    return model.train(was_training)


def prepare_qat(model, input_dtype: str = "uint8", averaging_constant: float = 0.01):
    """A copy of ``model`` whose Linear and Conv2d layers train through fake quantization."""
    qrange(input_dtype)
    model = copy.deepcopy(model)
    for name, layer in _targets(model, "prepare_qat"):
        cls = FakeQuantLinear if isinstance(layer, nn.Linear) else FakeQuantConv2d
        model = _replace(model, name, cls(layer, input_dtype, averaging_constant))
    return model


def convert(model):
    """The int8 model of a QAT model: each fake-quantized layer becomes its int8 layer (a copy)."""
    model = copy.deepcopy(model)
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (FakeQuantLinear, FakeQuantConv2d))]
    if not layers:
        raise ValueError("convert: the model has no fake-quantized layer; make one with prepare_qat(model) "
                         "and train it, or use quantize_model for post-training quantization")
    for name, layer in layers:
        model = _replace(model, name, layer.to_quantized())
    return model


def model_size_bytes(model) -> int:
    """Bytes of every parameter and buffer in the state dict (what a saved model holds, less the names)."""
    return int(sum(value.nbytes for value in model.state_dict().values()))
