"""TensorBoard logs: the event files a short run writes, read back record by record."""
import glob
import os
import struct

import numpy as np
import pytest

import minidl as mdl
from minidl import nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.ops.loss import cross_entropy
from minidl.train import Trainer

pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # noqa: E402

from minidl.train.tensorboard import TensorBoardLogger  # noqa: E402


def _read_events(folder):
    """Every Event of the event files in ``folder``, from the TFRecord framing:
    uint64 length, uint32 crc of the length, the bytes, uint32 crc of the bytes."""
    events = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        with open(path, "rb") as f:
            data = f.read()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            payload = data[at + 12:at + 12 + length]
            assert len(payload) == length
            events.append(event_pb2.Event.FromString(payload))
            at += 12 + length + 4
    return events


def _values(events):
    scalars, histograms = {}, {}
    for e in events:
        for v in e.summary.value:
            if v.HasField("histo"):
                histograms.setdefault(v.tag, {})[e.step] = v.histo
            else:
                scalars.setdefault(v.tag, {})[e.step] = v.simple_value
    return scalars, histograms


def _run(callbacks, seed=0):
    x, y = gaussian_blobs(n=64, centers=3, std=1.0, seed=0)
    x = x.astype(np.float32)
    mdl.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Dropout(0.2), nn.Linear(8, 3))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), DataLoader((x, y), batch_size=16, shuffle=True,
                      seed=1), DataLoader((x, y), batch_size=32), eval_every=3, callbacks=callbacks, progress=False)
    trainer.fit(epochs=2)
    return trainer, x, y


def test_scalars_equal_the_history_and_histogram_counts_equal_the_sizes(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb")
    trainer, x, y = _run([logger])
    logger.close()
    scalars, histograms = _values(_read_events(tmp_path / "tb"))
    history = trainer.history
    assert len(history) == 4  # steps 3, 6 and the two epoch ends (4, 8): 4 records
    for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"):
        assert scalars[key] == {r["step"]: np.float32(r[key]) for r in history}, key
    assert scalars["step/loss"] == dict(zip(trainer.steps["step"], np.float32(trainer.steps["loss"])))
    assert scalars["step/lr"] == dict(zip(trainer.steps["step"], np.float32(trainer.steps["lr"])))
    record_steps = {r["step"] for r in history}
    model = trainer.model
    for name, p in model.named_parameters():
        for kind in ("weights", "gradients"):
            h = histograms[f"{kind}/{name}"]
            assert set(h) == record_steps
            assert all(v.num == p.numel() for v in h.values()), (kind, name)
    # The last weights histogram is of the final weights.
    last = max(record_steps)
    for name, p in model.named_parameters():
        h = histograms[f"weights/{name}"][last]
        np.testing.assert_allclose([h.min, h.max, h.sum], [p.array.min(), p.array.max(), p.array.sum()], rtol=1e-6)
    # Gradients and activations of the probe (the first validation batch, 32 samples), in eval mode.
    xp, yp = mdl.tensor(x[:32]), mdl.tensor(y[:32])
    model.eval()
    hidden = model[0](xp)
    cross_entropy(model(xp), yp).backward()
    for name, p in model.named_parameters():
        h = histograms[f"gradients/{name}"][last]
        np.testing.assert_allclose(h.sum, p.grad.array.sum(), rtol=1e-5, atol=1e-7)
    for layer, width in (("0", 8), ("1", 8), ("2", 8), ("3", 3)):
        assert all(v.num == 32 * width for v in histograms[f"activations/{layer}"].values())
    np.testing.assert_allclose(histograms["activations/0"][last].sum, hidden.array.sum(), rtol=1e-5)
    assert histograms["activations/1"][last].min == 0.0  # after the ReLU


def test_the_logger_changes_nothing_in_the_run(tmp_path):
    logged, _, _ = _run([TensorBoardLogger(tmp_path / "tb")])
    plain, _, _ = _run([])
    assert [{k: v for k, v in r.items() if k != "time"} for r in logged.history] == \
        [{k: v for k, v in r.items() if k != "time"} for r in plain.history]
    for (name, a), (_, b) in zip(logged.model.named_parameters(), plain.model.named_parameters()):
        np.testing.assert_array_equal(a.array, b.array, err_msg=name)


def test_choices_and_errors(tmp_path):
    logger = TensorBoardLogger(tmp_path / "tb", histograms=("weights",), histogram_every=2, step_scalars=False)
    trainer, _, _ = _run([logger])
    logger.close()
    scalars, histograms = _values(_read_events(tmp_path / "tb"))
    assert "step/loss" not in scalars and all(t.startswith("weights/") for t in histograms)
    assert set(histograms["weights/0.weight"]) == {r["step"] for r in trainer.history[1::2]}
    with pytest.raises(ValueError, match="histograms"):
        TensorBoardLogger(tmp_path, histograms=("biases",))


def test_cli_writes_event_files_and_a_resume_keeps_them(tmp_path, capsys):
    import json

    from minidl.cli import main
    out = tmp_path / "run"
    args = ["train", "--data", "spirals", "--epochs", "1", "--lr", "0.01", "--quiet", "--out", str(out)]
    assert main([*args, "--tensorboard"]) == 0
    assert "tensorboard" in capsys.readouterr().out
    scalars, histograms = _values(_read_events(out / "tensorboard"))
    with open(out / "metrics.jsonl") as f:  # JSONL is still written, and agrees
        records = [json.loads(line) for line in f if '"split"' not in line]
    assert scalars["val_accuracy"] == {r["step"]: np.float32(r["val_accuracy"]) for r in records}
    assert any(t.startswith("activations/") for t in histograms)
    # A resumed run, without the flag, keeps writing event files (its checkpoint holds the logger's state).
    assert main(["train", "--resume", str(out / "last.safetensors"), "--epochs", "2", "--quiet"]) == 0
    scalars, _ = _values(_read_events(out / "tensorboard"))
    assert len(scalars["val_accuracy"]) == 2


def test_on_a_device_the_histograms_are_of_the_device_arrays(standin_or_gpu, tmp_path):
    from minidl import backend
    x, y = gaussian_blobs(n=64, centers=3, std=1.0, seed=0)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 3))
    logger = TensorBoardLogger(tmp_path / "tb")
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x.astype(np.float32), y),
                      batch_size=16), DataLoader((x.astype(np.float32), y), batch_size=64), device="cuda",
                      callbacks=[logger], progress=False)
    trainer.fit(epochs=1)
    logger.close()
    scalars, histograms = _values(_read_events(tmp_path / "tb"))
    assert scalars["val_loss"] == {4: np.float32(trainer.history[0]["val_loss"])}
    for name, p in model.named_parameters():
        assert p.device.startswith("cuda")
        h = histograms[f"weights/{name}"][4]
        assert h.num == p.numel() and h.sum == pytest.approx(float(backend.to_numpy(p.array).sum()), rel=1e-6)
        assert histograms[f"gradients/{name}"][4].num == p.numel()
    assert histograms["activations/2"][4].num == 64 * 3
