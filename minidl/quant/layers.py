"""Int8 layers for inference, and the fake-quantized layers that train for them.

Int8 inference of a Linear layer y = x Wᵀ + b. The weight is stored as int8
codes per output channel o (symmetric: W[o, k] ≈ s_w[o] · q_w[o, k]); the
input is quantized on arrival with the scale and zero point calibrated for
it (x[n, k] ≈ s_x · (q_x[n, k] − z_x)). Then

    y[n, o] ≈ Σ_k s_x (q_x[n, k] − z_x) · s_w[o] q_w[o, k] + b[o]
            = s_x s_w[o] · acc[n, o] + b[o],   acc[n, o] = Σ_k (q_x[n, k] − z_x) q_w[o, k]

so the whole product is integer arithmetic, accumulated in int32, and one
multiply per output rescales it. Each term is at most 255 · 128 in size, so
int32 holds sums of up to 65,793 terms exactly (checked). A convolution is
the same product over its im2col windows; padding inserts the real 0, which
is the code z_x, i.e. 0 after subtracting z_x. The output is float32: the
next layer quantizes its own input (ReLU and max pooling are exact on
either side of the rounding).

These run on the CPU with NumPy (its integer matmul does not use BLAS: the
point here is exactness and size, not speed).
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.ops.conv import im2col_array
from minidl.quant.qparams import MovingAverageObserver, dequantize, qparams, qrange, quantize
from minidl.tensor import Tensor

__all__ = ["FakeQuantConv2d", "FakeQuantLinear", "QuantizedConv2d", "QuantizedLinear", "int_matmul",
           "weight_qparams"]

_INT32_TERMS = (2**31 - 1) // (255 * 128)       # the most products of an int8 weight and a centred uint8 input


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (M, K) @ b (K, N) for integer codes, accumulated in int32 (exact while K ≤ 65,793)."""
    if a.shape[-1] > _INT32_TERMS:
        raise ValueError(f"int_matmul: {a.shape[-1]} terms per output could overflow int32 "
                         f"(at most {_INT32_TERMS} products of 8-bit codes are exact)")
    return np.matmul(a.astype(np.int32), b.astype(np.int32))


def weight_qparams(weight: np.ndarray) -> tuple:
    """Symmetric int8 (scale, zero_point) per output channel (axis 0) from a weight's own range."""
    rows = np.asarray(weight, dtype=np.float32).reshape(weight.shape[0], -1)
    return qparams(rows.min(axis=1), rows.max(axis=1), "int8", symmetric=True)


def _host(x) -> np.ndarray:
    return backend.to_numpy(x.array if isinstance(x, Tensor) else x)


class _Quantized(nn.Module):
    """Shared by the int8 layers: the stored codes, scales and input parameters as buffers."""

    def _store(self, weight: np.ndarray, bias, input_scale, input_zero_point, input_dtype: str):
        w_scale, _ = weight_qparams(weight)
        self.input_dtype = input_dtype
        self.register_buffer("weight_q", Tensor(quantize(weight, w_scale, 0, "int8", axis=0)))
        self.register_buffer("weight_scale", Tensor(w_scale))
        self.register_buffer("input_scale", Tensor(np.array(input_scale, dtype=np.float32)))
        self.register_buffer("input_zero_point", Tensor(np.array(input_zero_point, dtype=np.int64)))
        self.register_buffer("bias", None if bias is None else Tensor(_host(bias).astype(np.float32)))

    def _centred_input(self, x) -> np.ndarray:
        """q_x − z_x as int32: the input's codes with the zero point taken out."""
        q = quantize(_host(x), self.input_scale.array, self.input_zero_point.array, self.input_dtype)
        return q.astype(np.int32) - np.int32(self.input_zero_point.array)

    def _rescale(self, acc: np.ndarray, channel_axis: int) -> Tensor:
        """y = s_x · s_w[o] · acc + b[o], in float32."""
        shape = [1] * acc.ndim
        shape[channel_axis] = -1
        multiplier = (self.input_scale.array * self.weight_scale.array).astype(np.float32).reshape(shape)
        y = acc.astype(np.float32) * multiplier
        if self.bias is not None:
            y = y + self.bias.array.reshape(shape)
        return Tensor(y)

    def dequantized_weight(self) -> np.ndarray:
        """The float weight the codes stand for: s_w[o] · q_w[o, ...]."""
        return dequantize(self.weight_q.array, self.weight_scale.array, 0, axis=0)


class QuantizedLinear(_Quantized):
    """y = s_x s_w[o] · Σ_k (q_x − z_x) q_w[o, k] + b[o]: an int8 Linear (inference only)."""

    def __init__(self, weight, bias, input_scale, input_zero_point, input_dtype: str = "uint8"):
        super().__init__()
        weight = _host(weight)
        if weight.ndim != 2:
            raise ValueError(f"QuantizedLinear: weight must be (out_features, in_features), got {weight.shape}")
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._store(weight, bias, input_scale, input_zero_point, input_dtype)

    def accumulate(self, x) -> np.ndarray:
        """The int32 accumulators acc[n, o] = Σ_k (q_x[n, k] − z_x) q_w[o, k]."""
        return int_matmul(self._centred_input(x), self.weight_q.array.T)

    def forward(self, x):
        x = _host(x)
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"QuantizedLinear: expected input (N, {self.in_features}), got {x.shape}")
        return self._rescale(self.accumulate(x), 1)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, int8 weights, {self.input_dtype} inputs"


class QuantizedConv2d(_Quantized):
    """An int8 Conv2d (groups = 1): the integer product of im2col windows and int8 kernels, rescaled."""

    def __init__(self, weight, bias, input_scale, input_zero_point, stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1), input_dtype: str = "uint8"):
        super().__init__()
        weight = _host(weight)
        if weight.ndim != 4:
            raise ValueError(f"QuantizedConv2d: weight must be (C_out, C_in, kH, kW), got {weight.shape}")
        if isinstance(padding, str):
            raise ValueError(f"QuantizedConv2d: padding must be numbers, got {padding!r}")
        self.out_channels, self.in_channels = weight.shape[:2]
        self.kernel_size = weight.shape[2:]
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
        self._store(weight, bias, input_scale, input_zero_point, input_dtype)

    def accumulate(self, x) -> np.ndarray:
        """The int32 accumulators (N, OH, OW, C_out) of the integer convolution."""
        cols = im2col_array(self._centred_input(x), self.kernel_size, self.stride, self.padding, self.dilation)
        n, oh, ow = cols.shape[:3]
        kernel = self.weight_q.array.transpose(0, 2, 3, 1).reshape(self.out_channels, -1)  # (O, KH·KW·C)
        return int_matmul(cols.reshape(n * oh * ow, -1), kernel.T).reshape(n, oh, ow, self.out_channels)

    def forward(self, x):
        x = _host(x)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"QuantizedConv2d: expected input (N, {self.in_channels}, H, W), got {x.shape}")
        return self._rescale(self.accumulate(x).transpose(0, 3, 1, 2), 1)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, int8 weights, {self.input_dtype} inputs")


class _FakeQuant(nn.Module):
    """Shared by the QAT layers: fake-quantized input (moving-average range) and weight (per channel)."""

    def _setup(self, layer, input_dtype: str, averaging_constant: float):
        self.weight = nn.Parameter(layer.weight.array.copy())
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.array.copy())
        self.input_dtype = input_dtype
        self.observer = MovingAverageObserver(averaging_constant, dtype=input_dtype)

    def _quantized_operands(self, x):
        if self.training:
            self.observer.update(_host(x))
        s_x, z_x = self.observer.qparams()
        q_min, q_max = qrange(self.input_dtype)
        x_fq = F.fake_quantize(x, float(s_x), float(z_x), q_min, q_max)
        w_scale, _ = weight_qparams(_host(self.weight))
        shape = (-1,) + (1,) * (self.weight.ndim - 1)
        w_fq = F.fake_quantize(self.weight, w_scale.reshape(shape), 0, -128, 127)
        return x_fq, w_fq


class FakeQuantLinear(_FakeQuant):
    """A Linear trained through fake quantization: y = fq(x) fq(W)ᵀ + b, with the STE backward."""

    def __init__(self, layer, input_dtype: str = "uint8", averaging_constant: float = 0.01):
        super().__init__()
        self._setup(layer, input_dtype, averaging_constant)

    def forward(self, x):
        x_fq, w_fq = self._quantized_operands(x)
        return F.linear(x_fq, w_fq, self.bias)

    def to_quantized(self) -> QuantizedLinear:
        s_x, z_x = self.observer.qparams()
        return QuantizedLinear(self.weight.array, None if self.bias is None else self.bias.array, s_x, z_x,
                               self.input_dtype)


class FakeQuantConv2d(_FakeQuant):
    """A Conv2d trained through fake quantization of its input and kernel."""

    def __init__(self, layer, input_dtype: str = "uint8", averaging_constant: float = 0.01):
        super().__init__()
        self.stride, self.padding, self.dilation = layer.stride, layer.padding, layer.dilation
        self._setup(layer, input_dtype, averaging_constant)

    def forward(self, x):
        x_fq, w_fq = self._quantized_operands(x)
        return F.conv2d(x_fq, w_fq, self.bias, self.stride, self.padding, self.dilation)

    def to_quantized(self) -> QuantizedConv2d:
        s_x, z_x = self.observer.qparams()
        return QuantizedConv2d(self.weight.array, None if self.bias is None else self.bias.array, s_x, z_x,
                               self.stride, self.padding, self.dilation, self.input_dtype)
