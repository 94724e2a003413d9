"""Quantization to 8 bits: scales and zero points, int8 layers, post-training and quantization-aware.

    from minidl import quant
    int8 = quant.quantize_model(model, x_train[:512])                  # PTQ: calibrate, then int8 layers
    qat = quant.prepare_qat(model)                                      # QAT: fine-tune fake-quantized
    ...train qat...
    int8 = quant.convert(qat)
    quant.model_size_bytes(model), quant.model_size_bytes(int8)

The equations (scale, zero point, the integer product and its rescaling)
are in the docstrings of :mod:`minidl.quant.qparams` and
:mod:`minidl.quant.layers`; the fake-quantize op with its straight-through
gradient is :func:`minidl.functional.fake_quantize`.
"""
from minidl.quant.convert import convert, model_size_bytes, prepare_qat, quantize_model
from minidl.quant.layers import (
    FakeQuantConv2d,
    FakeQuantLinear,
    QuantizedConv2d,
    QuantizedLinear,
    int_matmul,
    weight_qparams,
)
from minidl.quant.qparams import (
    MinMaxObserver,
    MovingAverageObserver,
    PercentileObserver,
    dequantize,
    qparams,
    qrange,
    quantize,
)

__all__ = [
    "FakeQuantConv2d", "FakeQuantLinear", "MinMaxObserver", "MovingAverageObserver", "PercentileObserver",
    "QuantizedConv2d", "QuantizedLinear", "convert", "dequantize", "int_matmul", "model_size_bytes",
    "prepare_qat", "qparams", "qrange", "quantize", "quantize_model", "weight_qparams",
]

# 4-bit weights (NF4, int4) and QLoRA
from minidl.quant.int4 import (  # noqa: E402
    Linear4bit,
    Quantized4bit,
    dequantize_4bit,
    int4_levels,
    nf4_levels,
    pack_4bit,
    quantize_4bit,
    quantize_model_4bit,
    unpack_4bit,
)
from minidl.quant.qlora import apply_qlora  # noqa: E402

__all__ += ["Linear4bit", "Quantized4bit", "apply_qlora", "dequantize_4bit", "int4_levels", "nf4_levels",
            "pack_4bit", "quantize_4bit", "quantize_model_4bit", "unpack_4bit"]
