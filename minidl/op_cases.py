"""One small random-input case for every differentiable op.

``minidl gradcheck`` runs :func:`minidl.gradcheck.max_relative_error` on each
case and prints the table; the test suite runs the same cases, so adding an
op here puts it under both. Inputs are float64 (finite differences need
it), shaped to exercise broadcasting and every argument worth checking.
"""
from __future__ import annotations

import numpy as np

import minidl.functional as F
from minidl.ops.fft_conv import fft_conv2d
from minidl.ops.sparse import CSRStructure, csr_linear
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


class _GroupOfOne:
    """A group of one rank, as the communication ops see a communicator (its ``allreduce_``).

    The op cases run in one process, where both communication ops are the
    identity; their multi-rank behaviour is checked on real MPI ranks in
    tests/parallel/test_model_parallel.py.
    """

    rank, size = 0, 1

    def allreduce_(self, array):
        return array


# A pruned 4 × 5 weight's places: an empty row, a full one, and columns used twice or not at all.
_PRUNED = CSRStructure.from_dense(np.array([[1, 0, 2, 0, 0], [0, 0, 0, 0, 0], [3, 4, 5, 6, 7], [0, 0, 8, 0, 0.]]))[0]


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
        ("pow_scalar_square_root", lambda x: x ** 0.5, [t(3, 4, positive=True)]),
        ("pow_scalar_reciprocal_square_root", lambda x: x ** -0.5, [t(3, 4, positive=True)]),
        ("pow_scalar_fourth_and_minus_second", lambda x: x ** 4.0 + x ** -2, [t(3, 4, positive=True)]),
        ("exp", F.exp, [t(3, 4)]),
        ("log", F.log, [t(3, 4, positive=True)]),
        ("sqrt", F.sqrt, [t(3, 4, positive=True)]),
        ("abs", F.abs, [_away_from_kinks(rng, 3, 4)]),
        ("clip", lambda x: F.clip(x, -0.6, 0.4),  # some entries clipped, some not, none at a bound
         [Tensor(np.linspace(-1.05, 1.05, 12).reshape(3, 4), requires_grad=True)]),
        ("maximum", F.maximum, [_distinct(rng, 3, 4), t(4)]),
        ("minimum", F.minimum, [_distinct(rng, 3, 4), t(4)]),
        ("where", F.where, [Tensor(rng.random((3, 4)) > 0.5), t(3, 4), t(4)]),
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
        ("contiguous", lambda x: x.T.contiguous(), [t(3, 4)]),
        ("transpose", lambda x: F.transpose(x, (2, 0, 1)), [t(2, 3, 4)]),
        ("broadcast_to", lambda x: F.broadcast_to(x, (3, 4)), [t(1, 4)]),
        ("sum_to", lambda x: x.sum_to((3, 1)), [t(2, 3, 4)]),
        ("getitem", lambda x, i: F.getitem(x, (i, slice(1, 3))), [t(3, 4), Tensor(np.array([0, 2, 0]))]),
        # PyTorch's order: the integer indexes first, so idx's axis stays in place (shape (3, 2))
        ("getitem_integer_slice_array", lambda x, i: x[1, :, i], [t(2, 3, 4), Tensor(np.array([3, 0]))]),
        ("concatenate", lambda a, b: F.concatenate([a, b], axis=1), [t(3, 2), t(3, 4)]),
        ("stack", lambda a, b: F.stack([a, b], axis=1), [t(3, 4), t(3, 4)]),
        ("pad", lambda x: F.pad(x, (2, 1, 1, 0)), [t(3, 4)]),
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
    out += _quantization_cases(rng)
    out += _communication_cases(t)
    out += _group_gather_cases(t)
    out += _fft_and_sparse_cases(t)  # last: the cases above keep their random inputs
    out += _layer_norm_affine_cases(t)
    return out


def _fft_and_sparse_cases(t):
    """Convolution by FFT and the CSR product (minidl.ops.fft_conv, minidl.ops.sparse)."""
    return [
        ("fft_conv2d", lambda x, w, b: fft_conv2d(x, w, b, padding=(1, 0)), [t(2, 2, 5, 6), t(3, 2, 3, 2), t(3)]),
        ("csr_linear", lambda x, v, b: csr_linear(x, v, _PRUNED, b), [t(2, 3, 5), t(_PRUNED.nnz), t(4)]),
    ]


def _communication_cases(t):
    """Tensor parallelism's two conjugate ops, each times its input so the second order is not zero."""
    from minidl.ops.distributed import copy_to_group, sum_over_group

    group = _GroupOfOne()
    return [
        ("copy_to_group", lambda x: copy_to_group(x, group) * x, [t(3, 4)]),
        ("sum_over_group", lambda x, w: F.linear(sum_over_group(x, group), w) * x.sum(), [t(3, 4), t(2, 4)]),
    ]


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
        ("embedding", F.embedding, [Tensor(np.array([[0, 2], [2, 1]])), t(3, 4)]),
        ("cross_entropy", lambda z, y: F.cross_entropy(z, y, label_smoothing=0.1), [t(5, 4), Tensor(targets)]),
        ("nll_loss", lambda z, y: F.nll_loss(F.log_softmax(z), y), [t(5, 4), Tensor(targets)]),
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
    from minidl.ops.loss import CrossEntropyGrad, SmoothL1LossGrad
    from minidl.ops.norm import Normalize, NormalizeGrad
    from minidl.ops.pool import MaxPool2d, MaxPoolGather, MaxPoolScatter
    from minidl.ops.shape import GetItemGrad

    mask = rng.random((3, 4)) > 0.5
    coefficients = np.eye(4)[targets] * 0.9 + 0.1 / 4  # label smoothing 0.1, as the cross_entropy case

    def cross_entropy_grad(x, gy, a):
        shifted = np.exp(x.array - x.array.max(axis=1, keepdims=True))
        return CrossEntropyGrad(shifted / shifted.sum(axis=1, keepdims=True))(x, gy, a)

    def normalize_grad(x, gy, axes=(1,)):
        normalize = Normalize(axes, 1e-5)
        x_hat = normalize.forward(x.array)
        return NormalizeGrad(axes, 1e-5, x_hat, normalize.inv_std)(x, gy)

    pooled = _distinct(rng, 2, 3, 5, 5)  # overlapping padded windows: 3×3, stride 2, padding 1

    def max_pool_routed(op, g):
        pool = MaxPool2d((3, 3), (2, 2), (1, 1))
        pool(Tensor(pooled.array))  # records each window's winner, as the parent's forward does
        return op(pool)(g)

    return [
        ("relu_grad", lambda gy: ReLUGrad()(gy, Tensor(np.where(mask, 1.0, -1.0))), [t(3, 4)]),
        ("tanh_grad", lambda y, gy: TanhGrad()(y, gy), [t(3, 4, spread=0.5), t(3, 4)]),
        ("sigmoid_grad", lambda y, gy: SigmoidGrad()(y, gy), [t(3, 4, spread=0.5), t(3, 4)]),
        ("softmax_grad", lambda y, gy: SoftmaxGrad(-1)(y, gy), [t(3, 4), t(3, 4)]),
        ("log_softmax_grad", lambda y, gy: LogSoftmaxGrad(0)(y, gy), [t(3, 4), t(3, 4)]),
        ("gelu_grad", lambda x: GELUGrad("none")(x), [t(3, 4)]),
        ("gelu_tanh_grad", lambda x: GELUGrad("tanh")(x), [t(3, 4)]),
        ("linear_grad_data", lambda gy, w: LinearGradData()(gy, w), [t(2, 5, 3), t(3, 4)]),
        ("linear_grad_weight", lambda gy, x: LinearGradWeight()(gy, x), [t(2, 5, 3), t(2, 5, 4)]),
        ("linear_grad_weight_one_row", lambda gy, x: LinearGradWeight()(gy, x), [t(1, 3), t(1, 4)]),
        ("cross_entropy_grad", cross_entropy_grad, [t(5, 4), t(5), Tensor(coefficients)]),
        ("smooth_l1_loss_grad", lambda x, y, gy: SmoothL1LossGrad(0.8, 1.0, "mean")(x, y, gy),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01),
          Tensor(np.array(0.7), requires_grad=True)]),
        ("huber_loss_grad_none", lambda x, y, gy: SmoothL1LossGrad(0.9, 0.9, "none")(x, y, gy),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01), t(3, 4)]),
        ("normalize_grad", normalize_grad, [t(3, 4), t(3, 4)]),
        ("normalize_grad_two_axes", lambda x, gy: normalize_grad(x, gy, (0, 2)), [t(2, 3, 4), t(2, 3, 4)]),
        ("getitem_grad", lambda gy: GetItemGrad((np.array([0, 2, 0]), slice(1, 3)), (3, 4))(gy), [t(3, 2)]),
        ("col2im", lambda cols: Col2Im((1, 2, 3, 3), (2, 2), (1, 1), (1, 1))(cols), [t(1, 4, 4, 2, 2, 2)]),
        ("max_pool_scatter", lambda gy: max_pool_routed(MaxPoolScatter, gy), [t(2, 3, 3, 3)]),
        ("max_pool_gather", lambda x: max_pool_routed(MaxPoolGather, x), [t(2, 3, 5, 5)]),
    ]


def _shape_cases(rng, t):
    """The shape ops: permute, squeeze, flip, split, unfold..."""
    return [
        ("flatten", lambda x: F.flatten(x, 1), [t(2, 3, 2)]),
        ("unflatten", lambda x: F.unflatten(x, 1, (2, -1)), [t(3, 4)]),
        ("squeeze", lambda x: F.squeeze(x, (0, 2)), [t(1, 3, 1, 2)]),
        ("unsqueeze", lambda x: F.unsqueeze(x, -2), [t(3, 4)]),
        ("permute", lambda x: F.permute(x, 2, 0, 1), [t(2, 3, 4)]),
        ("movedim", lambda x: F.movedim(x, (0, 1), (2, 0)), [t(2, 3, 4)]),
        ("expand", lambda x: F.expand(x, 2, -1, 4), [t(3, 1)]),
        ("cat", lambda a, b: F.cat([a, b], dim=-1), [t(3, 2), t(3, 1)]),
        ("split", lambda x: F.split(x, 2, dim=1), [t(2, 5)]),
        ("split_sizes", lambda x: F.split(x, [1, 0, 2], dim=0), [t(3, 2)]),
        ("chunk", lambda x: F.chunk(x, 3, dim=-1), [t(2, 4)]),
        ("narrow", lambda x: F.narrow(x, 1, -3, 2), [t(2, 4)]),
        ("pad_reflect", lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), [t(1, 3, 4)]),
        ("pad_replicate", lambda x: F.pad(x, (3, -1), mode="replicate"), [t(2, 3)]),
        ("pad_reflect_crop", lambda x: F.pad(x, (3, -2, -1, 2), mode="reflect"), [t(1, 4, 5)]),
        ("pad_circular", lambda x: F.pad(x, (1, 2, 2, 0), mode="circular"), [t(1, 2, 3)]),
        ("flip", lambda x: F.flip(x, (0, 2)), [t(2, 3, 2)]),
        ("roll", lambda x: F.roll(x, (1, -2), (0, 1)), [t(3, 4)]),
        ("roll_flattened", lambda x: F.roll(x, 5), [t(3, 4)]),
        ("repeat", lambda x: F.repeat(x, 2, 1, 3), [t(2, 2)]),
        ("repeat_interleave",  # one count for all, then one count per element
         lambda x: F.repeat_interleave(F.repeat_interleave(x, 2, dim=1), [2, 0, 3], dim=0), [t(3, 2)]),
        ("tril", lambda x: F.tril(x, 1), [t(2, 3, 4)]),
        ("triu", lambda x: F.triu(x, -1), [t(3, 4)]),
        ("diagonal", lambda x: F.diagonal(x, 1, 0, 2), [t(3, 2, 4)]),
        ("unfold", lambda x: x.unfold(1, 3, 2), [t(2, 7)]),
    ]


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
    # Indices, masks and conditions are inputs (Tensors without gradient), so that the sweep in
    # tests/test_inplace.py can change each in place after the forward and expect backward to refuse.
    row_index = Tensor(np.array([[3, 0, 3, 1, 2], [1, 1, 0, 2, 2], [0, 3, 2, 2, 1]]))  # repeats: gradients add
    column_index = Tensor(np.array([[2, 0, 1, 0], [1, 2, 2, 1]]))
    distinct_columns = Tensor(np.array([[3, 0], [1, 2], [0, 1]]))  # scatter writes each place once
    mask = Tensor(rng.random((3, 4)) > 0.5)
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
        ("gather", lambda x, i: F.gather(x, 1, i), [t(3, 4), row_index]),
        ("scatter_add", lambda x, i, src: F.scatter_add(x, 0, i, src), [t(3, 4), column_index, t(2, 5)]),
        ("scatter", lambda x, i, src: F.scatter(x, 1, i, src), [t(3, 4), distinct_columns, t(3, 2)]),
        ("scatter_value", lambda x, i: F.scatter(x, 1, i, 0.5), [t(3, 4), distinct_columns]),
        ("scatter_reduce", lambda x, i, src: F.scatter_reduce(x, 0, i, src, "sum"),
         [t(3, 4), column_index, t(2, 5)]),
        ("scatter_reduce_mean_exclude_self",
         lambda x, i, src: F.scatter_reduce(x, 0, i, src, "mean", include_self=False),
         [t(3, 4), column_index, t(2, 4)]),
        ("scatter_reduce_prod", lambda x, i, src: F.scatter_reduce(x, 0, i, src, "prod"),  # a place with one
         [Tensor(np.array([[0.5, -1.2], [0.0, 2.0], [1.5, 0.7], [-0.4, 0.9]]), requires_grad=True),  # zero, one
          Tensor(np.array([[1, 0], [3, 1], [2, 3]])),  # with two (x and src), the others with none
          Tensor(np.array([[0.0, 1.1], [-0.8, 1.4], [0.0, 0.6]]), requires_grad=True)]),
        ("scatter_reduce_prod_exclude_self",
         lambda x, i, src: F.scatter_reduce(x, 1, i, src, "prod", include_self=False), [t(3, 4), row_index, t(3, 5)]),
        ("scatter_reduce_amax", lambda x, i, src: F.scatter_reduce(x, 0, i, src, "amax"),  # src off x's grid: no ties
         [_distinct(rng, 3, 4), column_index, Tensor(_distinct(rng, 2, 4).array + 0.15, requires_grad=True)]),
        ("scatter_reduce_amin_exclude_self",
         lambda x, i, src: F.scatter_reduce(x, 1, i, src, "amin", include_self=False),
         [_distinct(rng, 3, 4), row_index, _distinct(rng, 3, 5)]),
        ("scatter_multiply", lambda x, i, src: F.scatter(x, 1, i, src, reduce="multiply"),
         [t(3, 4), row_index, t(3, 5)]),
        ("cummax", lambda x: F.cummax(x, 1).values, [_distinct(rng, 3, 4)]),
        ("cummin", lambda x: F.cummin(x, 0).values, [_distinct(rng, 3, 4)]),
        ("std_mean", lambda x: F.std_mean(x, dim=1), [t(3, 4)]),
        ("var_mean", lambda x: F.var_mean(x, (0, 2), correction=0, keepdim=True), [t(2, 3, 4)]),
        ("diag", lambda v: F.diag(v, 1), [t(3)]),
        ("diag_matrix", lambda x: F.diag(x, -1), [t(3, 4)]),
        ("index_select", lambda x, i: F.index_select(x, 0, i), [t(3, 4), Tensor(np.array([2, 0, 2]))]),
        ("masked_fill", lambda x, m: F.masked_fill(x, m, -1.0), [t(3, 4), mask]),
        ("masked_select", lambda x, m: F.masked_select(x, m), [t(3, 4), Tensor(mask.array[0])]),
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
    """The elementwise math functions: trigonometric, rounding, logarithms, comparisons' kin.

    Inputs stay inside each domain (|x| < 0.9 for asin, x > 1.1 for acosh) and away from the
    jumps of the step functions and remainders (no value within 0.1 of an integer quotient).
    """
    from minidl.ops.elementwise import floor_divide

    def uniform(low, high, *shape):
        return Tensor(rng.uniform(low, high, shape), requires_grad=True)

    def off_grid(*shape, step=1.0):
        """Values on a grid of ``step`` plus 0.15 to 0.35 (or 0.65 to 0.85) steps: far from every
        multiple of a step and from every half step (floor, round, trunc jump there)."""
        whole = rng.integers(-3, 3, shape)
        frac = rng.uniform(0.15, 0.35, shape) + 0.5 * rng.integers(0, 2, shape)
        return Tensor((whole + frac) * step, requires_grad=True)

    divisor = Tensor(rng.uniform(0.7, 1.5, 4) * np.array([1, -1, 1, -1]), requires_grad=True)
    dividend = Tensor(off_grid(3, 4).array * divisor.array, requires_grad=True)  # a / b is off the grid
    lo = np.array([-0.5, -0.3, 0.2, -1.0])
    hi = lo + np.array([0.8, 1.0, 0.6, 1.5])
    below, above = lo - rng.uniform(0.1, 0.5, 4), hi + rng.uniform(0.1, 0.5, 4)
    x_clamp = Tensor(np.stack([below, (lo + hi) / 2, above]), requires_grad=True)  # each side of each bound
    return [
        ("sin", F.sin, [t(3, 4)]),
        ("cos", F.cos, [t(3, 4)]),
        ("tan", F.tan, [uniform(-1.2, 1.2, 3, 4)]),
        ("asin", F.asin, [uniform(-0.9, 0.9, 3, 4)]),
        ("acos", F.acos, [uniform(-0.9, 0.9, 3, 4)]),
        ("atan", F.atan, [t(3, 4)]),
        ("atan2", F.atan2, [_away_from_kinks(rng, 3, 4), t(4)]),
        ("sinh", F.sinh, [t(3, 4)]),
        ("cosh", F.cosh, [t(3, 4)]),
        ("asinh", F.asinh, [t(3, 4)]),
        ("acosh", F.acosh, [uniform(1.1, 3.0, 3, 4)]),
        ("atanh", F.atanh, [uniform(-0.9, 0.9, 3, 4)]),
        ("floor", F.floor, [off_grid(3, 4)]),
        ("ceil", F.ceil, [off_grid(3, 4)]),
        ("trunc", F.trunc, [off_grid(3, 4)]),
        ("round", F.round, [off_grid(3, 4)]),
        ("round_decimals", lambda x: F.round(x, decimals=1), [off_grid(3, 4, step=0.1)]),
        ("sign", F.sign, [_away_from_kinks(rng, 3, 4)]),
        ("rsqrt", F.rsqrt, [t(3, 4, positive=True)]),
        ("reciprocal", F.reciprocal, [_away_from_kinks(rng, 3, 4)]),
        ("erf", F.erf, [t(3, 4)]),
        ("erfc", F.erfc, [t(3, 4)]),
        ("log1p", F.log1p, [uniform(-0.5, 2.0, 3, 4)]),
        ("expm1", F.expm1, [t(3, 4)]),
        ("log2", F.log2, [t(3, 4, positive=True)]),
        ("log10", F.log10, [t(3, 4, positive=True)]),
        ("exp2", F.exp2, [t(3, 4)]),
        ("fmod", F.fmod, [dividend, divisor]),
        ("remainder", F.remainder, [dividend, divisor]),
        ("div_trunc", lambda a, b: F.div(a, b, rounding_mode="trunc"), [dividend, divisor]),
        ("floor_divide", floor_divide, [dividend, divisor]),
        ("lerp", F.lerp, [t(3, 4), t(4), uniform(0.0, 1.0, 3, 1)]),
        ("lerp_scalar_weight", lambda a, b: F.lerp(a, b, 0.3), [t(3, 4), t(3, 4)]),
        ("logaddexp", F.logaddexp, [t(3, 4), t(4)]),
        ("copysign", F.copysign, [_away_from_kinks(rng, 3, 4), _away_from_kinks(rng, 4)]),
        ("clamp", F.clamp, [x_clamp, Tensor(lo, requires_grad=True), Tensor(hi, requires_grad=True)]),
        ("clamp_min_tensor", lambda x, m: F.clamp(x, min=m, max=0.9), [x_clamp, Tensor(lo, requires_grad=True)]),
        ("clamp_crossed", F.clamp, [x_clamp, Tensor(hi, requires_grad=True), Tensor(lo, requires_grad=True)]),
    ]


def _activation_cases(rng, t):
    """The activation functions beyond ReLU and its first kin."""

    def avoiding(kinks, lo, hi, *shape):
        """Uniform values in [lo, hi], each at least 0.1 from every kink (pushed 0.2 up when too close)."""
        data = rng.uniform(lo, hi, shape)
        for kink in kinks:
            data = np.where(np.abs(data - kink) < 0.1, data + 0.2, data)
        return Tensor(data, requires_grad=True)

    return [
        ("silu", F.silu, [t(3, 4, spread=2.0)]),
        ("mish", F.mish, [t(3, 4, spread=2.0)]),
        ("selu", F.selu, [_away_from_kinks(rng, 3, 4)]),
        ("celu", lambda x: F.celu(x, alpha=0.5), [_away_from_kinks(rng, 3, 4)]),
        ("relu6", F.relu6, [avoiding((0, 6), -2, 8, 3, 4)]),
        ("hardtanh", F.hardtanh, [avoiding((-1, 1), -2, 2, 3, 4)]),
        ("hardtanh_bounds", lambda x: F.hardtanh(x, -0.5, 2.0), [avoiding((-0.5, 2), -2, 3, 3, 4)]),
        ("hardswish", F.hardswish, [avoiding((-3, 3), -5, 5, 3, 4)]),
        ("hardsigmoid", F.hardsigmoid, [avoiding((-3, 3), -5, 5, 3, 4)]),
        ("logsigmoid", F.logsigmoid, [t(3, 4, spread=3.0)]),
        ("softsign", F.softsign, [_away_from_kinks(rng, 3, 4)]),  # |x|: softsign'' jumps at 0
        ("softmin", lambda x: F.softmin(x, dim=0), [t(3, 4)]),
        ("softplus_beta_threshold", lambda x: F.softplus(x, beta=2.0, threshold=3.0),  # linear above x = 1.5
         [avoiding((1.5,), -2, 3, 3, 4)]),
        ("glu", lambda x: F.glu(x, dim=1), [t(3, 4)]),
        ("prelu", F.prelu, [_away_from_kinks(rng, 2, 3, 4), t(3)]),
        ("prelu_one_slope", F.prelu, [_away_from_kinks(rng, 3, 4), t(1)]),
    ]


def _conv_and_pool_cases(rng, t):
    """Grouped, dilated and transposed convolution; pooling variants; resampling."""
    def pool_indices(shape, kernel, stride, padding=0):
        """max_pool's indices on tie-free values: what max_unpool is given."""
        x = _distinct(np.random.default_rng(0), *shape)
        pool = F.max_pool2d if len(shape) == 4 else F.max_pool1d
        return pool(x, kernel, stride, padding, return_indices=True)[1]

    unpool2 = pool_indices((1, 2, 4, 6), 2, 2)
    unpool2_overlap = pool_indices((1, 2, 5, 5), 3, 1)  # overlapping windows: some indices repeat
    unpool1 = pool_indices((2, 2, 7), 3, 2, 1)
    from minidl.ops.conv import ChannelsLast
    return [
        ("channels_last", lambda x: ChannelsLast()(x), [t(2, 3, 4, 5)]),
        ("channels_last_already", lambda x: ChannelsLast()(x.permute(0, 3, 1, 2)), [t(2, 4, 5, 3)]),
        ("conv2d_groups_dilation", lambda x, w, b: F.conv2d(x, w, b, (2, 1), 1, (1, 2), 2),
         [t(2, 4, 5, 6), t(6, 2, 3, 2), t(6)]),
        ("conv2d_depthwise_same", lambda x, w: F.conv2d(x, w, padding="same", groups=3),
         [t(1, 3, 5, 5), t(3, 1, 3, 3)]),
        ("conv1d_dilated_same", lambda x, w, b: F.conv1d(x, w, b, padding="same", dilation=2),
         [t(2, 2, 7), t(4, 2, 2), t(4)]),
        ("conv_transpose2d", lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
         [t(2, 2, 3, 3), t(2, 3, 3, 2), t(3)]),
        ("conv_transpose2d_groups_dilation",
         lambda x, w: F.conv_transpose2d(x, w, stride=(1, 2), groups=2, dilation=(2, 1)),
         [t(1, 4, 3, 2), t(4, 1, 2, 2)]),
        ("conv_transpose1d", lambda x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1),
         [t(2, 2, 4), t(2, 3, 3), t(3)]),
        ("max_pool1d", lambda x: F.max_pool1d(x, 3, 2, 1), [_distinct(rng, 2, 2, 7)]),
        ("max_pool2d_dilation_ceil", lambda x: F.max_pool2d(x, 3, 2, 1, dilation=(1, 2), ceil_mode=True),
         [_distinct(rng, 1, 2, 6, 8)]),
        ("max_pool2d_ceil_wide_kernel", lambda x: F.max_pool2d(x, 5, 3, padding=1, ceil_mode=True),
         [_distinct(rng, 1, 2, 3, 4)]),
        ("max_unpool2d", lambda x: F.max_unpool2d(x, unpool2, 2), [t(1, 2, 2, 3)]),
        ("max_unpool2d_repeated_indices", lambda x: F.max_unpool2d(x, unpool2_overlap, 3, 1), [t(1, 2, 3, 3)]),
        ("max_unpool1d", lambda x: F.max_unpool1d(x, unpool1, 3, 2, 1), [t(2, 2, 4)]),
        ("avg_pool1d", lambda x: F.avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), [t(2, 2, 8)]),
        ("avg_pool2d_ceil_exclude_pad",
         lambda x: F.avg_pool2d(x, (3, 2), 2, 1, ceil_mode=True, count_include_pad=False), [t(1, 2, 5, 6)]),
        ("avg_pool2d_divisor_override", lambda x: F.avg_pool2d(x, 2, 1, divisor_override=3), [t(1, 2, 3, 4)]),
        ("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 3), [t(2, 2, 7)]),
        ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 4)), [t(2, 2, 5, 7)]),
        ("adaptive_avg_pool2d_global", lambda x: F.adaptive_avg_pool2d(x, 1), [t(2, 2, 3, 3)]),
        ("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 3), [_distinct(rng, 2, 2, 7)]),
        ("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, (3, 4)), [_distinct(rng, 1, 2, 5, 7)]),
        ("adaptive_max_pool2d_equal_bins", lambda x: F.adaptive_max_pool2d(x, (2, 3)), [_distinct(rng, 1, 2, 4, 6)]),
        ("interpolate", lambda x: F.interpolate(x, size=(5, 7)), [t(1, 2, 3, 4)]),
        ("interpolate_bilinear", lambda x: F.interpolate(x, scale_factor=1.7, mode="bilinear"), [t(1, 2, 3, 4)]),
        ("interpolate_bilinear_align_corners",
         lambda x: F.interpolate(x, size=(5, 3), mode="bilinear", align_corners=True), [t(1, 2, 3, 4)]),
        ("interpolate_linear", lambda x: F.interpolate(x, size=8, mode="linear"), [t(2, 2, 5)]),
        ("interpolate_trilinear", lambda x: F.interpolate(x, size=(3, 5, 2), mode="trilinear"), [t(1, 2, 2, 3, 4)]),
        ("interpolate_nearest_5d", lambda x: F.interpolate(x, scale_factor=(1.5, 2, 0.7)), [t(1, 2, 2, 3, 4)]),
        ("interpolate_area", lambda x: F.interpolate(x, size=(2, 4), mode="area"), [t(1, 2, 5, 6)]),
        ("conv3d", lambda x, w, b: F.conv3d(x, w, b, stride=(2, 1, 1), padding=1, groups=2),
         [t(1, 2, 3, 3, 4), t(4, 1, 2, 2, 3), t(4)]),
        ("conv_transpose3d", lambda x, w, b: F.conv_transpose3d(x, w, b, stride=2, padding=(1, 0, 1),
                                                                output_padding=(1, 0, 0)),
         [t(1, 2, 2, 2, 3), t(2, 2, 2, 2, 2), t(2)]),
        ("max_pool3d", lambda x: F.max_pool3d(x, 2, (1, 2, 2), padding=1, ceil_mode=True),
         [_distinct(rng, 1, 2, 3, 4, 3)]),
        ("avg_pool3d", lambda x: F.avg_pool3d(x, (2, 3, 2), 2, padding=1, ceil_mode=True, count_include_pad=False),
         [t(1, 2, 3, 4, 5)]),
        ("pixel_shuffle", lambda x: F.pixel_shuffle(x, 2), [t(1, 8, 2, 3)]),
        ("pixel_unshuffle", lambda x: F.pixel_unshuffle(x, 2), [t(1, 2, 4, 6)]),
    ]


def _loss_and_attention_cases(rng, t):
    """The losses of the PyTorch vocabulary and scaled dot-product attention."""
    from minidl.ops.attention import AttentionGrad, TiledAttention, TiledAttentionGrad, _probabilities

    targets = np.array([1, -100, 3, 0, 2])  # one sample ignored
    probabilities = rng.dirichlet(np.ones(4), size=5)
    inside = lambda *s: Tensor(rng.uniform(0.1, 0.9, s), requires_grad=True)  # noqa: E731 - away from 0 and 1
    keys_mask = np.array([[True, False, True, True, False]] * 3 + [[False] * 5])  # the last query sees no key
    bias = rng.standard_normal((3, 5))
    bias[0, 1] = -np.inf

    def attention_with_fixed_dropout(q, k, v):
        from minidl.backend import manual_seed
        manual_seed(1234)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)

    def attention_grad(gy, q, k, v, b, mask=keys_mask[:3], scale=0.7):
        probs, dead = _probabilities(q.array, k.array, b.array, scale, mask)
        return AttentionGrad(scale, mask, dead, probs, None)(gy, q, k, v, b)

    def tiled_attention_grad(gy, q, k, v, mask=keys_mask[:3], scale=0.7):
        forward = TiledAttention(scale, mask, block=2)
        forward.forward(q.array, k.array, v.array)
        return TiledAttentionGrad(scale, mask, False, 2, forward.out, forward.lse)(gy, q, k, v)

    return [
        ("cross_entropy_ignore_index_weight",
         lambda z, y: F.cross_entropy(z, y, weight=np.array([0.5, 1.0, 2.0, 1.5]), label_smoothing=0.1),
         [t(5, 4), Tensor(targets)]),
        ("cross_entropy_probabilities", lambda z, p: F.cross_entropy(z, p, label_smoothing=0.2),
         [t(5, 4), Tensor(probabilities)]),
        ("cross_entropy_differentiable_probabilities", lambda z, p: F.cross_entropy(z, p, reduction="sum"),
         [t(2, 3, 2), Tensor(rng.dirichlet(np.ones(3), size=(2, 2)).transpose(0, 2, 1), requires_grad=True)]),
        ("nll_loss_ignore_index_weight",
         lambda z, y: F.nll_loss(z, y, weight=np.array([0.5, 1.0, 2.0, 1.5]), ignore_index=-100),
         [t(5, 4), Tensor(targets)]),
        ("binary_cross_entropy", lambda x, y: F.binary_cross_entropy(x, y, weight=np.array([1.0, 2.0, 0.5])),
         [inside(4, 3), inside(4, 3)]),
        ("kl_div", lambda x, y: F.kl_div(F.log_softmax(x, dim=1), y, reduction="batchmean"),
         [t(3, 4), inside(3, 4)]),
        ("kl_div_log_target", lambda x, y: F.kl_div(x, y, reduction="sum", log_target=True), [t(3, 4), t(3, 4)]),
        ("smooth_l1_loss", lambda x, y: F.smooth_l1_loss(x, y, beta=0.8),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01)]),
        ("huber_loss", lambda x, y: F.huber_loss(x, y, delta=0.7, weight=np.linspace(0.5, 1.5, 12).reshape(3, 4)),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01)]),
        ("smooth_l1_loss_sum", lambda x, y: F.smooth_l1_loss(x, y, reduction="sum", beta=1.4),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01)]),
        ("huber_loss_none", lambda x, y: F.huber_loss(x, y, reduction="none", delta=0.9),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01)]),
        ("huber_loss_mean", lambda x, y: F.huber_loss(x, y, delta=1.4),
         [Tensor(np.linspace(-2, 2, 12).reshape(3, 4) + 0.05, requires_grad=True), t(3, 4, spread=0.01)]),
        ("normalize", lambda x: F.normalize(x, dim=1), [t(3, 4)]),
        ("normalize_p3", lambda x: F.normalize(x, p=3, dim=0), [_away_from_kinks(rng, 3, 4)]),
        ("normalize_p_negative", lambda x: F.normalize(x, p=-1.5, dim=1), [_away_from_kinks(rng, 3, 4)]),
        ("cosine_similarity", lambda a, b: F.cosine_similarity(a, b, dim=-1), [t(3, 4), t(1, 4)]),
        ("pairwise_distance", F.pairwise_distance, [t(3, 4), t(3, 4)]),
        ("pairwise_distance_p1_keepdim", lambda a, b: F.pairwise_distance(a, b, p=1, keepdim=True),
         [_away_from_kinks(rng, 3, 4), Tensor(np.zeros(4))]),
        ("pairwise_distance_inf", lambda a, b: F.pairwise_distance(a, b, p=float("inf")),
         [_distinct(rng, 3, 4), Tensor(np.zeros(4))]),
        ("scaled_dot_product_attention", F.scaled_dot_product_attention, [t(2, 3, 4), t(2, 5, 4), t(2, 5, 6)]),
        ("scaled_dot_product_attention_causal",
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3),
         [t(2, 4, 3), t(2, 4, 3), t(1, 4, 2)]),
        ("scaled_dot_product_attention_bool_mask",
         lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
         [t(2, 4, 3), t(2, 5, 3), t(2, 5, 2), Tensor(keys_mask)]),
        ("scaled_dot_product_attention_float_mask", F.scaled_dot_product_attention,
         [t(2, 3, 4), t(2, 5, 4), t(2, 5, 2), Tensor(bias, requires_grad=True)]),
        ("scaled_dot_product_attention_gqa",
         lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b, enable_gqa=True),
         [t(1, 4, 2, 3), t(1, 2, 3, 3), t(1, 2, 3, 2), t(4, 2, 3)]),
        ("scaled_dot_product_attention_dropout", attention_with_fixed_dropout, [t(2, 3, 4), t(2, 5, 4), t(2, 5, 2)]),
        ("scaled_dot_product_attention_tiled",
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, tiled=True),
         [t(2, 4, 3), t(2, 4, 3), t(1, 4, 2)]),
        ("tiled_attention_blocks", lambda q, k, v: TiledAttention(0.6, keys_mask, block=2)(q, k, v),
         [t(1, 4, 3), t(2, 5, 3), t(2, 5, 2)]),  # three blocks of keys; the last query sees none
        ("tiled_attention_causal_blocks", lambda q, k, v: TiledAttention(0.6, causal=True, block=2)(q, k, v),
         [t(2, 5, 3), t(2, 5, 3), t(2, 5, 2)]),
        ("tiled_attention_grad", tiled_attention_grad, [t(2, 3, 2), t(2, 3, 4), t(2, 5, 4), t(2, 5, 2)]),
        ("attention_grad", attention_grad,
         [t(2, 3, 2), t(2, 3, 4), t(2, 5, 4), t(2, 5, 2), Tensor(bias.copy(), requires_grad=True)]),
    ]


def _normalization_and_recurrent_cases(rng, t):
    """Instance and RMS normalization, channel dropout."""
    from minidl.backend import manual_seed

    def channel_dropout(op):
        def fn(x):  # the same mask on every call (reseeded), as _dropout_with_fixed_mask
            manual_seed(4321)
            return op(x, p=0.4, training=True)
        return fn

    return [
        ("instance_norm", lambda x, w, b: F.instance_norm(x, weight=w, bias=b), [t(2, 3, 4), t(3), t(3)]),
        ("instance_norm_2d", lambda x: F.instance_norm(x, eps=1e-3), [t(2, 2, 3, 3)]),
        ("rms_norm", lambda x, w: F.rms_norm(x, (4,), w), [t(3, 4), t(4)]),
        ("rms_norm_two_axes", lambda x: F.rms_norm(x, (2, 3), eps=1e-4), [t(2, 2, 3)]),
        ("dropout1d", channel_dropout(F.dropout1d), [t(3, 4, 5)]),
        ("dropout2d", channel_dropout(F.dropout2d), [t(3, 4, 2, 2)]),
    ]


def _quantization_cases(rng):
    """Fake quantization: its backward is the straight-through estimator, the derivative of a clip.

    The rounding's true derivative is 0, so each case checks the STE against
    what it stands for: ``fake_quantize(x) − (fake_quantize(x) − clip(x)).detach()``
    has the value of ``clip(x, s·(q_min − z), s·(q_max − z))`` at every point
    the finite differences visit, and the gradient of fake_quantize alone. The
    inputs keep a grid step away from the clip bounds, where the STE's mask and
    the clip's differ by half a step.
    """
    def straight_through(scale, zero, q_min, q_max):
        lo, hi = scale * (q_min - zero), scale * (q_max - zero)

        def fn(x):
            y = F.fake_quantize(x, scale, zero, q_min, q_max)
            return y - (y - F.clip(x, lo, hi)).detach()
        return fn

    def grid_input(lo, hi, step, shape):
        """Values inside [lo + step, hi − step] or beyond [lo − step, hi + step], never near a bound."""
        inside = rng.uniform(lo + step, hi - step, size=shape)
        beyond = step * (1 + 3 * rng.random(shape))
        outside = np.where(rng.random(shape) < 0.5, lo - beyond, hi + beyond)
        return Tensor(np.where(rng.random(shape) < 0.75, inside, outside), requires_grad=True)

    per_channel_scale = np.array([[0.1], [0.3], [0.05]])
    per_channel_zero = np.array([[0.0], [2.0], [-3.0]])
    rows = [grid_input(s * (-8 - z), s * (7 - z), s, (1, 5)).array
            for s, z in zip(per_channel_scale[:, 0], per_channel_zero[:, 0])]
    x_channels = Tensor(np.concatenate(rows), requires_grad=True)
    return [
        ("fake_quantize", straight_through(0.25, 3.0, -8, 7), [grid_input(0.25 * -11, 0.25 * 4, 0.25, (4, 5))]),
        ("fake_quantize_uint8", straight_through(0.02, 128.0, 0, 255),
         [grid_input(0.02 * -128, 0.02 * 127, 0.02, (3, 4))]),
        ("fake_quantize_per_channel", straight_through(per_channel_scale, per_channel_zero, -8, 7), [x_channels]),
    ]


# ---------------------------------------------------------------- which cases the complex step can check
# The complex-step derivative Im f(x + ih)/h needs f analytic at x: every op on the way takes complex128
# and computes the analytic continuation. PIECEWISE_ANALYTIC cases select among analytic pieces by
# comparisons, which NumPy makes on the real part first; the case's inputs keep away from the kinks,
# so the step stays on one piece and the check is as exact there. Every other case is listed in
# NOT_ANALYTIC with the reason; tests/test_op_cases.py checks that each case is in exactly one place.
_NO_COMPLEX_LOOP = "NumPy has no complex {} (a comparison or rounding that has no analytic continuation)"
_ABS = "uses |x|, which is not analytic (|x + ih| = |x| to first order: the complex step sees 0)"
_STABLE_SOFTPLUS = "the overflow-safe softplus is max(x, 0) + log1p(e^−|x|): it uses |x|"
NOT_ANALYTIC = {
    "fft_conv2d": "the real FFT (rfft2) takes real arrays only, so a complex step has nowhere to go",
    "abs": _ABS,
    "l1_loss": _ABS,
    "softsign": "x / (1 + |x|): " + _ABS,
    "norm_p3_dim": "the p-norm (Σ|x|ᵖ)^(1/p) " + _ABS,
    "norm_p_half": "the p-norm (Σ|x|ᵖ)^(1/p) " + _ABS,
    "norm_p1": "the 1-norm Σ|x| " + _ABS,
    "norm_inf": "the ∞-norm max|x| " + _ABS,
    "normalize_p3": "divides by the p-norm, which " + _ABS,
    "normalize_p_negative": "divides by the p-norm, which " + _ABS,
    "pairwise_distance_p1_keepdim": "the 1-norm of the difference " + _ABS,
    "pairwise_distance_inf": "the ∞-norm of the difference " + _ABS,
    "smooth_l1_loss": "|x − y| picks the branch and enters the value: " + _ABS,
    "huber_loss": "|x − y| picks the branch and enters the value: " + _ABS,
    "smooth_l1_loss_sum": "|x − y| picks the branch and enters the value: " + _ABS,
    "huber_loss_none": "|x − y| picks the branch and enters the value: " + _ABS,
    "huber_loss_mean": "|x − y| picks the branch and enters the value: " + _ABS,
    "norm_nuc": "the sum of singular values: NumPy's complex SVD is of the Hermitian kind (real singular "
                "values of A Aᴴ), not the analytic continuation of the real SVD",
    "svd": "NumPy's complex SVD factors with the conjugate transpose (A = U S Vᴴ): not the analytic "
           "continuation of the real SVD",
    "sign": "NumPy's complex sign is z/|z|: " + _ABS,
    "softplus": _STABLE_SOFTPLUS,
    "softplus_beta_threshold": _STABLE_SOFTPLUS,
    "logsigmoid": "the overflow-safe form min(x, 0) − log1p(e^−|x|) " + _ABS,
    "mish": "x·tanh(softplus(x)) with " + _STABLE_SOFTPLUS,
    "binary_cross_entropy_with_logits": "softplus(x) − t·x with " + _STABLE_SOFTPLUS,
    "logaddexp": _NO_COMPLEX_LOOP.format("logaddexp"),
    "logcumsumexp": _NO_COMPLEX_LOOP.format("logaddexp (its scan)"),
    "logcumsumexp_grad": _NO_COMPLEX_LOOP.format("logaddexp (its scan)"),
    "atan2": _NO_COMPLEX_LOOP.format("arctan2") + "; atan2(y, x) is the angle of x + iy, a real function",
    "copysign": _NO_COMPLEX_LOOP.format("copysign"),
    "floor": _NO_COMPLEX_LOOP.format("floor"),
    "ceil": _NO_COMPLEX_LOOP.format("ceil"),
    "trunc": _NO_COMPLEX_LOOP.format("trunc"),
    "div_trunc": _NO_COMPLEX_LOOP.format("trunc"),
    "floor_divide": _NO_COMPLEX_LOOP.format("floor_divide"),
    "fmod": _NO_COMPLEX_LOOP.format("fmod"),
    "remainder": _NO_COMPLEX_LOOP.format("remainder"),
    "interpolate_linear": "the sample positions are computed in the input's dtype and floored "
                          "(no complex floor); the weights would be linear",
    "interpolate_bilinear": "as interpolate_linear: positions floored in the input's dtype",
    "interpolate_bilinear_align_corners": "as interpolate_linear: positions floored in the input's dtype",
    "interpolate_trilinear": "as interpolate_linear: positions floored in the input's dtype",
    "cross_entropy_differentiable_probabilities": "the target's dtype says what it is (integer classes or "
                                                  "floating probabilities): a complex target is refused",
}
PIECEWISE_ANALYTIC = frozenset({
    "clip", "maximum", "minimum", "relu", "leaky_relu", "elu", "max", "min", "max_pool2d", "max_dim", "min_dim",
    "sort", "topk", "scatter_reduce_amax", "scatter_reduce_amin_exclude_self", "cummax", "cummin",
    "round", "round_decimals", "clamp", "clamp_min_tensor", "clamp_crossed", "selu", "celu", "relu6",
    "hardtanh", "hardtanh_bounds", "hardswish", "hardsigmoid", "prelu", "prelu_one_slope", "max_pool1d",
    "max_pool2d_dilation_ceil", "max_pool2d_ceil_wide_kernel", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "adaptive_max_pool2d_equal_bins", "max_pool3d", "fake_quantize", "fake_quantize_uint8",
    "fake_quantize_per_channel", "smooth_l1_loss_grad", "huber_loss_grad_none",
})


def complex_step_status(name: str) -> str:
    """'analytic', 'piecewise analytic', or why the complex step cannot check the case ``name``."""
    if name in NOT_ANALYTIC:
        return NOT_ANALYTIC[name]
    return "piecewise analytic" if name in PIECEWISE_ANALYTIC else "analytic"


# ---------------------------------------------------------------- filter-wise and spatial parallelism
class _GatheringGroupOfOne(_GroupOfOne):
    """A group of one rank that also all-gathers (its ``allgather``: the array with a new axis of one)."""

    def allgather(self, array):
        return array[None].copy()


def _group_gather_cases(t):
    """The all-gather/split pair of filter-wise and spatial parallelism, each times its input (second order)."""
    from minidl.ops.group_gather import gather_from_group, split_to_group

    group = _GatheringGroupOfOne()
    return [
        ("gather_from_group", lambda x: gather_from_group(x, group, axis=1) * x, [t(2, 3, 2)]),
        ("split_to_group", lambda x: split_to_group(x, group, axis=-1) * x, [t(3, 4)]),
    ]


# ---------------------------------------------------------------- layer norm as one op
def _layer_norm_affine_cases(t):
    """LayerNormAffine with γ only, β only, neither (a Normalize), over two axes; its γ gradient op."""
    from minidl.ops.norm import LayerNormWeightGrad, Normalize

    def weight_grad(x, gy, axes=(1, 2)):  # x̂ and s recomputed from x on every call, as the forward would
        normalize = Normalize(axes, 1e-5)
        x_hat = normalize.forward(x.array)
        return LayerNormWeightGrad(axes, 1e-5, x_hat, normalize.inv_std)(x, gy)

    return [
        ("layer_norm_weight_only", lambda x, w: F.layer_norm(x, (4,), w), [t(3, 4), t(4)]),
        ("layer_norm_bias_only", lambda x, b: F.layer_norm(x, 4, None, b), [t(2, 3, 4), t(4)]),
        ("layer_norm_no_affine", lambda x: F.layer_norm(x, (4,)), [t(3, 4)]),
        ("layer_norm_two_axes", lambda x, w, b: F.layer_norm(x, (3, 4), w, b), [t(2, 3, 4), t(3, 4), t(3, 4)]),
        ("layer_norm_weight_grad", weight_grad, [t(2, 3, 4), t(2, 3, 4)]),
    ]
