"""A sparse weight in CSR form and its product with dense inputs: what an unstructured-pruned layer can run.

Compressed sparse row (CSR) keeps an O × I matrix W with nnz nonzeros as three arrays:

    values[k]    the k-th nonzero, row by row (nnz)
    indices[k]   its column (nnz)
    indptr[r]    where row r starts in values; row r is values[indptr[r] : indptr[r + 1]]  (O + 1)

so a layer pruned to density d stores d·O·I values and as many column indices instead of O·I
values (with 4-byte values and 4-byte indices, smaller than dense below d = ½).

The product with a batch x (B × I), y = x Wᵀ as in a Linear layer, is per output row r a sum over
that row's nonzeros only:

    y[b, r] = Σ_{k ∈ row r} values[k] · x[b, indices[k]],

computed here without a Python loop over rows or entries: gather the columns of xᵀ that the
nonzeros need (nnz × B), scale each by its value, and add each row's run with one
``np.add.reduceat``. That is 2·nnz·B FLOPs against the dense product's 2·O·I·B, but as memory-
bound gathers instead of a tuned GEMM; ``benchmarks/bench_sparse.py`` measures the density below
which it wins on this machine (docs/performance.md). Where SciPy is installed, its compiled CSR
product does the same sums without the nnz × B temporary (an optional accelerator, as for erf).

The gradients are the same two kinds of product:

    dx = dy W            the same gather-and-sum over Wᵀ, whose CSR form (the columns' runs, the
                         values permuted) is computed once with the structure;
    dvalues[k] = Σ_b dy[b, r_k] · x[b, indices[k]]   only at the stored places ("sampled" dense
                         product): a pruned weight gets no gradient and stays pruned. Above a
                         density of 5 % it is the dense dyᵀ x read at those places (one GEMM).

Both are written with this op and differentiable indexing, so every derivative order follows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from minidl import backend
from minidl.autograd import Function
from minidl.backend import xp_of
from minidl.ops.linalg import matmul
from minidl.ops.reduction import sum as reduce_sum
from minidl.ops.shape import getitem, reshape, transpose
from minidl.tensor import Tensor, as_tensor

# The ops of this family that minidl.ops also attaches to Tensor as methods.
TENSOR_METHODS = ()
# Above this density the values' gradient is the dense dW = dyᵀ x (one GEMM) read at the stored places:
# the per-place gathers move B·nnz values each, more than a GEMM costs once nnz is a few percent of O·I.
SAMPLED_DENSE_ABOVE = 0.05


@dataclass(frozen=True, eq=False)
class CSRStructure:
    """Where the nonzeros of an O × I matrix are: ``indptr`` (O + 1), ``indices`` (nnz), ``shape`` (O, I).

    ``rows[k]`` is the row of nonzero k; the transposed structure (the I × O matrix Wᵀ in CSR) and
    ``order``, the permutation taking W's values to Wᵀ's, are built on first use.
    """

    indptr: np.ndarray
    indices: np.ndarray
    shape: tuple

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def density(self) -> float:
        return self.nnz / max(self.shape[0] * self.shape[1], 1)

    @property
    def rows(self) -> np.ndarray:
        xp = xp_of(self.indptr)
        return xp.repeat(xp.arange(self.shape[0]), xp.diff(self.indptr))

    def transposed(self) -> tuple["CSRStructure", np.ndarray]:
        """(the structure of Wᵀ, ``order``): Wᵀ's values are W's values[order]."""
        cached = self.__dict__.get("_transposed")
        if cached is None:
            xp = xp_of(self.indptr)
            order = xp.argsort(self.indices, kind="stable")  # by column, rows ascending within each
            counts = xp.bincount(self.indices, minlength=self.shape[1])
            indptr = xp.concatenate([xp.zeros(1, dtype=self.indptr.dtype), xp.cumsum(counts)]).astype(
                self.indptr.dtype)
            cached = (CSRStructure(indptr, self.rows[order].astype(self.indices.dtype), self.shape[::-1]), order)
            object.__setattr__(self, "_transposed", cached)
        return cached

    @classmethod
    def from_dense(cls, dense, keep=None) -> tuple["CSRStructure", np.ndarray]:
        """(structure, values) of a 2-D array: its nonzeros, or the places where ``keep`` is True
        (a pruning mask: a kept weight that is exactly zero is still stored)."""
        xp = xp_of(dense)
        if dense.ndim != 2:
            raise ValueError(f"CSRStructure.from_dense: expects a 2-D matrix, got shape {tuple(dense.shape)}")
        keep = dense != 0 if keep is None else xp.asarray(keep, dtype=bool)
        if keep.shape != dense.shape:
            raise ValueError(f"CSRStructure.from_dense: mask shape {tuple(keep.shape)} is not the matrix's "
                             f"{tuple(dense.shape)}")
        rows, cols = xp.nonzero(keep)  # row-major order: row by row, columns ascending
        indptr = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(xp.bincount(rows, minlength=dense.shape[0]))])
        return cls(indptr.astype(np.int64), cols.astype(np.int64), tuple(dense.shape)), dense[rows, cols]

    def on(self, like) -> "CSRStructure":
        """This structure with its index arrays on the device of the array ``like`` (a copy made once per device)."""
        xp = xp_of(like)
        if xp_of(self.indptr) is xp and backend.device_of(self.indptr) == backend.device_of(like):
            return self
        copies = self.__dict__.setdefault("_copies", {})
        device = backend.device_of(like)
        if device not in copies:
            copies[device] = CSRStructure(xp.asarray(self.indptr), xp.asarray(self.indices), self.shape)
        return copies[device]

    def to_dense(self, values):
        """The O × I matrix with ``values`` at the stored places and zeros elsewhere."""
        xp = xp_of(values)
        dense = xp.zeros(self.shape, dtype=values.dtype)
        dense[self.rows, self.indices] = values
        return dense


def csr_product_array(x, values, structure: CSRStructure):
    """y = x Wᵀ on arrays, x (B, I) → (B, O): the gather, scale and per-row ``reduceat`` of the module docstring,
    or SciPy's compiled CSR product where SciPy is installed (NumPy arrays; the same sums, row by row)."""
    xp = xp_of(x)
    sparse = backend.scipy_sparse() if xp is np else None
    if sparse is not None:
        matrix = sparse.csr_matrix((values, structure.indices, structure.indptr), shape=structure.shape)
        return np.ascontiguousarray((matrix @ x.T).T, dtype=np.result_type(x, values))
    out = xp.zeros((structure.shape[0], x.shape[0]), dtype=x.dtype)  # yᵀ: each row a contiguous run of B
    nonempty = structure.indptr[1:] > structure.indptr[:-1]
    if structure.nnz:
        terms = xp.ascontiguousarray(x.T)[structure.indices]  # (nnz, B): contiguous rows gathered (2× faster)
        terms *= values[:, None]  # row k is values[k] · x[:, indices[k]]
        out[nonempty] = xp.add.reduceat(terms, structure.indptr[:-1][nonempty], axis=0)
    return out.T


class CSRMatMul(Function):
    """y = x Wᵀ with W (O × I) in CSR: y[b, r] = Σ_{k ∈ row r} v[k] x[b, c_k];
    dx = dy W (the same product over Wᵀ's structure, values permuted),  dv[k] = Σ_b dy[b, r_k] x[b, c_k]."""

    def __init__(self, structure: CSRStructure):
        self.structure = structure

    def forward(self, x, values):
        self.structure = self.structure.on(x)  # the index arrays where x lives (once per device)
        return csr_product_array(x, values, self.structure)

    def backward(self, gy):
        x, values = self.inputs
        gx = gv = None
        if x.requires_grad:
            transposed, order = self.structure.transposed()
            gx = CSRMatMul(transposed)(gy, getitem(values, Tensor(order)))
        if values.requires_grad:
            rows, cols = Tensor(self.structure.rows), Tensor(self.structure.indices)
            if self.structure.density > SAMPLED_DENSE_ABOVE:  # the dense dW, read at the stored places
                gv = getitem(matmul(transpose(gy), x), (rows, cols))
            else:  # B products per stored place: cheaper than the dense dW below the threshold
                gv = reduce_sum(getitem(transpose(gy), rows) * getitem(transpose(x), cols), axis=1)
        return gx, gv

    def jvp(self, dx, dvalues):
        """ẏ = ẋ Wᵀ + x Ẇᵀ  (y is linear in x and in the values)."""
        x, values = self.inputs
        dy = None if dx is None else CSRMatMul(self.structure)(dx, values)
        if dvalues is not None:
            along = CSRMatMul(self.structure)(x, dvalues)
            dy = along if dy is None else dy + along
        return dy


def csr_linear(x, values, structure: CSRStructure, bias=None) -> Tensor:
    """A Linear layer with a CSR weight: y = x Wᵀ + b, x (…, I) → (…, O); ``values`` (nnz,) are W's stored entries."""
    x, values = as_tensor(x), as_tensor(values)
    out_features, in_features = structure.shape
    if x.shape[-1:] != (in_features,):
        raise ValueError(f"csr_linear: x's last dimension must be {in_features} (W is {out_features} × "
                         f"{in_features}), got x of shape {tuple(x.shape)}")
    if tuple(values.shape) != (structure.nnz,):
        raise ValueError(f"csr_linear: values must have shape ({structure.nnz},), got {tuple(values.shape)}")
    if x.dtype != values.dtype:
        raise TypeError(f"csr_linear: x is {x.dtype} but the values are {values.dtype}; convert one of them")
    lead = x.shape[:-1]
    y = CSRMatMul(structure)(reshape(x, -1, in_features), values)
    if bias is not None:
        y = y + bias
    return reshape(y, *lead, out_features)
