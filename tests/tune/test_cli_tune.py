"""``minidl tune``: each strategy writes its table and plot and prints the best configuration."""
import csv
import json

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
