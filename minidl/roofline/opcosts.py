"""How much arithmetic and how much memory traffic each op needs: the two numbers of the roofline.

For every op, forward and backward separately:

- **FLOPs**: floating-point operations, one per add, multiply, compare,
  divide, square root or elementary function (exp, log) of one element. A
  matrix product of (n×k) by (k×m) is n·m dot products of length k: n·m·k
  multiplies and n·m·k adds, 2nmk FLOPs.
- **bytes**: the *compulsory* traffic, every input array read once and every
  output array written once (elements × itemsize). Temporaries an
  implementation creates are extra traffic, not counted here: they are
  what keeps it below the roofline. A gradient that can be handed on as
  it is (add's backward) or as a broadcast view (sum's) costs nothing.

Arithmetic intensity = FLOPs / bytes. Against the machine balance
(peak FLOP/s ÷ bandwidth) it says which ceiling an op meets first: below the
balance the op is memory-bound, above it compute-bound.

The backward counts assume every input needs a gradient unless the function
takes an argument saying otherwise (a first Linear layer needs no dx).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one phase of one op."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved: 0 for an op that only moves data, NaN for one with no work at all."""
        if not self.bytes:
            return math.inf if self.flops else math.nan
        return self.flops / self.bytes

    @property
    def work(self) -> bool:
        """False for a phase with nothing compulsory to do (a gradient handed on by reference)."""
        return bool(self.flops or self.bytes)

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


@dataclass(frozen=True)
class OpCost:
    """The forward and backward costs of one op at one size."""

    forward: Cost
    backward: Cost

    def phase(self, name: str) -> Cost:
        return getattr(self, name)


def _elements(shape) -> int:
    return math.prod(shape) if isinstance(shape, (tuple, list)) else int(shape)


# ---------------------------------------------------------------- matrix products
def matmul(n: int, k: int, m: int, itemsize: int = 4) -> OpCost:
    """C = A B with A (n×k), B (k×m).

    forward   2nmk FLOPs;  reads A, B, writes C
    backward  dA = G Bᵀ and dB = Aᵀ G: 4nmk FLOPs;  reads G, A, B, writes dA, dB
    """
    forward = Cost(2 * n * k * m, (n * k + k * m + n * m) * itemsize)
    backward = Cost(4 * n * k * m, (n * m + n * k + k * m + n * k + k * m) * itemsize)
    return OpCost(forward, backward)


def linear(batch: int, in_features: int, out_features: int, bias: bool = True,
           input_grad: bool = True, itemsize: int = 4) -> OpCost:
    """y = x Wᵀ + b, x (B×I), W (O×I), b (O).

    forward   2·B·I·O (the product) + B·O (the bias);  reads x, W, b, writes y
    backward  dx = dy W: 2·B·O·I;  dW = dyᵀ x: 2·B·O·I;  db = Σ_batch dy: B·O;
              reads dy, x, W, writes dx, dW, db (dx only when ``input_grad``)
    For B ≪ I, O the weights dominate the traffic and the intensity is
    ≈ 2B / itemsize: B FLOP/byte in 16-bit, B/2 in float32.
    """
    b, i, o = batch, in_features, out_features
    forward = Cost(2 * b * i * o + (b * o if bias else 0),
                   (b * i + o * i + (o if bias else 0) + b * o) * itemsize)
    flops = 2 * b * o * i + (2 * b * o * i if input_grad else 0) + (b * o if bias else 0)
    moved = b * o + b * i + o * i + o * i + (b * i if input_grad else 0) + (o if bias else 0)
    return OpCost(forward, Cost(flops, moved * itemsize))


# ---------------------------------------------------------------- elementwise
def add(shape, itemsize: int = 4) -> OpCost:
    """y = a + b (same shapes).  forward n FLOPs, reads a, b, writes y;
    backward da = db = dy: nothing to compute or move, dy is handed on by reference."""
    n = _elements(shape)
    return OpCost(Cost(n, 3 * n * itemsize), Cost(0, 0))


def mul(shape, itemsize: int = 4) -> OpCost:
    """y = a · b.  forward n FLOPs;  backward da = dy·b, db = dy·a: 2n FLOPs, reads dy, a, b, writes da, db."""
    n = _elements(shape)
    return OpCost(Cost(n, 3 * n * itemsize), Cost(2 * n, 5 * n * itemsize))


def relu(shape, itemsize: int = 4) -> OpCost:
    """y = max(x, 0): n compares, reads x, writes y;  dx = dy·[x > 0]: n FLOPs, reads dy and x, writes dx."""
    n = _elements(shape)
    return OpCost(Cost(n, 2 * n * itemsize), Cost(n, 3 * n * itemsize))


def exp(shape, itemsize: int = 4) -> OpCost:
    """y = eˣ: n FLOPs (one per elementary function), reads x, writes y;  dx = dy·y: n FLOPs, 3 arrays."""
    n = _elements(shape)
    return OpCost(Cost(n, 2 * n * itemsize), Cost(n, 3 * n * itemsize))


# ---------------------------------------------------------------- reductions over the last axis
def sum_rows(rows: int, cols: int, itemsize: int = 4) -> OpCost:
    """y_r = Σ_c x_rc.  forward (cols − 1)·rows adds, reads x, writes y;
    backward dx = dy broadcast along the rows: a view of dy, nothing to compute or move."""
    n = rows * cols
    return OpCost(Cost(rows * (cols - 1), (n + rows) * itemsize), Cost(0, 0))


def softmax(rows: int, cols: int, itemsize: int = 4) -> OpCost:
    """y = e^(x − max x) / Σ e^(x − max x) per row.

    forward   max (n), subtract (n), exp (n), sum (n), divide (n): 5n FLOPs;  reads x, writes y
    backward  dx = y (dy − Σ dy·y): multiply (n), sum (n), subtract (n), multiply (n): 4n;
              reads dy, y, writes dx
    """
    n = rows * cols
    return OpCost(Cost(5 * n, 2 * n * itemsize), Cost(4 * n, 3 * n * itemsize))


def log_softmax(rows: int, cols: int, itemsize: int = 4) -> OpCost:
    """y = (x − m) − ln Σ e^(x − m) per row, m = max x.

    forward   max (n), subtract (n), exp (n), sum (n), log (rows), subtract (n): 5n + rows
    backward  dx = dy − e^y Σ dy: exp (n), sum (n), multiply (n), subtract (n): 4n;
              reads dy, y, writes dx
    """
    n = rows * cols
    return OpCost(Cost(5 * n + rows, 2 * n * itemsize), Cost(4 * n, 3 * n * itemsize))


# ---------------------------------------------------------------- convolution and normalization
def conv2d(batch: int, in_channels: int, height: int, width: int, out_channels: int,
           kernel: int | tuple = 3, stride: int = 1, padding: int = 0, bias: bool = True,
           itemsize: int = 4) -> OpCost:
    """y[n,o,i,j] = b[o] + Σ_{c,p,q} W[o,c,p,q] x[n,c,i·s+p,j·s+q].

    forward   2·N·O·OH·OW·C·KH·KW (+ N·O·OH·OW for the bias);  reads x, W, b, writes y
    backward  dx and dW: each 2·N·O·OH·OW·C·KH·KW;  db: N·O·OH·OW;
              reads dy, x, W, writes dx, dW, db
    (The im2col copy the implementation makes is not compulsory traffic.)
    """
    kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
    oh = (height + 2 * padding - kh) // stride + 1
    ow = (width + 2 * padding - kw) // stride + 1
    outputs = batch * out_channels * oh * ow
    macs = outputs * in_channels * kh * kw
    x, w, y = batch * in_channels * height * width, out_channels * in_channels * kh * kw, outputs
    b = out_channels if bias else 0
    forward = Cost(2 * macs + (outputs if bias else 0), (x + w + b + y) * itemsize)
    backward = Cost(4 * macs + (outputs if bias else 0), (y + x + w + x + w + b) * itemsize)
    return OpCost(forward, backward)


def _normalization(n: int, groups: int, params: int, itemsize: int) -> OpCost:
    """Standardize n values in ``groups`` groups, then y = x̂·γ + β with ``params`` values each.

    forward   per element: mean (1), subtract (1), square and sum (2), scale by 1/σ (1),
              γ (1), β (1): 7n;  per group: divide the sums, add ε, square root, invert: 4·groups;
              reads x, γ, β, writes y
    backward  per element: x̂ (2), u = dy·γ (1), Σu (1), u·x̂ and its sum (2), dβ = Σdy (1),
              dγ = Σdy·x̂ (2), dx = (1/σ)(u − ⟨u⟩ − x̂⟨u·x̂⟩): 4;  13n;  per group: 2 divisions;
              reads dy, x, γ, writes dx, dγ, dβ
    """
    forward = Cost(7 * n + 4 * groups, (2 * n + 2 * params) * itemsize)
    backward = Cost(13 * n + 2 * groups, (3 * n + 3 * params) * itemsize)
    return OpCost(forward, backward)


def batch_norm(batch: int, channels: int, *spatial: int, itemsize: int = 4) -> OpCost:
    """Batch norm in training, over the batch and spatial axes, one statistic per channel (see _normalization)."""
    n = batch * channels * math.prod(spatial)
    return _normalization(n, channels, channels, itemsize)


def layer_norm(rows: int, features: int, itemsize: int = 4) -> OpCost:
    """Layer norm over the last axis of (rows, features), γ and β of size ``features``."""
    return _normalization(rows * features, rows, features, itemsize)


# ---------------------------------------------------------------- optimizer updates (no backward)
def sgd_step(params: int, momentum: bool = False, itemsize: int = 4) -> Cost:
    """w ← w − lr·g: 2 FLOPs per parameter, reads w, g, writes w.
    With momentum, b ← μb + g (2) then w ← w − lr·b (2): reads w, g, b, writes w, b."""
    if momentum:
        return Cost(4 * params, 5 * params * itemsize)
    return Cost(2 * params, 3 * params * itemsize)


def adam_step(params: int, itemsize: int = 4) -> Cost:
    """Adam per parameter: m ← β₁m + (1−β₁)g (3), v ← β₂v + (1−β₂)g² (4), m̂ (1), v̂ (1),
    √ (1), + ε (1), r = m̂/(√v̂ + ε) (1), w ← w − lr·r (2): 14 FLOPs;
    reads w, g, m, v, writes w, m, v."""
    return Cost(14 * params, 7 * params * itemsize)
