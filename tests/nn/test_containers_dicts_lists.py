"""ModuleDict, ParameterList, ParameterDict: registration, state-dict names as PyTorch's, mutation, errors."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim


class Heads(nn.Module):
    def __init__(self, lib):
        super().__init__()
        self.heads = lib.ModuleDict({"cls": lib.Linear(3, 2), "reg": lib.Linear(3, 1)})
        self.scales = lib.ParameterList([lib.Parameter(lib_ones(lib, 2)), lib.Parameter(lib_ones(lib, 1))])
        self.extra = lib.ParameterDict({"temperature": lib.Parameter(lib_ones(lib, 1))})

    def forward(self, x):
        return [self.heads[k](x) * self.scales[i] for i, k in enumerate(self.heads)]


def lib_ones(lib, n):
    return mdl.ones(n) if lib is nn else lib.__torch__.ones(n)


def test_state_dict_names_and_order_match_torch():
    torch = pytest.importorskip("torch")

    class TorchHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = torch.nn.ModuleDict({"cls": torch.nn.Linear(3, 2), "reg": torch.nn.Linear(3, 1)})
            self.scales = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(2)),
                                                  torch.nn.Parameter(torch.randn(1))])
            self.extra = torch.nn.ParameterDict({"temperature": torch.nn.Parameter(torch.randn(1))})

    class OurHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"cls": nn.Linear(3, 2), "reg": nn.Linear(3, 1)})
            self.scales = nn.ParameterList([nn.Parameter(mdl.ones(2)), mdl.ones(1)])  # a Tensor is wrapped
            self.extra = nn.ParameterDict({"temperature": mdl.ones(1)})

        def forward(self, x):
            return sum((self.heads[k](x) * self.scales[i]).sum() for i, k in enumerate(self.heads))

    torch.manual_seed(0)
    theirs, ours = TorchHeads(), OurHeads()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    out = ours(mdl.tensor(x))
    want = sum((theirs.heads[k](torch.tensor(x)) * theirs.scales[i]).sum() for i, k in enumerate(theirs.heads))
    # a float32 sum of a dozen products of size ~1 can cancel to a small total: its rounding is absolute
    # (a few float32 ulps of 1), so atol besides rtol; a wrong weight or order is off by ~0.1
    np.testing.assert_allclose(float(out), float(want.detach()), rtol=1e-5, atol=1e-6)
    out.backward()
    want.backward()
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        if q.grad is not None:
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, err_msg=name)
    assert all(isinstance(p, nn.Parameter) for p in ours.scales) and ours.extra["temperature"].requires_grad
    # the optimizer sees every container's parameters
    assert len(list(optim.SGD(ours.parameters(), lr=0.1).parameters())) == 7


def test_module_dict_behaves_like_a_dict():
    d = nn.ModuleDict([("a", nn.Linear(2, 2)), ("b", nn.ReLU())])
    assert list(d) == ["a", "b"] and len(d) == 2 and "a" in d and "z" not in d
    assert list(d.keys()) == ["a", "b"] and isinstance(list(d.values())[1], nn.ReLU)
    d["c"] = nn.Linear(2, 1)
    d.update({"a": nn.Linear(2, 3)})  # replaces in place, keeps the position
    assert list(d) == ["a", "b", "c"] and d["a"].weight.shape == (3, 2)
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias", "c.weight", "c.bias"]
    popped = d.pop("b")
    assert isinstance(popped, nn.ReLU) and list(d) == ["a", "c"]
    del d["a"]
    assert list(d.state_dict()) == ["c.weight", "c.bias"]
    d.train(False)
    assert not d["c"].training
    d.clear()
    assert len(d) == 0
    with pytest.raises(KeyError, match="ModuleDict has no module 'x'"):
        d["x"]
    with pytest.raises(TypeError, match="every element must be a Module"):
        d["f"] = np.tanh
    with pytest.raises(KeyError, match="without '.'"):
        d["a.b"] = nn.ReLU()
    with pytest.raises(KeyError, match="name of an attribute"):
        d["update"] = nn.ReLU()
    with pytest.raises(NotImplementedError, match="ModuleDict has no forward"):
        d(mdl.zeros(1))


def test_parameter_list_and_dict_behave_like_containers():
    ps = nn.ParameterList([mdl.ones(2), mdl.zeros(3)])
    assert len(ps) == 2 and [p.shape for p in ps] == [(2,), (3,)]
    ps.append(mdl.ones(1, 1))
    ps[0] = nn.Parameter(mdl.full((2,), 5.0))
    assert list(ps.state_dict()) == ["0", "1", "2"] and float(ps[0].numpy()[0]) == 5.0
    assert [p.shape for p in ps[1:]] == [(3,), (1, 1)] and ps[-1].shape == (1, 1)
    with pytest.raises(IndexError, match="out of range"):
        ps[3]
    with pytest.raises(TypeError, match="Parameter or a Tensor"):
        ps.append("w")
    pd = nn.ParameterDict({"alpha": mdl.ones(1)})
    pd["beta"] = mdl.zeros(2)
    pd.update([("gamma", mdl.ones(3))])
    assert list(pd) == ["alpha", "beta", "gamma"] and "beta" in pd
    assert [(k, p.shape) for k, p in pd.items()] == [("alpha", (1,)), ("beta", (2,)), ("gamma", (3,))]
    assert pd.pop("beta").shape == (2,) and list(pd.state_dict()) == ["alpha", "gamma"]
    with pytest.raises(KeyError, match="ParameterDict has no parameter 'beta'"):
        pd["beta"]
    # a wrapped Tensor shares its array: training the Parameter changes what was given
    t = mdl.zeros(2)
    ps2 = nn.ParameterList([t])
    ps2[0].array += 1
    np.testing.assert_array_equal(t.numpy(), [1, 1])


def test_containers_round_trip_through_save_and_load(tmp_path):
    model = nn.Module()
    model.blocks = nn.ModuleDict({"enc": nn.Linear(2, 3)})
    model.gains = nn.ParameterList([mdl.randn(3), mdl.randn(4)])
    model.named = nn.ParameterDict({"t": mdl.randn(1)})
    mdl.save(model.state_dict(), tmp_path / "w.safetensors")
    other = nn.Module()
    other.blocks = nn.ModuleDict({"enc": nn.Linear(2, 3)})
    other.gains = nn.ParameterList([mdl.zeros(3), mdl.zeros(4)])
    other.named = nn.ParameterDict({"t": mdl.zeros(1)})
    other.load_state_dict(mdl.load(tmp_path / "w.safetensors"))
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_replacing_an_entry_keeps_its_place():
    """As in PyTorch (and a dict): seq[0] = m replaces the first layer, the chain's order stays."""
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    seq[0] = nn.Linear(2, 2, bias=False)
    assert list(seq.state_dict()) == ["0.weight", "2.weight", "2.bias"]
    x = mdl.randn(3, 2)
    np.testing.assert_allclose(seq(x).numpy(), seq[2](seq[1](seq[0](x))).numpy())
    ml = nn.ModuleList([nn.Linear(1, 1), nn.Linear(1, 2)])
    ml[0] = nn.Linear(1, 3)
    assert [m.out_features for m in ml] == [3, 2] and list(ml.state_dict())[0] == "0.weight"
