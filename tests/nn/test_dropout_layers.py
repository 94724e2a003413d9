"""nn.Dropout1d / nn.Dropout2d: whole channels dropped in training, identity in evaluation, PyTorch's layouts."""
import numpy as np
import pytest

import minidl as mdl
from minidl import nn


@pytest.mark.parametrize("layer, shape", [("Dropout1d", (20, 30, 4)), ("Dropout1d", (30, 4)),
                                          ("Dropout2d", (20, 30, 2, 3))])
def test_channel_dropout_layers_train_and_eval(layer, shape):
    torch = pytest.importorskip("torch")
    ours, theirs = getattr(nn, layer)(p=0.4), getattr(torch.nn, layer)(p=0.4)
    assert repr(ours) == repr(theirs)
    x = np.random.default_rng(0).random(shape).astype(np.float32) + 1
    mdl.manual_seed(0)
    y = ours(mdl.tensor(x)).numpy()
    ratio = y / x
    per_channel = ratio.reshape(int(np.prod(shape[:-1 if layer == "Dropout1d" else -2])), -1)
    np.testing.assert_allclose(per_channel, np.broadcast_to(per_channel[:, :1], per_channel.shape), rtol=1e-6)
    kept = per_channel[:, 0] != 0
    np.testing.assert_allclose(per_channel[kept], 1 / 0.6, rtol=1e-6)
    assert (per_channel[~kept] == 0).all()
    assert abs((per_channel[:, 0] == 0).mean() - 0.4) < 0.12
    ours.eval()
    theirs.eval()
    np.testing.assert_array_equal(ours(mdl.tensor(x)).numpy(), theirs(torch.tensor(x)).numpy())


def test_channel_dropout_p_one_zeroes_and_p_zero_passes():
    x = mdl.randn(2, 3, 4, 4)
    np.testing.assert_array_equal(nn.Dropout2d(1.0)(x).numpy(), 0)
    np.testing.assert_array_equal(nn.Dropout1d(1.0)(x[0]).numpy(), 0)
    np.testing.assert_array_equal(nn.Dropout2d(0.0)(x).numpy(), x.numpy())
    with pytest.raises(ValueError, match="Dropout: p is a probability"):
        nn.Dropout2d(1.5)
