"""The silent failures' detectors, each on the bug built on purpose and on the healthy case; the prediction
gallery, the inference budget, EarlyStopping(stop_below=) and the detectors in ``minidl diagnose``."""
import numpy as np
import pytest

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.data.text import next_token_windows
from minidl.train import EarlyStopping, Trainer, clip_loss
from minidl.train.inference_budget import format_inference_report, inference_report
from minidl.train.inspection import PredictionGallery, predict_classes
from minidl.train.silent_failures import (
    check_augmentation,
    check_capacity,
    check_loss_gradient,
    check_next_token_leak,
    check_next_token_targets,
)


def _blobs(n=300, seed=0):
    centers = np.array([[3.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 3.0, 0]])
    x, y = gaussian_blobs(n=n, centers=centers, seed=seed, std=1.0)
    return x.astype(np.float32), y


def _mlp(seed=0, width=16):
    mdl.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))


# ---------------------------------------------------------------- augmentation
def test_an_identity_augmentation_changes_nothing_and_a_label_mixing_pipeline_is_flagged():
    x, y = _blobs()
    model = _mlp()
    before = [p.numpy().copy() for p in model.parameters()]
    same = check_augmentation(model, x[200:], y[200:], (x[:200], y[:200]), transform=lambda xb: xb, steps=60)
    assert same.passed and same.value == 0.0  # the same batches from the same weights: the same model
    assert all(a == b for a, b in same.per_class.values())

    def mixes_labels(xb, yb):  # the bug: the augmented copy gets its neighbour's label
        return xb + 0.01, np.roll(yb, 1)

    mixed = check_augmentation(model, x[200:], y[200:], (x[:200], y[:200]), pipeline=mixes_labels, steps=60)
    assert mixed.passed is False and mixed.value > 0.3
    assert all(np.array_equal(a, b) for a, b in zip(before, [p.numpy() for p in model.parameters()]))
    with pytest.raises(ValueError, match="exactly one of"):
        check_augmentation(model, x, y, (x, y))


# ---------------------------------------------------------------- next-token off-by-one
def test_windows_shifted_by_one_pass_and_copied_targets_fail():
    ids = np.random.default_rng(0).integers(0, 20, size=500)
    x, y = next_token_windows(ids, block_size=8)
    good = check_next_token_targets(x, y)
    assert good.passed and good.shifted == 1.0
    bad = check_next_token_targets(x, x.copy())
    assert bad.passed is False and bad.copied == 1.0 and bad.shifted == pytest.approx(np.mean(x[:, :-1] == x[:, 1:]))
    with pytest.raises(ValueError, match="same shape"):
        check_next_token_targets(x, y[:, :-1])


class _TokenModel(nn.Module):
    """Each position's token → an embedding → scores over the vocabulary (no context at all)."""

    def __init__(self, vocab):
        super().__init__()
        self.embed, self.out = nn.Embedding(vocab, 16), nn.Linear(16, vocab)

    def forward(self, ids):
        return self.out(self.embed(ids))


def test_a_model_that_sees_its_target_is_caught_and_one_that_cannot_is_not():
    vocab = 12
    ids = np.random.default_rng(1).integers(0, vocab, size=4000)   # independent tokens: nothing to predict
    x, y = next_token_windows(ids, block_size=16)
    mdl.manual_seed(0)
    honest = check_next_token_leak(_TokenModel(vocab), x, y, vocab, steps=60, lr=1e-2)
    assert honest.passed and honest.accuracy < 0.2     # about 1/12
    mdl.manual_seed(0)
    leaky = check_next_token_leak(_TokenModel(vocab), x, x.copy(), vocab, steps=60, lr=1e-2)  # target = input
    assert leaky.passed is False and leaky.accuracy > 0.9


# ---------------------------------------------------------------- loss clipping
def test_the_share_without_gradient_is_the_share_above_the_clipped_loss():
    x, y = _blobs(100)
    model = _mlp()
    with mdl.no_grad():
        losses = F.cross_entropy(model(mdl.tensor(x)), mdl.tensor(y), reduction="none").numpy()
    threshold = float(np.median(losses))
    clipped = check_loss_gradient(model, x, y, lambda out, t: clip_loss(F.cross_entropy(out, t, reduction="none"),
                                                                         threshold))
    assert clipped.passed is False and clipped.zero_share == pytest.approx(np.mean(losses > threshold))
    plain = check_loss_gradient(model, x, y, F.cross_entropy)
    assert plain.passed and plain.zero_share == 0.0


# ---------------------------------------------------------------- capacity
def test_training_loss_that_rises_with_width_is_flagged():
    x, y = _blobs(200)

    def healthy(width):
        return _mlp(0, width)

    def badly_initialized(width):  # weights N(0, 1) whatever the fan-in: wider layers blow the signal up
        model = _mlp(0, width)
        for layer in (model[0], model[2]):
            nn.init.normal_(layer.weight, 0.0, float(width) ** 0.5)
        return model

    good = check_capacity(healthy, [4, 16, 64], x, y, steps=80, lr=1e-2)
    assert good.passed and good.losses[64] <= good.losses[4]
    bad = check_capacity(badly_initialized, [4, 16, 64], x, y, steps=80, lr=1e-2)
    assert bad.passed is False and bad.losses[64] > bad.losses[4]


# ---------------------------------------------------------------- gallery, budget, early stopping
def test_the_gallery_writes_one_picture_per_epoch_with_the_batch_accuracy(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    x, y = _blobs(128)
    x_img = np.repeat(x, 4, axis=1)        # 16 features: drawn as 4x4 images
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    gallery = PredictionGallery(x_img[:8], y[:8], tmp_path / "gallery")
    Trainer(model, optim.Adam(model.parameters(), lr=1e-2), DataLoader((x_img, y), batch_size=32),
            callbacks=[gallery], progress=False).fit(2)
    assert [p.split("/")[-1] for p in gallery.written] == ["epoch-001.png", "epoch-002.png"]
    assert all((tmp_path / "gallery" / name).stat().st_size > 1000 for name in ("epoch-001.png", "epoch-002.png"))
    assert gallery.accuracy[-1] == np.mean(predict_classes(model, x_img[:8]) == y[:8])


def test_the_inference_budget_by_hand():
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
    report = inference_report(model, np.zeros((1, 64), np.float32), repeats=5)
    parameters = 64 * 32 + 32 + 2 * 32 + 32 * 10 + 10
    buffers = sum(b.numel() * b.array.dtype.itemsize for _, b in model.named_buffers())
    assert report["parameters"] == parameters and report["weight_bytes"] == 4 * parameters + buffers
    assert report["activation_bytes"] == 4 * (32 + 32 + 32 + 10) and report["largest_activation_bytes"] == 128
    assert report["peak_pair_bytes"] == 4 * (64 + 32) and report["layers"] == 4
    assert 0 < report["latency_ms"] <= report["latency_p90_ms"]
    assert "latency at batch 1" in format_inference_report(report)
    with pytest.raises(ValueError, match=r"x\[:1\]"):
        inference_report(model, np.zeros((2, 64), np.float32))


def test_early_stopping_stops_at_the_first_record_below_the_threshold():
    x, y = _blobs(256)
    model = _mlp()
    stop = EarlyStopping(monitor="train_loss", stop_below=0.3, patience=1000)
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), DataLoader((x, y), batch_size=32),
                      callbacks=[stop], eval_every=4, progress=False)
    trainer.fit(50)
    losses = [r["train_loss"] for r in trainer.history]
    first = next(i for i, v in enumerate(losses) if v < 0.3)
    assert first == len(losses) - 1 and stop.reached_step == trainer.history[-1]["step"] == trainer.step
    assert stop.state_dict()["reached_step"] == stop.reached_step
    again = EarlyStopping(monitor="train_loss", stop_below=0.3)
    again.load_state_dict(stop.state_dict())
    assert again.reached_step == stop.reached_step
    with pytest.raises(ValueError, match="stop_below must be a finite number"):
        EarlyStopping(stop_below=float("nan"))


def test_minidl_diagnose_runs_the_detectors_and_the_budget(capsys):
    from minidl.cli import main
    code = main(["diagnose", "--steps", "60", "--augment", "noise"])
    text = capsys.readouterr().out
    assert "silent failures:" in text and "[PASS] every example gets a gradient" in text
    assert "augmentation keeps the labels (noise)" in text and "latency at batch 1" in text
    assert code in (0, 1) and "of 5 checks passed" in text and "of 2 silent-failure detectors passed" in text
