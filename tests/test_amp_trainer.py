"""Mixed precision in the Trainer: skipped steps are not divergence, the scaler resumes bit for bit."""
import numpy as np
import pytest

import minidl as mdl
from minidl import amp, nn, optim
from minidl.data import DataLoader, gaussian_blobs
from minidl.train import Trainer
from tests.train._helpers import StopAt

# float16 overflows on purpose here (that is what the scaler is for): NumPy warns at each one
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")


def _trainer(mode="fp16", seed=0, max_grad_norm=1.0):
    x, y = gaussian_blobs(n=120, centers=3, std=1.5, seed=0)
    mdl.manual_seed(seed)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = optim.Adam(model.parameters(), lr=1e-2)
    trainer = Trainer(model, opt, DataLoader((x, y), batch_size=16, shuffle=True, seed=seed),
                      DataLoader((x, y), batch_size=120), eval_every=4, max_grad_norm=max_grad_norm,
                      accumulation_steps=2, progress=False, amp=mode)
    if mode == "fp16":  # a scale so large that the first float16 gradients overflow: skipped steps, then growth
        trainer.scaler = amp.GradScaler(init_scale=2.0 ** 20, growth_interval=3)
    return trainer


def test_fp16_run_skips_overflowing_steps_without_stopping_and_logs_the_scale():
    trainer = _trainer()
    trainer.fit(6)
    scaler = trainer.scaler
    assert scaler.skipped_steps > 0  # 2²⁰·g overflows float16 (max 65504): backed off, not a divergence
    assert scaler.get_scale() < 2.0 ** 20
    last = trainer.history[-1]
    assert last["amp_scale"] == scaler.get_scale() and last["skipped_steps"] == scaler.skipped_steps
    assert all(p.dtype == np.float32 for p in trainer.model.parameters())
    assert trainer.history[-1]["val_accuracy"] > 0.6


@pytest.mark.parametrize("stop_step", [5, 9])
def test_resumed_fp16_run_is_bit_exact(tmp_path, stop_step):
    path = tmp_path / "ckpt.safetensors"
    straight = _trainer()
    straight.callbacks.append(StopAt(-1, path))
    straight.fit(3)
    first = _trainer()
    first.callbacks.append(StopAt(stop_step, path))
    first.fit(3)
    resumed = _trainer(seed=1)
    resumed.callbacks.append(StopAt(-1, path))
    resumed.scaler = amp.GradScaler()  # everything, the scale included, must come from the file
    resumed.load_checkpoint(path)
    resumed.fit(3)
    assert resumed.scaler.state_dict() == straight.scaler.state_dict()
    for name, value in straight.model.state_dict().items():
        np.testing.assert_array_equal(resumed.model.state_dict()[name], value, err_msg=name)
    assert [r["amp_scale"] for r in resumed.history] == [r["amp_scale"] for r in straight.history]


def test_bf16_run_trains_like_float32_and_has_no_scaler():
    pytest.importorskip("ml_dtypes")
    bf16, fp32 = _trainer("bf16"), _trainer(None)
    bf16.fit(3)
    fp32.fit(3)
    assert not bf16.scaler.is_enabled() and "amp_scale" not in bf16.history[-1]
    assert abs(bf16.history[-1]["val_accuracy"] - fp32.history[-1]["val_accuracy"]) <= 0.05
    with pytest.raises(ValueError, match="amp must be"):
        _trainer("fp8")


def test_cli_amp_option_trains_and_logs_the_scale(tmp_path, capsys):
    import json

    from minidl.cli import main
    out = tmp_path / "run"
    assert main(["train", "--data", "spirals", "--epochs", "2", "--lr", "0.01", "--amp", "fp16", "--quiet",
                 "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validations = [r for r in records if "val_loss" in r]
    assert validations and all(r["amp_scale"] > 0 and r["skipped_steps"] >= 0 for r in validations)
    with pytest.raises(SystemExit):
        main(["train", "--amp", "fp32"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--amp {fp16,bf16}" in capsys.readouterr().out
