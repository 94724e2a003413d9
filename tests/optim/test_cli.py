"""`minidl optimizers` and `minidl lr-find` through the command-line entry point."""
from minidl.cli import main


def test_optimizers_command(tmp_path, capsys, monkeypatch):
    """The wiring only: the figure itself is tested in test_trajectories.py."""
    from minidl.optim import trajectories
    calls = []
    monkeypatch.setattr(trajectories, "optimizers_command", lambda out, steps: calls.append((out, steps)) or out)
    assert main(["optimizers", "--out", str(tmp_path / "grid.png"), "--steps", "10"]) == 0
    assert calls == [(str(tmp_path / "grid.png"), 10)]
    assert "wrote" in capsys.readouterr().out


def test_lr_find_command(tmp_path, monkeypatch):
    """The wiring only: the command itself is tested in test_lr_finder.py."""
    from minidl.optim import lr_finder
    calls = []
    monkeypatch.setattr(lr_finder, "lr_find_command", lambda out, **kw: calls.append((out, kw)) or out)
    assert main(["lr-find", "--out", str(tmp_path / "lr.png"), "--steps", "20", "--optimizer", "adam"]) == 0
    out, kw = calls[0]
    assert out == str(tmp_path / "lr.png") and kw["steps"] == 20 and kw["optimizer"] == "adam"
    assert kw["lr_min"] == 1e-5 and kw["lr_max"] == 1.0
    assert main(["lr-find", "--lr-min", "1", "--lr-max", "0.5"]) == 2
