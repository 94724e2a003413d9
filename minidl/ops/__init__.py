"""Every differentiable op of minidl, one Function each, grouped by family.

Importing this package also gives :class:`minidl.tensor.Tensor` its
operators (``+ - * / // % ** @``, indexing; ``~ & | ^`` on masks) and its
methods (``sum``, ``reshape``, ``relu``, ``sin``, ``add``...), each a thin
call of the op below. They are
attached here, not in tensor.py, because ops are the layer above tensors.
"""
import numpy as np

from minidl.ops import (
    activation,
    attention,
    distance,
    einsum,
    elementwise,
    indexing,
    linalg,
    math,
    rearrange,
    reduction,
    sampling,
    scan,
    scatter_reduce,
    shape,
    volume,
)
from minidl.ops.elementwise import abs, add, compare, div, floor_divide, mul, neg, pow, sub, where
from minidl.ops.linalg import matmul
from minidl.ops.math import remainder
from minidl.ops.shape import getitem, reshape, transpose
from minidl.tensor import Tensor, as_tensor


def _reflected(op):
    return lambda self, other: op(as_tensor(other, like=self), self)


# Every family module; each lists in TENSOR_METHODS the ops that are also Tensor methods.
FAMILIES = (activation, attention, distance, einsum, elementwise, indexing, linalg, math, rearrange, reduction,
            sampling, scan, scatter_reduce, shape, volume)


def _attach_tensor_methods():
    T = Tensor
    T.__add__, T.__radd__ = add, _reflected(add)
    T.__sub__, T.__rsub__ = sub, _reflected(sub)
    T.__mul__, T.__rmul__ = mul, _reflected(mul)
    T.__truediv__, T.__rtruediv__ = div, _reflected(div)
    T.__pow__, T.__rpow__ = pow, _reflected(pow)
    T.__floordiv__, T.__rfloordiv__ = floor_divide, _reflected(floor_divide)
    T.__mod__, T.__rmod__ = remainder, _reflected(remainder)  # Python's % and torch's: the divisor's sign
    T.__matmul__, T.__rmatmul__ = matmul, _reflected(matmul)
    T.__neg__ = neg
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__invert__ = _bitwise("invert")  # ~mask
    T.__and__ = T.__rand__ = _bitwise("bitwise_and")  # mask & mask (commutative: one op serves both sides)
    T.__or__ = T.__ror__ = _bitwise("bitwise_or")
    T.__xor__ = T.__rxor__ = _bitwise("bitwise_xor")
    T.__getitem__ = getitem
    # comparisons are ops (Compare), so that a traced step recomputes the masks they make
    T.__eq__ = T.eq = compare("eq")
    T.__ne__ = T.ne = compare("ne")
    T.__lt__ = T.lt = compare("lt")
    T.__le__ = T.le = compare("le")
    T.__gt__ = T.gt = compare("gt")
    T.__ge__ = T.ge = compare("ge")
    for family in FAMILIES:
        for name in family.TENSOR_METHODS:  # each family names the ops that are also Tensor methods
            setattr(T, name, getattr(family, name))
    T.T = property(lambda self: transpose(self))
    T.mT = property(shape.swap_last_axes)
    T.view = reshape  # PyTorch habit
    T.where = lambda self, condition, other: where(condition, self, other)  # torch's x.where(cond, y)


def _bitwise(name):
    """A bool/integer operator (``~ & | ^``) on the raw values: no gradient, as in PyTorch."""
    def op(self, *other):
        arrays = [o.array if isinstance(o, Tensor) else o for o in other]
        dtypes = [self.dtype] + [a.dtype if hasattr(a, "dtype") else np.result_type(a) for a in arrays]
        if any(d.kind not in "biu" for d in dtypes):
            raise TypeError(f"{name}: ~, &, | and ^ need bool or integer tensors, got "
                            f"{' and '.join(map(str, dtypes))}; compare first (x > 0) or use logical_and/or/not/xor")
        return Tensor(getattr(self.xp, name)(self.array, *arrays))
    return op


_attach_tensor_methods()
