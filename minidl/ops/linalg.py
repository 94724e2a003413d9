"""Matrix products: matmul (NumPy's @ rules), the Linear layer's op, and norms.

For Y = A B with A (n×k) and B (k×m), each element y_ij = Σ_l a_il b_lj, so

    ∂L/∂a_il = Σ_j g_ij b_lj   →   dA = G Bᵀ
    ∂L/∂b_lj = Σ_i a_il g_ij   →   dB = Aᵀ G

Batched inputs apply this to every matrix of the batch; a batch axis that was
broadcast sums its gradients back (sum_to). A 1-D operand is a row (on the
left) or a column (on the right) vector whose extra axis is dropped.

A vector p-norm y = (Σ |x|^p)^(1/p) has ∂y/∂x = sign(x) (|x|/y)^(p−1): for
p = 2 that is x / y, the unit vector along x.
"""
from __future__ import annotations

import math

import numpy as np

from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.elementwise import abs as elementwise_abs
from minidl.ops.elementwise import where
from minidl.ops.reduction import Max, Min, Reduction, _dims, _keep
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import reshape, sum_to, swap_last_axes
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("norm",)


class MatMul(Function):
    """y = a @ b;  da = dy @ bᵀ,  db = aᵀ @ dy (vectors and batches as NumPy)."""
    saved_inputs = "each other"

    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
        try:
            return a @ b
        except ValueError:
            inner = b.shape[0] if b.ndim == 1 else b.shape[-2]
            if a.shape[-1] != inner:
                reason = (f"a's last axis ({a.shape[-1]}) must equal b's "
                          f"{'only' if b.ndim == 1 else 'second-to-last'} axis ({inner})")
            else:
                reason = (f"the batch axes {a.shape[:-2]} and {b.shape[:-2]} do not broadcast "
                          "(NumPy rule: trailing axes must be equal or 1)")
            raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not align: {reason}") from None

    def backward(self, gy):
        a, b = self.inputs
        a2 = reshape(a, 1, -1) if a.ndim == 1 else a  # a vector on the left is a row
        b2 = reshape(b, -1, 1) if b.ndim == 1 else b  # a vector on the right is a column
        batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        g2 = reshape(gy, batch + (a2.shape[-2], b2.shape[-1]))
        ga = reshape(sum_to(g2 @ swap_last_axes(b2), a2.shape), a.shape) if a.requires_grad else None
        gb = reshape(sum_to(swap_last_axes(a2) @ g2, b2.shape), b.shape) if b.requires_grad else None
        return ga, gb


def matmul(a, b):
    """NumPy's a @ b with gradients; arrays are taken as constants."""
    return MatMul()(as_tensor(a), as_tensor(b))


class Linear(Function):
    """y = x Wᵀ + b with W of shape (out, in) (PyTorch's layout);
    dx = dy W,  dW = dyᵀ x,  db = Σ_batch dy.

    One op rather than matmul + add so a Linear layer costs one node and two
    GEMMs per backward, the BLAS calls working on contiguous 2-D arrays.
    """
    saved_inputs = "each other"  # x is read only for dW, W only for dx; the bias never

    def forward(self, x, weight, bias=None):
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(f"linear: input of shape {x.shape} has {x.shape[-1]} features but "
                             f"weight of shape {weight.shape} expects {weight.shape[1]} (weight is (out, in))")
        if x.ndim == 2 and 1 < x.shape[0] < 64 and xp_of(x) is np:
            # A few rows: OpenBLAS runs the wide product W xᵀ about twice as fast as the skinny
            # x Wᵀ (measured on AVX-512, batch 2 to 32); one small copy gives back a row-major y.
            y = np.ascontiguousarray((weight @ x.T).T)
        else:
            y = x @ weight.T
        if bias is not None:
            y += bias
        return y

    def backward(self, gy):
        x, weight = self.inputs[0], self.inputs[1]
        gx = LinearGradData()(gy, weight) if x.requires_grad else None
        gw = LinearGradWeight()(gy, x) if weight.requires_grad else None
        if len(self.inputs) == 2:
            return gx, gw
        gb = reduce_sum(gy, axis=tuple(range(gy.ndim - 1))) if self.inputs[2].requires_grad else None
        return gx, gw, gb


class LinearGradData(Function):
    """Linear's input gradient as an op of (dy, W):  z = dy W;
    d(dy) = dz Wᵀ (a Linear without bias),  dW = dyᵀ dz (a LinearGradWeight).
    """

    def forward(self, gy, weight):
        return gy @ weight

    def backward(self, gz):
        gy, weight = self.inputs
        return (Linear()(gz, weight) if gy.requires_grad else None,
                LinearGradWeight()(gy, gz) if weight.requires_grad else None)


class LinearGradWeight(Function):
    """Linear's weight gradient as an op of (dy, x), leading axes flattened:  z = dyᵀ x;
    d(dy) = x dzᵀ (a Linear of x by dz),  dx = dy dz (a LinearGradData).
    """

    def forward(self, gy, x):
        g2 = gy.reshape(-1, gy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        if g2.shape[0] == 1:  # one sample: an outer product, one broadcast multiply (BLAS is slow at k = 1)
            return g2.T * x2
        return g2.T @ x2

    def backward(self, gz):
        gy, x = self.inputs
        return (Linear()(x, gz) if gy.requires_grad else None,
                LinearGradData()(gy, gz) if x.requires_grad else None)


def linear(x, weight, bias=None):
    """F.linear(x, weight, bias): x Wᵀ + b, weight of shape (out_features, in_features)."""
    return Linear()(x, weight) if bias is None else Linear()(x, weight, bias)


# ---------------------------------------------------------------- norms
class VectorNorm(Reduction):
    """y = (Σ |x|^p)^(1/p) over axes;  dx = dy · sign(x) · (|x| / y)^(p−1), and dx = 0 where x = 0 or y = 0.

    For p = 2 (and PyTorch's 'fro'): y = √(Σ x²),  dx = dy · x / y. The zeros
    are PyTorch's: the zero vector has gradient 0 (not 0/0), and for p < 1 an
    entry x = 0 has gradient 0 (not 0 · ∞). Inside those places the formula
    sees stand-ins (|x| = 1, y = 1), so differentiating it again is finite too.
    """

    def __init__(self, p, axis=None, keepdims=False):
        super().__init__(axis, keepdims)
        self.p = p

    def forward(self, x):
        self.prepare(x)
        xp = xp_of(x)
        if self.p == 2:
            return xp.sqrt((x * x).sum(axis=self.axes, keepdims=self.keepdims))
        return (xp.abs(x) ** self.p).sum(axis=self.axes, keepdims=self.keepdims) ** (1 / self.p)

    def backward(self, gy):
        x = self.inputs[0]
        y = self.expand(self.output())
        y_safe = where(y.data == 0, 1, y)
        if self.p == 2:
            return self.expand(gy) * x / y_safe
        zero = x.data == 0
        ratio = where(zero, 1, elementwise_abs(x)) / y_safe
        return where(zero, 0, self.expand(gy) * Tensor(x.xp.sign(x.data)) * ratio ** (self.p - 1))


def norm(x, p="fro", dim=None, keepdim=False, *, axis=None, keepdims=None):
    """PyTorch's ``norm``: a vector p-norm over ``dim`` (all of x by default).

    p: 'fro' or 2 (√Σx²), 1 (Σ|x|), inf (max |x|), -inf (min |x|), 0 (the count of
    nonzeros, no gradient) or any other number ((Σ|x|^p)^(1/p)). With a 2-tuple
    ``dim`` 'fro' is the Frobenius norm of those matrices. The nuclear norm
    (p='nuc', the sum of singular values) is not provided: its gradient needs
    an SVD backward.
    """
    dim, keep = _dims("norm", dim, axis), _keep("norm", keepdim, keepdims)
    if p is None or p == "fro":
        p = 2
    elif isinstance(p, str):
        if p == "nuc":
            raise NotImplementedError("norm: p='nuc' (the nuclear norm) is not implemented in minidl: its gradient "
                                      "needs an SVD backward; use p='fro' or a number")
        raise ValueError(f"norm: p must be 'fro', 'nuc' or a number, got {p!r}")
    p = float(p)
    if p == 1:
        return reduce_sum(elementwise_abs(x), dim, keep)
    if p == math.inf:
        return Max(dim, keep)(elementwise_abs(x))
    if p == -math.inf:
        return Min(dim, keep)(elementwise_abs(x))
    if p == 0:
        return reduce_sum(Tensor((x.data != 0).astype(x.dtype)), dim, keep)
    return VectorNorm(2 if p == 2 else p, dim, keep)(x)
