"""``minidl tune``: each strategy writes its table and plot and prints the best configuration."""
import csv
import io
import json
import sys

import pytest

from minidl.cli import build_parser, main


def _run(tmp_path, *argv):
    out = tmp_path / "run"
    code = main(["tune", "--batch-size", "128", "--optimizer", "sgd", "--out", str(out), *argv])
    return code, out


def test_halving_writes_the_table_and_plot(tmp_path, capsys):
    code, out = _run(tmp_path, "--strategy", "halving", "--trials", "3", "--epochs", "3",
                     "--param", "lr=log:1e-3:0.3", "--param", "weight_decay=1e-4")
    text = capsys.readouterr().out
    assert code == 0
    rows = list(csv.DictReader(open(out / "trials.csv")))
    assert [(r["rung"], r["epochs"]) for r in rows] == [("0", "1")] * 3 + [("1", "3")]  # rungs (3, 1), (1, 3)
    assert all(float(r["weight_decay"]) == 1e-4 for r in rows)
    assert len(open(out / "trials.jsonl").readlines()) == 4 and (out / "scores.png").stat().st_size > 1000
    assert "4 trials, 5 epochs trained" in text and "train it: minidl train --data digits" in text
    best = max((r for r in rows if r["epochs"] == "3"), key=lambda r: float(r["val_accuracy"]))
    assert f"--lr {float(best['lr']):g}" in text


def test_lr_sweep_takes_the_largest_stable_rate(tmp_path, capsys):
    code, out = _run(tmp_path, "--strategy", "lr-sweep", "--epochs", "1", "--optimizer", "adam")
    text = capsys.readouterr().out
    lines = [json.loads(line) for line in open(out / "trials.jsonl")]
    stable = [line["lr"] for line in lines if line["status"] == "ok"]
    assert code == 0 and lines[-1]["status"] == "diverged"  # Adam diverges before lr = 1 on digits
    assert f"did not diverge: {max(stable):g}" in text
    assert [line["lr"] for line in lines] == sorted(line["lr"] for line in lines)


def test_tpe_from_the_command_line(tmp_path, capsys):
    pytest.importorskip("optuna")
    code, out = _run(tmp_path, "--strategy", "tpe", "--trials", "2", "--epochs", "1", "--preset", "weight-decay",
                     "--metric", "val_loss")
    assert code == 0 and len(list(csv.DictReader(open(out / "trials.csv")))) == 2
    assert "val_loss" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--param", "momentum=log:0.1:1"], ["--param", "lr=log:1"],
                                  ["--strategy", "annealing"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["tune", *argv])
    assert exc.value.code == 2


@pytest.mark.parametrize("argv, message", [(["--data", "nowhere"], "nowhere"), (["--eta", "1"], "eta"),
                                           (["--strategy", "halving", "--min-epochs", "5", "--epochs", "3"],
                                            "min_epochs")])
def test_bad_settings_fail_before_writing(tmp_path, capsys, argv, message):
    code, out = _run(tmp_path, *argv)
    assert code == 2 and not out.exists() and message in capsys.readouterr().err


@pytest.mark.parametrize("param, message", [
    ("dropout=uniform:0:1.5", "--param dropout: the range Uniform(0, 1.5) reaches 1.5, and dropout must be a number "
                              "in [0, 1)"),
    ("lr=uniform:-0.1:0.5", "reaches -0.1, and lr must be a number > 0"),
    ("batch_size=uniform:16:64", "--param batch_size: Uniform(16, 64) draws fractions"),
    ("batch_size=int:0:64", "reaches 0, and batch_size must be a whole number >= 1"),
    ("optimizer=choice:adam,adamm", "reaches 'adamm', and optimizer must be a minidl.optim optimizer's name"),
    ("schedule=choice:cosine,linear", "reaches 'linear'"),
    ("label_smoothing=2", "reaches 2, and label_smoothing must be a number in [0, 1]"),
    ("accumulate=choice:1,2.5", "reaches 2.5"),
])
def test_every_range_is_checked_against_its_domain_before_the_first_trial(tmp_path, capsys, monkeypatch, param,
                                                                          message):
    from minidl.tune.objective import TrainerObjective
    calls = []
    monkeypatch.setattr(TrainerObjective, "__call__", lambda self, *a, **k: calls.append(a))
    code, out = _run(tmp_path, "--strategy", "random", "--trials", "3", "--epochs", "1", "--param", param)
    err = capsys.readouterr().err
    assert code == 2 and calls == [] and not out.exists()
    assert err.count("\n") == 1 and message in err and "nothing was trained" in err


def test_trials_csv_is_written_as_trials_finish_and_kept_when_a_later_one_fails(tmp_path, capsys, monkeypatch):
    from minidl.tune.objective import TrainerObjective
    real, seen = TrainerObjective.__call__, []

    def third_fails(self, config, epochs, key=None):
        seen.append(config)
        if len(seen) == 3:
            rows = list(csv.DictReader(open(tmp_path / "run" / "trials.csv")))
            assert [float(r["lr"]) for r in rows] == [c["lr"] for c in seen[:2]]   # on disk before trial 3 ends
            raise ValueError("the third trial could not run")
        return real(self, config, epochs, key=key)

    monkeypatch.setattr(TrainerObjective, "__call__", third_fails)
    code, out = _run(tmp_path, "--strategy", "random", "--trials", "4", "--epochs", "1", "--param", "lr=log:1e-3:0.1")
    err = capsys.readouterr().err
    assert code == 2 and err == f"minidl tune: error: the third trial could not run; the finished trials are in " \
                                f"{out / 'trials.csv'}\n"
    rows = list(csv.DictReader(open(out / "trials.csv")))
    assert [float(r["lr"]) for r in rows] == [c["lr"] for c in seen[:2]]
    assert len(open(out / "trials.jsonl").readlines()) == 2


def test_a_second_search_into_the_same_folder_is_refused(tmp_path, capsys):
    args = ("--strategy", "grid", "--points", "1", "--epochs", "1", "--param", "lr=0.05")
    assert _run(tmp_path, *args)[0] == 0
    assert "wrote" in capsys.readouterr().out
    code, out = _run(tmp_path, *args)
    err = capsys.readouterr().err
    assert code == 2 and "already holds a run (trials.csv, trials.jsonl, scores.png, curves.png)" in err
    assert _run(tmp_path, *args, "--overwrite")[0] == 0


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_best_line_is_the_first_row_and_a_bar_counts_the_trials(tmp_path, capsys, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # the bar shows on a terminal only
    code, out = _run(tmp_path, "--strategy", "random", "--trials", "3", "--epochs", "1", "--param",
                     "lr=log:1e-3:0.3")
    captured = capsys.readouterr()
    assert code == 0
    lines = captured.out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["number"])
    header, first = lines[at].split(), lines[at + 1].split()
    best = next(line for line in lines if line.startswith("best: "))
    assert float(best.split("lr=")[1].split()[0]) == pytest.approx(float(first[header.index("lr")]), rel=1e-3)
    assert f"val_accuracy {float(first[header.index('val_accuracy')]):.4g}" in best
    assert "3/3" in terminal.getvalue() and "trial" in terminal.getvalue()  # the bar, on stderr
    terminal.seek(0), terminal.truncate()
    code, _ = _run(tmp_path / "quiet", "--strategy", "random", "--trials", "2", "--epochs", "1", "--quiet")
    assert code == 0 and terminal.getvalue() == ""
