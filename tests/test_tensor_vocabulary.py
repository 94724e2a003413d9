"""The Tensor and package names a PyTorch user reaches for: size(), numel(), dim(), t(), dtype
conversions, to(dtype), the factories and dtype names; each against NumPy and, when installed, torch."""
import numpy as np
import pytest

import minidl as mdl


# ---------------------------------------------------------------- size, numel, dim, t
def test_size_is_torch_method_and_numel_counts_elements(torch):
    x, tx = mdl.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    assert x.size() == tuple(tx.size()) == (2, 3, 4)
    assert [x.size(d) for d in (0, 1, 2, -1, -3)] == [tx.size(d) for d in (0, 1, 2, -1, -3)] == [2, 3, 4, 4, 2]
    assert x.numel() == tx.numel() == 24
    assert x.dim() == tx.dim() == 3
    assert mdl.tensor(2.0).size() == () and mdl.tensor(2.0).numel() == 1 and mdl.tensor(2.0).dim() == 0


@pytest.mark.parametrize("shape, dim", [((2, 3), 2), ((2, 3), -3), ((), 0)])
def test_size_of_a_missing_axis_raises_index_error_as_torch(shape, dim, torch):
    with pytest.raises(IndexError):
        torch.zeros(shape).size(dim)
    with pytest.raises(IndexError, match=f"size: dimension {dim} is out of range for a tensor with {len(shape)}"):
        mdl.zeros(*shape).size(dim)


def test_numel_counts_parameters_of_a_module():
    from minidl import nn
    model = nn.Linear(3, 4)
    assert model.num_parameters() == 3 * 4 + 4 == sum(p.numel() for p in model.parameters())


def test_t_transposes_matrices_and_keeps_vectors(torch):
    a = np.arange(6.0).reshape(2, 3)
    x = mdl.tensor(a, requires_grad=True)
    np.testing.assert_array_equal(x.t().numpy(), torch.tensor(a).t().numpy())
    (x.t() * mdl.tensor(np.arange(6.0).reshape(3, 2))).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.arange(6.0).reshape(3, 2).T)
    v = mdl.tensor([1.0, 2.0])
    assert v.t() is v and mdl.tensor(3.0).t().item() == 3.0
    with pytest.raises(ValueError, match=r"t\(\): expects a tensor with at most 2 dimensions, got shape \(2, 2, 2\)"):
        mdl.zeros(2, 2, 2).t()


def test_clone_item_zero_and_requires_grad():
    x = mdl.tensor([1.0, 2.0]).requires_grad_()
    assert x.requires_grad
    c = x.clone()
    (c * 3).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])  # gradients flow through clone
    with mdl.no_grad():
        c2 = x.clone()
        c2.array[0] = 9.0
    assert x.tolist() == [1.0, 2.0]  # its own memory
    z = mdl.tensor([1.0, 2.0]).zero_()
    assert z.tolist() == [0.0, 0.0]
    assert mdl.tensor([[7.5]]).item() == 7.5
    with pytest.raises(ValueError, match="item"):
        mdl.tensor([1.0, 2.0]).item()


# ---------------------------------------------------------------- dtypes
def test_dtype_names_compare_equal_to_tensor_dtypes(torch):
    pairs = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int64": np.int64,
             "int32": np.int32, "bool": np.bool_, "float": np.float32, "double": np.float64, "half": np.float16,
             "long": np.int64, "int": np.int32, "uint8": np.uint8, "int8": np.int8, "int16": np.int16}
    for name, numpy_type in pairs.items():
        assert getattr(mdl, name) == np.dtype(numpy_type), name
        assert mdl.zeros(2, dtype=getattr(mdl, name)).dtype == getattr(mdl, name)
        assert str(getattr(torch, name)) == f"torch.{getattr(mdl, name)}".replace("bool_", "bool"), name
    assert mdl.tensor([1.0]).dtype == mdl.float32


def test_bfloat16_explains_what_it_needs():
    try:
        import ml_dtypes
    except ImportError:
        with pytest.raises(AttributeError, match="minidl.bfloat16 needs the ml_dtypes package"):
            mdl.bfloat16  # noqa: B018
        assert not hasattr(mdl, "bfloat16")
    else:
        assert mdl.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(AttributeError, match="has no attribute 'float128x'"):
        mdl.float128x  # noqa: B018


@pytest.mark.parametrize("method, dtype", [("float", np.float32), ("double", np.float64), ("half", np.float16),
                                           ("long", np.int64), ("int", np.int32), ("bool", np.bool_)])
def test_conversion_methods_match_torch(method, dtype, torch):
    values = np.array([-1.5, 0.0, 2.7])
    ours = getattr(mdl.tensor(values), method)()
    theirs = getattr(torch.tensor(values), method)()
    assert ours.dtype == dtype
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())  # truncation toward 0 for integers, as torch
    same = mdl.tensor(np.zeros(2, dtype))
    assert getattr(same, method)() is same  # already that dtype: the tensor itself, as torch


def test_type_and_to_with_dtypes():
    x = mdl.tensor([1.5, -2.5])
    assert x.type() == "float32"
    assert x.type(mdl.float64).dtype == np.float64
    assert x.type("int64").tolist() == [1, -2]
    assert x.to(mdl.float32) is x and x.to("cpu") is x and x.to("cpu", mdl.float32) is x
    assert x.to(mdl.float16).dtype == np.float16
    assert x.to("cpu", mdl.float64).dtype == np.float64
    assert x.to(dtype="float64", device="cpu").dtype == np.float64
    assert x.to(mdl.tensor([1], dtype="int32")).dtype == np.int32  # another tensor's dtype and device
    copied = x.to("cpu", copy=True, non_blocking=True)
    assert copied is not x and copied.tolist() == x.tolist() and copied.array is not x.array
    with pytest.raises(ValueError, match="unknown device 'cuda:x'"):
        x.to("cuda:x")


def test_dtype_conversions_pass_gradients_back_in_the_source_dtype(torch):
    x = mdl.tensor([1.0, 2.0], requires_grad=True)
    (x.double() * mdl.tensor([3.0, 4.0], dtype="float64")).sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.tolist() == [3.0, 4.0]
    y = mdl.tensor([1.0, 2.0], dtype="float64", requires_grad=True)
    y.to(mdl.float16).float().sum().backward()
    assert y.grad.dtype == np.float64 and y.grad.tolist() == [1.0, 1.0]
    assert not mdl.tensor([1.5], requires_grad=True).long().requires_grad  # integers carry no gradient


# ---------------------------------------------------------------- factories
def test_eye_matches_numpy_and_torch(torch):
    np.testing.assert_array_equal(mdl.eye(3).numpy(), np.eye(3))
    np.testing.assert_array_equal(mdl.eye(2, 4).numpy(), torch.eye(2, 4).numpy())
    assert mdl.eye(2).dtype == np.float32 and mdl.eye(2, dtype=mdl.int64).dtype == np.int64
    assert mdl.eye(3, requires_grad=True).requires_grad


@pytest.mark.parametrize("start, end, steps", [(0, 1, 5), (-2.5, 7.0, 11), (3, -3, 4), (1, 2, 1), (0, 1, 0)])
def test_linspace_matches_torch(start, end, steps, torch):
    ours = mdl.linspace(start, end, steps)
    theirs = torch.linspace(start, end, steps)
    assert ours.dtype == np.float32 and ours.shape == (steps,)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mdl.linspace(start, end, steps, dtype="float64").numpy(),
                               [start + (end - start) * i / max(steps - 1, 1) for i in range(steps)], atol=1e-14)
    np.testing.assert_array_equal(mdl.linspace(0, 10, 5, dtype=mdl.int64).numpy(),
                                  torch.linspace(0, 10, 5, dtype=torch.int64).numpy())


def test_logspace_matches_torch(torch):
    np.testing.assert_allclose(mdl.logspace(0, 3, 4).numpy(), [1, 10, 100, 1000], rtol=1e-7)
    np.testing.assert_allclose(mdl.logspace(-1, 2, 7, base=2.0).numpy(),
                               torch.logspace(-1, 2, 7, base=2.0).numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="logspace: steps must be a non-negative int, got -1"):
        mdl.logspace(0, 1, -1)


def test_full_like_empty_and_empty_like(torch):
    ints = mdl.tensor([1, 2, 3])
    filled = mdl.full_like(ints, 2.7)
    assert filled.dtype == np.int64 and filled.tolist() == torch.full_like(torch.tensor([1, 2, 3]), 2.7).tolist()
    assert mdl.full_like(mdl.zeros(2, 2), -1.5).tolist() == [[-1.5, -1.5], [-1.5, -1.5]]
    assert mdl.full_like(ints, 0.5, dtype=mdl.float64).tolist() == [0.5, 0.5, 0.5]
    e = mdl.empty(2, 3)
    assert e.shape == (2, 3) and e.dtype == np.float32
    assert mdl.empty((4,), dtype=mdl.int32).dtype == np.int32
    like = mdl.empty_like(ints)
    assert like.shape == (3,) and like.dtype == np.int64


def test_zeros_ones_full_rand_arange_take_a_dtype():
    assert mdl.zeros(2, dtype=mdl.int64).tolist() == [0, 0]
    assert mdl.ones(2, 2, dtype=mdl.float64).dtype == np.float64
    assert mdl.full((2,), 3, dtype=mdl.int32).dtype == np.int32
    assert mdl.randn(3, dtype=mdl.float64).dtype == np.float64
    assert mdl.rand(3, dtype=mdl.float16).dtype == np.float16
    assert mdl.arange(4, dtype=mdl.float64).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_randint_follows_torch_signatures_and_the_seed(torch):
    mdl.manual_seed(3)
    a = mdl.randint(10, (1000,))
    assert a.dtype == np.int64 and a.shape == (1000,)
    assert a.numpy().min() >= 0 and a.numpy().max() <= 9 and len(np.unique(a.numpy())) == 10
    b = mdl.randint(-3, 3, (20, 50))
    assert b.shape == (20, 50) and b.numpy().min() == -3 and b.numpy().max() == 2
    assert mdl.randint(5, size=(2,)).shape == (2,) and mdl.randint(0, 5, 7).shape == (7,)
    assert mdl.randint(0, 2, (3,), dtype=mdl.int32).dtype == np.int32
    mdl.manual_seed(3)
    assert mdl.randint(10, (1000,)).tolist() == a.tolist()
    with pytest.raises(ValueError, match="randint: expected low < high, got low=4, high=4"):
        mdl.randint(4, 4, (2,))
    with pytest.raises(TypeError, match="randint: size is required"):
        mdl.randint(0, 4)


def test_from_numpy_shares_memory_as_torch():
    array = np.arange(4.0)
    t = mdl.from_numpy(array)
    assert t.dtype == np.float64  # the array's dtype, as torch.from_numpy
    array[0] = 10.0
    assert t.tolist()[0] == 10.0
    t.array[1] = -1.0
    assert array[1] == -1.0
    with pytest.raises(TypeError, match="from_numpy: expected a NumPy array, got list"):
        mdl.from_numpy([1.0, 2.0])
    with pytest.raises(TypeError, match="from_numpy: arrays of dtype <U1"):
        mdl.from_numpy(np.array(["a"]))


def test_package_allclose_is_torch_allclose(torch):
    a, b = np.array([1.0, 2.0]), np.array([1.0, 2.0 + 3e-5])
    assert mdl.allclose(mdl.tensor(a), mdl.tensor(b)) is torch.allclose(torch.tensor(a), torch.tensor(b)) is False
    assert mdl.allclose(mdl.tensor(a), mdl.tensor(b), rtol=1e-4) is True


def test_package_level_ops_are_the_functional_ops():
    """torch.cat, torch.sort... have their minidl twins at the top level: the very functions of minidl.functional."""
    import minidl.functional as F
    names = ["argmax", "argmin", "argsort", "cat", "chunk", "cumprod", "cumsum", "einsum", "flatten", "flip",
             "gather", "index_select", "masked_fill", "matmul", "mean", "nonzero", "permute", "prod", "reshape",
             "roll", "sort", "split", "squeeze", "std", "topk", "tril", "triu", "unsqueeze", "var"]
    assert [n for n in names if getattr(mdl, n) is not getattr(F, n)] == []
    assert set(names) <= set(mdl.__all__)
    x = mdl.tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(mdl.cat([x, x], dim=1).numpy(), np.concatenate([x.numpy()] * 2, axis=1))
