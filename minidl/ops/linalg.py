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

from minidl import backend
from minidl.autocast_mode import autocast_to
from minidl.autograd import Function, tangent_sum
from minidl.backend import xp_of
from minidl.ops.elementwise import abs as elementwise_abs
from minidl.ops.elementwise import where
from minidl.ops.reduction import Max, Min, Reduction, _dims, _keep
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import Transpose, broadcast_to, reshape, sum_to, swap_last_axes
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ("matmul", "mm", "bmm", "dot", "outer", "norm")


class MatMul(Function):
    """y = a @ b;  da = dy @ bᵀ,  db = aᵀ @ dy (vectors and batches as NumPy)."""
    saved_inputs = "each other"

    def forward(self, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"matmul: operands must have at least 1 dimension, got shapes {a.shape} and {b.shape}")
        try:
            return backend.matmul(a, b)
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

    def jvp(self, da, db):
        """dy = da @ b + a @ db."""
        a, b = self.inputs
        return tangent_sum(None if da is None else MatMul()(da, b), None if db is None else MatMul()(a, db))


@autocast_to("lower")
def matmul(a, b):
    """NumPy's a @ b with gradients; arrays are taken as constants."""
    return MatMul()(as_tensor(a), as_tensor(b))


def mm(a, b):
    """PyTorch's ``mm``: the product of two matrices (2-D each; :func:`matmul` for batches or vectors)."""
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"mm: both operands must be matrices (2-D), got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}; use matmul (or @) for batched or 1-D operands")
    return matmul(a, b)


def bmm(a, b):
    """PyTorch's ``bmm``: ``y[i] = a[i] @ b[i]`` for a batch of matrices, (B, n, k) @ (B, k, m) → (B, n, m).

    Both operands are 3-D with the same batch size: unlike :func:`matmul`, nothing broadcasts.
    """
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim != 3 or b.ndim != 3:
        raise ValueError(f"bmm: both operands must be batches of matrices (3-D), got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}; use mm for 2-D or matmul (or @) to broadcast")
    if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply; expected "
                         "(B, n, k) and (B, k, m), the same batch size B and inner size k")
    return matmul(a, b)


def _vectors(op, a, b):
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"{op}: both operands must be vectors (1-D), got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}; flatten them first, or use matmul for matrices")
    return a, b


def dot(a, b):
    """PyTorch's ``dot``: y = Σ_i a_i b_i for two vectors of the same length and dtype (a 0-d tensor).

    dy/da = b, dy/db = a: the 1-D case of :class:`MatMul`.
    """
    a, b = _vectors("dot", a, b)
    if a.shape != b.shape:
        raise ValueError(f"dot: the vectors must have the same length, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"dot: both vectors must have the same dtype, got {a.dtype} and {b.dtype}; "
                        "convert one first, e.g. b.to(a.dtype)")
    return matmul(a, b)


def outer(a, b):
    """PyTorch's ``outer``: y_ij = a_i b_j for two vectors, an (n, m) matrix (gradients by the product rule)."""
    a, b = _vectors("outer", a, b)
    return reshape(a, (-1, 1)) * reshape(b, (1, -1))


def _as_rows(a):
    """``a`` of shape (..., k) as the 2-D (rows, k) that one GEMM takes: NumPy's matmul of a 3-D array
    runs one small product per leading index (1.3–4.7× slower, measured on 2 cores)."""
    return a.reshape(-1, a.shape[-1]) if a.ndim > 2 and a.shape[-1] else a


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
        rows = _as_rows(x)
        if rows.ndim == 2 and 1 < rows.shape[0] < 64 and xp_of(x) is np:
            # A few rows: OpenBLAS runs the wide product W xᵀ about twice as fast as the skinny
            # x Wᵀ (measured on AVX-512, batch 2 to 32); one small copy gives back a row-major y.
            y = np.ascontiguousarray(backend.matmul(weight, rows.T).T)
        else:
            y = backend.matmul(rows, weight.T)
        if rows is not x:
            y = y.reshape(x.shape[:-1] + (weight.shape[0],))
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

    def jvp(self, dx, dweight, dbias=None):
        """dy = dx Wᵀ + x dWᵀ + db."""
        x, weight = self.inputs[0], self.inputs[1]
        y = tangent_sum(None if dx is None else Linear()(dx, weight), None if dweight is None else Linear()(x, dweight))
        if dbias is not None:
            y = tangent_sum(y, broadcast_to(dbias, self.output().shape) if y is None else dbias)
        return y


class LinearGradData(Function):
    """Linear's input gradient as an op of (dy, W):  z = dy W;
    d(dy) = dz Wᵀ (a Linear without bias),  dW = dyᵀ dz (a LinearGradWeight).
    """

    def forward(self, gy, weight):
        rows = _as_rows(gy)
        z = backend.matmul(rows, weight)
        return z if rows is gy else z.reshape(gy.shape[:-1] + (weight.shape[1],))

    def backward(self, gz):
        gy, weight = self.inputs
        return (Linear()(gz, weight) if gy.requires_grad else None,
                LinearGradWeight()(gy, gz) if weight.requires_grad else None)

    def jvp(self, dgy, dweight):
        """dz = d(dy) W + dy dW."""
        gy, weight = self.inputs
        return tangent_sum(None if dgy is None else LinearGradData()(dgy, weight),
                           None if dweight is None else LinearGradData()(gy, dweight))


class LinearGradWeight(Function):
    """Linear's weight gradient as an op of (dy, x), leading axes flattened:  z = dyᵀ x;
    d(dy) = x dzᵀ (a Linear of x by dz),  dx = dy dz (a LinearGradData).
    """

    def forward(self, gy, x):
        g2 = gy.reshape(-1, gy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        if g2.shape[0] == 1:  # one sample: an outer product, one broadcast multiply (BLAS is slow at k = 1)
            return g2.T * x2
        return backend.matmul(g2.T, x2)

    def backward(self, gz):
        gy, x = self.inputs
        return (Linear()(x, gz) if gy.requires_grad else None,
                LinearGradData()(gy, gz) if x.requires_grad else None)

    def jvp(self, dgy, dx):
        """dz = d(dy)ᵀ x + dyᵀ dx."""
        gy, x = self.inputs
        return tangent_sum(None if dgy is None else LinearGradWeight()(dgy, x),
                           None if dx is None else LinearGradWeight()(gy, dx))


@autocast_to("lower")
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
        with np.errstate(divide="ignore"):  # p < 0: |0|ᵖ = inf, and the norm is 0
            return (xp.abs(x) ** self.p).sum(axis=self.axes, keepdims=self.keepdims) ** (1 / self.p)

    def backward(self, gy):
        x = self.inputs[0]
        y = self.expand(self.output())
        y_safe = where(y.array == 0, 1, y)
        if self.p == 2:
            return self.expand(gy) * x / y_safe
        zero = (x.array == 0) | (y.array == 0)  # y = 0 with x ≠ 0 where p < 0 and another entry is 0
        ratio = where(zero, 1, elementwise_abs(x)) / y_safe
        return where(zero, 0, self.expand(gy) * Tensor(x.xp.sign(x.array)) * ratio ** (self.p - 1))

    def jvp(self, dx):
        """dy = Σ sign(x) (|x| / y)^(p−1) dx over axes (p = 2: Σ x dx / y), with the same zeros."""
        x = self.inputs[0]
        y = self.output()
        if self.p == 2:
            return reduce_sum(x * dx, axis=self.axes, keepdims=self.keepdims) / where(y.array == 0, 1, y)
        y = self.expand(y)
        y_safe = where(y.array == 0, 1, y)
        zero = (x.array == 0) | (y.array == 0)
        ratio = where(zero, 1, elementwise_abs(x)) / y_safe
        slope = where(zero, 0, Tensor(x.xp.sign(x.array)) * ratio ** (self.p - 1))
        return reduce_sum(slope * dx, axis=self.axes, keepdims=self.keepdims)


class SVD(Function):
    """A = U diag(s) Vᵀ;
    dA = U (J diag(s) + diag(s) K + diag(ds)) Vᵀ + (I − U Uᵀ) dU diag(s)⁻¹ Vᵀ + U diag(s)⁻¹ dVᵀ (I − V Vᵀ).

    The thin SVD of a (batch of) m×n matrix, k = min(m, n): U is m×k, s holds
    the k singular values (descending), and the third output is Vᵀ (k×n). In
    the gradient (the real case of PyTorch's svd_backward),

        J = F ⊙ (Uᵀ dU − dUᵀ U),  K = F ⊙ (Vᵀ dV − dVᵀ V),  F_ij = 1 / (s_j² − s_i²)

    with F's diagonal taken as 1 (J and K have a zero diagonal); the last two
    terms appear only for a tall (m > k) or a wide (n > k) matrix. Defined
    where the singular values are distinct and nonzero, as in PyTorch: a
    repeated or zero value makes F or diag(s)⁻¹ infinite when dU or dV is not 0.
    Used by the nuclear norm; the backward reads U, s, Vᵀ again, through a
    new SVD of A if they were freed, so it differentiates to any order.
    """

    def forward(self, a):
        u, s, vh = xp_of(a).linalg.svd(a, full_matrices=False)
        return u, s, vh

    def backward(self, gu, gs, gvh):
        u, s, vh = [self.output(i) for i in range(3)]
        if u is None or s is None or vh is None:
            u, s, vh = SVD()(self.inputs[0])
        m, n, k = u.shape[-2], vh.shape[-1], s.shape[-1]
        batch = s.shape[:-1]
        eye = Tensor(s.xp.eye(k, dtype=s.dtype))
        s_row, s_col = reshape(s, batch + (1, k)), reshape(s, batch + (k, 1))
        s2 = s * s
        f_inverse = reshape(s2, batch + (1, k)) - reshape(s2, batch + (k, 1)) + eye  # s_j² − s_i², 1 on the diagonal
        v, gv = swap_last_axes(vh), swap_last_axes(gvh)
        uu = swap_last_axes(u) @ gu
        vv = vh @ gv
        core = ((uu - swap_last_axes(uu)) * s_row + s_col * (vv - swap_last_axes(vv))) / f_inverse
        core = core + eye * reshape(gs, batch + (k, 1))
        if m > k:
            gu_s = gu / s_row
            return (u @ core + gu_s - u @ (swap_last_axes(u) @ gu_s)) @ vh
        if n > k:
            gv_s = swap_last_axes(gv / s_row)
            return u @ (core @ vh + gv_s - (gv_s @ v) @ vh)
        return u @ core @ vh

    def jvp(self, da):
        """With dP = Uᵀ dA V, S = diag(s) and F as above (its diagonal 0):

            ds = diag(dP)
            dU = U (F ⊙ (dP S + S dPᵀ)) + (I − U Uᵀ) dA V S⁻¹
            dV = V (F ⊙ (S dP + dPᵀ S)) + (I − V Vᵀ) dAᵀ U S⁻¹   (the third output is dVᵀ)
        """
        u, s, vh = [self.output(i) for i in range(3)]
        m, n, k = u.shape[-2], vh.shape[-1], s.shape[-1]
        batch = s.shape[:-1]
        eye = Tensor(s.xp.eye(k, dtype=s.dtype))
        s_row, s_col = reshape(s, batch + (1, k)), reshape(s, batch + (k, 1))
        s2 = s * s
        f = (1 - eye) / (reshape(s2, batch + (1, k)) - reshape(s2, batch + (k, 1)) + eye)  # F, 0 on the diagonal
        v = swap_last_axes(vh)
        dp = swap_last_axes(u) @ da @ v
        ds = reshape((dp * eye) @ Tensor(s.xp.ones((k, 1), dtype=s.dtype)), batch + (k,))
        dpt = swap_last_axes(dp)
        du = u @ (f * (dp * s_row + s_col * dpt))
        dv = v @ (f * (s_col * dp + dpt * s_row))
        if m > k:
            du = du + (da @ v - u @ dp) / s_row
        if n > k:
            dv = dv + (swap_last_axes(da) @ u - v @ dpt) / s_row
        return du, ds, swap_last_axes(dv)


class NuclearNorm(Function):
    """y = Σ_i s_i with A = U diag(s) Vᵀ;  dA = dy U Vᵀ.

    Over the last two axes of A (a batch of matrices). The gradient U Vᵀ is
    taken from a differentiable :class:`SVD` of A, so its own derivative is
    SVD's backward. At a rank-deficient A the norm has no gradient; U Vᵀ is
    then one subgradient (PyTorch's choice as well).
    """
    saved_inputs = None

    def forward(self, a):
        return xp_of(a).linalg.svd(a, compute_uv=False).sum(axis=-1)

    def backward(self, gy):
        u, _, vh = SVD()(self.inputs[0])
        return reshape(gy, gy.shape + (1, 1)) * (u @ vh)

    def jvp(self, da):
        """dy = Σ (U Vᵀ) ⊙ dA over the last two axes."""
        u, _, vh = SVD()(self.inputs[0])
        return reduce_sum((u @ vh) * da, axis=(-2, -1))


@autocast_to("float32")
def norm(x, p="fro", dim=None, keepdim=False, *, axis=None, keepdims=None):
    """PyTorch's ``norm``: a vector p-norm over ``dim`` (all of x by default).

    p: 'fro' or 2 (√Σx²), 1 (Σ|x|), inf (max |x|), -inf (min |x|), 0 (the count of
    nonzeros, no gradient) or any other number ((Σ|x|^p)^(1/p)). With a 2-tuple
    ``dim`` 'fro' is the Frobenius norm of those matrices, and 'nuc' is the
    nuclear norm (the sum of the singular values) of the matrices spanned by
    the two dims (of a 2-D x when dim is None). As in ``torch.norm``, a number
    p with a 2-tuple dim is the vector norm over both dims.
    """
    dim, keep = _dims("norm", dim, axis), _keep("norm", keepdim, keepdims)
    if p is None or p == "fro":
        p = 2
    elif isinstance(p, str):
        if p == "nuc":
            return _nuclear_norm(x, dim, keep)
        raise ValueError(f"norm: p must be 'fro', 'nuc' or a number, got {p!r}")
    p = float(p)
    if p == 1:
        return reduce_sum(elementwise_abs(x), dim, keep)
    if p == math.inf:
        return Max(dim, keep)(elementwise_abs(x))
    if p == -math.inf:
        return Min(dim, keep)(elementwise_abs(x))
    if p == 0:
        return reduce_sum(Tensor((x.array != 0).astype(x.dtype)), dim, keep)
    return VectorNorm(2 if p == 2 else p, dim, keep)(x)


def _nuclear_norm(x, dim, keep):
    if dim is None:
        if x.ndim != 2:
            raise ValueError(f"norm: p='nuc' without dim needs a 2-D tensor, got shape {x.shape}; "
                             "pass dim=(row_dim, column_dim)")
        dim = (0, 1)
    pair = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    axes = [a % x.ndim if -x.ndim <= a < x.ndim else None for a in pair] if x.ndim else [None]
    if len(pair) != 2 or None in axes or axes[0] == axes[1]:
        raise ValueError(f"norm: p='nuc' needs dim to be two different dims of the tensor, got {dim!r} "
                         f"for shape {x.shape}")
    rest = [a for a in range(x.ndim) if a not in axes]
    perm = tuple(rest + axes)
    moved = x if perm == tuple(range(x.ndim)) else Transpose(perm)(x)
    y = NuclearNorm()(moved)
    if keep:
        y = reshape(y, tuple(1 if a in axes else n for a, n in enumerate(x.shape)))
    return y
