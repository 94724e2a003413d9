"""4-bit weights: NF4 (QLoRA's NormalFloat) and symmetric int4, block-wise absmax, two codes a byte.

    q = quant.quantize_4bit(w, "nf4", block_size=64, double_quant=True)
    w_hat = quant.dequantize_4bit(q)                       # the float weight the codes stand for
    layer = quant.Linear4bit.from_linear(linear, "nf4")    # dequantized on the fly in forward

Dettmers et al. (2023), "QLoRA". The weight is flattened and cut into
blocks of B = 64 values; each block b is scaled by its absolute maximum
m_b = max |w| (so it spans [−1, 1]) and each value replaced by the index of
the nearest of 16 levels:

    q_i = argmin_j |w_i / m_b − level_j|,      ŵ_i = m_b · level[q_i]

**NF4**: the levels are quantiles of N(0, 1), so that each of the 16 bins
holds an equal share of normally distributed weights, normalized to [−1, 1]
and with an exact 0. With δ = ½(1/30 + 1/32) (half a bin on each side, for
the 15 and 16 bins of the two halves) and Φ⁻¹ the normal quantile function:

    positive: Φ⁻¹(p) for 8 p evenly spaced from 1 − δ down to ½ (excluded)
    negative: −Φ⁻¹(p) for 7 p evenly spaced from 1 − δ down to ½ (excluded)
    levels = sort(positive ∪ {0} ∪ negative) / max

(:func:`nf4_levels`; the paper's and bitsandbytes' published table agrees
to 2·10⁻⁷, their float32 linspace). **int4**: the 15 evenly spaced levels
k/7, k = −7..7 (symmetric, 0 exact; code 15 unused), the plain alternative.

Error bound per block: a value lands on its nearest level, so
|w_i − ŵ_i| ≤ m_b · g/2 with g the widest gap between neighbouring levels
(NF4: 1 − 0.6962 = 0.304, at the bottom; int4: 1/7).

Storage: two 4-bit codes a byte, plus one float32 m_b per block: 4 + 32/B
= 4.5 bits a weight for B = 64. **Double quantization** stores the scales
themselves in 8 bits: the m_b, less their mean μ, in blocks of 256 with a
float32 absmax s_k each (symmetric int8: m_b ≈ μ + s_k·c_b/127), for
4 + 8/64 + 32/(64·256) + 32/N ≈ 4.127 bits a weight (QLoRA uses an 8-bit
float for c_b; a linear int8 grid is used here). A padded tail block is
stored whole.
"""
from __future__ import annotations

import copy
import math
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.tensor import Tensor

__all__ = ["Linear4bit", "Quantized4bit", "dequantize_4bit", "int4_levels", "nf4_levels", "pack_4bit",
           "quantize_4bit", "quantize_model_4bit", "unpack_4bit"]

_KINDS = ("nf4", "int4")
SCALE_BLOCK = 256                                   # scales per block of the double quantization


def nf4_levels() -> np.ndarray:
    """The 16 NF4 levels, ascending, from −1 to 1 with an exact 0 (derived: see the module docstring)."""
    delta = 0.5 * (1 / 30 + 1 / 32)
    quantile = NormalDist().inv_cdf
    positive = [quantile(p) for p in np.linspace(1 - delta, 0.5, 9)[:-1]]
    negative = [-quantile(p) for p in np.linspace(1 - delta, 0.5, 8)[:-1]]
    levels = np.sort(np.array(positive + [0.0] + negative))
    return (levels / levels.max()).astype(np.float32)


def int4_levels() -> np.ndarray:
    """The symmetric int4 levels k/7 for k = −7..7 (code k + 7), and a 16th code that is never chosen."""
    return np.append(np.arange(-7, 8) / 7.0, np.inf).astype(np.float32)


_LEVELS = {"nf4": nf4_levels(), "int4": int4_levels()}


def pack_4bit(codes: np.ndarray) -> np.ndarray:
    """Two 4-bit codes (0..15) a byte: byte k = codes[2k] | codes[2k + 1] << 4 (an odd count is padded with 0)."""
    codes = np.asarray(codes, dtype=np.uint8).reshape(-1)
    if codes.size and codes.max() > 15:
        raise ValueError(f"pack_4bit: codes must be in 0..15, got {int(codes.max())}")
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def unpack_4bit(packed, count: int):
    """The ``count`` codes of :func:`pack_4bit`'s bytes (on the bytes' device)."""
    xp = backend.xp_of(packed)
    codes = xp.stack([packed & 15, packed >> 4], axis=1).reshape(-1)
    return codes[:count]


class Quantized4bit(NamedTuple):
    """A 4-bit weight: packed codes, the block scales (plain or double-quantized), and what rebuilds it."""

    packed: np.ndarray          # uint8, two codes a byte
    absmax: np.ndarray          # float32 per block; empty when double-quantized
    absmax_codes: np.ndarray    # int8 per block (double quantization), else empty
    absmax_scale: np.ndarray    # float32 per SCALE_BLOCK scales (double quantization), else empty
    absmax_mean: np.ndarray     # float32 () (double quantization), else empty
    shape: tuple
    kind: str
    block_size: int

    def nbytes(self) -> int:
        """The bytes stored: codes and scales (what the bits-per-weight count counts)."""
        return int(sum(np.asarray(a).nbytes for a in self[:5]))

    def bits_per_weight(self) -> float:
        return 8.0 * self.nbytes() / math.prod(self.shape)


def _check(kind: str, block_size: int):
    if kind not in _KINDS:
        raise ValueError(f"quantize_4bit: kind must be one of {_KINDS}, got {kind!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2 or block_size % 2:
        raise ValueError(f"quantize_4bit: block_size must be an even integer >= 2, got {block_size!r}")


def quantize_4bit(weight, kind: str = "nf4", block_size: int = 64, double_quant: bool = False) -> Quantized4bit:
    """Block-wise absmax 4-bit codes of ``weight`` (any shape): see the module docstring."""
    _check(kind, block_size)
    w = np.asarray(backend.to_numpy(weight.array if isinstance(weight, Tensor) else weight), dtype=np.float32)
    if not np.all(np.isfinite(w)):
        raise ValueError(f"quantize_4bit: the weight (shape {w.shape}) has inf or NaN values")
    flat = w.reshape(-1)
    blocks = np.pad(flat, (0, -flat.size % block_size)).reshape(-1, block_size)
    absmax = np.abs(blocks).max(axis=1)
    scaled = blocks / np.where(absmax > 0, absmax, 1)[:, None]
    levels = _LEVELS[kind]
    finite = levels[np.isfinite(levels)]
    # nearest level: the midpoints between neighbours are the decision boundaries
    codes = np.searchsorted((finite[1:] + finite[:-1]) / 2, scaled).astype(np.uint8)
    packed = pack_4bit(codes.reshape(-1))
    empty = np.zeros(0, np.float32)
    if not double_quant:
        return Quantized4bit(packed, absmax.astype(np.float32), np.zeros(0, np.int8), empty, empty,
                             tuple(w.shape), kind, block_size)
    mean = np.float32(absmax.mean())
    centred = absmax - mean
    groups = np.pad(centred, (0, -centred.size % SCALE_BLOCK)).reshape(-1, SCALE_BLOCK)
    scale = (np.abs(groups).max(axis=1) / 127).astype(np.float32)
    c = np.rint(groups / np.where(scale > 0, scale, 1)[:, None]).astype(np.int8).reshape(-1)[:absmax.size]
    return Quantized4bit(packed, empty, c, scale, np.asarray(mean, np.float32), tuple(w.shape), kind, block_size)


def block_absmax(q: Quantized4bit):
    """m_b per block: stored, or rebuilt from the double quantization (μ + s_k · c_b)."""
    if q.absmax_codes.size == 0:
        return q.absmax
    xp = backend.xp_of(q.absmax_codes)
    scale = xp.repeat(q.absmax_scale, SCALE_BLOCK)[:q.absmax_codes.size]
    return (q.absmax_mean + scale * q.absmax_codes.astype(np.float32)).astype(np.float32)


def dequantize_4bit(q: Quantized4bit, dtype=np.float32):
    """ŵ = m_b · level[q]: the weight the codes stand for, in ``dtype`` and ``q``'s shape (on q's device)."""
    xp = backend.xp_of(q.packed)
    count = math.prod(q.shape)
    blocks = -(-count // q.block_size)
    codes = unpack_4bit(q.packed, blocks * q.block_size).reshape(blocks, q.block_size)
    levels = xp.asarray(_LEVELS[q.kind])
    values = levels[codes.astype(np.intp)] * block_absmax(q)[:, None]
    return values.reshape(-1)[:count].reshape(q.shape).astype(dtype)


class Linear4bit(nn.Module):
    """y = x Ŵᵀ + b with Ŵ = dequantize(4-bit codes), rebuilt on each forward; the codes never train.

    ``Linear4bit(in_features, out_features, bias=True, kind="nf4", block_size=64, double_quant=False,
    compute_dtype=float32)`` makes an empty layer (for ``load_state_dict``); :meth:`from_linear` quantizes a
    trained ``nn.Linear``. The codes and scales are buffers (saved, never updated); the bias stays a float
    Parameter (frozen with the rest when the layer is a QLoRA base). The gradient reaches the input
    through Ŵ: dx = g Ŵ.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, kind: str = "nf4",
                 block_size: int = 64, double_quant: bool = False, compute_dtype=np.float32):
        super().__init__()
        _check(kind, block_size)
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.kind, self.block_size, self.double_quant = kind, block_size, bool(double_quant)
        self.compute_dtype = np.dtype(compute_dtype)
        self._adopt(quantize_4bit(np.zeros((self.out_features, self.in_features), np.float32), kind, block_size,
                                  double_quant))
        self.bias = nn.Parameter(np.zeros(self.out_features, np.float32)) if bias else None

    def _adopt(self, q: Quantized4bit):
        for name in ("packed", "absmax", "absmax_codes", "absmax_scale", "absmax_mean"):
            self.register_buffer(f"weight_{name}", Tensor(getattr(q, name)))

    @classmethod
    def from_linear(cls, layer, kind: str = "nf4", block_size: int = 64, double_quant: bool = False,
                    compute_dtype=np.float32) -> Linear4bit:
        """The 4-bit copy of a trained ``nn.Linear`` (its weight quantized, its bias copied)."""
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"Linear4bit.from_linear: expected an nn.Linear, got {type(layer).__name__}")
        new = cls(layer.in_features, layer.out_features, layer.bias is not None, kind, block_size, double_quant,
                  compute_dtype)
        new._adopt(quantize_4bit(layer.weight.array, kind, block_size, double_quant))
        if layer.bias is not None:
            new.bias.array[...] = backend.to_numpy(layer.bias.array)
        return new

    def quantized(self) -> Quantized4bit:
        return Quantized4bit(*(getattr(self, f"weight_{name}").array for name in
                               ("packed", "absmax", "absmax_codes", "absmax_scale", "absmax_mean")),
                             (self.out_features, self.in_features), self.kind, self.block_size)

    def dequantized_weight(self):
        """Ŵ (out_features, in_features) in the compute dtype."""
        return dequantize_4bit(self.quantized(), self.compute_dtype)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise ValueError(f"Linear4bit: expected input (..., {self.in_features}), got {tuple(x.shape)}")
        return F.linear(x, Tensor(self.dequantized_weight()), self.bias)

    def check_loaded_state(self, state: dict) -> list:
        """Codes of the right count, scales finite and non-negative: a damaged file is refused, not run."""
        problems = []
        count = -(-self.out_features * self.in_features // self.block_size) * self.block_size
        packed = state["weight_packed"]
        if packed.dtype != np.uint8 or packed.size != count // 2:
            problems.append(("weight_packed", f"expected {count // 2} uint8 bytes (two codes each), got "
                                              f"{packed.size} of {packed.dtype}"))
        for name in ("weight_absmax", "weight_absmax_scale"):
            value = backend.to_numpy(state[name]).astype(np.float64)
            if not np.all(np.isfinite(value) & (value >= 0)):
                problems.append((name, "block scales must be finite and non-negative"))
        return problems

    def extra_repr(self):
        bits = self.quantized().bits_per_weight()
        return (f"{self.in_features}, {self.out_features}, {self.kind} blocks of {self.block_size}"
                f"{', double-quantized scales' if self.double_quant else ''} ({bits:.3f} bits a weight)")


def quantize_model_4bit(model, kind: str = "nf4", block_size: int = 64, double_quant: bool = False):
    """A copy of ``model`` with every ``nn.Linear`` a :class:`Linear4bit` (``model`` itself is unchanged)."""
    _check(kind, block_size)
    model = copy.deepcopy(model)
    layers = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if not layers:
        raise ValueError("quantize_model_4bit: the model has no nn.Linear layer to store in 4 bits")
    for name, layer in layers:
        new = Linear4bit.from_linear(layer, kind, block_size, double_quant)
        if name == "":
            return new
        nn.utils.replace_module(model, name, new)
    return model
