"""Activation modules against PyTorch's: constructors, outputs and gradients, reprs, PReLU's weight,
the softmax family's ``dim`` and ``inplace``."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.tensor import Tensor

# (module name, constructor arguments): built the same way in minidl and in torch
MODULES = [
    ("SiLU", {}), ("Mish", {}), ("SELU", {}), ("CELU", {}), ("CELU", {"alpha": 0.5}), ("ReLU6", {}),
    ("Hardtanh", {}), ("Hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("Hardswish", {}), ("Hardsigmoid", {}),
    ("LogSigmoid", {}), ("Softsign", {}), ("Softmin", {"dim": 1}), ("Softplus", {}),
    ("Softplus", {"beta": 2.0, "threshold": 3.0}), ("GLU", {}), ("GLU", {"dim": 1}), ("LogSoftmax", {"dim": 1}),
    ("LogSoftmax", {"dim": -1}), ("Softmax", {"dim": 0}), ("ReLU", {}), ("LeakyReLU", {"negative_slope": 0.2}),
    ("ELU", {"alpha": 0.5}), ("GELU", {"approximate": "tanh"}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in kwargs.items()) for name, kwargs in MODULES]


def inputs():
    """Values on both sides of every kink (0, ±1, ±3, 6, 1.5) and far out, none at a kink."""
    x = np.random.default_rng(0).uniform(-8, 8, (3, 4, 6))
    x[0, 0, :] = [-50.0, 50.0, -0.5, 0.5, 6.5, 25.0]
    return x


@pytest.mark.parametrize("name,kwargs", MODULES, ids=IDS)
def test_module_output_and_input_gradient_match_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    x = inputs()
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    t = mdl.tensor(x, requires_grad=True)
    y = ours(t)
    v = np.random.default_rng(1).standard_normal(y.shape)
    y.backward(Tensor(v))
    tx = torch.tensor(x, requires_grad=True)
    ty = theirs(tx)
    ty.backward(torch.tensor(v))
    assert y.shape == tuple(ty.shape)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-15)
    rtol = 1e-7 if name == "Hardsigmoid" else 1e-11  # torch's float64 backward there uses a float32 1/6
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=1e-14)


@pytest.mark.parametrize("name,kwargs", MODULES + [("PReLU", {}), ("PReLU", {"num_parameters": 4}),
                                                   ("ReLU", {"inplace": True}), ("Hardtanh", {"inplace": True}),
                                                   ("Softmin", {}), ("LogSoftmax", {}), ("Softmax", {})],
                         ids=IDS + ["PReLU", "PReLU-4", "ReLU-inplace", "Hardtanh-inplace", "Softmin-None",
                                    "LogSoftmax-None", "Softmax-None"])
def test_repr_is_torchs(name, kwargs):
    torch = pytest.importorskip("torch")
    assert repr(getattr(nn, name)(**kwargs)) == repr(getattr(torch.nn, name)(**kwargs))


def test_float32_input_gives_float32_output():
    x = mdl.tensor(inputs().astype(np.float32))
    for name, kwargs in MODULES:
        assert getattr(nn, name)(**kwargs)(x).dtype == np.float32, name


# ---------------------------------------------------------------- PReLU
def test_prelu_weight_initialization_and_state_dict():
    layer = nn.PReLU()
    assert layer.weight.shape == (1,) and layer.weight.dtype == np.float32
    np.testing.assert_array_equal(layer.weight.numpy(), [0.25])
    layer = nn.PReLU(num_parameters=3, init=0.1, dtype=np.float64)
    np.testing.assert_array_equal(layer.weight.numpy(), [0.1, 0.1, 0.1])
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    assert list(layer.state_dict()) == ["weight"] and layer.weight.dtype == np.float64


@pytest.mark.parametrize("num_parameters,shape", [(1, (2, 3, 4, 5)), (3, (2, 3, 4, 5)), (3, (4, 3)), (1, (7,))])
def test_prelu_with_torchs_weights_matches_torch_outputs_and_both_gradients(num_parameters, shape):
    torch = pytest.importorskip("torch")
    theirs = torch.nn.PReLU(num_parameters).double()
    with torch.no_grad():
        theirs.weight.uniform_(-0.5, 0.5)
    ours = nn.PReLU(num_parameters, dtype=np.float64)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(2).standard_normal(shape)
    v = np.random.default_rng(3).standard_normal(shape)
    t = mdl.tensor(x, requires_grad=True)
    y = ours(t)
    y.backward(Tensor(v))
    tx = torch.tensor(x, requires_grad=True)
    ty = theirs(tx)
    ty.backward(torch.tensor(v))
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-15)
    np.testing.assert_allclose(t.grad.numpy(), tx.grad.numpy(), rtol=1e-14)
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-12)


def test_prelu_learns_its_slope():
    """Fit y = where(x > 0, x, 0.6x): the slope moves from 0.25 to 0.6."""
    layer = nn.PReLU()
    opt = optim.SGD(layer.parameters(), lr=0.5)
    x = np.linspace(-2, 2, 41).astype(np.float32)
    target = Tensor(np.where(x > 0, x, 0.6 * x))
    for _ in range(100):
        opt.zero_grad()
        loss = ((layer(mdl.tensor(x)) - target) ** 2).mean()
        loss.backward()
        opt.step()
    np.testing.assert_allclose(layer.weight.numpy(), [0.6], rtol=1e-4)


def test_prelu_refuses_a_channel_mismatch_and_bad_sizes():
    with pytest.raises(ValueError, match=r"prelu: weight has 3 slopes.*\(2, 4\).*4 channel"):
        nn.PReLU(3)(mdl.randn(2, 4))
    with pytest.raises(ValueError, match="PReLU: num_parameters must be positive"):
        nn.PReLU(0)
    with pytest.raises(TypeError, match="PReLU: parameters must be floating point"):
        nn.PReLU(dtype=np.int32)


# ---------------------------------------------------------------- dim, inplace, arguments
@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax", "Softmin"])
def test_softmax_modules_default_dim_none_like_torch(name):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).standard_normal((3, 5))
    with pytest.warns(UserWarning, match="Implicit dimension"):
        expected = getattr(torch.nn, name)()(torch.tensor(x)).numpy()
    np.testing.assert_allclose(getattr(nn, name)()(mdl.tensor(x)).numpy(), expected, rtol=1e-13)
    with pytest.raises(ValueError, match=r"give dim for an input of shape \(2, 3, 5\)"):
        getattr(nn, name)()(mdl.randn(2, 3, 5))


@pytest.mark.parametrize("name,kwargs", [("ReLU", {}), ("LeakyReLU", {}), ("ELU", {}), ("SiLU", {}), ("Mish", {}),
                                         ("SELU", {}), ("CELU", {}), ("ReLU6", {}), ("Hardtanh", {}),
                                         ("Hardswish", {}), ("Hardsigmoid", {})])
def test_inplace_modules_write_into_their_input_where_no_gradient_is_recorded(name, kwargs):
    data = np.linspace(-5, 7, 13)
    expected = getattr(nn, name)(**kwargs)(mdl.tensor(data)).numpy()
    layer = getattr(nn, name)(inplace=True, **kwargs)
    assert layer.inplace is True and getattr(nn, name)().inplace is False
    x = mdl.tensor(data.copy())
    assert layer(x) is x
    np.testing.assert_array_equal(x.numpy(), expected)
    hidden = mdl.tensor(data, requires_grad=True) * 1.0
    with pytest.raises(RuntimeError, match=r"\(inplace=True\): minidl records no in-place op.*inplace=False"):
        layer(hidden)


def test_bad_constructor_arguments_raise_naming_the_layer():
    with pytest.raises(ValueError, match=r"Hardtanh: max_val \(1.0\) must be greater than min_val \(1.0\)"):
        nn.Hardtanh(1.0, 1.0)
    with pytest.raises(ValueError, match="CELU: alpha cannot be 0"):
        nn.CELU(alpha=0)


def test_modules_in_a_sequential_train_end_to_end():
    """A small net using the new modules: its gradients are finite-difference correct."""
    f64 = np.float64
    model = nn.Sequential(nn.Linear(4, 6, dtype=f64), nn.PReLU(6, dtype=f64), nn.Linear(6, 8, dtype=f64),
                          nn.GLU(), nn.SiLU(), nn.Linear(4, 3, dtype=f64), nn.LogSoftmax(dim=1))
    x = mdl.tensor(np.random.default_rng(5).standard_normal((5, 4)))
    params = list(model.parameters())

    def loss(*ps):
        return model(x).sum()
    assert mdl.gradcheck(loss, params)
