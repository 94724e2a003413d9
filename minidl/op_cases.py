"""One small random-input case for every differentiable op.

``minidl gradcheck`` runs :func:`minidl.gradcheck.max_relative_error` on each
case and prints the table; the test suite runs the same cases, so adding an
op here puts it under both. Inputs are float64 (finite differences need
it), shaped to exercise broadcasting and every argument worth checking.
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl.tensor import Tensor


def _t(rng, *shape, positive=False, spread=1.0):
    data = rng.standard_normal(shape) * spread
    if positive:
        data = np.abs(data) + 0.5
    return Tensor(data, requires_grad=True)


def _away_from_kinks(rng, *shape):
    """Values at least 0.1 away from 0, so relu/abs/clip are differentiable at every point."""
    data = rng.standard_normal(shape)
    data += np.sign(data) * 0.1
    return Tensor(data, requires_grad=True)


def _distinct(rng, *shape):
    """A random permutation of well-separated values: max/min/pooling have no ties."""
    data = rng.permutation(np.arange(np.prod(shape), dtype=np.float64) * 0.37).reshape(shape)
    return Tensor(data, requires_grad=True)


def _dropout_with_fixed_mask(x):
    """Dropout with the same mask on every call (reseeded), so finite differences compare like with like."""
    from minidl.backend import manual_seed
    manual_seed(1234)
    return F.dropout(x, p=0.3, training=True)


def cases(seed: int = 0):
    """A list of (name, fn, inputs): fn(*inputs) is what gets checked."""
    rng = np.random.default_rng(seed)
    t = lambda *s, **k: _t(rng, *s, **k)  # noqa: E731
    targets = rng.integers(0, 4, size=5)
    out = [
        ("add", F.add, [t(3, 4), t(4)]),
        ("sub", F.sub, [t(3, 1), t(1, 4)]),
        ("mul", F.mul, [t(2, 3), t(2, 1)]),
        ("div", F.div, [t(3, 4), t(4, positive=True)]),
        ("neg", F.neg, [t(3)]),
        ("pow", F.pow, [t(3, 4, positive=True), t(4)]),
        ("pow_scalar", lambda x: F.pow(x, 3), [t(3, 4)]),
        ("exp", F.exp, [t(3, 4)]),
        ("log", F.log, [t(3, 4, positive=True)]),
        ("sqrt", F.sqrt, [t(3, 4, positive=True)]),
        ("abs", F.abs, [_away_from_kinks(rng, 3, 4)]),
        ("clip", lambda x: F.clip(x, -0.6, 0.4),  # some entries clipped, some not, none at a bound
         [Tensor(np.linspace(-1.05, 1.05, 12).reshape(3, 4), requires_grad=True)]),
        ("maximum", F.maximum, [_distinct(rng, 3, 4), t(4)]),
        ("minimum", F.minimum, [_distinct(rng, 3, 4), t(4)]),
        ("where", lambda a, b: F.where(a.data > 0, a, b), [t(3, 4), t(4)]),
        ("relu", F.relu, [_away_from_kinks(rng, 3, 4)]),
        ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), [_away_from_kinks(rng, 3, 4)]),
        ("elu", F.elu, [_away_from_kinks(rng, 3, 4)]),
        ("gelu", F.gelu, [t(3, 4)]),
        ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), [t(3, 4)]),
        ("softplus", F.softplus, [t(3, 4)]),
        ("tanh", F.tanh, [t(3, 4)]),
        ("sigmoid", F.sigmoid, [t(3, 4)]),
        ("softmax", F.softmax, [t(3, 4)]),
        ("log_softmax", lambda x: F.log_softmax(x, axis=0), [t(3, 4)]),
        ("logsumexp", F.logsumexp, [t(3, 4)]),
        ("sum", lambda x: F.sum(x, axis=1), [t(3, 4)]),
        ("mean", lambda x: F.mean(x, axis=(0, 2), keepdims=True), [t(2, 3, 4)]),
        ("max", lambda x: F.max(x, axis=0), [_distinct(rng, 3, 4)]),
        ("min", lambda x: F.min(x, axis=-1), [_distinct(rng, 3, 4)]),
        ("var", lambda x: F.var(x, axis=1, ddof=1), [t(3, 4)]),
        ("reshape", lambda x: F.reshape(x, (4, 3)), [t(3, 4)]),
        ("transpose", lambda x: F.transpose(x, (2, 0, 1)), [t(2, 3, 4)]),
        ("broadcast_to", lambda x: F.broadcast_to(x, (3, 4)), [t(1, 4)]),
        ("getitem", lambda x: F.getitem(x, (np.array([0, 2, 0]), slice(1, 3))), [t(3, 4)]),
        ("concatenate", lambda a, b: F.concatenate([a, b], axis=1), [t(3, 2), t(3, 4)]),
        ("stack", lambda a, b: F.stack([a, b], axis=1), [t(3, 4), t(3, 4)]),
        ("pad", lambda x: F.pad(x, ((1, 0), (2, 1))), [t(3, 4)]),
        ("matmul", F.matmul, [t(2, 3, 4), t(4, 5)]),
        ("linear", F.linear, [t(5, 4), t(3, 4), t(3)]),
    ]
    out += _layer_cases(rng, t, targets)
    out += _gradient_op_cases(rng, t, targets)
    out += _shape_cases(rng, t)
    out += _reduction_and_indexing_cases(rng, t)
    out += _math_cases(rng, t)
    out += _activation_cases(rng, t)
    out += _conv_and_pool_cases(rng, t)
    out += _loss_and_attention_cases(rng, t)
    out += _normalization_and_recurrent_cases(rng, t)
    return out


def _layer_cases(rng, t, targets):
    """Cases for the conv, pooling, normalization, regularization and loss ops."""
    labels01 = Tensor((rng.random((3, 4)) > 0.5).astype(float))
    out = [
        ("conv1d", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), [t(2, 3, 7), t(4, 3, 3), t(4)]),
        ("conv2d", lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1), [t(2, 2, 5, 5), t(3, 2, 3, 3), t(3)]),
        ("im2col", lambda x: F.im2col(x, 2, stride=1, padding=1), [t(1, 2, 3, 3)]),
        ("max_pool2d", lambda x: F.max_pool2d(x, 2), [_distinct(rng, 2, 2, 4, 4)]),
        ("avg_pool2d", lambda x: F.avg_pool2d(x, 2, stride=1), [t(2, 2, 4, 4)]),
        ("batch_norm", lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [t(6, 3), t(3), t(3)]),
        ("layer_norm", lambda x, w, b: F.layer_norm(x, (4,), w, b), [t(3, 4), t(4), t(4)]),
        ("group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), [t(2, 4, 3), t(4), t(4)]),
        ("dropout", _dropout_with_fixed_mask, [t(4, 5)]),
        ("embedding", lambda w: F.embedding(np.array([[0, 2], [2, 1]]), w), [t(3, 4)]),
        ("cross_entropy", lambda z: F.cross_entropy(z, targets, label_smoothing=0.1), [t(5, 4)]),
        ("nll_loss", lambda z: F.nll_loss(F.log_softmax(z), targets), [t(5, 4)]),
        ("mse_loss", F.mse_loss, [t(3, 4), t(3, 4)]),
        ("l1_loss", F.l1_loss, [_away_from_kinks(rng, 3, 4), Tensor(np.zeros((3, 4)))]),
        ("binary_cross_entropy_with_logits",
         lambda z: F.binary_cross_entropy_with_logits(z, labels01), [t(3, 4)]),
    ]
    return out


def _gradient_op_cases(rng, t, targets):
    """The gradient ops: each first-order backward is an op of its own, checked here like any op.

    What a gradient op's forward takes from its parent's forward (a mask, the softmax,
    the normalization statistics) is recomputed from the inputs on every call, as the
    parent would, so that the finite differences see a consistent function.
    """
    from minidl.ops.activation import GELUGrad, LogSoftmaxGrad, ReLUGrad, SigmoidGrad, SoftmaxGrad, TanhGrad
    from minidl.ops.conv import Col2Im
    from minidl.ops.linalg import LinearGradData, LinearGradWeight
    from minidl.ops.loss import CrossEntropyGrad
    from minidl.ops.norm import Normalize, NormalizeGrad
    from minidl.ops.shape import GetItemGrad

    mask = rng.random((3, 4)) > 0.5
    coefficients = np.eye(4)[targets] * 0.9 + 0.1 / 4  # label smoothing 0.1, as the cross_entropy case

    def cross_entropy_grad(x, gy):
        shifted = np.exp(x.data - x.data.max(axis=1, keepdims=True))
        return CrossEntropyGrad(shifted / shifted.sum(axis=1, keepdims=True), coefficients)(x, gy)

    def normalize_grad(x, gy, axes=(1,)):
        normalize = Normalize(axes, 1e-5)
        x_hat = normalize.forward(x.data)
        return NormalizeGrad(axes, 1e-5, x_hat, normalize.inv_std)(x, gy)

    return [
        ("relu_grad", lambda gy: ReLUGrad(mask)(gy), [t(3, 4)]),
        ("tanh_grad", lambda y, gy: TanhGrad()(y, gy), [t(3, 4, spread=0.5), t(3, 4)]),
        ("sigmoid_grad", lambda y, gy: SigmoidGrad()(y, gy), [t(3, 4, spread=0.5), t(3, 4)]),
        ("softmax_grad", lambda y, gy: SoftmaxGrad(-1)(y, gy), [t(3, 4), t(3, 4)]),
        ("log_softmax_grad", lambda y, gy: LogSoftmaxGrad(0)(y, gy), [t(3, 4), t(3, 4)]),
        ("gelu_grad", lambda x: GELUGrad("none")(x), [t(3, 4)]),
        ("gelu_tanh_grad", lambda x: GELUGrad("tanh")(x), [t(3, 4)]),
        ("linear_grad_data", lambda gy, w: LinearGradData()(gy, w), [t(2, 5, 3), t(3, 4)]),
        ("linear_grad_weight", lambda gy, x: LinearGradWeight()(gy, x), [t(2, 5, 3), t(2, 5, 4)]),
        ("linear_grad_weight_one_row", lambda gy, x: LinearGradWeight()(gy, x), [t(1, 3), t(1, 4)]),
        ("cross_entropy_grad", cross_entropy_grad, [t(5, 4), t(5)]),
        ("normalize_grad", normalize_grad, [t(3, 4), t(3, 4)]),
        ("normalize_grad_two_axes", lambda x, gy: normalize_grad(x, gy, (0, 2)), [t(2, 3, 4), t(2, 3, 4)]),
        ("getitem_grad", lambda gy: GetItemGrad((np.array([0, 2, 0]), slice(1, 3)), (3, 4))(gy), [t(3, 2)]),
        ("col2im", lambda cols: Col2Im((1, 2, 3, 3), (2, 2), (1, 1), (1, 1))(cols), [t(1, 4, 4, 2, 2, 2)]),
    ]


def _shape_cases(rng, t):
    """The shape ops: permute, squeeze, flip, split, unfold..."""
    return []


def _reduction_and_indexing_cases(rng, t):
    """Reductions, sorting, gathering and scattering, norms and einsum."""
    from minidl.ops.linalg import SVD
    from minidl.ops.scan import LinearScan, LogcumsumexpGrad

    def svd_reassembled(a, weights):
        u, s, vh = SVD()(a)
        return (u * weights) @ vh + s

    one_zero = Tensor(np.array([[0.5, -1.2, 0.0, 2.0], [1.5, 0.7, -0.4, 0.9]]), requires_grad=True)
    two_zeros = Tensor(np.array([[[0.5, 0.0], [-1.2, 0.8]], [[0.0, 1.5], [0.7, -2.0]]]), requires_grad=True)
    zeros_in_rows = Tensor(np.array([[0.5, 0.0, 1.3, 0.0, -0.7], [1.1, -0.6, 0.0, 2.0, 0.9]]), requires_grad=True)
    row_index = np.array([[3, 0, 3, 1, 2], [1, 1, 0, 2, 2], [0, 3, 2, 2, 1]])  # repeats: gradients add up
    column_index = np.array([[2, 0, 1, 0], [1, 2, 2, 1]])
    distinct_columns = np.array([[3, 0], [1, 2], [0, 1]])  # scatter writes each place once
    mask = rng.random((3, 4)) > 0.5
    weights = Tensor(np.array([1.5, -0.5, 2.0]))
    return [
        ("max_dim", lambda x: F.max(x, 1).values, [_distinct(rng, 3, 4)]),
        ("min_dim", lambda x: x.min(dim=0, keepdim=True).values, [_distinct(rng, 3, 4)]),
        ("std", lambda x: F.std(x, dim=1), [t(3, 4)]),
        ("prod", lambda x: F.prod(x, dim=1), [t(3, 4)]),
        ("prod_one_zero", lambda x: F.prod(x, dim=1, keepdim=True), [one_zero]),
        ("prod_two_zeros", lambda x: F.prod(x, axis=(0, 2)), [two_zeros]),  # slice 0 holds both zeros
        ("cumsum", lambda x: F.cumsum(x, 1), [t(3, 4)]),
        ("cumprod", lambda x: F.cumprod(x, 0), [t(3, 4)]),
        ("cumprod_zeros", lambda x: F.cumprod(x, -1), [zeros_in_rows]),
        ("linear_scan", lambda a, b: LinearScan(1, False)(a, b), [t(2, 5), t(2, 5)]),
        ("linear_scan_reverse", lambda a, b: LinearScan(0, True)(a, b), [t(4, 3), t(4, 3)]),
        ("logcumsumexp", lambda x: F.logcumsumexp(x, -1), [t(3, 4)]),
        ("logcumsumexp_grad", lambda p, q, a: LogcumsumexpGrad(0, True)(p, q, a), [t(3, 4), t(3, 4), t(3, 4)]),
        ("sort", lambda x: F.sort(x, dim=1, descending=True).values, [_distinct(rng, 3, 4)]),
        ("topk", lambda x: F.topk(x, 2, dim=0).values, [_distinct(rng, 3, 4)]),
        ("gather", lambda x: F.gather(x, 1, row_index), [t(3, 4)]),
        ("scatter_add", lambda x, src: F.scatter_add(x, 0, column_index, src), [t(3, 4), t(2, 5)]),
        ("scatter", lambda x, src: F.scatter(x, 1, distinct_columns, src), [t(3, 4), t(3, 2)]),
        ("scatter_value", lambda x: F.scatter(x, 1, distinct_columns, 0.5), [t(3, 4)]),
        ("index_select", lambda x: F.index_select(x, 0, [2, 0, 2]), [t(3, 4)]),
        ("masked_fill", lambda x: F.masked_fill(x, mask, -1.0), [t(3, 4)]),
        ("masked_select", lambda x: F.masked_select(x, mask[0]), [t(3, 4)]),
        ("norm", F.norm, [t(3, 4)]),
        ("norm_p3_dim", lambda x: F.norm(x, 3, dim=1, keepdim=True), [_away_from_kinks(rng, 3, 4)]),
        ("norm_p_half", lambda x: F.norm(x, 0.5, dim=0), [_away_from_kinks(rng, 3, 4)]),
        ("norm_p1", lambda x: F.norm(x, 1, dim=(0, 1)), [_away_from_kinks(rng, 3, 4)]),
        ("norm_inf", lambda x: F.norm(x, float("inf"), dim=1), [_distinct(rng, 3, 4)]),
        ("norm_nuc", lambda x: F.norm(x, "nuc", dim=(0, 2), keepdim=True), [t(3, 2, 4)]),
        ("svd", lambda a: svd_reassembled(a, weights), [t(4, 3)]),  # U diag(w) Vᵀ: the sign of each pair cancels
        ("einsum", lambda a, b: F.einsum("bij,bjk->bik", a, b), [t(2, 3, 4), t(2, 4, 5)]),
        ("einsum_trace", lambda a: F.einsum("ii", a), [t(3, 3)]),
        ("einsum_diagonal_ellipsis", lambda a, b: F.einsum("...ii,i->...i", a, b), [t(2, 3, 3), t(3)]),
        ("einsum_three_and_broadcast", lambda a, b, c: F.einsum("ij,kj,k->i", a, b, c), [t(3, 4), t(1, 4), t(2)]),
    ]


def _math_cases(rng, t):
    """The elementwise math functions: trigonometric, rounding, logarithms, comparisons' kin."""
    return []


def _activation_cases(rng, t):
    """The activation functions beyond ReLU and its first kin."""
    return []


def _conv_and_pool_cases(rng, t):
    """Grouped, dilated and transposed convolution; pooling variants; resampling."""
    return []


def _loss_and_attention_cases(rng, t):
    """The losses of the PyTorch vocabulary and scaled dot-product attention."""
    return []


def _normalization_and_recurrent_cases(rng, t):
    """Instance and RMS normalization, recurrent cells."""
    return []
