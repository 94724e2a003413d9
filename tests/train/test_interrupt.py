"""Ctrl-C during training: one line saying where the last checkpoint is and the command that continues;
``--resume`` takes the run folder; ``gpt sample`` reads an interrupted run; a short run's curves show their points."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import minidl as mdl
from minidl import nn
from minidl.cli.args import continue_command
from minidl.data import DataLoader
from minidl.train import Callback, ModelCheckpoint, Trainer, TrainingInterrupted
from minidl.train.run_folder import resume_checkpoint
from tests.cli_helpers import run_cli as _run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start(argv, tmp_path):
    """``python -m minidl *argv`` in a process of its own, with Ctrl-C's default handling (a test runner started
    in the background may ignore SIGINT, and its children would inherit that)."""
    return subprocess.Popen([sys.executable, "-m", "minidl", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=REPO),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _interrupt_after(job, path, extra_seconds=0.5, limit=180):
    """SIGINT to ``job`` once ``path`` exists; (exit code, stdout, stderr)."""
    until = time.monotonic() + limit
    while not os.path.exists(path):
        if job.poll() is not None or time.monotonic() > until:
            job.kill()
            raise AssertionError(f"{path} never appeared:\n{job.communicate()[1][-3000:]}")
        time.sleep(0.1)
    time.sleep(extra_seconds)
    job.send_signal(signal.SIGINT)
    out, err = job.communicate(timeout=60)
    return job.returncode, out, err


class _CtrlCAt(Callback):
    def __init__(self, step):
        self.at = step

    def on_step_end(self, trainer, step, logs):
        if step == self.at:
            raise KeyboardInterrupt


def _trainer(tmp_path, stop_at):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 2, size=40)
    mdl.manual_seed(0)
    model = nn.Linear(3, 2)
    return Trainer(model, mdl.optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=10),
                   DataLoader((x, y), batch_size=10), callbacks=[ModelCheckpoint(tmp_path), _CtrlCAt(stop_at)],
                   progress=False)


def test_fit_turns_ctrl_c_into_training_interrupted_naming_the_last_checkpoint(tmp_path):
    trainer = _trainer(tmp_path, stop_at=6)  # 4 steps an epoch: the epoch-end checkpoint is at step 4
    with pytest.raises(TrainingInterrupted) as caught:
        trainer.fit(5)
    exc = caught.value
    assert isinstance(exc, KeyboardInterrupt)
    assert (exc.step, exc.checkpoint, exc.checkpoint_step) == (6, os.path.join(tmp_path, "last.safetensors"), 4)
    assert f"the last checkpoint is {tmp_path}/last.safetensors (step 4)" in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__


def test_ctrl_c_before_any_checkpoint_says_there_is_none(tmp_path):
    with pytest.raises(TrainingInterrupted, match="no checkpoint was written yet") as caught:
        _trainer(tmp_path, stop_at=2).fit(5)
    assert caught.value.checkpoint is None


def test_ctrl_c_during_minidl_train_prints_one_line_and_the_command_that_continues(tmp_path, capsys):
    folder = tmp_path / "run"
    argv = ["train", "--data", "spirals", "--epochs", "400", "--lr", "0.01", "--quiet", "--out", str(folder)]
    code, out, err = _interrupt_after(_start(argv, tmp_path), folder / "last.safetensors")
    assert code == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("minidl train: stopped (Ctrl-C) at step ")
    # the newest checkpoint: last.safetensors, resumed through the folder, or best.safetensors when Ctrl-C landed
    # between the two writes of an epoch's end, named itself
    named = lines[0].split("the last checkpoint is ")[1].split(" (step ")[0]
    assert named in (f"{folder}/last.safetensors", f"{folder}/best.safetensors")
    target = folder if named.endswith("last.safetensors") else named
    command = f"minidl train --data spirals --epochs 400 --lr 0.01 --quiet --resume {target}"
    assert lines[0].endswith(f"continue with: {command}")
    # the folder form of --resume continues the run (one more epoch than the checkpoint holds)
    step = mdl.load(str(folder / "last.safetensors"))["trainer"]["step"]
    epochs = step // 25 + 1  # 25 batches an epoch
    code, out, err = _run(capsys, "train", "--resume", str(folder), "--epochs", str(epochs), "--quiet")
    assert code == 0, err
    assert f"resuming at step {step}" in out


def test_resume_takes_the_folder_or_the_file_and_says_what_a_folder_lacks(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "model.safetensors").write_bytes(b"")
    assert resume_checkpoint(str(tmp_path / "x.safetensors")) == str(tmp_path / "x.safetensors")
    with pytest.raises(FileNotFoundError, match=r"has no last.safetensors .*it holds model.safetensors"):
        resume_checkpoint(str(tmp_path / "run"))
    (tmp_path / "run" / "last.safetensors").write_bytes(b"")
    assert resume_checkpoint(str(tmp_path / "run")) == str(tmp_path / "run" / "last.safetensors")


def test_the_continue_command_drops_the_old_resume_out_and_overwrite():
    argv = ["gpt", "train", "--steps", "9", "--out", "runs/a", "--overwrite", "--resume=runs/a/last.safetensors"]
    assert continue_command(argv, "runs/a") == "minidl gpt train --steps 9 --resume runs/a"
    assert continue_command(["train", "--data-parallel"], "runs/my run", ranks=2) == \
        "mpiexec -n 2 python -m mpi4py -m minidl train --data-parallel --resume 'runs/my run'"


def test_ctrl_c_during_gpt_train_then_sample_from_the_interrupted_run(tmp_path, capsys):
    folder = tmp_path / "gpt"
    argv = ["gpt", "train", "--steps", "100000", "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
            "--block-size", "16", "--batch-size", "4", "--eval-every", "5", "--sample-every", "100000",
            "--warmup", "1", "--quiet", "--out", str(folder)]
    code, out, err = _interrupt_after(_start(argv, tmp_path), folder / "last.safetensors")
    assert code == 130 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"the last checkpoint is {folder}/last.safetensors" in err
    assert err.strip().endswith(f"continue with: minidl {' '.join(argv[:-2])} --resume {folder}")
    assert not (folder / "gpt.safetensors").exists()  # the run did not end: only its checkpoint
    from minidl.models.gpt_train import load_run
    model, tok = load_run(str(folder))
    saved = mdl.load(str(folder / "last.safetensors"))["model"]
    for name, value in model.state_dict().items():  # the checkpoint's weights, in a GPT of its settings
        np.testing.assert_array_equal(np.asarray(value), np.asarray(saved[name]))
    assert model.config.n_embd == 16 and model.config.block_size == 16
    from_file, _ = load_run(str(folder / "last.safetensors"))  # the checkpoint file named itself
    for name, value in from_file.state_dict().items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(saved[name]))
    code, out, err = _run(capsys, "gpt", "sample", "--run", str(folder), "--tokens", "12", "--prompt", "A")
    assert code == 0, err
    assert len(out) == 1 + 12 + 1 and out.startswith("A")  # the prompt, 12 characters, print's newline


def test_gpt_sample_names_the_files_it_needs(tmp_path, capsys):
    code, out, err = _run(capsys, "gpt", "sample", "--run", str(tmp_path))
    assert code == 1
    assert "neither gpt.safetensors" in err and "nor last.safetensors" in err and "train first" in err


@pytest.mark.parametrize("count", [1, 3])
def test_a_short_runs_per_step_curves_mark_every_point(count):
    from minidl.train.curves import make_figure
    steps = {"step": list(range(1, count + 1)), "loss": [2.0 - 0.1 * i for i in range(count)],
             "lr": [0.01] * count}
    history = [{"step": count, "epoch": 1.0, "train_loss": 1.9, "val_loss": 2.0, "lr": 0.01}]
    fig = make_figure(history, steps)
    loss_axis, lr_axis = fig.axes[0], fig.axes[1]
    (per_step,) = [line for line in loss_axis.get_lines() if line.get_label() == "train (each step)"]
    (lr_line,) = lr_axis.get_lines()
    for line in (per_step, lr_line):
        assert list(line.get_xdata()) == steps["step"]
        assert line.get_marker() not in (None, "None", "", " ") and line.get_markersize() >= 3


def test_a_long_runs_per_step_curve_stays_a_plain_line():
    from minidl.train.curves import FEW_POINTS, make_figure
    n = FEW_POINTS + 1
    fig = make_figure([{"step": n, "epoch": 1.0, "train_loss": 1.0, "val_loss": 1.0}],
                      {"step": list(range(1, n + 1)), "loss": [1.0] * n, "lr": [0.1] * n})
    (line,) = [each for each in fig.axes[0].get_lines() if len(each.get_xdata()) == n]
    assert line.get_marker() in (None, "None", "", " ")
