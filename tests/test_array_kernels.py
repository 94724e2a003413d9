"""minidl.array_kernels: the NumPy error function and the sorted scatter-add, by value.

erf is checked against Python's math.erf (correctly rounded to about an ulp) on a dense grid
in both precisions; scatter_add against np.add.at, the definition it replaces, on every kind of
key the ops hand it (and on the keys it leaves to np.add.at).
"""
import math

import numpy as np
import pytest

from minidl import array_kernels

GRID = np.concatenate([np.linspace(-7, 7, 14001), np.geomspace(1e-300, 7, 600), -np.geomspace(1e-300, 7, 600),
                       [0.75, -0.75, np.nextafter(0.75, 0), 6.0, 4.3, 3.92]])


def _ulps(y, expected, dtype):
    spacing = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
    return np.abs(y.astype(np.float64) - expected) / spacing


def test_erf_float64_is_within_two_ulps_of_math_erf():
    expected = np.array([math.erf(v) for v in GRID])
    y = array_kernels.erf(GRID)
    assert y.dtype == np.float64
    assert _ulps(y, expected, np.float64).max() <= 2


def test_erf_float32_is_within_six_ulps_of_math_erf():
    x = GRID.astype(np.float32)
    expected = np.array([math.erf(float(v)) for v in x])
    y = array_kernels.erf(x)
    assert y.dtype == np.float32
    assert _ulps(y, expected, np.float32).max() <= 6


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_erf_special_values_and_symmetry(dtype):
    y = array_kernels.erf(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 40.0, -40.0], dtype))
    assert np.isnan(y[0])
    np.testing.assert_array_equal(y[1:], [1, -1, 0, 0, 1, -1])
    assert np.signbit(y[4]) and not np.signbit(y[3])  # erf(−0) = −0
    x = GRID.astype(dtype)
    np.testing.assert_array_equal(array_kernels.erf(-x), -array_kernels.erf(x))  # odd, exactly
    np.testing.assert_array_equal(array_kernels.erf(x[:10].reshape(5, 2)), array_kernels.erf(x[:10]).reshape(5, 2))
    assert array_kernels.erf(np.array(0.5, dtype)).shape == ()


def test_erf_sixteen_bit_floats_go_through_float32():
    x = np.linspace(-3, 3, 61).astype(np.float16)
    y = array_kernels.erf(x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.array([math.erf(float(v)) for v in x]).astype(np.float32).astype(np.float16))


def test_erf_refuses_complex_and_says_scipy_is_needed():
    with pytest.raises(TypeError, match="erf.*complex128.*SciPy"):
        array_kernels.erf(np.array([1 + 1j]))


# ---------------------------------------------------------------- scatter-add
def _both(target, key, values):
    """(kernel result, np.add.at result) on copies of target."""
    mine, reference = target.copy(), target.copy()
    array_kernels.scatter_add(mine, key, values)
    np.add.at(reference, key, values)
    return mine, reference


RNG = np.random.default_rng(0)
ROWS = RNG.integers(0, 7, size=(5, 9))


@pytest.fixture(params=["one-hot product", "sort and reduceat"])
def scatter_path(request, monkeypatch):
    """Each scatter-add test runs both ways of summing: the one-hot product (few places) and the sort."""
    monkeypatch.setattr(array_kernels, "ONE_HOT_ROWS", 10 ** 9 if request.param == "one-hot product" else 0)
    return request.param


@pytest.mark.parametrize("name, shape, key, values_shape", [
    ("embedding rows", (7, 4), ROWS, (5, 9, 4)),
    ("rows, a tuple of one array", (7, 4), (ROWS[0],), (9, 4)),
    ("negative rows", (7, 4), np.array([-1, 6, 0, -7, 3]), (5, 4)),
    ("columns x[:, idx]", (3, 7, 2), (slice(None), ROWS[1]), (3, 9, 2)),
    ("array then a slice", (7, 5), (ROWS[2], slice(1, 4)), (9, 3)),
    ("strided slice before the array", (6, 7), (slice(0, 6, 2), ROWS[3]), (3, 9)),
    ("every axis indexed (a gather's places)", (4, 7), (np.arange(4)[:, None], RNG.integers(0, 7, (4, 6))), (4, 6)),
    ("broadcast values", (7, 4), ROWS[4], (4,)),
    ("scalar index", (7, 4), np.array(3), (4,)),
    ("empty index", (7, 4), np.array([], np.int64), (0, 4)),
])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.int64, np.complex128])
def test_scatter_add_equals_np_add_at(name, shape, key, values_shape, dtype, scatter_path):
    """Integers exactly; floats to the rounding of a sum in another order (reduceat adds a run
    in its own order): within 8 ulps of the run's sum of magnitudes."""
    values = (RNG.standard_normal(values_shape) * 10).astype(dtype)
    if dtype == np.complex128:
        values = values + 1j * RNG.standard_normal(values_shape)
    mine, reference = _both(np.zeros(shape, dtype), key, values)
    assert mine.dtype == dtype
    if dtype == np.int64:
        np.testing.assert_array_equal(mine, reference)
        return
    magnitudes = np.zeros(shape)
    np.add.at(magnitudes, key, np.abs(values).astype(np.float64))
    assert np.all(np.abs(mine - reference) <= 8 * np.finfo(dtype).eps * magnitudes)
    np.testing.assert_array_equal(mine == 0, magnitudes == 0)  # nothing lands where nothing was added


def test_scatter_add_into_values_adds_each_run_once(scatter_path):
    target = RNG.standard_normal((7, 4))
    values = RNG.standard_normal((5, 9, 4))
    mine, reference = _both(target, ROWS, values)
    np.testing.assert_allclose(mine, reference, rtol=1e-14, atol=1e-14)


def test_scatter_add_writes_through_a_view(scatter_path):
    base = np.zeros((3, 7, 4))
    view = base[1]  # GetItemGrad scatters into such a view of its zeros
    array_kernels.scatter_add(view, ROWS[0], np.ones((9, 4)))
    counts = np.bincount(ROWS[0], minlength=7)
    np.testing.assert_array_equal(base[1], np.repeat(counts[:, None], 4, axis=1))
    assert not base[0].any() and not base[2].any()


def test_scatter_add_of_an_infinite_value_lands_at_its_place_only():
    """0·∞ is NaN: a one-hot product would spread an ∞ over every place, so such values are sorted."""
    target = np.zeros((5, 3), np.float32)
    values = np.ones((4, 3), np.float32)
    values[1, 2] = np.inf
    array_kernels.scatter_add(target, np.array([0, 2, 2, 4]), values)
    expected = np.zeros((5, 3), np.float32)
    np.add.at(expected, np.array([0, 2, 2, 4]), values)
    np.testing.assert_array_equal(target, expected)
    assert not np.isnan(target).any() and np.isinf(target[2, 2])


def test_scatter_add_into_few_places_is_an_embeddings_gradient():
    """The one-hot path at an embedding's size (28 characters, 512 lookups, width 64), float32,
    against a float64 np.add.at: within float32's rounding of each place's sum of magnitudes."""
    index = RNG.integers(0, 28, size=(32, 16))
    values = RNG.standard_normal((32, 16, 64)).astype(np.float32)
    mine = np.zeros((28, 64), np.float32)
    array_kernels.scatter_add(mine, index, values)
    reference, magnitudes = np.zeros((28, 64)), np.zeros((28, 64))
    np.add.at(reference, index, values.astype(np.float64))
    np.add.at(magnitudes, index, np.abs(values).astype(np.float64))
    assert np.all(np.abs(mine - reference) <= 4 * np.finfo(np.float32).eps * magnitudes)


@pytest.mark.parametrize("key", [np.array([0, 7]), np.array([-8, 1]), (np.array([0]), np.array([9]))])
def test_scatter_add_out_of_range_is_an_index_error(key):
    target = np.zeros((7, 9))
    with pytest.raises(IndexError):
        array_kernels.scatter_add(target, key, 1.0)
    assert not target.any()


@pytest.mark.parametrize("key", [
    np.array([True, False, True, False, False, False, True]),  # a boolean mask
    (2, ROWS[0]),  # an integer before an array: NumPy's own ordering rules
    (ROWS[0][:3], slice(None), ROWS[1][:3]),  # two arrays around a slice
])
def test_other_keys_fall_back_to_np_add_at(key):
    target = np.zeros((7, 7, 9))
    values = np.ones(target[key].shape)
    mine, reference = _both(target, key, values)
    np.testing.assert_array_equal(mine, reference)


# ---------------------------------------------------------------- sums over short rows
@pytest.mark.parametrize("shape, count", [((5, 7), 1), ((3, 4, 6), 2), ((2, 3, 300), 1), ((4,), 1)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.complex128])
def test_sum_trailing_is_the_sum_over_the_last_axes(shape, count, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    axes = tuple(range(len(shape) - count, len(shape)))
    expected = x.astype(np.complex256 if dtype == np.complex128 else np.longdouble).sum(axis=axes, keepdims=True)
    total = array_kernels.sum_trailing(x, count)
    assert total.shape == expected.shape and total.dtype == x.dtype
    np.testing.assert_allclose(total.astype(np.complex128), expected.astype(np.complex128),
                               rtol=0, atol=64 * np.finfo(dtype).eps * np.abs(x).sum())
    assert array_kernels.sum_trailing(x, count, keepdims=False).shape == expected.shape[:len(shape) - count]
    strided = np.asarray(x)[..., ::2]  # not contiguous: NumPy's own sum
    np.testing.assert_array_equal(array_kernels.sum_trailing(strided, 1), strided.sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("a_shape, b_shape", [((6, 5), (6, 5)), ((5,), (3, 5)), ((2, 3, 4), (3, 4)),
                                              ((1, 3, 4), (2, 3, 4)), ((2, 400), (2, 400))])
def test_dot_trailing_is_the_sum_of_products_over_the_last_axis(a_shape, b_shape):
    a, b = RNG.standard_normal(a_shape), RNG.standard_normal(b_shape)
    expected = (a * b).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(array_kernels.dot_trailing(a, b, 1), expected, rtol=1e-13, atol=1e-13)
    assert array_kernels.dot_trailing(a, b, 1).shape == expected.shape
