"""``minidl gpt train`` and ``gpt sample`` at the edges: short runs, the run folder, bad flags, damaged run files."""
import json
import os

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from tests.cli_helpers import run_cli as _run

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16", "--batch-size", "4",
        "--warmup", "1", "--quiet"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt") / "run"
    assert main(["gpt", "train", "--steps", "3", *TINY, "--out", str(out)]) == 0
    return out


def test_a_run_shorter_than_eval_every_writes_its_checkpoint_and_metrics(tmp_path, capsys):
    out = tmp_path / "run"
    code, printed, _ = _run(capsys, "gpt", "train", "--steps", "6", *TINY, "--out", str(out))   # eval every 100
    assert code == 0
    assert f"wrote {out}/: gpt.safetensors, last.safetensors, loss.png, metrics.jsonl;" in printed
    assert mdl.load(out / "last.safetensors")["trainer"]["step"] == 6
    with open(out / "metrics.jsonl") as f:
        (record,) = [json.loads(line) for line in f]
    assert record["step"] == 6 and np.isfinite(record["val_loss"])
    assert f"validation loss {record['val_loss']:.4f} nats after 6 steps" in printed
    # and it resumes from there
    assert _run(capsys, "gpt", "train", "--steps", "8", "--quiet", "--resume", str(out / "last.safetensors"))[0] == 0
    assert mdl.load(out / "last.safetensors")["trainer"]["step"] == 8


def test_the_closing_line_names_only_files_that_exist(tmp_path, capsys, monkeypatch):
    from minidl.train import curves
    monkeypatch.setattr(curves, "plot_curves", lambda *a, **k: None)   # a run that drew no loss.png
    import minidl.train
    monkeypatch.setattr(minidl.train, "plot_curves", lambda *a, **k: None)
    out = tmp_path / "run"
    code, printed, _ = _run(capsys, "gpt", "train", "--steps", "2", *TINY, "--out", str(out))
    assert code == 0 and not (out / "loss.png").exists()
    assert f"wrote {out}/: gpt.safetensors, last.safetensors, metrics.jsonl;" in printed


def test_block_size_longer_than_the_text_names_the_flag(capsys):
    code, printed, err = _run(capsys, "gpt", "train", "--block-size", "100000000", "--steps", "1", "--quiet")
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert err.startswith("minidl gpt train: error: --block-size 100000000 is longer than the validation text "
                          "allows (at most ")


def test_a_second_run_into_a_used_folder_is_refused_and_default_names_do_not_collide(tmp_path, capsys, short_run,
                                                                                      monkeypatch):
    code, printed, err = _run(capsys, "gpt", "train", "--steps", "2", *TINY, "--out", str(short_run))
    assert code == 2 and err.count("\n") == 1 and "already holds a run" in err and "--overwrite" in err
    monkeypatch.chdir(tmp_path)
    os.makedirs(os.path.join("runs", "gpt"))   # taken (say, by a run starting now)
    code, printed, _ = _run(capsys, "gpt", "train", "--steps", "2", *TINY)
    assert code == 0 and f"writing to {os.path.join('runs', 'gpt-2')}" in printed
    assert os.path.exists(os.path.join("runs", "gpt-2", "gpt.safetensors"))


def _greedy(run, prompt, n):
    from minidl.models.gpt_train import load_run
    model, tok = load_run(str(run))
    ids = list(tok.encode(prompt))
    with mdl.no_grad():
        for _ in range(n):
            logits = model(np.array([ids[-model.config.block_size:]])).numpy()[0, -1]
            ids.append(int(np.argmax(logits)))
    return tok.decode(np.array(ids))


def test_a_temperature_that_overflows_the_softmax_samples_greedily(capsys, short_run):
    code, printed, err = _run(capsys, "gpt", "sample", "--run", str(short_run), "--prompt", "ROMEO:",
                              "--tokens", "20", "--temperature", "1e-310")
    assert code == 0 and err == ""
    assert printed == _greedy(short_run, "ROMEO:", 20) + "\n"
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            main(["gpt", "sample", "--run", str(short_run), "--temperature", bad])
        assert "--temperature" in capsys.readouterr().err


def test_tokens_are_bounded_and_ctrl_c_stops_cleanly(capsys, short_run, monkeypatch):
    with pytest.raises(SystemExit):
        main(["gpt", "sample", "--run", str(short_run), "--tokens", "100000000"])
    assert "at most 10,000 characters per sample" in capsys.readouterr().err
    from minidl.models.gpt import GPT

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(GPT, "generate", interrupted)
    code, printed, err = _run(capsys, "gpt", "sample", "--run", str(short_run), "--num-samples", "2")
    assert code == 130 and printed == "" and err == "minidl gpt sample: stopped (Ctrl-C) after 0 of 2 samples\n"


@pytest.mark.parametrize("damage, words", [
    (lambda s: s["config"].__setitem__("n_layers", 2), "unknown config key 'n_layers'"),
    (lambda s: s["config"].__setitem__("n_embd", "16"), "config key 'n_embd' holds '16', not a positive integer"),
    (lambda s: s["tokenizer"].__setitem__("chars", s["tokenizer"]["chars"][:-5]),
     "characters and its config key vocab_size says"),
    (lambda s: s["config"].pop("vocab_size"), "its config lacks the key 'vocab_size'"),
    (lambda s: s["config"].__setitem__("n_head", 3), "its config does not make a GPT"),
])
def test_a_damaged_run_file_is_reported_in_one_line_naming_the_file_and_the_key(tmp_path, capsys, short_run,
                                                                                 damage, words):
    saved = mdl.load(short_run / "gpt.safetensors")
    damage(saved)
    path = tmp_path / "gpt.safetensors"
    mdl.save(saved, path)
    code, printed, err = _run(capsys, "gpt", "sample", "--run", str(path))
    assert code == 1 and printed == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"minidl gpt sample: error: {path} is damaged: ") and words in err


def test_a_full_disk_during_gpt_training_is_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    import errno

    from minidl import serialization
    real, calls = serialization.atomic_write, []

    def atomic_write(path, write_to):   # the second last.safetensors meets a full disk, part-way through
        if os.path.basename(path) == "last.safetensors":
            calls.append(path)
            if len(calls) == 2:
                def full(tmp):
                    with open(tmp, "wb") as f:
                        f.write(b"\0" * 64)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real(path, full)
        return real(path, write_to)

    monkeypatch.setattr(serialization, "atomic_write", atomic_write)
    out = tmp_path / "run"
    code, printed, err = _run(capsys, "gpt", "train", "--steps", "6", "--eval-every", "2", *TINY, "--out", str(out))
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"minidl gpt train: error: cannot write {out / 'last.safetensors'}: No space left on "
                          "device (errno 28, ENOSPC)")
    assert mdl.load(out / "last.safetensors")["trainer"]["step"] == 2      # the last good checkpoint, whole


def test_a_run_shorter_than_its_warmup_ends_at_min_lr_and_never_below():
    """8 steps with the default warmup of 60: the ramp takes half the run, the cosine the rest, down to min_lr."""
    import math

    from minidl.models.gpt_train import DEFAULTS, train
    s = dict(DEFAULTS, n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, steps=8, eval_every=4)
    lr, low = s["lr"], s["min_lr"]
    got = train(s, None, show=False)["trainer"].steps["lr"]
    # by hand: W = min(60, 8 // 2) = 4 ramp steps from lr/20, then a cosine over the last 4 steps (t = 4 … 7)
    ramp = [lr * (1 / 20 + 19 / 20 * t / 4) for t in range(4)]
    cosine = [low + (lr - low) * (1 + math.cos(math.pi * (t - 4) / 3)) / 2 for t in range(4, 8)]
    np.testing.assert_allclose(got, ramp + cosine, rtol=1e-12)
    assert got[-1] == pytest.approx(low, rel=1e-12) and min(got[4:]) >= low * (1 - 1e-12)


def test_sampling_on_a_terminal_shows_a_bar_over_the_tokens_and_prints_the_same_text(capsys, short_run,
                                                                                      monkeypatch):
    import io
    import sys

    from minidl.models.gpt_train import load_run
    model, tok = load_run(str(short_run))
    counts = []
    with_hook = model.generate(tok.encode("ROMEO:")[None], 7, generator=np.random.default_rng(3),
                               on_token=counts.append)
    np.testing.assert_array_equal(with_hook, model.generate(tok.encode("ROMEO:")[None], 7,
                                                            generator=np.random.default_rng(3)))
    assert counts == [1, 2, 3, 4, 5, 6, 7]  # called once per drawn token

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code, printed, _ = _run(capsys, "gpt", "sample", "--run", str(short_run), "--prompt", "ROMEO:",
                            "--tokens", "20", "--temperature", "1e-310")
    assert code == 0 and printed == _greedy(short_run, "ROMEO:", 20) + "\n"  # the bar is on stderr only
    assert "sample 1/1" in terminal.getvalue() and "/20" in terminal.getvalue()
