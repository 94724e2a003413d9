"""Every differentiable op of minidl, one Function each, grouped by family.

Importing this package also gives :class:`minidl.tensor.Tensor` its
operators (``+ - * / ** @``, indexing) and NumPy-style methods (``sum``,
``reshape``, ``relu``...), each a thin call of the op below. They are
attached here, not in tensor.py, because ops are the layer above tensors.
"""
from minidl.ops import activation, einsum, elementwise, indexing, linalg, reduction, scan, shape
from minidl.ops.activation import elu, gelu, leaky_relu, log_softmax, logsumexp, relu, sigmoid, softmax, softplus, tanh
from minidl.ops.conv import conv1d, conv2d, im2col
from minidl.ops.elementwise import abs, add, clip, div, exp, log, maximum, minimum, mul, neg, pow, sqrt, sub, where
from minidl.ops.linalg import linear, matmul
from minidl.ops.loss import binary_cross_entropy_with_logits, cross_entropy, l1_loss, mse_loss, nll_loss
from minidl.ops.norm import batch_norm, group_norm, layer_norm
from minidl.ops.pool import avg_pool2d, max_pool2d
from minidl.ops.reduction import max, mean, min, sum, var
from minidl.ops.regularization import dropout, embedding
from minidl.ops.shape import broadcast_to, concatenate, flatten, getitem, pad, reshape, stack, sum_to, transpose
from minidl.tensor import Tensor, as_tensor


def _reflected(op):
    return lambda self, other: op(as_tensor(other, like=self), self)


def _attach_tensor_methods():
    T = Tensor
    T.__add__, T.__radd__ = add, _reflected(add)
    T.__sub__, T.__rsub__ = sub, _reflected(sub)
    T.__mul__, T.__rmul__ = mul, _reflected(mul)
    T.__truediv__, T.__rtruediv__ = div, _reflected(div)
    T.__pow__, T.__rpow__ = pow, _reflected(pow)
    T.__matmul__, T.__rmatmul__ = matmul, _reflected(matmul)
    T.__neg__ = neg
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__getitem__ = getitem
    for family in (activation, einsum, elementwise, indexing, linalg, reduction, scan, shape):
        for name in family.TENSOR_METHODS:  # each family names the ops that are also Tensor methods
            setattr(T, name, getattr(family, name))
    T.T = property(lambda self: transpose(self))
    T.mT = property(shape.swap_last_axes)
    T.view = reshape  # PyTorch habit


_attach_tensor_methods()
