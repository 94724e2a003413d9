"""`minidl optimizers` and `minidl lr-find` through the command-line entry point."""
from minidl.cli import main


def test_optimizers_command(tmp_path, capsys, monkeypatch):
    """The wiring only: the figure itself is tested in test_trajectories.py."""
    from minidl.optim import trajectories
    calls = []
    monkeypatch.setattr(trajectories, "optimizers_command",
                        lambda out, steps, progress: calls.append((out, steps, progress)) or out)
    assert main(["optimizers", "--out", str(tmp_path / "figs"), "--steps", "10"]) == 0
    assert calls == [(str(tmp_path / "figs" / "optimizers.png"), 10, True)]  # --out is the folder
    out = capsys.readouterr().out
    assert f"writing to {tmp_path / 'figs'}/" in out and "wrote" in out


def test_optimizers_default_folder_and_progress(tmp_path, capsys, monkeypatch):
    """Without --out the PNG goes to runs/optimizers-<time>/; the runs show a progress bar."""
    monkeypatch.chdir(tmp_path)
    assert main(["optimizers", "--steps", "3"]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("optimizers-") and (folder / "optimizers.png").exists()
    captured = capsys.readouterr()
    assert f"wrote runs/{folder.name}/optimizers.png" in captured.out
    from minidl.optim.trajectories import LANDSCAPES, optimizer_families
    runs = len(LANDSCAPES) * sum(len(members) for members in optimizer_families().values())
    assert "optimizers: 100%" in captured.err and f"{runs}/{runs}" in captured.err  # tqdm's bar: every run counted


def test_lr_find_command(tmp_path, monkeypatch):
    """The wiring only: the command itself is tested in test_lr_finder.py."""
    from minidl.cli import optimizers
    calls = []
    monkeypatch.setattr(optimizers, "lr_find_command", lambda out, **kw: calls.append((out, kw)) or out)
    assert main(["lr-find", "--out", str(tmp_path / "lr"), "--steps", "20", "--optimizer", "adam"]) == 0
    out, kw = calls[0]
    assert out == str(tmp_path / "lr" / "lr_find.png") and kw["steps"] == 20 and kw["optimizer"] == "adam"
    assert kw["lr_min"] == 1e-5 and kw["lr_max"] == 1.0
    assert main(["lr-find", "--lr-min", "1", "--lr-max", "0.5"]) == 2
