"""Module API: registration, traversal, state dicts, load errors, modes, devices/dtypes, repr, containers."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn


def mlp():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(mdl.ones(3))
        self.inner = nn.Linear(3, 2)
        self.register_buffer("count", mdl.zeros(1))
        self.register_buffer("scratch", mdl.zeros(2), persistent=False)
        self.note = "plain attribute"

    def forward(self, x):
        return self.inner(x * self.scale)


# ---------------------------------------------------------------- registration and traversal
def test_parameters_in_definition_order_and_counted():
    model = mlp()
    names = [name for name, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [p.shape for p in model.parameters()] == [(128, 64), (128,), (10, 128), (10,)]
    assert model.num_parameters() == 64 * 128 + 128 + 128 * 10 + 10
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.dtype == np.float32
               for p in model.parameters())


def test_parameter_is_a_tensor_that_requires_grad():
    p = nn.Parameter(mdl.zeros(2, 3))
    assert isinstance(p, mdl.Tensor) and p.requires_grad and p.is_leaf
    assert not nn.Parameter(mdl.zeros(2), requires_grad=False).requires_grad
    assert repr(p).startswith("Parameter containing:\ntensor(")


def test_buffers_children_and_modules():
    block = Block()
    assert [n for n, _ in block.named_parameters()] == ["scale", "inner.weight", "inner.bias"]
    assert [n for n, _ in block.named_buffers()] == ["count", "scratch"]
    assert list(block.named_children()) == [("inner", block.inner)]
    assert [n for n, _ in block.named_modules()] == ["", "inner"]
    assert list(block.state_dict()) == ["scale", "count", "inner.weight", "inner.bias"]  # scratch not persistent
    assert block.note == "plain attribute"
    assert [n for n, _ in block.named_parameters(recurse=False)] == ["scale"]


def test_reassigning_and_deleting_registered_names():
    layer = nn.Linear(3, 2)
    layer.bias = None
    assert [n for n, _ in layer.named_parameters()] == ["weight"]
    assert layer.bias is None
    with pytest.raises(TypeError, match="is a parameter: assign an nn.Parameter"):
        layer.weight = mdl.zeros(2, 3)
    block = Block()
    with pytest.raises(TypeError, match="is a buffer"):
        block.count = np.zeros(1)
    del block.inner
    assert [n for n, _ in block.named_parameters()] == ["scale"]
    with pytest.raises(AttributeError, match="no attribute 'inner'"):
        block.inner


def test_shared_parameter_listed_once_but_saved_under_each_name():
    a = nn.Linear(4, 4)
    model = nn.Sequential(a, nn.ReLU(), a)
    assert len(list(model.parameters())) == 2
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_forgetting_super_init_is_explained():
    class Broken(nn.Module):
        def __init__(self):
            self.layer = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match="super\\(\\).__init__\\(\\)"):
        Broken()


# ---------------------------------------------------------------- state dicts
def test_state_dict_is_a_copy_and_round_trips():
    mdl.manual_seed(1)
    source, target = mlp(), mlp()
    state = source.state_dict()
    x = mdl.randn(5, 64)
    expected = source(x).numpy()
    source[0].weight.array += 1.0  # training on does not change the snapshot
    assert not np.array_equal(state["0.weight"], source[0].weight.array)
    params_before = [(p, p.array) for p in target.parameters()]
    result = target.load_state_dict(state)
    assert result.missing_keys == [] and result.unexpected_keys == []
    np.testing.assert_array_equal(target(x).numpy(), expected)
    for p, array in params_before:  # copied in place: optimizers holding p (and p.array) keep working
        assert p.array is array


def test_load_accepts_tensors_and_casts_to_the_parameter_dtype():
    layer = nn.Linear(2, 3)
    w = np.arange(6, dtype=np.float64).reshape(3, 2)
    layer.load_state_dict({"weight": mdl.tensor(w), "bias": np.array([1, 2, 3])})
    assert layer.weight.dtype == np.float32 and layer.bias.dtype == np.float32
    np.testing.assert_array_equal(layer.weight.array, w.astype(np.float32))
    np.testing.assert_array_equal(layer.bias.array, [1, 2, 3])


def test_load_errors_list_missing_unexpected_and_mis_shaped_keys():
    model = mlp()
    before = model.state_dict()
    state = model.state_dict()
    del state["2.bias"]
    state["3.weight"] = np.zeros((1, 1), np.float32)
    state["0.weight"] = np.zeros((128, 63), np.float32)
    with pytest.raises(nn.StateDictError) as info:
        model.load_state_dict(state)
    message = str(info.value)
    assert "missing keys (1): 2.bias" in message
    assert "unexpected keys (1): 3.weight" in message
    assert "mis-shaped key 0.weight: the module expects shape (128, 64), the state has (128, 63)" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    for key, value in model.state_dict().items():  # nothing was copied
        np.testing.assert_array_equal(value, before[key])


def test_non_strict_load_returns_the_differences_but_shapes_must_agree():
    model = mlp()
    state = {"0.weight": np.ones((128, 64), np.float32), "extra": np.zeros(2)}
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["0.bias", "2.weight", "2.bias"]
    assert result.unexpected_keys == ["extra"]
    assert (model[0].weight.array == 1).all()
    with pytest.raises(nn.StateDictError, match="mis-shaped key 2.bias"):
        model.load_state_dict({"2.bias": np.zeros(3)}, strict=False)


def test_save_and_load_through_safetensors(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    model(mdl.randn(5, 4))  # moves the running statistics and the 0-d step counter
    other = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    mdl.save(model.state_dict(), tmp_path / "w.safetensors")
    other.load_state_dict(mdl.load(tmp_path / "w.safetensors"))
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert a.shape == b.shape, name
        np.testing.assert_array_equal(a, b)


def test_state_dict_keys_match_torch():
    torch = pytest.importorskip("torch")
    ours = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                 torch.nn.Linear(4, 2))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})


# ---------------------------------------------------------------- modes, gradients, dtypes, devices
def test_train_and_eval_switch_every_module():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Dropout(0.5)))
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_zero_grad_sets_gradients_to_none():
    model = mlp()
    model(mdl.randn(4, 64)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_requires_grad_freezes_parameters():
    model = mlp()
    model[0].requires_grad_(False)
    assert model.num_parameters(trainable_only=True) == 128 * 10 + 10
    model(mdl.randn(2, 64)).sum().backward()
    assert model[0].weight.grad is None and model[2].weight.grad is not None


def test_double_casts_in_place_and_keeps_integer_buffers():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = list(model.parameters())
    model.double()
    assert [p for p in model.parameters()] == params  # the same objects
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert model[1].running_mean.dtype == np.float64
    assert model[1].num_batches_tracked.dtype == np.int64
    model.to(np.float32)
    assert all(p.dtype == np.float32 for p in model.parameters())
    with pytest.raises(TypeError, match="floating point"):
        model.to(dtype=np.int32)


def test_gradcheck_of_a_small_float64_model():
    mdl.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    x = mdl.randn(2, 3, dtype=np.float64, requires_grad=True)
    assert mdl.gradcheck(lambda x, *ps: model(x), [x] + list(model.parameters()))


def test_to_device_moves_parameters_and_buffers_in_place(device):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = list(model.parameters())
    model(mdl.randn(5, 3)).sum().backward()
    model.to(device)
    assert list(model.parameters()) == params
    assert all(p.device.startswith(device) for p in model.parameters())
    assert all(b.device.startswith(device) for b in model.buffers())
    assert all(p.grad.device.startswith(device) for p in model.parameters())
    out = model(mdl.randn(5, 3, device=device))
    assert out.device.startswith(device)
    state = model.state_dict()
    assert all(mdl.Tensor(v).device.startswith(device) for v in state.values())
    model.cpu()
    model.load_state_dict(state)  # arrays from another device are moved
    with pytest.raises(ValueError, match="neither a device"):
        model.to("tpu")


# ---------------------------------------------------------------- inputs that are not Tensors
def test_a_layer_called_on_a_numpy_array_gives_what_it_gives_on_the_tensor():
    layer = nn.Linear(3, 2)
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    y = layer(x)
    assert isinstance(y, mdl.Tensor) and y.dtype == np.float32 and y.shape == (4, 2)
    w, b = layer.weight.numpy().astype(np.float64), layer.bias.numpy().astype(np.float64)
    np.testing.assert_allclose(y.numpy(), x.astype(np.float64) @ w.T + b, rtol=1e-6)
    np.testing.assert_array_equal(y.numpy(), layer(mdl.tensor(x)).numpy())
    assert nn.Linear(3, 2).double()(x.astype(np.float64)).dtype == np.float64  # the array's dtype is kept


def test_a_numpy_input_is_a_constant_copied_like_mdl_tensor():
    layer = nn.Linear(3, 1, bias=False)
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    y = layer(x)
    x[...] = 100.0  # the layer holds its own copy: dW = xᵀ·1 uses the values at call time
    y.sum().backward()
    np.testing.assert_array_equal(layer.weight.grad.numpy(), [[5.0, 7.0, 9.0]])


def test_containers_hooks_and_embedding_see_numpy_inputs_as_tensors():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    seen = []
    model.register_forward_hook(lambda module, inputs, out: seen.append(type(inputs[0])))
    x = np.ones((5, 3), np.float32)
    np.testing.assert_array_equal(model(x).numpy(), model(mdl.tensor(x)).numpy())
    assert seen == [mdl.Tensor, mdl.Tensor]
    table = nn.Embedding(6, 2)
    np.testing.assert_array_equal(table(np.array([4, 0, 4])).numpy(), table.weight.numpy()[[4, 0, 4]])


def test_other_positional_inputs_reach_forward_unchanged():
    class Takes(nn.Module):
        def forward(self, x, state, mode, scale, indices):
            return x, state, mode, scale, indices

    x, state = mdl.ones(2), (mdl.zeros(1), mdl.zeros(1))
    out = Takes()(x, state, "fast", 0.5, [1, 2])
    assert out[0] is x and out[1] is state and out[2:] == ("fast", 0.5, [1, 2])
    assert Takes()(x, None, "slow", np.float32(2.0), None)[1] is None


class ForeignArray:
    """Another library's array: it offers NumPy's array protocol but is not a NumPy array."""

    def __array__(self, dtype=None, copy=None):
        return np.ones((4, 3), np.float32)


def test_another_librarys_array_is_a_type_error_naming_the_layer_and_the_type():
    with pytest.raises(TypeError) as info:
        nn.Linear(3, 2)(ForeignArray())
    message = str(info.value)
    assert message.startswith("Linear:") and "ForeignArray" in message and "mdl.tensor" in message


def test_a_torch_tensor_is_a_type_error_naming_the_layer():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"Sequential: got a torch\.Tensor"):
        nn.Sequential(nn.Linear(3, 2))(torch.ones(4, 3))


# ---------------------------------------------------------------- repr and hooks
def test_repr_tree_reads_like_pytorch():
    assert repr(mlp()) == (
        "Sequential(\n"
        "  (0): Linear(in_features=64, out_features=128, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Linear(in_features=128, out_features=10, bias=True)\n"
        ")")
    nested = nn.Sequential(nn.Residual(nn.Sequential(nn.Linear(2, 2), nn.Tanh())), nn.Identity())
    assert repr(nested) == (
        "Sequential(\n"
        "  (0): Residual(\n"
        "    (body): Sequential(\n"
        "      (0): Linear(in_features=2, out_features=2, bias=True)\n"
        "      (1): Tanh()\n"
        "    )\n"
        "  )\n"
        "  (1): Identity()\n"
        ")")


def test_repr_equals_torch_for_common_layers():
    torch = pytest.importorskip("torch")
    pairs = [
        (nn.Conv2d(3, 16, 3, padding=1), torch.nn.Conv2d(3, 16, 3, padding=1)),
        (nn.Conv1d(2, 4, 5, stride=2, bias=False), torch.nn.Conv1d(2, 4, 5, stride=2, bias=False)),
        (nn.BatchNorm2d(16), torch.nn.BatchNorm2d(16)),
        (nn.LayerNorm(64), torch.nn.LayerNorm(64)),
        (nn.GroupNorm(4, 16), torch.nn.GroupNorm(4, 16)),
        (nn.Dropout(0.3), torch.nn.Dropout(0.3)),
        (nn.Embedding(10, 3), torch.nn.Embedding(10, 3)),
        (nn.LSTM(10, 20, num_layers=2, batch_first=True), torch.nn.LSTM(10, 20, num_layers=2, batch_first=True)),
        (nn.GRU(3, 4, bidirectional=True), torch.nn.GRU(3, 4, bidirectional=True)),
        (nn.Flatten(), torch.nn.Flatten()),
        (nn.LeakyReLU(0.2), torch.nn.LeakyReLU(0.2)),
        (nn.ELU(), torch.nn.ELU()),
        (nn.GELU(), torch.nn.GELU()),
        (nn.Softmax(dim=1), torch.nn.Softmax(dim=1)),
        (nn.Linear(3, 2, bias=False), torch.nn.Linear(3, 2, bias=False)),
    ]
    for ours, theirs in pairs:
        assert repr(ours) == repr(theirs)


def test_forward_hook_sees_outputs_and_can_be_removed():
    model = mlp()
    seen = []
    handle = model[1].register_forward_hook(lambda module, inputs, out: seen.append((module, out.shape)))
    model(mdl.randn(2, 64))
    assert seen == [(model[1], (2, 128))]
    handle.remove()
    model(mdl.randn(2, 64))
    assert len(seen) == 1


# ---------------------------------------------------------------- containers
def test_sequential_indexing_slicing_and_append():
    model = mlp()
    assert len(model) == 3 and isinstance(model[-1], nn.Linear)
    head = model[:2]
    assert isinstance(head, nn.Sequential) and list(head) == [model[0], model[1]]
    assert head(mdl.randn(2, 64)).shape == (2, 128)
    model.append(nn.Softmax())
    assert [n for n, _ in model.named_children()][-1] == "3"
    np.testing.assert_allclose(model(mdl.randn(2, 64)).numpy().sum(axis=1), 1.0, rtol=1e-6)
    with pytest.raises(IndexError, match="out of range"):
        model[7]
    with pytest.raises(TypeError, match="must be a Module"):
        nn.Sequential(nn.Linear(2, 2), lambda x: x)


def test_sequential_from_an_ordered_dict_keeps_the_names():
    from collections import OrderedDict
    model = nn.Sequential(OrderedDict(hidden=nn.Linear(2, 3), act=nn.ReLU(), out=nn.Linear(3, 1)))
    assert list(model.state_dict()) == ["hidden.weight", "hidden.bias", "out.weight", "out.bias"]
    assert model.hidden is model[0]


def test_module_list_registers_its_modules():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(3))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    model = Stack()
    assert len(list(model.parameters())) == 6
    assert list(model.state_dict())[:2] == ["layers.0.weight", "layers.0.bias"]
    assert model(mdl.randn(4, 2)).shape == (4, 2)
    model.layers.insert(0, nn.Linear(2, 2))
    assert len(model.layers) == 4 and list(model.state_dict())[-1] == "layers.3.bias"


def test_identity_and_residual():
    x = mdl.randn(3, 4)
    assert nn.Identity(54, unused="argument")(x) is x
    body = nn.Linear(4, 4)
    np.testing.assert_allclose(nn.Residual(body)(x).numpy(), body(x).numpy() + x.numpy(), rtol=1e-6)
    shortcut = nn.Linear(4, 6)
    block = nn.Residual(nn.Linear(4, 6), shortcut)
    np.testing.assert_allclose(block(x).numpy(), block.body(x).numpy() + shortcut(x).numpy(), rtol=1e-6)
    assert nn.Residual.checkpoint_atomic and not nn.Sequential.checkpoint_atomic
    with pytest.raises(ValueError, match="give a shortcut"):
        nn.Residual(nn.Linear(4, 6))(x)


def test_deepcopy_gives_an_independent_model():
    import copy
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    clone = copy.deepcopy(model)
    assert list(clone.state_dict()) == list(model.state_dict())
    assert clone[0].weight is not model[0].weight and isinstance(clone[0].weight, nn.Parameter)
    clone[0].weight.array += 1
    clone(mdl.randn(4, 3))
    assert not np.array_equal(clone[0].weight.array, model[0].weight.array)
    assert int(model[1].num_batches_tracked.array) == 0


# ---------------------------------------------------------------- all-or-nothing loads, buffers included
def _bn_model():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3))
    model(mdl.tensor(np.random.default_rng(0).normal(size=(4, 2)).astype(np.float32)))  # move the buffers
    return model


def _copies(model):
    return {k: np.array(v) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("value, message", [
    ("abc", "unusable key 1.num_batches_tracked: holds <U3 values"),
    (None, "unusable key 1.num_batches_tracked: holds object values"),
    (np.array(np.nan), "non-integer values"),
    (np.array(2.5), "non-integer values"),
    (np.array(2**70, dtype=np.float64), "outside the range of int64"),
    (np.array(1 + 2j), "complex128 values"),
])
def test_a_bad_buffer_value_leaves_the_whole_module_unchanged(value, message):
    model = _bn_model()
    state = {k: v + 1 for k, v in _copies(model).items()}   # every entry changes; 0.weight comes first
    state["1.num_batches_tracked"] = value
    before = _copies(model)
    with pytest.raises(nn.StateDictError, match=message):
        model.check_state_dict(state)
    with pytest.raises(nn.StateDictError, match=message):
        model.load_state_dict(state)
    for k, v in _copies(model).items():
        np.testing.assert_array_equal(v, before[k])


def test_integral_values_convert_and_check_state_dict_changes_nothing():
    model = _bn_model()
    state = _copies(model)
    state["1.num_batches_tracked"] = np.array(7.0)
    state["extra"] = np.ones(1)
    before = _copies(model)
    result = model.check_state_dict(state, strict=False)
    assert result.unexpected_keys == ["extra"] and result.missing_keys == []
    for k, v in _copies(model).items():
        np.testing.assert_array_equal(v, before[k])
    model.load_state_dict(state, strict=False)
    assert int(model[1].num_batches_tracked.array) == 7 and model[1].num_batches_tracked.dtype == np.int64


def test_a_ragged_list_is_an_unusable_key():
    model = nn.Linear(2, 2)
    state = {"weight": [[1.0, 2.0], [3.0]], "bias": np.zeros(2, np.float32)}
    before = _copies(model)
    with pytest.raises(nn.StateDictError, match="unusable key weight: not an array"):
        model.load_state_dict(state)
    np.testing.assert_array_equal(model.bias.array, before["bias"])
