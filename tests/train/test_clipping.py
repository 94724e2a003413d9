"""PercentileClipping (the threshold is the percentile of recent norms) and clip_loss (zero gradient above c)."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import Trainer
from minidl.train.clipping import PercentileClipping, clip_loss


def test_threshold_is_the_percentile_of_the_last_norms_and_clipping_keeps_the_direction():
    rng = np.random.default_rng(0)
    clipper = PercentileClipping(percentile=75, window=6, warmup=3)
    p = mdl.zeros(4, dtype=np.float64, requires_grad=True)
    norms = []
    for step in range(12):
        g = rng.normal(size=4) * (20.0 if step in (5, 9) else 1.0)  # two spikes
        p.grad = mdl.tensor(g.copy())
        before = clipper.clip_([p])
        assert before == pytest.approx(np.linalg.norm(g), rel=1e-12)
        expected = None if len(norms) < 3 else np.percentile(norms[-6:], 75)
        assert clipper.thresholds[-1] == (None if expected is None else pytest.approx(expected, rel=1e-12))
        out = p.grad.numpy()
        if expected is not None and np.linalg.norm(g) > expected:
            assert np.linalg.norm(out) == pytest.approx(expected, rel=1e-5)     # shortened to the threshold
            np.testing.assert_allclose(out / np.linalg.norm(out), g / np.linalg.norm(g), rtol=1e-9)  # same direction
        else:
            np.testing.assert_allclose(out, g, rtol=1e-12)
        norms.append(np.linalg.norm(g))
    assert clipper.history == pytest.approx(norms[-6:])
    over = [i for i, n in enumerate(norms) if i >= 3 and n > np.percentile(norms[max(0, i - 6):i], 75)]
    assert clipper.clipped == len(over) and {5, 9} <= set(over)


def test_inside_the_trainer_it_clips_before_the_update():
    """The Trainer's run equals a hand-written loop calling clip_ between backward() and step()."""
    x, y = gaussian_blobs(n=64, centers=2, seed=0)
    mdl.manual_seed(0)
    model = nn.Linear(2, 2)
    start = {k: v.copy() for k, v in model.state_dict().items()}
    clipper = PercentileClipping(percentile=10, warmup=2)
    Trainer(model, optim.SGD(model.parameters(), lr=0.5), DataLoader((x, y), batch_size=16), callbacks=[clipper],
            progress=False).fit(epochs=2)
    assert len(clipper.history) == 8 and clipper.thresholds[:2] == [None, None] and clipper.clipped >= 1
    by_hand, manual = nn.Linear(2, 2), PercentileClipping(percentile=10, warmup=2)
    by_hand.load_state_dict(start)
    opt = optim.SGD(by_hand.parameters(), lr=0.5)
    for _ in range(2):
        for i in range(0, 64, 16):
            opt.zero_grad()
            F.cross_entropy(by_hand(mdl.tensor(x[i:i + 16])), mdl.tensor(y[i:i + 16])).backward()
            manual.clip_(list(by_hand.parameters()))
            opt.step()
    np.testing.assert_allclose(model.weight.numpy(), by_hand.weight.numpy(), rtol=1e-6)
    assert manual.history == pytest.approx(clipper.history, rel=1e-6)
    other = PercentileClipping()
    other.load_state_dict(clipper.state_dict())
    assert other.history == clipper.history
    with pytest.raises(ValueError, match="percentile must be in"):
        PercentileClipping(percentile=0)


def test_clip_loss_zeroes_the_gradient_of_the_examples_above_the_threshold():
    rng = np.random.default_rng(1)
    logits = mdl.tensor(rng.normal(size=(6, 3)) * 3, requires_grad=True)
    y = mdl.tensor(np.array([0, 1, 2, 0, 1, 2]))
    per_example = F.cross_entropy(logits, y, reduction="none")
    values = per_example.numpy()
    c = float(np.median(values))
    clip_loss(per_example, c).backward()
    # the same gradient by hand: softmax − onehot for the examples below c, divided by N; zero for the rest
    z = logits.numpy()
    softmax = np.exp(z - z.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    expected = (softmax - np.eye(3)[y.numpy()]) / 6 * (values < c)[:, None]
    np.testing.assert_allclose(logits.grad.numpy(), expected, rtol=1e-10, atol=1e-12)
    assert float(clip_loss(per_example, c, reduction="sum").item()) == pytest.approx(np.minimum(values, c).sum())
    with pytest.raises(ValueError, match="per-example losses"):
        clip_loss(per_example.mean(), 1.0)
