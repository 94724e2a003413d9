"""The loss modules: each equals its function with the same options and PyTorch's module with the same arguments."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn


def _data(rng, name):
    """(input, target) suited to the loss ``name``."""
    if name in ("CrossEntropyLoss",):
        return rng.standard_normal((6, 4)), np.array([0, 3, -100, 1, 2, 3])
    if name == "NLLLoss":
        x = rng.standard_normal((6, 4))
        return x - np.log(np.exp(x).sum(1, keepdims=True)), np.array([0, 3, 2, -100, 2, 1])
    if name == "BCELoss":
        return rng.uniform(0.05, 0.95, (6, 4)), rng.random((6, 4))
    if name == "KLDivLoss":
        x = rng.standard_normal((6, 4))
        return x - np.log(np.exp(x).sum(1, keepdims=True)), rng.dirichlet(np.ones(4), size=6)
    return rng.standard_normal((6, 4)) * 2, rng.standard_normal((6, 4))


CASES = [
    ("CrossEntropyLoss", {}),
    ("CrossEntropyLoss", {"weight": np.array([1.0, 2.0, 0.5, 1.5]), "label_smoothing": 0.1, "reduction": "sum"}),
    ("CrossEntropyLoss", {"ignore_index": 3, "reduction": "none"}),
    ("NLLLoss", {"weight": np.array([1.0, 2.0, 0.5, 1.5])}),
    ("MSELoss", {"reduction": "sum"}),
    ("L1Loss", {}),
    ("BCELoss", {"weight": np.linspace(0.5, 2, 4)}),
    ("BCEWithLogitsLoss", {"pos_weight": np.array([1.0, 3.0, 0.5, 2.0]), "reduction": "none"}),
    ("KLDivLoss", {"reduction": "batchmean"}),
    ("KLDivLoss", {"reduction": "sum", "log_target": True}),
    ("HuberLoss", {"delta": 0.5}),
    ("SmoothL1Loss", {"beta": 0.5, "reduction": "sum"}),
]


@pytest.mark.parametrize("name, kwargs", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_loss_module_matches_torch_module(torch, name, kwargs):
    rng = np.random.default_rng(1)
    x, t = _data(rng, name)
    if name == "BCEWithLogitsLoss":
        t = (t > 0).astype(np.float64)
    if kwargs.get("ignore_index") == 3:
        t = np.where(t == -100, 0, t)
    criterion = getattr(nn, name)(**kwargs)
    tcriterion = getattr(torch.nn, name)(**{k: torch.tensor(v) if isinstance(v, np.ndarray) else v
                                            for k, v in kwargs.items()})
    xt = mdl.tensor(x, requires_grad=True)
    loss = criterion(xt, t)
    tx = torch.tensor(x, requires_grad=True)
    tloss = tcriterion(tx, torch.tensor(t))
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(loss.shape)
    loss.backward(mdl.tensor(g))
    tloss.backward(torch.tensor(g))
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_modules_call_their_function():
    rng = np.random.default_rng(2)
    x, t = rng.standard_normal((5, 3)), rng.integers(0, 3, 5)
    w = np.array([0.5, 1.0, 2.0])
    got = nn.CrossEntropyLoss(w, label_smoothing=0.2, reduction="none")(mdl.tensor(x), t)
    want = F.cross_entropy(mdl.tensor(x), t, w, label_smoothing=0.2, reduction="none")
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    y = rng.standard_normal((5, 3))
    assert nn.HuberLoss("sum", 0.3)(mdl.tensor(x), y).item() == F.huber_loss(mdl.tensor(x), y, "sum", 0.3).item()


def test_weights_are_buffers_in_the_state_dict():
    criterion = nn.BCEWithLogitsLoss(weight=np.ones(3), pos_weight=np.full(3, 2.0))
    assert list(criterion.state_dict()) == ["weight", "pos_weight"]
    assert list(nn.CrossEntropyLoss().state_dict()) == []  # no weight: nothing saved, as PyTorch
    restored = nn.CrossEntropyLoss(weight=np.zeros(4))
    restored.load_state_dict({"weight": np.array([1.0, 2.0, 3.0, 4.0])})
    np.testing.assert_array_equal(restored.weight.numpy(), [1, 2, 3, 4])
    x = mdl.randn(2, 3)
    assert criterion(x, np.ones((2, 3))).dtype == np.float32  # float64 buffers do not upcast a float32 loss


def test_repr_and_errors():
    assert repr(nn.CrossEntropyLoss(label_smoothing=0.1)) == \
        "CrossEntropyLoss(ignore_index=-100, reduction='mean', label_smoothing=0.1)"
    assert repr(nn.MSELoss(reduction="sum")) == "MSELoss(reduction='sum')"
    assert repr(nn.KLDivLoss(reduction="batchmean")) == "KLDivLoss(reduction='batchmean', log_target=False)"
    with pytest.raises(ValueError, match=r"MSELoss: reduction must be one of 'mean', 'sum', 'none', got 'avg'"):
        nn.MSELoss(reduction="avg")
    with pytest.raises(ValueError, match=r"CrossEntropyLoss: reduction must be one of"):
        nn.CrossEntropyLoss(reduction="batchmean")
    with pytest.raises(ValueError, match=r"HuberLoss: delta must be positive"):
        nn.HuberLoss(delta=-1.0)
    with pytest.raises(ValueError, match=r"SmoothL1Loss: beta must be non-negative"):
        nn.SmoothL1Loss(beta=-1.0)
    with pytest.raises(TypeError):
        nn.MSELoss(None, None, "sum")  # PyTorch's deprecated size_average and reduce are not taken
