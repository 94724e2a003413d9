"""SGD with quantized gradients (SGD-Q): QSGD's unbiased b-bit gradients, and the bits they save.

    opt = optim.QuantizedGradients(optim.SGD(model.parameters(), lr=0.1), bits=4)
    ...loss.backward(); opt.step()...          # each gradient quantized, then the inner update
    opt.bits_sent, opt.bits_dense              # what a data-parallel run would have sent, and float32's

Alistarh et al. (2017), "QSGD". A gradient v is cut into buckets of d
values; each bucket is sent as its norm ‖v‖₂ (32 bits), and per value one
sign bit and a level ℓ in {0, …, s} (b − 1 bits, s = 2^(b−1) − 1), chosen at
random so that the result is unbiased:

    l = ⌊s·abs(v_i) / ‖v‖⌋,    p = s·abs(v_i) / ‖v‖ − l
    ξ_i = (l + 1)/s  with probability p,   l/s  otherwise
    Q(v_i) = ‖v‖ · sign(v_i) · ξ_i

    E[Q(v)] = v,      E‖Q(v) − v‖² = (‖v‖/s)² Σ_i p_i(1 − p_i) ≤ min(d/s², √d/s) · ‖v‖²   (QSGD, Lemma 3.1)

so SGD on Q(g) is SGD on an unbiased gradient with a bounded extra variance,
and converges as SGD does with a noisier gradient. A bucket costs 32 + d·b
bits against float32's 32·d: for b = 4, d = 512, 7.9 times fewer. (QSGD
codes the levels with Elias integer coding to go further; the fixed b bits
a value are counted here.)

It lives in ``optim`` and not ``parallel`` because it changes only what
one process's update sees: the quantizer, its variance and the bit count
are measured here. Sending the codes between processes in place of the
float gradients is not built (it would be a scheme of ``parallel``, which
hands the optimizer the dequantized average).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from minidl import backend
from minidl.autograd import enable_grad, no_grad
from minidl.optim.optimizer import Optimizer
from minidl.optim.wrapper import WrapsOptimizer
from minidl.tensor import Tensor

__all__ = ["QSGDCodes", "QuantizedGradients", "qsgd", "qsgd_bits", "qsgd_dequantize", "qsgd_quantize"]


class QSGDCodes(NamedTuple):
    """A quantized gradient: a norm per bucket, a sign and a level per value."""

    norms: object       # float32 (buckets,)
    negative: object    # bool (buckets, d): the sign bits
    levels: object      # uint8 (buckets, d), 0..s
    shape: tuple
    bits: int


def _check(bits, bucket_size):
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"QSGD: bits must be an integer from 2 to 8 (a sign bit and b - 1 level bits), got {bits!r}")
    if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size < 1:
        raise ValueError(f"QSGD: bucket_size must be a positive integer, got {bucket_size!r}")


def qsgd_quantize(g, bits: int = 4, bucket_size: int = 512, rng=None) -> QSGDCodes:
    """QSGD's codes of the array ``g``: see the module docstring (``rng``: minidl's generator by default)."""
    _check(bits, bucket_size)
    xp = backend.xp_of(g)
    s = 2 ** (bits - 1) - 1
    flat = g.reshape(-1).astype(np.float32)
    v = xp.pad(flat, (0, -flat.size % bucket_size)).reshape(-1, bucket_size)
    norms = xp.sqrt((v.astype(np.float64) ** 2).sum(axis=1)).astype(np.float32)
    ratio = s * xp.abs(v) / xp.where(norms > 0, norms, 1)[:, None]      # s|v_i|/‖v‖ in [0, s]
    low = xp.floor(ratio)
    rng = backend.rng(backend.device_of(g)) if rng is None else rng
    up = rng.random(ratio.shape, dtype=np.float32) < (ratio - low)
    levels = xp.minimum(low + up, s).astype(np.uint8)
    return QSGDCodes(norms, xp.signbit(v), levels, tuple(g.shape), bits)


def qsgd_dequantize(codes: QSGDCodes, dtype=np.float32):
    """Q(v) = ‖v‖ · sign(v) · ℓ / s, in ``codes.shape``."""
    s = 2 ** (codes.bits - 1) - 1
    xp = backend.xp_of(codes.levels)
    values = codes.norms[:, None] * codes.levels.astype(np.float32) / np.float32(s)
    values = xp.where(codes.negative, -values, values)
    return values.reshape(-1)[:math.prod(codes.shape)].reshape(codes.shape).astype(dtype)


def qsgd(g, bits: int = 4, bucket_size: int = 512, rng=None):
    """Q(g): quantized and dequantized, in g's dtype (unbiased: E[Q(g)] = g)."""
    return qsgd_dequantize(qsgd_quantize(g, bits, bucket_size, rng), g.dtype)


def qsgd_bits(count: int, bits: int = 4, bucket_size: int = 512) -> int:
    """Bits that carry ``count`` gradient values: 32 per bucket (its norm) + b per value."""
    _check(bits, bucket_size)
    return 32 * -(-count // bucket_size) + bits * count


class QuantizedGradients(WrapsOptimizer, Optimizer):
    """``QuantizedGradients(optimizer, bits=4, bucket_size=512)``: SGD-Q around any optimizer.

    Each step replaces every gradient g by Q(g) (:func:`qsgd`, a new gradient Tensor) and then
    runs the inner optimizer. ``bits_sent`` counts what the quantized gradients cost
    (:func:`qsgd_bits`), ``bits_dense`` what float32 gradients would have.
    """

    def __init__(self, optimizer: Optimizer, bits: int = 4, bucket_size: int = 512):  # noqa: D107
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"QuantizedGradients: expected an inner optimizer (e.g. SGD(params)), "
                            f"got {type(optimizer).__name__}")
        _check(bits, bucket_size)
        self.optimizer, self.bits, self.bucket_size = optimizer, bits, bucket_size
        self.defaults = optimizer.defaults
        self.bits_sent = self.bits_dense = 0

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for _, p, _ in self.optimizer.parameters():
                if p.grad is None or not p.requires_grad:
                    continue
                with backend.using(p.device):
                    p.grad = Tensor(qsgd(p.grad.array, self.bits, self.bucket_size))
                count = p.grad.array.size
                self.bits_sent += qsgd_bits(count, self.bits, self.bucket_size)
                self.bits_dense += 32 * count
        self.optimizer.step()
        return loss

    def state_dict(self):
        return {"inner": self.optimizer.state_dict(), "bits_sent": self.bits_sent, "bits_dense": self.bits_dense}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["inner"])
        self.bits_sent, self.bits_dense = int(state_dict["bits_sent"]), int(state_dict["bits_dense"])

    def __repr__(self):
        return f"QuantizedGradients(bits={self.bits}, bucket_size={self.bucket_size}, {self.optimizer!r})"
