"""Shape ops: reshape, transpose, broadcast_to, sum_to, indexing, concatenate, stack, pad, flatten.

The PyTorch vocabulary (permute, squeeze, split...) is tested in test_shape_vocabulary.py.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import minidl as mdl
import minidl.functional as F
from minidl.ops.shape import sum_to
from tests.conftest import check_device_against_cpu, leaf

FEW = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**32 - 1)
shapes = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)


def check(fn, x, expected):
    """Forward equals the NumPy result; gradients pass gradcheck, and (through a square) gradgradcheck."""
    t = leaf(x)
    y = fn(t)
    np.testing.assert_array_equal(y.numpy(), expected)
    assert mdl.gradcheck(fn, [t])
    assert mdl.gradgradcheck(lambda a: fn(a * a), [t])


# ---------------------------------------------------------------- reshape, flatten
@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_reshape(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    target = data.draw(st.permutations(shape).map(tuple), label="target")
    minus_one = data.draw(st.sampled_from([None] + list(range(len(shape)))), label="-1 at")
    if minus_one is not None:
        target = target[:minus_one] + (-1,) + target[minus_one + 1:]
    check(lambda a: a.reshape(target), x, x.reshape(target))
    np.testing.assert_array_equal(F.reshape(leaf(x), *target).numpy(), x.reshape(target))


def test_reshape_to_a_wrong_size_names_the_op_and_shapes():
    with pytest.raises(ValueError) as info:
        mdl.zeros(2, 3).reshape(4, 2)
    message = str(info.value)
    assert "reshape" in message and "(2, 3)" in message and "(4, 2)" in message and "6" in message


def test_view_and_flatten():
    x = np.arange(24.0).reshape(2, 3, 4)
    check(lambda a: a.view(6, 4), x, x.reshape(6, 4))
    check(lambda a: a.flatten(), x, x.reshape(24))  # PyTorch's default: every dim
    check(lambda a: F.flatten(a, 1), x, x.reshape(2, 12))


# ---------------------------------------------------------------- transpose
@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_transpose_with_a_permutation(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    perm = data.draw(st.permutations(range(len(shape))).map(tuple), label="perm")
    check(lambda a: a.transpose(perm), x, x.transpose(perm))
    check(lambda a: a.transpose(), x, x.transpose())
    check(lambda a: a.T, x, x.T)


def test_transpose_with_two_axes_swaps_them_as_pytorch_does():
    x = np.arange(24.0).reshape(2, 3, 4)
    check(lambda a: a.transpose(0, 2), x, np.swapaxes(x, 0, 2))
    check(lambda a: F.transpose(a, -1, -2), x, np.swapaxes(x, -1, -2))
    m = np.arange(6.0).reshape(2, 3)
    check(lambda a: a.transpose(0, 1), m, m.T)  # on a matrix too: the transpose, not a no-op
    check(lambda a: a.transpose(1, 0), m, m.T)
    check(lambda a: a.transpose((0, 1)), m, m)  # a tuple is NumPy's permutation
    check(lambda a: a.mT, x, np.swapaxes(x, -1, -2))


@pytest.mark.parametrize("axes", [(-2, -1, 1, 0), (-1, -2, -3, -4), (3, -3, 0, -2)])
def test_transpose_with_negative_axes_sends_the_gradient_back_to_each_place(axes):
    x = np.random.default_rng(0).standard_normal((3, 4, 5, 6))
    positive = tuple(a % 4 for a in axes)
    t = leaf(x)
    y = t.transpose(axes)
    assert y.shape == tuple(x.shape[a] for a in positive)
    weights = np.random.default_rng(1).standard_normal(y.shape)
    (y * mdl.tensor(weights)).sum().backward()
    assert t.grad.shape == x.shape
    expected = np.zeros_like(x)
    for index in np.ndindex(y.shape):  # y[index] = x[source], so dL/dx[source] = weights[index]
        source = [0] * 4
        for i, a in enumerate(positive):
            source[a] = index[i]
        expected[tuple(source)] = weights[index]
    np.testing.assert_array_equal(t.grad.numpy(), expected)
    small = np.random.default_rng(2).standard_normal((2, 3, 1, 2))
    check(lambda a: a.transpose(axes), small, small.transpose(positive))


@pytest.mark.parametrize("shape, axes, why", [
    ((2, 3), ((0, 2),), "out of range"),
    ((2, 3), (0, 2), "out of range"),
    ((2, 3), ((0, 0),), "repeat"),
    ((2, 3, 4), ((0, 1, 1),), "repeat"),
    ((2, 3), ((0, 1, 2),), "3 axes"),
    ((2, 3, 4), (1,), "1 axis"),
    ((2, 3, 4), ((0, 1, -4),), "out of range"),
    ((2, 3), (-3, 0), "out of range"),
])
def test_transpose_with_bad_axes_names_the_op_the_shape_and_the_axes(shape, axes, why):
    with pytest.raises(ValueError) as info:
        mdl.zeros(*shape).transpose(*axes)
    message = str(info.value)
    given = axes[0] if len(axes) == 1 and isinstance(axes[0], tuple) else axes
    assert message.startswith("transpose:") and str(shape) in message and str(given) in message
    assert why in message


def test_transpose_axes_must_be_integers():
    with pytest.raises(TypeError, match=r"transpose.*integers.*\(2, 3\)"):
        mdl.zeros(2, 3).transpose((1.0, 0))


# ---------------------------------------------------------------- broadcast_to and sum_to
@FEW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, min_dims=0, max_dims=3, max_side=3), seed=seeds)
def test_broadcast_to_and_sum_to(shapes, seed):
    (src,), target = shapes.input_shapes, shapes.result_shape
    x = np.random.default_rng(seed).standard_normal(src)
    check(lambda a: a.broadcast_to(target), x, np.broadcast_to(x, target))
    y = np.random.default_rng(seed + 1).standard_normal(target)
    lead = len(target) - len(src)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(src) if n == 1 and target[lead + i] != 1)
    expected = y.sum(axis=axes, keepdims=True).reshape(src)
    t = leaf(y)
    np.testing.assert_allclose(sum_to(t, src).numpy(), expected, rtol=1e-12)
    assert mdl.gradcheck(lambda a: sum_to(a, src), [t])


def test_broadcast_to_a_wrong_shape():
    with pytest.raises(ValueError, match=r"broadcast_to.*\(2, 3\).*\(4, 3\)"):
        mdl.zeros(2, 3).broadcast_to((4, 3))


def test_broadcast_gradient_sums_over_the_copies():
    x = leaf([[1.0], [2.0]])
    x.broadcast_to((3, 2, 4)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[12.0], [12.0]])


# ---------------------------------------------------------------- indexing
X = np.arange(60.0).reshape(3, 4, 5) * 0.1


@pytest.mark.parametrize("key", [
    1, -1, (0, 2), (0, 2, 3), slice(1, None), (slice(None), slice(None, None, 2)),
    (slice(None, None, -1), 1), (Ellipsis, 2), (None, 1), (slice(0, 2), None, 3),
    np.array([0, 2]), np.array([2, 2, 0, 2]), (slice(None), np.array([1, 1, 3])),
    (np.array([0, 0, 1]), np.array([4, 4, 4]) - 1), [1, 1],
    (np.array([[0, 1], [1, 1]]), slice(None), 0),
    X > 2.5, (X[:, :, 0] > 1.0), (slice(None), np.array([True, False, True, True])),
])
def test_getitem_matches_numpy_and_passes_gradcheck(key):
    check(lambda a: a[key], X, X[key])


def test_getitem_with_repeated_indices_adds_their_gradients():
    x = leaf([1.0, 2.0, 3.0, 4.0])
    x[np.array([0, 2, 2, 2, 3, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, 3.0, 1.0])
    x.grad = None
    x[[1, 1]].backward(grad=np.array([10.0, 5.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 15.0, 0.0, 0.0])


def test_getitem_with_a_boolean_tensor_mask():
    x = leaf([1.0, -2.0, 3.0, -4.0])
    mask = x > 0  # a bool Tensor, as users write it
    y = x[mask]
    np.testing.assert_array_equal(y.numpy(), [1.0, 3.0])
    (y * y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 0.0, 6.0, 0.0])


def test_getitem_with_an_integer_tensor_index():
    x = leaf([[1.0, 2.0], [3.0, 4.0]])
    rows = mdl.tensor([1, 1, 0])
    np.testing.assert_array_equal(x[rows].numpy(), [[3, 4], [3, 4], [1, 2]])
    x[rows].sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 1.0], [2.0, 2.0]])


def test_getitem_on_an_empty_batch():
    x = leaf(np.zeros((0, 3)))
    y = x[:, 1:]
    assert y.shape == (0, 2)
    y.backward(grad=np.zeros((0, 2)))
    assert x.grad.shape == (0, 3)


# ---------------------------------------------------------------- concatenate and stack
@FEW
@given(shape=shapes, seed=seeds, data=st.data())
def test_concatenate(shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3), label="sizes")
    parts = []
    for n in sizes:
        s = list(shape)
        s[axis] = n
        parts.append(rng.standard_normal(s))
    ts = [leaf(p) for p in parts]
    np.testing.assert_array_equal(mdl.concatenate(ts, axis).numpy(), np.concatenate(parts, axis))
    np.testing.assert_array_equal(mdl.concatenate(ts, dim=axis).numpy(), np.concatenate(parts, axis))
    assert mdl.gradcheck(lambda *a: mdl.concatenate(a, axis), ts)
    assert mdl.gradgradcheck(lambda *a: mdl.concatenate([t * t for t in a], axis), ts)


def test_concatenate_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"concatenate.*\(2, 3\).*\(3, 4\)"):
        mdl.concatenate([mdl.zeros(2, 3), mdl.zeros(3, 4)])


@FEW
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3), seed=seeds, data=st.data())
def test_stack(shape, seed, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    count = data.draw(st.integers(1, 3), label="count")
    parts = [rng.standard_normal(shape) for _ in range(count)]
    ts = [leaf(p) for p in parts]
    np.testing.assert_array_equal(mdl.stack(ts, axis).numpy(), np.stack(parts, axis))
    np.testing.assert_array_equal(mdl.stack(ts, dim=axis).numpy(), np.stack(parts, axis))
    assert mdl.gradcheck(lambda *a: mdl.stack(a, axis), ts)
    if np.prod(shape) > 0:
        assert mdl.gradgradcheck(lambda *a: mdl.stack([t * t for t in a], axis), ts)


def test_stack_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError, match=r"stack.*\(2,\).*\(3,\)"):
        mdl.stack([mdl.zeros(2), mdl.zeros(3)])


# ---------------------------------------------------------------- pad (more in test_shape_pad.py)
@pytest.mark.parametrize("widths, numpy_widths", [
    ((1, 1), ((0, 0), (1, 1))), ((2, 0), ((0, 0), (2, 0))), ((0, 1, 2, 3), ((2, 3), (0, 1))),
    ([1, 1, 0, 0], ((0, 0), (1, 1))),
])
@pytest.mark.parametrize("value", [0.0, -1.5])
def test_pad(widths, numpy_widths, value):
    x = np.arange(6.0).reshape(2, 3)
    expected = np.pad(x, numpy_widths, constant_values=value)
    check(lambda a: F.pad(a, widths, value=value), x, expected)


def test_pad_gradient_is_the_interior():
    x = leaf(np.ones((2, 2)))
    y = F.pad(x, (1, 1, 1, 1))
    (y * mdl.tensor(np.arange(16.0).reshape(4, 4))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[5.0, 6.0], [9.0, 10.0]])


# ---------------------------------------------------------------- dtypes and devices
SHAPE_OPS = {
    "reshape": lambda a: a.reshape(3, 2), "transpose": lambda a: a.transpose(),
    "broadcast_to": lambda a: a.broadcast_to((2, 2, 3)), "getitem": lambda a: a[np.array([1, 1]), 1:],
    "mask": lambda a: a[a > 0.5], "concatenate": lambda a: mdl.concatenate([a, a * 2], axis=1),
    "stack": lambda a: mdl.stack([a, a], axis=-1), "pad": lambda a: F.pad(a, (1, 1, 1, 1)),
    "flatten": lambda a: a.flatten(), "sum_to": lambda a: sum_to(a, (1, 3)),
}


@pytest.mark.parametrize("name", SHAPE_OPS)
def test_float32_stays_float32(name):
    x = mdl.tensor([[0.25, 1.0, 2.0], [-1.0, 0.75, 3.0]], requires_grad=True)
    y = SHAPE_OPS[name](x)
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


@pytest.mark.parametrize("name", SHAPE_OPS)
def test_forward_and_backward_on_device(device, name):
    x = np.random.default_rng(0).standard_normal((2, 3))
    check_device_against_cpu(SHAPE_OPS[name], x, device, exact=True, seed=1)
