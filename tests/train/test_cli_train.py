"""``minidl train`` and ``minidl diagnose`` end to end: files, accuracy, resume, bad input."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from tests.cli_helpers import metrics_records as _records
from tests.cli_helpers import run_cli as _run


def test_default_run_reaches_95_percent_and_writes_its_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = _run(capsys, "train")   # no flags at all: the MLP on the bundled digits
    assert code == 0
    assert "epoch 20/20" in err              # the progress bar
    (run,) = os.listdir(tmp_path / "runs")
    folder = tmp_path / "runs" / run
    assert {"curves.png", "metrics.jsonl", "model.safetensors", "last.safetensors", "best.safetensors",
            "standardizer.safetensors"} <= set(os.listdir(folder))
    records = _records(folder)
    test = records[-1]
    # The default run reaches 98.3% (seed 0); seeds 1 and 2 give 99.4% and 96.7%: the bar sits
    # several test samples below the lowest, far more than a BLAS's rounding moves.
    assert test["split"] == "test" and test["accuracy"] >= 0.95
    assert f"test accuracy of the final weights (step {test['step']}): {test['accuracy']:.2%}" in out
    assert f"wrote runs/{run}/: model.safetensors, standardizer.safetensors, curves.png, metrics.jsonl, " \
           "last.safetensors, best.safetensors" in out  # every file the run wrote, named
    assert run.startswith("train-digits-mlp-") and f"writing to runs/{run}" in out
    assert len(records) == 21 and records[-2]["epoch"] == 20.0
    assert (folder / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from minidl.train.classifiers import build_model
    model = build_model("mlp", (1, 8, 8), 10)
    model.load_state_dict(mdl.load(folder / "model.safetensors"))   # a plain state dict


def test_console_script_one_epoch_on_spirals(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "minidl", "train", "--data", "spirals", "--epochs", "1",
                           "--lr", "0.01", "--out", str(out), "--quiet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "test accuracy" in proc.stdout
    assert {"curves.png", "metrics.jsonl", "model.safetensors"} <= set(os.listdir(out))
    assert len(_records(out)) == 2


def test_resume_continues_the_same_run(tmp_path, capsys):
    common = ["train", "--quiet", "--schedule", "constant", "--dropout", "0.2", "--batch-size", "64"]
    assert _run(capsys, *common, "--epochs", "2", "--out", str(tmp_path / "straight"))[0] == 0
    assert _run(capsys, *common, "--epochs", "1", "--out", str(tmp_path / "split"))[0] == 0
    code, out, _ = _run(capsys, "train", "--quiet", "--epochs", "2",
                        "--resume", str(tmp_path / "split" / "last.safetensors"))
    assert code == 0 and "resuming at step" in out
    a = mdl.load(tmp_path / "straight" / "model.safetensors")
    b = mdl.load(tmp_path / "split" / "model.safetensors")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    steps = [r["step"] for r in _records(tmp_path / "split") if "split" not in r]
    assert steps == [23, 46]


def _write_idx(path, array):
    codes = {np.uint8: 0x08}
    header = bytes([0, 0, codes[array.dtype.type], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def test_cnn_on_mnist_files(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        labels = np.arange(n, dtype=np.uint8) % 3
        images = np.zeros((n, 28, 28), np.uint8)
        for i, label in enumerate(labels):   # a bright bar whose position is the class
            images[i, 4 + 8 * label: 8 + 8 * label, 4:24] = 200
        images = np.clip(images + rng.integers(0, 40, images.shape), 0, 255).astype(np.uint8)
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", labels)
    code, out, err = _run(capsys, "train", "--data", f"mnist:{tmp_path}", "--model", "cnn", "--epochs", "2",
                          "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0, err
    assert "cnn on mnist" in out and "54 training / 6 validation / 20 test" in out


@pytest.mark.parametrize("argv, message", [
    (["--batch-size", "0"], "must be a positive integer"),
    (["--batch-size", "-3"], "must be a positive integer"),
    (["--epochs", "0"], "must be a positive integer"),
    (["--lr", "-1"], "must be a positive number"),
    (["--data", "cifar"], "expected digits, spirals or mnist:PATH"),
])
def test_bad_arguments_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(["train", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_data_path(tmp_path, capsys):
    code, _, err = _run(capsys, "train", "--data", f"mnist:{tmp_path / 'nowhere'}", "--quiet",
                        "--out", str(tmp_path / "run"))
    assert code == 2 and "does not exist" in err and "train-images-idx3-ubyte" in err
    code, _, err = _run(capsys, "train", "--data", f"mnist:{tmp_path}", "--quiet", "--out", str(tmp_path / "run"))
    assert code == 2 and "Put these files there" in err and "train-images-idx3-ubyte" in err


def test_cnn_on_one_dimensional_data(tmp_path, capsys):
    code, _, err = _run(capsys, "train", "--data", "spirals", "--model", "cnn", "--quiet",
                        "--out", str(tmp_path / "run"))
    assert code == 2 and "needs images" in err and "(2,)" in err and "--model mlp" in err


def test_unknown_optimizer_and_bad_resume(tmp_path, capsys):
    code, _, err = _run(capsys, "train", "--optimizer", "sgdx", "--quiet", "--out", str(tmp_path / "a"))
    assert code == 2 and "unknown optimizer" in err and "adamw" in err
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint at all")
    code, _, err = _run(capsys, "train", "--resume", str(garbage), "--quiet")
    assert code == 2 and "not a complete safetensors file" in err


def test_diagnose_command(capsys):
    code, out, _ = _run(capsys, "diagnose", "--steps", "100")
    assert code == 0
    assert "initial loss" in out and "overfit 2 samples" in out and "zeroed inputs" in out and "random inputs" in out
    assert "dead ReLU" in out and "5 of 5 checks passed" in out


@pytest.fixture(scope="module")
def spirals_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("spirals")
    assert main(["train", "--data", "spirals", "--epochs", "1", "--lr", "0.01", "--quiet", "--out", str(out)]) == 0
    return out


def _damage_last(run, folder, damage):
    state = mdl.load(run / "last.safetensors")
    damage(state)
    target = folder / "run"
    target.mkdir()
    mdl.save(state, target / "last.safetensors")
    return target / "last.safetensors"


@pytest.mark.parametrize("part, damage", [
    ("scheduler", lambda s: s["scheduler"].__setitem__("T", s["scheduler"].pop("t"))),
    ("loader", lambda s: s["loader"].__setitem__("seed", "zero")),
    ("rng", lambda s: s["rng"]["python"].__setitem__(0, "three")),
    ("optimizer", lambda s: s["optimizer"]["state"][0].pop("v")),
    ("run setting batch_size", lambda s: s["extra"]["settings"].__setitem__("batch_size", "many")),
    ("run setting device", lambda s: s["extra"]["settings"].__setitem__("device", "tpu")),
])
def test_resume_from_a_damaged_checkpoint_exits_2_with_one_line(tmp_path, capsys, spirals_run, part, damage):
    path = _damage_last(spirals_run, tmp_path, damage)
    before = path.read_bytes()
    code, out, err = _run(capsys, "train", "--resume", str(path), "--epochs", "2", "--quiet")
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("minidl train: error: cannot resume") and part in err
    assert "Traceback" not in err and out == ""
    assert path.read_bytes() == before and set(os.listdir(path.parent)) - {".lock"} == {"last.safetensors"}


def test_resume_from_a_checkpoint_with_bytes_zeroed_in_place_exits_2_naming_the_tensor(tmp_path, capsys,
                                                                                       spirals_run):
    import json
    import shutil
    import struct

    target = tmp_path / "run"
    target.mkdir()
    path = target / "last.safetensors"
    shutil.copy(spirals_run / "last.safetensors", path)
    raw = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:start])
    name, entry = max(((n, e) for n, e in header.items() if n != "__metadata__"),
                      key=lambda item: item[1]["data_offsets"][1] - item[1]["data_offsets"][0])
    begin = start + entry["data_offsets"][0]
    assert entry["data_offsets"][1] - entry["data_offsets"][0] >= 200
    raw[begin:begin + 200] = bytes(200)           # a safetensors file has no checksum of its own: still valid
    path.write_bytes(bytes(raw))
    code, out, err = _run(capsys, "train", "--resume", str(path), "--epochs", "2", "--quiet")
    assert code == 2                              # before: resumed and trained on the zeroed weights, exit 0
    assert err.count("\n") == 1 and err.startswith("minidl train: error: cannot resume")
    assert f"the bytes of the tensor '{name}' do not match the checksum" in err and out == ""


def test_resume_without_the_checkpoints_gpu_says_how_to_resume_on_the_cpu(tmp_path, capsys, spirals_run,
                                                                           monkeypatch):
    from minidl import backend

    def no_gpu():
        raise RuntimeError("device 'cuda': no GPU found on this machine")

    path = _damage_last(spirals_run, tmp_path, lambda s: s["extra"]["settings"].__setitem__("device", "cuda"))
    monkeypatch.setattr(backend, "cupy_module", no_gpu)
    code, out, err = _run(capsys, "train", "--resume", str(path), "--epochs", "2", "--quiet")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no GPU found" in err and "'cuda' is the resumed run's; --device cpu resumes it on the CPU" in err
    code, out, _ = _run(capsys, "train", "--resume", str(path), "--epochs", "2", "--quiet", "--device", "cpu")
    assert code == 0 and "resuming at step" in out


def test_resumed_run_writes_each_metrics_record_once(tmp_path, capsys, spirals_run):
    path = _damage_last(spirals_run, tmp_path, lambda s: None)
    step = int(mdl.load(path)["trainer"]["step"])
    with open(path.parent / "metrics.jsonl", "w") as f:   # what a run killed after its checkpoint left
        f.write(f'{{"step": {step}, "epoch": 1.0}}\n{{"step": {2 * step}, "epoch": 2.0, "killed": 1}}\n{{"ste')
    assert _run(capsys, "train", "--resume", str(path), "--epochs", "2", "--quiet")[0] == 0
    records = _records(path.parent)
    assert [(r["step"], r.get("split")) for r in records] == [(step, None), (2 * step, None), (2 * step, "test")]
    assert not any("killed" in r for r in records)
