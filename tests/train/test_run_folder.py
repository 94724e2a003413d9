"""A run folder belongs to one run: the lock, --resume / --overwrite, atomic default names, write checks."""
import datetime
import errno
import os
import subprocess
import sys
import textwrap

import pytest

import minidl as mdl
from minidl import serialization
from minidl.cli import default_out
from minidl.train.run_folder import RunFolderError, claim, default_name
from tests.cli_helpers import metrics_records as _records
from tests.cli_helpers import run_cli as _run

SPIRALS = ["train", "--data", "spirals", "--lr", "0.01", "--quiet", "--batch-size", "128"]


def test_a_second_run_into_a_locked_folder_exits_2_naming_the_folder_and_the_process(tmp_path, capsys):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from minidl.train.run_folder import claim
            held = claim("train", {str(folder)!r})
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, err = _run(capsys, *SPIRALS, "--epochs", "1", "--out", str(folder))
        assert code == 2 and out == ""
        assert err == f"minidl train: error: {folder} is in use by another run (process {holder.pid}); wait for " \
                      "it to end, or choose another --out\n"
        assert sorted(os.listdir(folder)) == [".lock"]  # nothing of the second run was written
    finally:
        holder.communicate("", timeout=30)
    # the holder has ended: its lock went with it (no stale lock), and the folder is free
    assert _run(capsys, *SPIRALS, "--epochs", "1", "--out", str(folder))[0] == 0


def test_the_lock_is_held_for_the_whole_run_and_released_after(tmp_path, capsys, monkeypatch):
    from minidl.train import Trainer
    seen = []
    real_fit = Trainer.fit

    def fit_and_try_a_second_claim(self, *args, **kwargs):  # a second run starting while this one trains
        with pytest.raises(RunFolderError, match=f"in use by another run \\(process {os.getpid()}\\)"):
            claim("train", str(tmp_path / "run"))
        seen.append(True)
        return real_fit(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "fit", fit_and_try_a_second_claim)
    assert _run(capsys, *SPIRALS, "--epochs", "1", "--out", str(tmp_path / "run"))[0] == 0
    assert seen == [True]
    claim("train", str(tmp_path / "other")).release()
    with claim("predict", str(tmp_path / "run")) as held:   # released when the command ended
        assert held.path == str(tmp_path / "run")


def test_a_finished_run_is_refused_unless_resumed_or_overwritten(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert _run(capsys, *SPIRALS, "--epochs", "1", "--out", out)[0] == 0
    model = (tmp_path / "run" / "model.safetensors").read_bytes()
    code, printed, err = _run(capsys, *SPIRALS, "--epochs", "1", "--out", out, "--seed", "1")
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert f"{out} already holds a run (model.safetensors, standardizer.safetensors, curves.png, metrics.jsonl, " \
           "last.safetensors, best.safetensors); continue it with --resume, start it again with --overwrite" in err
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == model and len(_records(out)) == 2

    (tmp_path / "run" / "notes.txt").write_text("mine")          # not a run file: --overwrite keeps it
    assert _run(capsys, *SPIRALS, "--epochs", "2", "--out", out, "--overwrite", "--seed", "1")[0] == 0
    records = _records(out)   # the new run's two epochs and its test line, none of the old run's
    assert [r.get("epoch", r.get("split")) for r in records] == [1.0, 2.0, "test"]
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "run" / "model.safetensors").read_bytes() != model

    code, printed, err = _run(capsys, "train", "--quiet", "--epochs", "3", "--overwrite",
                              "--resume", os.path.join(out, "last.safetensors"))
    assert code == 2 and "--overwrite starts the run again and --resume continues it" in err
    assert _run(capsys, "train", "--quiet", "--epochs", "3", "--resume", os.path.join(out, "last.safetensors"))[0] == 0
    # continued: epoch 3 and its test line after the first end's
    assert [r.get("epoch", r.get("split")) for r in _records(out)] == [1.0, 2.0, "test", 3.0, "test"]


def test_default_names_are_taken_atomically(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    # Two runs started in the same second: each call takes (creates) its folder, so the second
    # never gets the first one's name, even before the first has written anything.
    first, second = default_out("bench", now), default_out("bench", now)
    assert (first, second) == ("runs/bench-20260102-030405", "runs/bench-20260102-030405-2")
    assert os.path.isdir(first) and os.path.isdir(second)
    assert default_name("bench", now=now) == "runs/bench-20260102-030405-3"


def test_default_names_of_runs_started_together_never_collide(tmp_path):
    script = textwrap.dedent(f"""
        import datetime, os
        from minidl.train.run_folder import default_name
        os.chdir({str(tmp_path)!r})
        print(default_name("train", now=datetime.datetime(2026, 1, 2, 3, 4, 5)))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(6)]
    names = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert len(set(names)) == 6 and all(p.returncode == 0 for p in procs)


def test_a_folder_that_cannot_be_made_exits_2_before_training(tmp_path, capsys):
    (tmp_path / "file").write_text("in the way")
    out = str(tmp_path / "file" / "run")
    code, printed, err = _run(capsys, *SPIRALS, "--epochs", "1", "--out", out)
    assert code == 2 and printed == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"minidl train: error: cannot create the run folder {out}: Not a directory "
                          "(errno 20, ENOTDIR)")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_exits_2_before_training(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        code, printed, err = _run(capsys, *SPIRALS, "--epochs", "1", "--out", str(folder))
    finally:
        folder.chmod(0o700)
    assert code == 2 and printed == "" and err.count("\n") == 1
    assert err.startswith(f"minidl train: error: cannot write to the run folder {folder}: Permission denied")


def test_the_write_check_runs_before_any_work(tmp_path, monkeypatch):
    """The probe file is created and removed: a folder where files cannot be created is refused at once."""
    import minidl.train.run_folder as rf
    real_open = open

    def refusing_open(path, *args, **kwargs):   # a folder that takes the lock file but no new file
        if os.path.basename(str(path)).startswith(".write-check-"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(rf, "open", refusing_open, raising=False)
    with pytest.raises(RunFolderError, match="cannot write to the run folder .*: Permission denied "
                                             r"\(errno 13, EACCES\)"):
        claim("train", str(tmp_path / "run"))
    monkeypatch.undo()
    claim("train", str(tmp_path / "run")).release()   # the lock was released by the failed claim
    assert os.listdir(tmp_path / "run") == [".lock"]   # and the probe is gone


def _full_disk_at(monkeypatch, name, nth):
    """Make the ``nth`` write of a file called ``name`` fail as a full disk does: part written, then ENOSPC."""
    real, calls = serialization.atomic_write, []

    def atomic_write(path, write_to):
        if os.path.basename(os.fspath(path)) == name:
            calls.append(path)
            if len(calls) == nth:
                def half_then_full(tmp):
                    with open(tmp, "wb") as f:
                        f.write(b"\0" * 100)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))   # as f.write on a full disk: no name
                return real(path, half_then_full)
        return real(path, write_to)

    monkeypatch.setattr(serialization, "atomic_write", atomic_write)


def test_a_full_disk_during_the_run_exits_2_in_one_line_keeping_the_last_checkpoint(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    _full_disk_at(monkeypatch, "last.safetensors", 2)   # the checkpoint after epoch 2
    code, printed, err = _run(capsys, *SPIRALS, "--epochs", "3", "--out", str(out))
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert err == f"minidl train: error: cannot write {out / 'last.safetensors'}: No space left on device " \
                  "(errno 28, ENOSPC); the files written before it are kept, whole (a checkpoint is written to " \
                  "a temporary file, then renamed)\n"
    state = mdl.load(out / "last.safetensors")          # epoch 1's checkpoint, whole
    assert state["trainer"]["epoch"] == 1
    assert not [n for n in os.listdir(out) if n.startswith(".tmp-")]   # no temporary left behind
    monkeypatch.undo()
    assert _run(capsys, "train", "--quiet", "--epochs", "3", "--resume", str(out / "last.safetensors"))[0] == 0


def test_a_full_disk_writing_the_metrics_names_the_file(tmp_path, capsys, monkeypatch):
    from minidl.train import callbacks
    out = tmp_path / "run"
    real_open = open

    class FullFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def open_full(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return FullFile(f) if str(path).endswith("metrics.jsonl") and "a" in mode else f

    monkeypatch.setattr(callbacks, "open", open_full, raising=False)
    code, printed, err = _run(capsys, *SPIRALS, "--epochs", "2", "--out", str(out))
    assert code == 2 and err.startswith(f"minidl train: error: cannot write {out / 'metrics.jsonl'}: No space "
                                        "left on device (errno 28, ENOSPC)")
