"""Assignment 2 (op backwards): wrong solutions as students write them."""
from tests.course.mistakes import Mistake

SUM_TO = "minidl.ops.shape.SumTo.forward"
MATMUL = "minidl.ops.linalg.MatMul.backward"
SOFTMAX = "minidl.ops.activation.SoftmaxGrad.forward"
CROSS_ENTROPY = "minidl.ops.loss.CrossEntropyGrad.forward"
OUTPUT_SIZE = "minidl.ops.conv.output_size"
COL2IM = "minidl.ops.conv.col2im_array"
NORMALIZE = "minidl.ops.norm.NormalizeGrad.forward"
ATTENTION = "minidl.ops.attention.AttentionGrad.forward"

_COL2IM = """
xp = xp_of(cols)
n, c, h, w = in_shape
(kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
(pt, pb), (pl, pr) = _sides(padding)
oh, ow = cols.shape[1], cols.shape[2]
image = xp.zeros((n, h + pt + pb, w + pl + pr, c), cols.dtype)
for p in range(kh):
    for q in range(kw):
        {line}
return image[:, pt:pt + h, pl:pl + w].transpose(0, 3, 1, 2)
"""

_ATTENTION = """
xp = xp_of(gy)
p = self.probs
gv = _sum_to({gv}, v.shape)
gz = gy @ xp.swapaxes(v, -1, -2)
{softmax}gz *= p
gq = _sum_to(gz @ k, q.shape)
gk = _sum_to({gk}, k.shape)
{scale}return gq, gk, gv
"""


def _attention(gv="xp.swapaxes(p, -1, -2) @ gy", gk="xp.swapaxes(gz, -1, -2) @ q",
               softmax="gz -= (gz * p).sum(axis=-1, keepdims=True)\n", scale="gq *= self.scale\ngk *= self.scale\n"):
    return _ATTENTION.format(gv=gv, gk=gk, softmax=softmax, scale=scale)


MISTAKES = [
    # 2.1 sum_to
    Mistake("2.1", "sums only the leading axes, keeps the stretched ones", {SUM_TO: """
self.in_shape = x.shape
lead = x.ndim - len(self.shape)
return x.sum(axis=tuple(range(lead)))
"""}, ("missing sum over broadcast axes",)),
    Mistake("2.1", "averages instead of summing", {SUM_TO: """
self.in_shape = x.shape
lead = x.ndim - len(self.shape)
axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(self.shape) if n == 1 and x.shape[lead + i] != 1)
return x.mean(axis=axes, keepdims=True).reshape(self.shape)
"""}, ("averaged, not summed",)),
    Mistake("2.1", "sums the stretched axes but forgets the leading ones", {SUM_TO: """
self.in_shape = x.shape
lead = x.ndim - len(self.shape)
axes = tuple(lead + i for i, n in enumerate(self.shape) if n == 1 and x.shape[lead + i] != 1)
return x.sum(axis=axes, keepdims=True)
"""}, ("missing sum over broadcast axes",)),
    # 2.2 matmul
    Mistake("2.2", "vectors handled, but a broadcast batch is not summed back", {MATMUL: """
a, b = self.inputs
a2 = reshape(a, 1, -1) if a.ndim == 1 else a
b2 = reshape(b, -1, 1) if b.ndim == 1 else b
g2 = reshape(gy, np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]) + (a2.shape[-2], b2.shape[-1]))
ga = g2 @ swap_last_axes(b2)
gb = swap_last_axes(a2) @ g2
return (reshape(ga, a.shape) if a.ndim == 1 else ga), (reshape(gb, b.shape) if b.ndim == 1 else gb)
"""}, ("missing sum over broadcast axes",), public_passes=True),
    Mistake("2.2", "da = dy @ b: b not transposed", {MATMUL: """
a, b = self.inputs
a2 = reshape(a, 1, -1) if a.ndim == 1 else a
b2 = reshape(b, -1, 1) if b.ndim == 1 else b
batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
g2 = reshape(gy, batch + (a2.shape[-2], b2.shape[-1]))
ga = reshape(sum_to(g2 @ b2, a2.shape), a.shape)
gb = reshape(sum_to(swap_last_axes(a2) @ g2, b2.shape), b.shape)
return ga, gb
"""}, ("transposed operand",)),
    Mistake("2.2", "db = dyᵀ a: the operands' order swapped", {MATMUL: """
a, b = self.inputs
a2 = reshape(a, 1, -1) if a.ndim == 1 else a
b2 = reshape(b, -1, 1) if b.ndim == 1 else b
batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
g2 = reshape(gy, batch + (a2.shape[-2], b2.shape[-1]))
ga = reshape(sum_to(g2 @ swap_last_axes(b2), a2.shape), a.shape)
gb = sum_to(swap_last_axes(g2) @ a2, swap_last_axes(b2).shape)
return ga, (reshape(gb, b.shape) if b.ndim == 1 else gb)
"""}, ("transposed operand",)),
    # 2.3 softmax and cross-entropy
    Mistake("2.3", "softmax: only the diagonal of the Jacobian", {SOFTMAX: "return y * gy\n"}, ("missing term",)),
    Mistake("2.3", "softmax: always the last axis", {SOFTMAX: """
return y * (gy - (gy * y).sum(axis=-1, keepdims=True))
"""}, ("wrong axis",), public_passes=True),
    Mistake("2.3", "softmax: the incoming gradient changed in place", {SOFTMAX: """
gy -= (gy * y).sum(axis=self.axis, keepdims=True)
gy *= y
return gy
"""}, ("in-place write into a saved input",)),
    Mistake("2.3", "cross-entropy: onehot − softmax", {CROSS_ENTROPY: """
return gy.reshape(-1, 1) * (coefficients - self.probs * coefficients.sum(axis=1, keepdims=True))
"""}, ("sign",)),
    Mistake("2.3", "cross-entropy: the upstream gradient dropped", {CROSS_ENTROPY: """
return self.probs * coefficients.sum(axis=1, keepdims=True) - coefficients
"""}, ("missing scale",)),
    Mistake("2.3", "cross-entropy: softmax − A, as if every row of A summed to 1", {CROSS_ENTROPY: """
return gy.reshape(-1, 1) * (self.probs - coefficients)
"""}, ("missing term",), public_passes=True),
    Mistake("2.3", "cross-entropy: the saved probabilities changed in place", {CROSS_ENTROPY: """
self.probs *= coefficients.sum(axis=1, keepdims=True)
self.probs -= coefficients
return gy.reshape(-1, 1) * self.probs
"""}, ("in-place write into a saved input",)),
    # 2.4 conv2d
    Mistake("2.4", "output size without the − 1", {OUTPUT_SIZE: """
return (size + 2 * padding - dilation * (kernel - 1)) // stride + 1
"""}, ("stride off by one",)),
    Mistake("2.4", "output size ignores the dilation", {OUTPUT_SIZE: """
return (size + 2 * padding - kernel) // stride + 1
"""}, ("dilation ignored",), public_passes=True),
    Mistake("2.4", "col2im assigns instead of adding", {COL2IM: _COL2IM.format(
        line="image[:, p * dh:p * dh + sh * (oh - 1) + 1:sh, q * dw:q * dw + sw * (ow - 1) + 1:sw] = "
             "cols[:, :, :, p, q]")}, ("gradient overwritten, not accumulated",)),
    Mistake("2.4", "col2im places the windows one pixel apart", {COL2IM: _COL2IM.format(
        line="image[:, p * dh:p * dh + oh, q * dw:q * dw + ow] += cols[:, :, :, p, q]")}, ("stride ignored",)),
    Mistake("2.4", "col2im forgets the dilation", {COL2IM: _COL2IM.format(
        line="image[:, p:p + sh * (oh - 1) + 1:sh, q:q + sw * (ow - 1) + 1:sw] += cols[:, :, :, p, q]")},
        ("dilation ignored",), public_passes=True),
    # 2.5 layer normalization
    Mistake("2.5", "the mean of dy forgotten", {NORMALIZE: """
axes, x_hat = self.axes, self.x_hat
return self.inv_std * (gy - x_hat * (gy * x_hat).mean(axis=axes, keepdims=True))
"""}, ("missing term",)),
    Mistake("2.5", "sums where the formula has means", {NORMALIZE: """
axes, x_hat = self.axes, self.x_hat
return self.inv_std * (gy - gy.sum(axis=axes, keepdims=True) - x_hat * (gy * x_hat).sum(axis=axes, keepdims=True))
"""}, ("missing scale",)),
    Mistake("2.5", "means over the whole array", {NORMALIZE: """
x_hat = self.x_hat
return self.inv_std * (gy - gy.mean() - x_hat * (gy * x_hat).mean())
"""}, ("wrong axis",)),
    Mistake("2.5", "dy centered in place", {NORMALIZE: """
axes, x_hat = self.axes, self.x_hat
gy -= gy.mean(axis=axes, keepdims=True)
gy -= x_hat * (gy * x_hat).mean(axis=axes, keepdims=True)
gy *= self.inv_std
return gy
"""}, ("in-place write into a saved input",)),
    # 2.6 attention
    Mistake("2.6", "the scale left out of dQ and dK", {ATTENTION: _attention(scale="")}, ("missing scale",)),
    Mistake("2.6", "the softmax's Jacobian without its sum", {ATTENTION: _attention(softmax="")}, ("missing term",)),
    Mistake("2.6", "dK = s·dZ Q: dZ not transposed", {ATTENTION: _attention(gk="gz @ q")}, ("transposed operand",)),
    Mistake("2.6", "dV = P dO: P not transposed", {ATTENTION: _attention(gv="p @ gy")}, ("transposed operand",)),
]
