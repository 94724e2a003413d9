"""The Tensor class and its factories: dtype rules, array facts, conversions, comparisons."""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend


# ---------------------------------------------------------------- tensor() dtype rules
@pytest.mark.parametrize("data, dtype", [
    (1.5, np.float32), ([1.0, 2.0], np.float32), ([[1, 2.5]], np.float32),  # any float → float32
    (3, np.int64), ([1, 2, 3], np.int64),
    ([True, False], np.bool_),
    (np.zeros(2, np.float64), np.float64), (np.zeros(2, np.float16), np.float16),
    (np.zeros(2, np.int32), np.int32), (np.float32(2.0), np.float32),
])
def test_tensor_dtype_rules(data, dtype):
    t = mdl.tensor(data)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.numpy(), np.asarray(data))


@pytest.mark.parametrize("data", [[1, 2], [1.0, 2.0], np.arange(2, dtype=np.int32)])
def test_dtype_argument_overrides_the_rules(data):
    assert mdl.tensor(data, dtype="float64").dtype == np.float64
    assert mdl.tensor(data, dtype=np.float16).dtype == np.float16


def test_tensor_copies_its_data():
    source = np.array([1.0, 2.0])
    t = mdl.tensor(source)
    source[0] = 99.0
    assert t.numpy()[0] == 1.0
    u = mdl.tensor(t)  # from a Tensor: a new leaf with its own buffer
    u.array[1] = -1.0
    assert t.numpy()[1] == 2.0


@pytest.mark.parametrize("data", [[1, 2], np.arange(3), [True]])
def test_integer_or_bool_tensor_cannot_require_grad(data):
    with pytest.raises(TypeError) as info:
        mdl.tensor(data, requires_grad=True)
    message = str(info.value)
    assert "floating-point" in message and str(np.asarray(data).dtype) in message
    assert "dtype=" in message  # says how to fix it


def test_requires_grad_leaf():
    t = mdl.tensor([1.0], requires_grad=True)
    assert t.requires_grad and t.is_leaf and t.grad is None and t.creator is None


# ---------------------------------------------------------------- factories
@pytest.mark.parametrize("factory", [mdl.zeros, mdl.ones, mdl.randn, mdl.rand])
@pytest.mark.parametrize("dtype", [None, "float64", np.float16])
def test_factories_shape_and_dtype(factory, dtype):
    a = factory(2, 3, dtype=dtype)
    b = factory((2, 3), dtype=dtype)
    expected = np.dtype(dtype or np.float32)
    for t in (a, b):
        assert t.shape == (2, 3) and t.dtype == expected and not t.requires_grad
    assert factory(4, requires_grad=True).requires_grad


def test_factory_values():
    np.testing.assert_array_equal(mdl.zeros(2, 2).numpy(), np.zeros((2, 2)))
    np.testing.assert_array_equal(mdl.ones(3).numpy(), np.ones(3))
    np.testing.assert_array_equal(mdl.full((2,), 7.0).numpy(), [7.0, 7.0])
    u = mdl.rand(1000).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0 and 0.4 < u.mean() < 0.6
    z = mdl.randn(10000, dtype="float64").numpy()
    assert abs(z.mean()) < 0.05 and abs(z.std() - 1.0) < 0.05


def test_rand_in_half_precision_stays_below_one():
    u = mdl.rand(100_000, dtype="float16").numpy()  # float32 draws near 1 would round up to 1.0
    assert u.dtype == np.float16 and u.min() >= 0.0 and u.max() < 1.0


def test_arange():
    a = mdl.arange(5)
    assert a.dtype == np.int64
    np.testing.assert_array_equal(a.numpy(), np.arange(5))
    np.testing.assert_array_equal(mdl.arange(2, 8, 2).numpy(), [2, 4, 6])
    b = mdl.arange(0.0, 1.0, 0.25, dtype="float32")
    assert b.dtype == np.float32
    np.testing.assert_array_equal(b.numpy(), [0.0, 0.25, 0.5, 0.75])


@pytest.mark.parametrize("args, values", [
    ((0.0, 1.0, 0.25), [0.0, 0.25, 0.5, 0.75]),
    ((3.0,), [0.0, 1.0, 2.0]),
    ((1, 2, 0.5), [1.0, 1.5]),  # one float among integers is enough
    ((np.float64(0.5), 2), [0.5, 1.5]),
])
def test_arange_with_a_float_argument_is_float32(args, values):
    a = mdl.arange(*args)
    assert a.dtype == np.float32  # as every float factory (and torch.arange), not NumPy's float64
    np.testing.assert_array_equal(a.numpy(), values)


def test_arange_matches_torch():
    torch = pytest.importorskip("torch")
    for args in [(7,), (2, 11, 3), (0.0, 1.0, 0.1), (-1.5, 2.0, 0.3), (5, 1, -0.7)]:
        ours, theirs = mdl.arange(*args), torch.arange(*args)
        assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch.")
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("like", [mdl.zeros_like, mdl.ones_like, mdl.randn_like, mdl.rand_like])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_like_factories_keep_shape_dtype_and_device(like, dtype):
    src = mdl.zeros(3, 1, 2, dtype=dtype)
    t = like(src)
    assert t.shape == (3, 1, 2) and t.dtype == np.dtype(dtype) and t.device == src.device
    assert like(src, requires_grad=True).requires_grad


def test_zeros_like_and_ones_like_values_and_dtype_override():
    src = mdl.randn(2, 2)
    np.testing.assert_array_equal(mdl.zeros_like(src).numpy(), 0)
    np.testing.assert_array_equal(mdl.ones_like(src).numpy(), 1)
    assert mdl.ones_like(src, dtype="float64").dtype == np.float64


def test_manual_seed_reproduces_randn_and_rand():
    mdl.manual_seed(42)
    a, b = mdl.randn(3, 4).numpy(), mdl.rand(5).numpy()
    mdl.manual_seed(42)
    np.testing.assert_array_equal(mdl.randn(3, 4).numpy(), a)
    np.testing.assert_array_equal(mdl.rand(5).numpy(), b)
    assert not np.array_equal(mdl.randn(3, 4).numpy(), a)  # the stream moves on


# ---------------------------------------------------------------- array facts and conversions
def test_array_facts():
    t = mdl.zeros(2, 3, 4)
    assert (t.shape, t.ndim, t.size(), t.numel(), len(t), t.dtype, t.device) == \
        ((2, 3, 4), 3, (2, 3, 4), 24, 2, np.float32, "cpu")


def test_item():
    assert mdl.tensor([[3.5]]).item() == 3.5
    assert isinstance(mdl.tensor(2).item(), int)
    assert float(mdl.tensor(1.25)) == 1.25
    with pytest.raises(ValueError, match=r"item\(\).*3 elements.*\(3,\)"):
        mdl.tensor([1.0, 2.0, 3.0]).item()


def test_numpy_and_tolist():
    data = np.arange(6.0).reshape(2, 3)
    t = mdl.tensor(data)
    out = t.numpy()
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, data)
    assert t.tolist() == data.tolist()


def test_bool_of_a_multi_element_tensor_is_ambiguous():
    assert bool(mdl.tensor([1.0]))
    with pytest.raises(ValueError, match="ambiguous"):
        bool(mdl.tensor([1.0, 2.0]))


def test_detach_shares_data_but_has_no_graph():
    x = mdl.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    d = y.detach()
    assert d.creator is None and not d.requires_grad
    assert np.shares_memory(d.array, y.array)
    z = (x * x.detach()).sum()  # the detached factor is a constant: dz/dx = x, not 2x
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0])


def test_T_reverses_axes_and_carries_gradient():
    a = np.arange(24.0).reshape(2, 3, 4)
    x = mdl.tensor(a, requires_grad=True)
    np.testing.assert_array_equal(x.T.numpy(), a.T)
    w = np.random.default_rng(0).standard_normal((4, 3, 2))
    (x.T * mdl.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), w.T)
    m = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(mdl.tensor(m).T.numpy(), m.T)


@pytest.mark.parametrize("op, np_op", [
    (lambda a, b: a == b, np.equal), (lambda a, b: a != b, np.not_equal),
    (lambda a, b: a < b, np.less), (lambda a, b: a <= b, np.less_equal),
    (lambda a, b: a > b, np.greater), (lambda a, b: a >= b, np.greater_equal),
])
def test_comparisons_return_bool_tensors_with_no_grad(op, np_op):
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([3.0, 2.0, 1.0])
    x = mdl.tensor(a, requires_grad=True)
    for other, other_np in ((mdl.tensor(b), b), (2.0, 2.0)):
        r = op(x, other)
        assert r.dtype == np.bool_ and not r.requires_grad and r.creator is None
        np.testing.assert_array_equal(r.numpy(), np_op(a, other_np))


def test_tensors_hash_by_identity():
    a, b = mdl.tensor([1.0]), mdl.tensor([1.0])
    table = {a: "a", b: "b"}
    assert table[a] == "a" and table[b] == "b"


def test_repr_shows_values_dtype_and_grad_fn():
    x = mdl.tensor([1.5, -2.0], requires_grad=True)
    assert "1.5" in repr(x) and "-2." in repr(x) and "requires_grad=True" in repr(x)
    y = x * 2
    assert "3." in repr(y) and "grad_fn=Mul" in repr(y)
    assert "dtype=float64" in repr(mdl.tensor([1.0], dtype="float64"))
    assert "grad_fn" not in repr(mdl.tensor([1.0]))


def test_to_cpu_is_identity():
    x = mdl.tensor([1.0], requires_grad=True)
    assert x.to("cpu") is x and x.cpu() is x


# ---------------------------------------------------------------- astype
def test_astype_gradient_flows_back_in_the_source_dtype():
    x = mdl.tensor([1.0, -2.0, 3.0], requires_grad=True)  # float32
    y = x.astype("float64")
    assert y.dtype == np.float64 and y.creator is not None
    (y * y).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [2.0, -4.0, 6.0])


def test_double_and_half_round_trip():
    x = mdl.tensor(np.array([0.5, 0.25], np.float64), requires_grad=True)
    h = x.astype(np.float16)
    assert h.dtype == np.float16
    (h.double() * 4).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), [4.0, 4.0])


def test_astype_to_an_integer_dtype_gives_a_constant():
    x = mdl.tensor([1.7, -2.2], requires_grad=True)
    i = x.astype("int64")
    assert i.dtype == np.int64 and not i.requires_grad and i.creator is None
    np.testing.assert_array_equal(i.numpy(), [1, -2])


# ---------------------------------------------------------------- operands that are not numbers
@pytest.mark.parametrize("op", [
    lambda x, o: x + o, lambda x, o: o + x, lambda x, o: x - o, lambda x, o: x * o,
    lambda x, o: x / o, lambda x, o: x ** o, lambda x, o: o * x,
], ids=["add", "radd", "sub", "mul", "div", "pow", "rmul"])
@pytest.mark.parametrize("operand, kind", [("a", "str"), (None, "NoneType"), (["a", "b"], "list"),
                                           ({1: 2}, "dict"), (np.array(["a"]), "numpy.ndarray")])
def test_a_non_numeric_operand_is_a_type_error_naming_it(op, operand, kind):
    x = mdl.tensor([1.0, 2.0])
    with pytest.raises(TypeError, match=rf"shape \(2,\) \(float32\) can't be combined with an? {kind}"):
        op(x, operand)


def test_a_non_numeric_matmul_operand_is_a_type_error():
    with pytest.raises(TypeError, match="got a str"):
        mdl.tensor([1.0, 2.0]) @ "a"


def test_numeric_operands_still_work():
    x = mdl.tensor([1.0, 2.0])
    np.testing.assert_array_equal((x + np.float32(1)).numpy(), [2.0, 3.0])
    np.testing.assert_array_equal((x * np.array([2, 3])).numpy(), [2.0, 6.0])
    np.testing.assert_array_equal((x - [1.0, 1.0]).numpy(), [0.0, 1.0])
    assert (x * 1j).dtype.kind == "c"


# ---------------------------------------------------------------- in-place methods, clone, requires_grad_
@pytest.mark.parametrize("method, args, expected", [
    ("add_", (np.array([1.0, 2.0, 3.0]),), [2.0, 4.0, 6.0]),
    ("add_", (2.0,), [3.0, 4.0, 5.0]),
    ("sub_", (1.0,), [0.0, 1.0, 2.0]),
    ("mul_", (np.array([2.0, 0.5, -1.0]),), [2.0, 1.0, -3.0]),
    ("div_", (4.0,), [0.25, 0.5, 0.75]),
    ("fill_", (7.0,), [7.0, 7.0, 7.0]),
    ("zero_", (), [0.0, 0.0, 0.0]),
    ("copy_", (np.array([9.0, 8.0, 7.0]),), [9.0, 8.0, 7.0]),
    ("copy_", (5,), [5.0, 5.0, 5.0]),
])
def test_in_place_methods_change_the_tensor_itself(method, args, expected):
    t = mdl.tensor([1.0, 2.0, 3.0])
    buffer = t.array
    assert getattr(t, method)(*args) is t
    assert t.array is buffer and t.dtype == np.float32
    np.testing.assert_array_equal(t.numpy(), expected)


def test_add_with_alpha_and_copy_from_a_tensor():
    t = mdl.tensor([1.0, 2.0])
    t.add_(mdl.tensor([10.0, 20.0]), alpha=-0.5)
    np.testing.assert_array_equal(t.numpy(), [-4.0, -8.0])
    t.copy_(mdl.tensor([[3.0, 4.0]]).reshape(2))
    np.testing.assert_array_equal(t.numpy(), [3.0, 4.0])


def test_in_place_methods_name_a_shape_that_does_not_fit():
    with pytest.raises(ValueError, match=r"copy_: cannot copy a value of shape \(3,\) into a tensor of shape \(2,\)"):
        mdl.tensor([1.0, 2.0]).copy_(np.zeros(3))
    with pytest.raises(ValueError, match=r"add_: an operand of shape \(2, 2\)"):
        mdl.tensor([1.0, 2.0]).add_(np.zeros((2, 2)))


def test_clone_copies_memory_and_passes_the_gradient():
    x = mdl.tensor([1.0, 2.0], requires_grad=True)
    y = x.clone()
    assert y.array is not x.array and y.dtype == x.dtype
    (y * y).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 4.0])


def test_requires_grad_in_place():
    w = (mdl.randn(3) * 0.01).requires_grad_()
    assert w.requires_grad and w.is_leaf
    (w * 2).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, 2.0, 2.0])
    assert not w.requires_grad_(False).requires_grad
    with pytest.raises(TypeError, match="floating-point"):
        mdl.arange(3).requires_grad_()


# ---------------------------------------------------------------- on each device
def test_factories_and_transfer_on_device(device):
    t = mdl.randn(2, 3, device=device, requires_grad=True)
    assert t.device.startswith(backend.parse_device(device)[0]) and t.dtype == np.float32
    assert mdl.zeros_like(t).device == t.device
    c = t.to("cpu")
    np.testing.assert_array_equal(c.numpy(), t.numpy())
    (c * 2).sum().backward()  # the gradient comes back to t's device
    assert t.grad.device == t.device
    np.testing.assert_array_equal(t.grad.numpy(), np.full((2, 3), 2.0))
