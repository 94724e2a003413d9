"""``minidl predict`` checks its inputs before it works: non-finite rows, labels that are not classes, damaged files."""
import os
import sys

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main


@pytest.fixture(scope="module")
def spirals_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("spirals") / "run"
    assert main(["train", "--data", "spirals", "--epochs", "1", "--lr", "0.01", "--quiet", "--out", str(out)]) == 0
    return out


def _predict(capsys, run, tmp_path, *argv):
    code = main(["predict", str(run), "--out", str(tmp_path / "p"), *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_nan_and_infinite_rows_are_refused_naming_the_first_rows(tmp_path, capsys, spirals_run):
    x = np.random.default_rng(0).standard_normal((12, 2))
    x[[2, 5, 6, 7, 9, 11], [0, 1, 0, 1, 0, 0]] = [np.nan, np.inf, np.nan, -np.inf, np.nan, np.nan]
    np.savetxt(tmp_path / "x.csv", x, delimiter=",")
    code, out, err = _predict(capsys, spirals_run, tmp_path, "--inputs", str(tmp_path / "x.csv"))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{tmp_path / 'x.csv'} has NaN or infinite values in 6 of its 12 rows (rows 3, 6, 7, 8, 10, ..., " \
           "counting from 1)" in err
    assert not (tmp_path / "p").exists()   # nothing written


@pytest.mark.parametrize("labels, words", [
    ([0, 1, 2.7, 1], "1 labels that are not classes of the run (integers 0 to 1): row 3: 2.7"),
    ([0, -1, 1, 99], "2 labels that are not classes of the run (integers 0 to 1): row 2: -1, row 4: 99"),
    ([0, 1, np.nan, 1], "row 3: nan"),
])
def test_labels_that_are_not_classes_are_refused(tmp_path, capsys, spirals_run, labels, words):
    np.savetxt(tmp_path / "x.csv", np.zeros((4, 2)), delimiter=",")
    np.save(tmp_path / "y.npy", np.array(labels, dtype=np.float64))
    code, out, err = _predict(capsys, spirals_run, tmp_path, "--inputs", str(tmp_path / "x.csv"),
                              "--labels", str(tmp_path / "y.npy"))
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err
    np.save(tmp_path / "y.npy", np.array([0, 1, 1, 0]))    # integer classes: accepted
    code, out, _ = _predict(capsys, spirals_run, tmp_path, "--inputs", str(tmp_path / "x.csv"),
                            "--labels", str(tmp_path / "y.npy"), "--overwrite")
    assert code == 0 and "accuracy:" in out


def test_a_bfloat16_model_without_ml_dtypes_is_one_line(tmp_path, capsys, spirals_run, monkeypatch):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    run = tmp_path / "run"
    run.mkdir()
    for name in ("standardizer.safetensors", "last.safetensors"):
        (run / name).write_bytes((spirals_run / name).read_bytes())
    weights = mdl.load(spirals_run / "model.safetensors")
    mdl.save({k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}, run / "model.safetensors")
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)      # as on a machine without it
    code, out, err = _predict(capsys, run, tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"minidl predict: error: load: {os.path.join(run, 'model.safetensors')} holds the "
                          "bfloat16 (BF16) array") and "pip install 'minidl[bf16]'" in err


def test_a_model_file_in_a_symlink_loop_is_one_line(tmp_path, capsys, spirals_run):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("standardizer.safetensors", "last.safetensors"):
        (run / name).write_bytes((spirals_run / name).read_bytes())
    os.symlink(run / "loop", run / "model.safetensors")
    os.symlink(run / "model.safetensors", run / "loop")
    code, out, err = _predict(capsys, run, tmp_path)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "Too many levels of symbolic links (errno 40, ELOOP)" in err
