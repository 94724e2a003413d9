"""minidl.train.ensemble: averaged probabilities, against NumPy."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import Ensemble, Trainer, average_probabilities


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _members(n=3):
    out = []
    for seed in range(n):
        mdl.manual_seed(seed)
        out.append(nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 3)).to(dtype=np.float64))
    return out


def test_average_of_probabilities():
    models = _members()
    x = mdl.tensor(np.random.default_rng(0).standard_normal((7, 2)) * 3)
    for m in models:
        m.eval()
    expected = np.mean([_softmax(m(x).numpy()) for m in models], axis=0)
    for m in models:
        m.train()
    ensemble = Ensemble(models)
    probs = ensemble.predict_proba(x)
    np.testing.assert_allclose(probs.numpy(), expected, rtol=1e-12)
    assert ensemble.training and all(m.training for m in models)  # modes restored
    np.testing.assert_allclose(average_probabilities(models, x).numpy(), expected, rtol=1e-12)
    ensemble.eval()
    np.testing.assert_allclose(ensemble(x).numpy(), np.log(expected), rtol=1e-12)
    # Averaging probabilities is not averaging logits: the argmax can differ, the values do.
    mean_logits = _softmax(np.mean([m(x).numpy() for m in models], axis=0))
    assert not np.allclose(mean_logits, expected)


def test_one_member_is_the_model_and_gradients_reach_every_member():
    (model,) = _members(1)
    model.eval()
    x = mdl.tensor(np.ones((2, 2)))
    np.testing.assert_allclose(Ensemble([model]).predict_proba(x).numpy(), _softmax(model(x).numpy()), rtol=1e-12)
    models = _members(2)
    ensemble = Ensemble(models).eval()
    mdl.functional.cross_entropy(ensemble(x), mdl.tensor(np.array([0, 2]))).backward()
    assert all(p.grad is not None for p in ensemble.parameters())
    assert len(ensemble.state_dict()) == 8
    with pytest.raises(ValueError, match="no models"):
        Ensemble([])


def test_the_trainer_evaluates_an_ensemble():
    x, y = gaussian_blobs(n=90, centers=3, seed=0)
    loader = DataLoader((x.astype(np.float64), y), batch_size=30)
    models = _members()
    for m in models:
        Trainer(m, optim.Adam(m.parameters(), lr=0.05), loader, progress=False).fit(epochs=3)
    ensemble = Ensemble(models)
    result = Trainer(ensemble, optim.SGD(ensemble.parameters(), lr=0.0), loader, progress=False).evaluate(loader)
    probs = ensemble.predict_proba(mdl.tensor(x.astype(np.float64))).numpy()
    assert result["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == y))
    assert result["loss"] == pytest.approx(-np.log(probs[np.arange(len(y)), y]).mean(), rel=1e-10)
