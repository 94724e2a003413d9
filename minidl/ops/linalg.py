"""Matrix products: matmul (NumPy's @ rules) and the Linear layer's op.

For Y = A B with A (n×k) and B (k×m), each element y_ij = Σ_l a_il b_lj, so

    ∂L/∂a_il = Σ_j g_ij b_lj   →   dA = G Bᵀ
    ∂L/∂b_lj = Σ_i a_il g_ij   →   dB = Aᵀ G

Batched inputs apply this to every matrix of the batch; a batch axis that was
broadcast sums its gradients back (sum_to). A 1-D operand is a row (on the
left) or a column (on the right) vector whose extra axis is dropped.
"""
from __future__ import annotations

import numpy as np

from minidl.autograd import Function, is_grad_enabled
from minidl.backend import xp_of
from minidl.ops.shape import reshape, sum_to, swap_last_axes
from minidl.tensor import Tensor, as_tensor


class MatMul(Function):
    """y = a @ b;  da = dy @ bᵀ,  db = aᵀ @ dy (vectors and batches as NumPy)."""

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
        if not is_grad_enabled():
            return self._first_order(gy.data, x, weight)
        gx = gy @ weight if x.requires_grad else None
        g2 = reshape(gy, -1, gy.shape[-1])
        gw = swap_last_axes(g2) @ reshape(x, -1, x.shape[-1]) if weight.requires_grad else None
        if len(self.inputs) == 2:
            return gx, gw
        gb = g2.sum(axis=0) if self.inputs[2].requires_grad else None
        return gx, gw, gb

    def _first_order(self, g, x, weight):
        """The same three products on raw arrays: the usual backward builds no nodes, so it
        needs no Tensor ops (those are for create_graph, to differentiate dx, dW again)."""
        g2 = g.reshape(-1, g.shape[-1])
        x2 = x.data.reshape(-1, x.shape[-1])
        gx = Tensor(g @ weight.data) if x.requires_grad else None
        gw = None
        if weight.requires_grad:  # one sample: dW is an outer product, one broadcast multiply (BLAS is slow at k = 1)
            gw = Tensor(g2.T * x2 if g2.shape[0] == 1 else g2.T @ x2)
        if len(self.inputs) == 2:
            return gx, gw
        return gx, gw, (Tensor(g2.sum(axis=0)) if self.inputs[2].requires_grad else None)


def linear(x, weight, bias=None):
    """F.linear(x, weight, bias): x Wᵀ + b, weight of shape (out_features, in_features)."""
    return Linear()(x, weight) if bias is None else Linear()(x, weight, bias)
