"""matmul (NumPy's @ rules: matrices, batches, broadcast batches, vectors) and F.linear."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minidl as mdl
import minidl.functional as F
from tests.conftest import leaf

FEW = settings(max_examples=20, deadline=None)
seeds = st.integers(0, 2**32 - 1)
side = st.integers(1, 3)


def check_matmul(a, b):
    ta, tb = leaf(a), leaf(b)
    y = ta @ tb
    expected = a @ b
    assert y.shape == expected.shape
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12, atol=1e-12)
    assert mdl.gradcheck(mdl.ops.matmul, [ta, tb])
    assert mdl.gradgradcheck(mdl.ops.matmul, [ta, tb])


@st.composite
def matmul_shapes(draw):
    """Two operand shapes NumPy's matmul accepts: vectors, matrices, batches that broadcast."""
    n, k, m = draw(side), draw(side), draw(side)
    batch = draw(st.lists(side, max_size=2))
    kinds = st.sampled_from(["vector", "matrix", "batch"])
    kind_a, kind_b = draw(kinds), draw(kinds)

    def batch_like():  # the same batch, with some axes shrunk to 1 or dropped in front: it must broadcast
        dims = [d if draw(st.booleans()) else 1 for d in batch]
        return dims[draw(st.integers(0, len(dims))):]

    shape_a = (k,) if kind_a == "vector" else (n, k) if kind_a == "matrix" else tuple(batch_like()) + (n, k)
    shape_b = (k,) if kind_b == "vector" else (k, m) if kind_b == "matrix" else tuple(batch_like()) + (k, m)
    return shape_a, shape_b


@FEW
@given(shapes=matmul_shapes(), seed=seeds)
def test_matmul_on_shapes_numpy_accepts(shapes, seed):
    rng = np.random.default_rng(seed)
    check_matmul(rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1]))


@pytest.mark.parametrize("sa, sb", [
    ((2, 3), (3, 4)),          # 2-D
    ((5, 2, 3), (5, 3, 4)),    # batched
    ((5, 2, 3), (3, 4)),       # matrix broadcast over a batch
    ((2, 1, 2, 3), (4, 3, 2)),  # batch axes broadcast against each other
    ((3,), (3, 4)),            # 1-D @ 2-D: a row vector
    ((2, 3), (3,)),            # 2-D @ 1-D: a column vector
    ((3,), (3,)),              # 1-D @ 1-D: the dot product, a 0-d result
    ((4, 2, 3), (3,)),         # 3-D @ 1-D
    ((3,), (4, 3, 2)),         # 1-D @ 3-D
])
def test_matmul_cases(sa, sb):
    rng = np.random.default_rng(0)
    check_matmul(rng.standard_normal(sa), rng.standard_normal(sb))


def test_matmul_gradient_by_hand():
    a = leaf([[1.0, 2.0], [3.0, 4.0]])
    b = leaf([[5.0], [6.0]])
    (a @ b).sum().backward()  # dA = G Bᵀ with G = ones(2, 1); dB = Aᵀ G
    np.testing.assert_array_equal(a.grad.numpy(), [[5.0, 6.0], [5.0, 6.0]])
    np.testing.assert_array_equal(b.grad.numpy(), [[4.0], [6.0]])


def test_matmul_with_numpy_operands_treats_them_as_constants():
    w = np.array([[1.0, 0.0], [2.0, 1.0]])
    x = leaf([[1.0, 1.0]])
    (x @ w).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 3.0]])
    x.grad = None
    (w @ x.T).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[3.0, 1.0]])


@pytest.mark.parametrize("sa, sb, fragment", [
    ((2, 3), (4, 5), "(3) must equal b's second-to-last axis (4)"),
    ((3,), (4,), "(3) must equal b's only axis (4)"),
    ((2, 3, 4), (5,), "(4) must equal b's only axis (5)"),
    ((2, 2, 3), (3, 3, 4), "batch axes (2,) and (3,) do not broadcast"),
])
def test_matmul_shape_mismatch_names_the_op_and_shapes(sa, sb, fragment):
    with pytest.raises(ValueError) as info:
        mdl.zeros(*sa) @ mdl.zeros(*sb)
    message = str(info.value)
    assert "matmul" in message and str(sa) in message and str(sb) in message and fragment in message


def test_matmul_of_a_0d_operand_is_an_error():
    with pytest.raises(ValueError, match=r"matmul.*at least 1 dimension.*\(\)"):
        mdl.tensor(2.0) @ mdl.zeros(3)


# ---------------------------------------------------------------- linear
@pytest.mark.parametrize("x_shape", [(4,), (1, 4), (5, 4), (70, 4), (2, 3, 4)])  # 1 and 5 rows take fast paths
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_x_wT_plus_b(x_shape, with_bias):
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal(x_shape), rng.standard_normal((3, 4)), rng.standard_normal(3)
    inputs = [leaf(x), leaf(w)] + ([leaf(b)] if with_bias else [])
    y = F.linear(*inputs)
    expected = x @ w.T + (b if with_bias else 0)
    assert y.shape == x_shape[:-1] + (3,)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12)
    assert mdl.gradcheck(F.linear, inputs)
    assert mdl.gradgradcheck(lambda *a: F.linear(*a) ** 2, inputs)


@FEW
@given(batch=st.lists(st.integers(0, 3), max_size=2), n_in=side, n_out=side, seed=seeds, bias=st.booleans())
def test_linear_on_drawn_shapes_including_empty_batches(batch, n_in, n_out, seed, bias):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(tuple(batch) + (n_in,))
    w, b = rng.standard_normal((n_out, n_in)), rng.standard_normal(n_out)
    inputs = [leaf(x), leaf(w)] + ([leaf(b)] if bias else [])
    y = F.linear(*inputs)
    np.testing.assert_allclose(y.numpy(), x @ w.T + (b if bias else 0), rtol=1e-12, atol=1e-12)
    assert mdl.gradcheck(F.linear, inputs)
    y.backward(grad=np.ones(y.shape))
    assert inputs[1].grad.shape == w.shape  # an empty batch still gives (zero) weight gradients
    if bias:
        assert inputs[2].grad.shape == b.shape


def test_linear_gradients_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    g = rng.standard_normal((2, 3, 5))
    ours = [leaf(x), leaf(w), leaf(b)]
    F.linear(*ours).backward(grad=g)
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    torch.nn.functional.linear(*theirs).backward(torch.tensor(g))
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-12)


def test_linear_feature_mismatch_names_the_op_and_shapes():
    with pytest.raises(ValueError) as info:
        F.linear(mdl.zeros(4, 5), mdl.zeros(2, 3))
    message = str(info.value)
    assert "linear" in message and "(4, 5)" in message and "(2, 3)" in message and "(out, in)" in message


# ---------------------------------------------------------------- dtypes and devices
@pytest.mark.parametrize("fn", [
    lambda x, w, b: x @ w.T, lambda x, w, b: F.linear(x, w, b), lambda x, w, b: F.linear(x, w),
    lambda x, w, b: x[0] @ w.T, lambda x, w, b: w @ x[0],
])
def test_float32_stays_float32(fn):
    x, w, b = (mdl.randn(*s, requires_grad=True) for s in ((2, 3), (3, 3), (3,)))
    y = fn(x, w, b)
    assert y.dtype == np.float32
    y.sum().backward()
    for t in (x, w, b):
        assert t.grad is None or t.grad.dtype == np.float32


@pytest.mark.parametrize("sa, sb", [((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((3,), (3,)), ((4, 2, 3), (3,))])
def test_matmul_on_device(device, sa, sb):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    ta, tb = leaf(a, device), leaf(b, device)
    y = ta @ tb
    assert y.device == ta.device
    np.testing.assert_allclose(y.numpy(), a @ b, rtol=1e-12)
    y.sum().backward()
    ca, cb = leaf(a), leaf(b)
    (ca @ cb).sum().backward()
    np.testing.assert_allclose(ta.grad.numpy(), ca.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), cb.grad.numpy(), rtol=1e-12)


def test_linear_on_device(device):
    rng = np.random.default_rng(4)
    x, w, b = rng.standard_normal((5, 4)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    ours = [leaf(a, device) for a in (x, w, b)]
    y = F.linear(*ours)
    np.testing.assert_allclose(y.numpy(), x @ w.T + b, rtol=1e-12)
    y.sum().backward()
    np.testing.assert_allclose(ours[0].grad.numpy(), np.ones((5, 3)) @ w, rtol=1e-12)
    np.testing.assert_allclose(ours[1].grad.numpy(), np.ones((5, 3)).T @ x, rtol=1e-12)
    np.testing.assert_allclose(ours[2].grad.numpy(), np.full(3, 5.0), rtol=1e-12)
