"""PyTorch's semantics where minidl used to give a near miss: ``Tensor.data`` as a detached Tensor,
``minidl.accelerator``, and the top-level matrix products and tensor facts, each beside PyTorch."""
import re

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.tensor import version_of


# ------------------------------------------------------------------ Tensor.data
def test_data_is_a_detached_tensor_on_the_same_storage():
    w = mdl.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (w * 2).sum()
    d = w.data
    assert isinstance(d, mdl.Tensor) and not d.requires_grad and d.creator is None and d.is_leaf
    assert np.shares_memory(d.array, w.array)
    assert y.data.creator is None and y.creator is not None  # an op's output: its .data is cut off too
    assert isinstance(w.data.numpy(), np.ndarray) and w.data.numpy().tolist() == [1.0, 2.0, 3.0]


def test_sgd_through_data_changes_the_parameter_in_place_as_pytorch(torch):
    rng = np.random.default_rng(0)
    w0, g = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    ours, theirs = nn.Parameter(mdl.tensor(w0)), torch.nn.Parameter(torch.tensor(w0))
    ours.grad, theirs.grad = mdl.tensor(g), torch.tensor(g)
    before = ours.array
    for p in (ours, theirs):
        p.data.add_(p.grad, alpha=-0.1)      # word_language_model's update
        p.data.mul_(0.5)
        p.data.copy_(p.data * 2.0)
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-15)
    np.testing.assert_allclose(ours.numpy(), w0 - 0.1 * g, rtol=1e-12)  # the formula, by hand
    assert ours.array is before and ours.requires_grad  # in place: the same buffer, still a parameter


def test_assigning_data_replaces_the_values_and_counts_as_a_change(torch):
    w = nn.Parameter(mdl.tensor(np.zeros(3)))
    tw = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    version = version_of(w)
    w.data = mdl.tensor([1.0, 2.0, 3.0])
    tw.data = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert w.numpy().tolist() == tw.detach().numpy().tolist() == [1.0, 2.0, 3.0]
    assert version_of(w) > version
    w.data = np.array([4.0, 5.0])  # an array too; a new shape, as PyTorch's set_data allows
    tw.data = torch.tensor([4.0, 5.0], dtype=torch.float64)
    assert w.shape == tuple(tw.shape) == (2,) and w.numpy().tolist() == [4.0, 5.0]
    w.data -= 1.0  # the augmented form: in place on the shared storage
    assert w.numpy().tolist() == [3.0, 4.0]


def test_max_of_data_gives_pytorchs_values_and_indices(torch):
    x = np.random.default_rng(1).standard_normal((5, 4))
    layer = nn.Linear(4, 3).double()
    out = layer(mdl.tensor(x))
    tout = torch.tensor(out.numpy(), requires_grad=True) * 1.0  # the same values, with a graph
    _, predicted = mdl.max(out.data, 1)  # the CIFAR tutorial's line
    _, tpredicted = torch.max(tout.data, 1)
    np.testing.assert_array_equal(predicted.numpy(), tpredicted.numpy())
    assert (predicted == mdl.tensor(tpredicted.numpy())).sum().item() == 5


def test_a_change_through_data_to_a_saved_tensor_is_refused_not_silently_used():
    w = mdl.tensor([1.0, 2.0], requires_grad=True)
    y = (w * w).sum()  # saves w for backward
    w.data.mul_(3.0)
    with pytest.raises(RuntimeError, match="in place"):
        y.backward()


# ------------------------------------------------------------------ minidl.accelerator
def test_accelerator_without_a_gpu_answers_as_pytorchs_cpu_build(monkeypatch):
    from minidl import backend
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    assert mdl.accelerator.is_available() is False
    assert mdl.accelerator.current_accelerator() is None
    assert mdl.accelerator.current_accelerator(check_available=True) is None
    assert mdl.accelerator.device_count() == 0
    device = mdl.accelerator.current_accelerator() if mdl.accelerator.is_available() else mdl.device("cpu")
    assert device == "cpu" and device.type == "cpu"  # pytorch/examples' device line
    with pytest.raises(RuntimeError, match="no accelerator is available"):
        mdl.accelerator.synchronize()


def test_accelerator_with_a_gpu_names_cuda(standin):
    from minidl import backend
    assert backend.gpu_available()
    device = mdl.accelerator.current_accelerator()
    assert mdl.accelerator.is_available() and device == "cuda" and device.type == "cuda"
    assert mdl.accelerator.device_count() == mdl.cuda.device_count() >= 1
    x = mdl.ones(3).to(device)
    assert x.device == "cuda:0"
    mdl.accelerator.synchronize()


def test_accelerator_has_pytorchs_names(torch):
    ours = {"is_available", "current_accelerator", "device_count", "current_device_index", "synchronize"}
    assert ours <= set(dir(torch.accelerator)) and ours <= set(dir(mdl.accelerator))


# ------------------------------------------------------------------ top-level products and facts
def test_products_give_pytorchs_values_and_gradients(torch):
    rng = np.random.default_rng(2)
    cases = {"mm": [(3, 4), (4, 5)], "bmm": [(2, 3, 4), (2, 4, 5)], "dot": [(4,), (4,)], "outer": [(3,), (5,)]}
    for name, shapes in cases.items():
        arrays = [rng.standard_normal(s) for s in shapes]
        ours = [mdl.tensor(a, requires_grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        y, ty = getattr(mdl, name)(*ours), getattr(torch, name)(*theirs)
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, err_msg=name)
        seed = rng.standard_normal(y.shape)
        (y * mdl.tensor(seed)).sum().backward()
        (ty * torch.tensor(seed)).sum().backward()
        for a, ta in zip(ours, theirs):
            np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-12, err_msg=name)
        method = getattr(ours[0], name)(ours[1])  # the Tensor method gives the same
        np.testing.assert_allclose(method.numpy(), y.numpy(), rtol=0)


def test_dot_and_outer_by_hand():
    assert mdl.dot(mdl.tensor([1.0, 2.0, 3.0]), mdl.tensor([4.0, 5.0, 6.0])).item() == 32.0
    assert mdl.outer(mdl.tensor([1.0, 2.0]), mdl.tensor([3.0, 4.0, 5.0])).numpy().tolist() == [[3, 4, 5], [6, 8, 10]]


@pytest.mark.parametrize("name,shapes", [
    ("mm", [(3,), (3, 2)]), ("mm", [(2, 3, 4), (4, 5)]),  # torch.mm refuses non-2-D
    ("bmm", [(3, 4), (4, 5)]), ("bmm", [(2, 3, 4), (3, 4, 5)]), ("bmm", [(2, 3, 4), (2, 5, 6)]),
    ("dot", [(3, 1), (3,)]), ("dot", [(3,), (4,)]),  # dot: 1-D of one length only
    ("outer", [(3, 1), (2,)]),
])
def test_products_refuse_the_shapes_pytorch_refuses(torch, name, shapes):
    arrays = [np.ones(s) for s in shapes]
    with pytest.raises(RuntimeError):
        getattr(torch, name)(*[torch.tensor(a) for a in arrays])
    with pytest.raises(ValueError, match=rf"{name}: .*{re.escape(str(tuple(shapes[0])))}"):
        getattr(mdl, name)(*[mdl.tensor(a) for a in arrays])


def test_dot_refuses_mixed_dtypes_as_pytorch(torch):
    with pytest.raises(RuntimeError):
        torch.dot(torch.ones(3, dtype=torch.float32), torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="dot: .*float32 and float64"):
        mdl.dot(mdl.ones(3), mdl.ones(3, dtype=mdl.float64))


def test_t_clone_numel_is_tensor_as_pytorch(torch):
    x = np.arange(6.0).reshape(2, 3)
    for shape in [(2, 3), (3,), ()]:
        a = np.arange(float(np.prod(shape))).reshape(shape)
        assert mdl.t(mdl.tensor(a)).numpy().tolist() == torch.t(torch.tensor(a)).numpy().tolist()
        assert mdl.numel(mdl.tensor(a)) == torch.numel(torch.tensor(a)) == a.size
    with pytest.raises(RuntimeError):
        torch.t(torch.ones(2, 3, 4))
    with pytest.raises(ValueError, match=r"t\(\): .*\(2, 3, 4\)"):
        mdl.t(mdl.ones(2, 3, 4))
    w = mdl.tensor(x, requires_grad=True)
    c = mdl.clone(w)
    assert c.numpy().tolist() == x.tolist() and not np.shares_memory(c.array, w.array)
    (c * 3).sum().backward()  # the gradient flows back through the copy
    assert w.grad.numpy().tolist() == np.full((2, 3), 3.0).tolist()
    assert mdl.is_tensor(w) and mdl.is_tensor(nn.Parameter(w)) and not mdl.is_tensor(x)
    assert torch.is_tensor(torch.ones(1)) and not torch.is_tensor(x)
    with pytest.raises(TypeError, match="numel\\(\\): expected a Tensor"):
        mdl.numel(x)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64", "int8", "bool", "complex64"])
def test_is_floating_point_as_pytorch(torch, dtype):
    ours = mdl.tensor(np.zeros(2, dtype=dtype))
    theirs = torch.tensor(np.zeros(2, dtype=dtype))
    assert ours.is_floating_point() is theirs.is_floating_point()
    assert mdl.is_floating_point(ours) is torch.is_floating_point(theirs)
