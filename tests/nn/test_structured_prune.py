"""Structured pruning: norms by hand, the smaller network equals the original with those channels cut off."""
import copy

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.nn.structured_prune import channel_norms, channels_to_keep, prune_channels


def _cnn():
    mdl.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 2 * 2, 12), nn.Tanh(), nn.Dropout(0.3), nn.Linear(12, 5))


def test_norms_and_choice_by_hand():
    layer = nn.Linear(3, 4)
    layer.weight.array[...] = np.array([[1, -2, 0], [0.5, 0.5, 0.5], [3, 0, 0], [-1, -1, -1]], np.float32)
    np.testing.assert_allclose(channel_norms(layer, "l1"), [3, 1.5, 3, 3])
    np.testing.assert_allclose(channel_norms(layer, "l2"), [np.sqrt(5), np.sqrt(0.75), 3, np.sqrt(3)])
    assert channels_to_keep(channel_norms(layer, "l2"), 0.5).tolist() == [0, 2]    # the two largest L2 norms
    assert channels_to_keep(np.array([1.0, 2.0]), 0.9).tolist() == [1]              # at least one is kept


def _cut_off(model, amount, norm):
    """The reference: the original network with each removed channel's input weights to the next layer zeroed."""
    reference = copy.deepcopy(model)
    layers = list(reference)
    producers = [i for i, m in enumerate(layers) if isinstance(m, (nn.Linear, nn.Conv2d))]
    keeps = [channels_to_keep(channel_norms(layers[i], norm), amount) for i in producers]   # all from the original
    for (i, j), keep in zip(zip(producers, producers[1:]), keeps):
        dropped = np.setdiff1d(np.arange(layers[i].weight.shape[0]), keep)
        w = layers[j].weight.array
        if isinstance(layers[j], nn.Linear) and isinstance(layers[i], nn.Conv2d):
            w.reshape(w.shape[0], layers[i].weight.shape[0], -1)[:, dropped] = 0
        else:
            w[:, dropped] = 0
    return reference


@pytest.mark.parametrize("norm", ["l1", "l2"])
def test_the_smaller_network_computes_what_the_cut_network_does(norm):
    model = _cnn()
    x = np.random.default_rng(0).standard_normal((5, 2, 8, 8)).astype(np.float32)
    model.train()
    model(x)                                   # running statistics that are not the defaults
    model.eval()
    small = prune_channels(model, 0.5, norm)
    assert [m.weight.shape for m in small if isinstance(m, (nn.Linear, nn.Conv2d))] == \
        [(3, 2, 3, 3), (4, 3, 3, 3), (6, 16), (5, 6)]
    assert small[1].running_mean.shape == (3,) and small[1].num_features == 3
    with mdl.no_grad():
        np.testing.assert_allclose(small(x).numpy(), _cut_off(model, 0.5, norm)(x).numpy(), rtol=1e-5, atol=1e-5)
    assert list(model[0].weight.shape) == [6, 2, 3, 3]                 # the original is unchanged
    # parameters by hand: conv 3·2·9+3, bn 3+3, conv 4·3·9+4, linear 16·6+6, linear 6·5+5
    assert small.num_parameters() == 57 + 6 + 112 + 102 + 35
    assert prune_channels(model, 0.0).num_parameters() == model.num_parameters()


def test_the_pruned_network_trains():
    small = prune_channels(_cnn(), 0.5)
    x = mdl.tensor(np.random.default_rng(1).standard_normal((4, 2, 8, 8)).astype(np.float32))
    small(x).sum().backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in small.parameters())


def test_bad_input():
    with pytest.raises(ValueError, match=r"amount is the fraction .* in \[0, 1\); got 1.0"):
        prune_channels(_cnn(), 1.0)
    with pytest.raises(ValueError, match=r"layer 1 \(LayerNorm\) between layers 0 and 2 mixes channels"):
        prune_channels(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2)), 0.5)
    with pytest.raises(TypeError, match="expected an nn.Sequential, got Linear"):
        prune_channels(nn.Linear(3, 4), 0.5)
    with pytest.raises(ValueError, match="needs at least two Linear/Conv2d layers"):
        prune_channels(nn.Sequential(nn.Linear(3, 4)), 0.5)
