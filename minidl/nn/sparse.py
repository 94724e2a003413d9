"""A pruned Linear layer stored and run sparse: its kept weights in CSR form (:mod:`minidl.ops.sparse`).

    pruning = nn.prune.Pruning(model); pruning.prune(0.95)      # 95 % of each weight zero
    sparse_model = nn.sparse.to_sparse(model)                     # every pruned Linear → SparseLinear
    sparse_model(x)                                               # the same outputs, from the stored nonzeros

A :class:`SparseLinear` keeps the nonzeros (``values``, a Parameter that trains), their columns and
the rows' starts (``indices`` and ``indptr``, integer buffers) and the bias. A pruned weight has no
stored place, so it gets no gradient and stays zero without a mask. Its state dict holds those four
tensors, so it saves and loads like any layer; ``to_dense()`` gives the plain Linear back.
"""
from __future__ import annotations

import copy

import numpy as np

from minidl.autograd import no_grad
from minidl.nn.layers import Linear
from minidl.nn.module import Module, Parameter
from minidl.nn.utils import replace_module
from minidl.ops.sparse import CSRStructure, csr_linear
from minidl.tensor import Tensor


class SparseLinear(Module):
    """y = x Wᵀ + b with W (out_features × in_features) stored in CSR: ``values``, ``indices``, ``indptr``.

    Build it from a Linear with :meth:`from_linear` (its nonzeros, or its pruning mask's kept places).
    """

    def __init__(self, structure: CSRStructure, values, bias=None):
        super().__init__()
        self.out_features, self.in_features = structure.shape
        self.values = Parameter(values)
        self.bias = None if bias is None else Parameter(bias)
        self.register_buffer("indptr", Tensor(structure.indptr))
        self.register_buffer("indices", Tensor(structure.indices))
        self._structure = structure

    @classmethod
    def from_linear(cls, linear: Linear) -> "SparseLinear":
        """The layer's kept weights in CSR: where its ``weight_mask`` (nn.prune's) is True, else where it is nonzero."""
        if not isinstance(linear, Linear):
            raise TypeError(f"SparseLinear.from_linear: expects an nn.Linear, got {type(linear).__name__}")
        mask = getattr(linear, "weight_mask", None)
        structure, values = CSRStructure.from_dense(linear.weight.array, None if mask is None else mask.array)
        bias = None if linear.bias is None else linear.bias.array.copy()
        return cls(structure, values.copy(), bias)

    @property
    def structure(self) -> CSRStructure:
        """The CSR structure of the current buffers (rebuilt when a loaded state changed them)."""
        s, indptr, indices = self._structure, self.indptr.array, self.indices.array
        if not (s.indptr.shape == indptr.shape and s.indices.shape == indices.shape
                and np.array_equal(s.indptr, indptr) and np.array_equal(s.indices, indices)):
            s = self._structure = CSRStructure(indptr, indices, (self.out_features, self.in_features))
        return s

    def check_loaded_state(self, state: dict) -> list:
        """A loaded structure must describe this layer's shape and match the values' count."""
        indptr, indices, values = state["indptr"], state["indices"], state["values"]
        problems = []
        if indptr.shape != (self.out_features + 1,) or (indptr.size and int(indptr[0]) != 0) \
                or np.any(np.diff(indptr) < 0) or int(indptr[-1]) != indices.shape[0]:
            problems.append(("indptr", f"is not the row starts of {self.out_features} rows over "
                                       f"{indices.shape[0]} stored values"))
        if indices.size and (indices.min() < 0 or indices.max() >= self.in_features):
            problems.append(("indices", f"has columns outside 0..{self.in_features - 1}"))
        if values.shape != indices.shape:
            problems.append(("values", f"has {values.shape[0]} entries for {indices.shape[0]} stored places"))
        return problems

    @property
    def density(self) -> float:
        return self.structure.density

    def forward(self, x):
        return csr_linear(x, self.values, self.structure, self.bias)

    def to_dense(self) -> Linear:
        """The plain Linear layer with these weights (zeros where nothing is stored)."""
        dense = Linear(self.in_features, self.out_features, bias=self.bias is not None,
                       device=self.values.device, dtype=self.values.dtype)
        with no_grad():
            dense.weight.array[...] = self.structure.to_dense(self.values.array)
            if self.bias is not None:
                dense.bias.array[...] = self.bias.array
        return dense

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"stored={self.structure.nnz} ({100 * self.density:.1f} %), bias={self.bias is not None}")


def to_sparse(model: Module, min_sparsity: float = 0.0) -> Module:
    """A copy of ``model`` with every Linear whose weight has at least ``min_sparsity`` zeros as a SparseLinear.

    ``model`` itself is not changed. A Linear that is the whole model is converted too.
    """
    if isinstance(model, Linear):
        return SparseLinear.from_linear(model)
    out = copy.deepcopy(model)
    targets = [(name, m) for name, m in out.named_modules() if isinstance(m, Linear) and name]
    for name, linear in targets:
        if float((linear.weight.array == 0).mean()) >= min_sparsity:
            replace_module(out, name, SparseLinear.from_linear(linear))
    return out
