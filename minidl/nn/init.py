"""Weight and bias initialization: the textbook's rules, in place on a Parameter.

Why it matters: through L layers the variance of the activations is multiplied
at each layer by about fan_in · Var(w) · (gain of the nonlinearity)⁻². Choosing
Var(w) so that this factor is 1 keeps the signal (and the gradient) from
vanishing or exploding:

    Xavier / Glorot (tanh, linear):  Var(w) = 2 / (fan_in + fan_out)
        uniform:  w ~ U(−k, k),  k = gain · √(6 / (fan_in + fan_out))
        normal:   σ = gain · √(2 / (fan_in + fan_out))
    Kaiming / He (ReLU family):      Var(w) = gain² / fan,  gain = √2 for ReLU
        normal:   σ = gain / √fan           (σ = √(2 / fan) for ReLU)
        uniform:  w ~ U(−√3 σ, √3 σ)
    fan = fan_in keeps the forward activations' variance, fan = fan_out the
    backward gradients'.
    Orthogonal: W = Q from the QR decomposition of a Gaussian matrix (all
        singular values 1: vectors keep their norm; good for recurrent weights).
    Truncated normal: a normal whose samples beyond ±2σ are drawn again.

For a weight of shape (out, in, *kernel) (Linear and Conv layouts),
fan_in = in · ∏kernel and fan_out = out · ∏kernel.

Bias rules (the last layer starts where the data says the answer is):
    imbalanced binary classifier:  b = log(n_pos / n_neg)  (σ(b) = the positive rate)
    regression:                    b = mean of the targets
    LSTM:                          forget gate 1, input and output gates −1
    ReLU layers (optional):        a small positive bias such as 0.01

Every function draws from ``minidl.backend.rng(device)``, so after
``mdl.manual_seed(s)`` the same seed gives the same weights. Each writes into
``tensor.array`` in place (no gradient is recorded) and returns the tensor.
"""
from __future__ import annotations

import math

import numpy as np

from minidl import backend
from minidl.tensor import Tensor, mark_changed

__all__ = [
    "calculate_gain", "constant_", "init_bias_class_priors", "init_bias_imbalanced_binary",
    "init_bias_regression", "init_lstm_gate_biases", "kaiming_normal_", "kaiming_uniform_",
    "normal_", "ones_", "orthogonal_", "relu_bias_", "trunc_normal_", "uniform_", "xavier_normal_",
    "xavier_uniform_", "zeros_",
]


# ---------------------------------------------------------------- helpers
def _check(tensor, fn):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"nn.init.{fn}: expected a Tensor or Parameter, got {type(tensor).__name__}")
    return tensor


def _fill(tensor: Tensor, array) -> Tensor:
    """Write ``array`` into the tensor's own buffer (optimizers keep their reference to it)."""
    tensor.array[...] = array.astype(tensor.dtype, copy=False)
    mark_changed(tensor)
    return tensor


def _sample_dtype(tensor: Tensor):
    """float32/float64 draw natively; anything else (float16) is drawn in float32 and cast."""
    return tensor.dtype if tensor.dtype in (np.float32, np.float64) else np.float32


def _standard_normal(tensor: Tensor, shape=None):
    return backend.rng(tensor.device).standard_normal(tensor.shape if shape is None else shape,
                                                      dtype=_sample_dtype(tensor))


def _uniform01(tensor: Tensor):
    return backend.rng(tensor.device).random(tensor.shape, dtype=_sample_dtype(tensor))


def _calculate_fan_in_and_fan_out(tensor) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of shape (out, in, *kernel).

    Linear (out, in): fan_in = in, fan_out = out. Conv (out, in/groups, k1, k2...):
    fan_in = in/groups · k1·k2·…, fan_out = out · k1·k2·…  (each output sees
    in·∏k inputs; each input feeds out·∏k outputs).
    """
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a weight with at least 2 dimensions, got shape {shape}; "
                         "a bias (1-D) has no fans: initialize it with uniform_/constant_ or a bias rule")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def _fan(tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"cannot initialize a weight of shape {tuple(tensor.shape)}: its {mode} is 0")
    return fan


_GAINS = {"linear": 1.0, "identity": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0,
          "conv_transpose1d": 1.0, "conv_transpose2d": 1.0, "conv_transpose3d": 1.0,
          "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0), "selu": 3.0 / 4}


def calculate_gain(nonlinearity: str, param=None) -> float:
    """The factor that makes up for how much a nonlinearity shrinks the variance (PyTorch's table).

    linear, identity, conv*, sigmoid: 1;  tanh: 5/3;  relu: √2;
    leaky_relu: √(2 / (1 + slope²)) (slope ``param``, default 0.01);  selu: 3/4.
    """
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain('leaky_relu', param): param must be a number, got {param!r}")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity in _GAINS:
        return _GAINS[nonlinearity]
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}; "
                     f"known: {', '.join(sorted(_GAINS) + ['leaky_relu'])}")


# ---------------------------------------------------------------- constants and plain distributions
def zeros_(tensor: Tensor) -> Tensor:
    _check(tensor, "zeros_").array[...] = 0
    mark_changed(tensor)
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    _check(tensor, "ones_").array[...] = 1
    mark_changed(tensor)
    return tensor


def constant_(tensor: Tensor, val: float) -> Tensor:
    _check(tensor, "constant_").array[...] = val
    mark_changed(tensor)
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    """w ~ U(a, b)."""
    if not a <= b:
        raise ValueError(f"nn.init.uniform_: need a <= b, got a={a}, b={b}")
    return _fill(_check(tensor, "uniform_"), a + (b - a) * _uniform01(tensor))


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    """w ~ N(mean, std²)."""
    if std < 0:
        raise ValueError(f"nn.init.normal_: std must be >= 0, got {std}")
    return _fill(_check(tensor, "normal_"), mean + std * _standard_normal(tensor))


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float | None = None,
                  b: float | None = None) -> Tensor:
    """w ~ N(mean, std²) restricted to [a, b], by drawing again every sample that falls outside.

    The bounds default to mean ± 2·std (the textbook's rule: no weight starts
    further than two standard deviations out). Given explicitly they are
    absolute values, as in PyTorch; note that PyTorch's defaults are a=−2,
    b=2 in absolute terms, which for std=0.02 truncates nothing. The result's
    std is about 0.88·std for ±2σ bounds.
    """
    _check(tensor, "trunc_normal_")
    if std <= 0:
        raise ValueError(f"nn.init.trunc_normal_: std must be > 0, got {std}")
    a = mean - 2 * std if a is None else a
    b = mean + 2 * std if b is None else b
    if not a < b:
        raise ValueError(f"nn.init.trunc_normal_: need a < b, got a={a}, b={b}")
    mass = 0.5 * (math.erf((b - mean) / (std * math.sqrt(2))) - math.erf((a - mean) / (std * math.sqrt(2))))
    if mass < 0.05:
        raise ValueError(f"nn.init.trunc_normal_: [a, b] = [{a}, {b}] holds only {mass:.2g} of the "
                         f"N({mean}, {std}²) mass, so resampling would take very long; widen the bounds")
    xp = tensor.xp
    values = mean + std * _standard_normal(tensor)
    outside = (values < a) | (values > b)
    while bool(outside.any()):  # each round keeps (1 − mass) of the misses: a few rounds suffice
        count = int(outside.sum())
        values[outside] = mean + std * _standard_normal(tensor, (count,))
        outside = (values < a) | (values > b)
    return _fill(tensor, xp.asarray(values))


# ---------------------------------------------------------------- variance-preserving rules
def xavier_uniform_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: w ~ U(−k, k), k = gain · √(6 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_check(tensor, "xavier_uniform_"))
    k = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -k, k)


def xavier_normal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot: w ~ N(0, σ²), σ = gain · √(2 / (fan_in + fan_out))."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(_check(tensor, "xavier_normal_"))
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def kaiming_uniform_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu") -> Tensor:
    """He: w ~ U(−√3·σ, √3·σ), σ = gain / √fan (same variance as kaiming_normal_).

    ``a`` is the negative slope for leaky_relu (a=0 is ReLU: gain √2). PyTorch's
    Linear/Conv default is a=√5, which gives bound 1/√fan_in.
    """
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(_check(tensor, "kaiming_uniform_"), mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor: Tensor, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu") -> Tensor:
    """He: w ~ N(0, σ²), σ = gain / √fan;  for ReLU σ = √(2 / fan)."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(_check(tensor, "kaiming_normal_"), mode))
    return normal_(tensor, 0.0, std)


def orthogonal_(tensor: Tensor, gain: float = 1.0) -> Tensor:
    """W = gain · Q, Q with orthonormal rows or columns (QᵀQ = I for a tall matrix, QQᵀ = I for a wide one).

    The weight is viewed as (shape[0], rest). Q comes from the QR decomposition
    of a Gaussian matrix, with the signs of R's diagonal moved into Q so that Q
    is uniformly distributed over orthogonal matrices.
    """
    _check(tensor, "orthogonal_")
    if tensor.ndim < 2:
        raise ValueError(f"nn.init.orthogonal_: need at least 2 dimensions, got shape {tensor.shape}")
    rows = tensor.shape[0]
    cols = tensor.numel() // rows
    xp = tensor.xp
    flat = _standard_normal(tensor, (rows, cols)).astype(np.float64)
    if rows < cols:
        flat = flat.T  # QR of the tall matrix, transposed back below
    q, r = xp.linalg.qr(flat)
    q = q * xp.sign(xp.diag(r))
    if rows < cols:
        q = q.T
    return _fill(tensor, (gain * q).reshape(tensor.shape))


# ---------------------------------------------------------------- bias rules
def init_bias_imbalanced_binary(bias: Tensor, n_pos: int, n_neg: int) -> Tensor:
    """Last-layer bias of a binary classifier with n_pos positives and n_neg negatives: b = log(n_pos / n_neg).

    Then σ(b) = n_pos / (n_pos + n_neg): the untrained model already predicts the
    base rate, and the first iterations are not spent learning the imbalance.
    """
    if n_pos <= 0 or n_neg <= 0:
        raise ValueError(f"init_bias_imbalanced_binary: need n_pos > 0 and n_neg > 0, got {n_pos}, {n_neg}")
    return constant_(_check(bias, "init_bias_imbalanced_binary"), math.log(n_pos / n_neg))


def init_bias_class_priors(bias: Tensor, counts) -> Tensor:
    """Last-layer bias of a K-class softmax classifier: b_k = log(count_k / Σ counts).

    Then softmax(b) = the class frequencies (the multi-class form of the binary rule).
    """
    counts = np.asarray(backend.to_numpy(counts.array if isinstance(counts, Tensor) else counts), np.float64)
    if counts.shape != tuple(bias.shape) or (counts <= 0).any():
        raise ValueError(f"init_bias_class_priors: need one positive count per class "
                         f"(bias shape {tuple(bias.shape)}), got counts {counts.tolist()}")
    return _fill(bias, bias.xp.asarray(np.log(counts / counts.sum())))


def init_bias_regression(bias: Tensor, targets) -> Tensor:
    """Last-layer bias of a regression model = the mean of the training targets (per output).

    ``targets`` has shape (N,) for one output or (N, out) for several; the untrained
    model then predicts the mean, and the loss starts at the targets' variance.
    """
    _check(bias, "init_bias_regression")
    values = targets.array if isinstance(targets, Tensor) else targets
    values = np.asarray(backend.to_numpy(values), dtype=np.float64)
    if values.size == 0:
        raise ValueError("init_bias_regression: targets is empty")
    mean = values.reshape(len(values), -1).mean(axis=0) if values.ndim else values.reshape(1)
    if mean.size != bias.numel():
        raise ValueError(f"init_bias_regression: targets of shape {values.shape} give {mean.size} means "
                         f"but the bias has shape {tuple(bias.shape)}")
    return _fill(bias, bias.xp.asarray(mean.reshape(bias.shape)))


def init_lstm_gate_biases(lstm, forget: float = 1.0, input: float = -1.0, output: float = -1.0,
                          cell: float = 0.0):
    """The textbook's LSTM rule: forget-gate bias 1, input- and output-gate biases −1.

    A forget bias of 1 makes σ(f) ≈ 0.73 at the start, so the cell keeps its
    memory and gradients flow across many steps; input and output biases of −1
    (σ ≈ 0.27) keep the gates mostly closed until they learn to open. The gate
    order is PyTorch's (i, f, g, o). Since the two bias vectors are added,
    ``bias_ih`` gets these values and ``bias_hh`` is zeroed, so the effective
    bias is exactly the rule. Every layer and direction is set; returns lstm.
    """
    names = [name for name, _ in lstm.named_parameters() if name.startswith("bias_ih")]
    if not names:
        raise ValueError(f"init_lstm_gate_biases: {type(lstm).__name__} has no bias_ih_* parameters "
                         "(an nn.LSTM built with bias=True is expected)")
    params = dict(lstm.named_parameters())
    for name in names:
        bias = params[name]
        hidden = bias.shape[0] // 4
        if bias.shape[0] != 4 * hidden:
            raise ValueError(f"init_lstm_gate_biases: {name} has {bias.shape[0]} entries, not 4 gates x hidden")
        for gate, value in enumerate((input, forget, cell, output)):
            bias.array[gate * hidden:(gate + 1) * hidden] = value
        mark_changed(bias)
        zeros_(params[name.replace("bias_ih", "bias_hh")])
    return lstm


def relu_bias_(bias: Tensor, value: float = 0.01) -> Tensor:
    """A small positive bias for a layer followed by ReLU, so every unit starts active (optional rule)."""
    return constant_(_check(bias, "relu_bias_"), value)
