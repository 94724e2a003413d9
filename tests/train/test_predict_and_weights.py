"""After `minidl train`: `minidl predict`, `load_run`, `minidl diagnose --weights`, and which loss is which."""
import json

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.data import digits
from minidl.train import load_run


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run") / "digits"
    assert main(["train", "--epochs", "2", "--quiet", "--out", str(folder)]) == 0
    return folder


def _test_record(folder):
    return [json.loads(line) for line in open(folder / "metrics.jsonl")][-1]


def test_predict_on_the_test_split_gives_the_accuracy_train_printed(run_folder, tmp_path, capsys):
    assert main(["predict", str(run_folder), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    test = _test_record(run_folder)
    assert test["split"] == "test"
    assert f"accuracy: {test['accuracy']:.2%} ({round(test['accuracy'] * 180)} of 180)" in out
    predicted = np.loadtxt(tmp_path / "p" / "predictions.csv", skiprows=1)
    assert predicted.shape == (180,) and f"wrote {tmp_path / 'p' / 'predictions.csv'}" in out


def test_predict_new_inputs_from_npy_and_csv(run_folder, tmp_path, capsys):
    images, labels = digits(flatten=True)
    run = load_run(run_folder)                      # the documented three lines
    expected = run.predict(images[:40])
    assert ((expected == labels[:40]).mean()) > 0.6  # two epochs already learn the digits (chance: 0.1)
    np.save(tmp_path / "x.npy", images[:40])
    np.savetxt(tmp_path / "x.csv", images[:40], delimiter=",")
    np.savetxt(tmp_path / "y.csv", labels[:40], fmt="%d")
    for inputs in ("x.npy", "x.csv"):
        assert main(["predict", str(run_folder), "--inputs", str(tmp_path / inputs), "--labels",
                     str(tmp_path / "y.csv"), "--out", str(tmp_path / inputs[2:])]) == 0
        out = capsys.readouterr().out
        np.testing.assert_array_equal(np.loadtxt(tmp_path / inputs[2:] / "predictions.csv", skiprows=1), expected)
        accuracy = (expected == labels[:40]).mean()
        assert f"accuracy: {accuracy:.2%} ({int((expected == labels[:40]).sum())} of 40)" in out


def test_load_run_applies_the_standardizer_as_training_did(run_folder):
    """The run's model on standardized inputs by hand gives the same scores as run.scores on raw inputs."""
    images, _ = digits()  # (N, 8, 8): load_run adds the channel axis the model was trained with
    run = load_run(run_folder)
    model = run.model
    stats = mdl.load(run_folder / "standardizer.safetensors")
    z = ((images[:16, None] - stats["mean"]) / stats["scale"]).astype(np.float32)
    with mdl.no_grad():
        by_hand = model(mdl.tensor(z)).numpy()
    np.testing.assert_allclose(run.scores(images[:16]), by_hand, rtol=1e-5, atol=1e-5)


def test_predict_refuses_what_it_cannot_use(run_folder, tmp_path, capsys):
    assert main(["predict", str(tmp_path)]) == 2
    assert "not a finished minidl train run folder" in capsys.readouterr().err
    np.save(tmp_path / "bad.npy", np.zeros((3, 5)))
    assert main(["predict", str(run_folder), "--inputs", str(tmp_path / "bad.npy")]) == 2
    assert "samples of shape (1, 8, 8) (64 values each), got an array of shape (3, 5)" in capsys.readouterr().err
    missing = tmp_path / "nowhere" / "x.npy"
    np.save(tmp_path / "good.npy", digits(flatten=True)[0][:5])
    for option, argv in (("--inputs", ["--inputs", str(missing)]),
                         ("--labels", ["--inputs", str(tmp_path / "good.npy"), "--labels", str(missing)])):
        assert main(["predict", str(run_folder), *argv]) == 2
        err = capsys.readouterr().err
        # before: "[Errno 2] No such file or directory" with no word on which option or what to give
        assert f"{option} {missing}: no such file" in err and "give the path of an existing .npy or .csv" in err
        assert len(err.strip().splitlines()) == 1


def test_diagnose_trained_weights_runs_init_checks_on_a_fresh_model(run_folder, capsys):
    code = main(["diagnose", "--weights", str(run_folder / "model.safetensors"), "--steps", "60"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "initial loss ≈ ln K (fresh model, same architecture)" in out
    assert "[PASS] trained model beats chance: validation loss on 180 samples" in out
    assert "loss on the 2 samples after 60 steps of Adam" in out  # says what was measured
    assert "(expected" not in out


def test_diagnose_without_a_fresh_model_skips_the_init_checks():
    from minidl.train.classifiers import build_model
    from minidl.train.diagnostics import diagnose
    images, labels = digits()
    model = build_model("mlp", (1, 8, 8), 10)
    report = diagnose(model, images[:200, None] / 16, labels[:200], images[200:300, None] / 16, labels[200:300],
                      overfit_steps=5, baseline_steps=5, trained=True)
    by_name = {c.name: c for c in report["checks"]}
    assert by_name["initial loss ≈ ln K"].passed is None and "skipped" in str(by_name["initial loss ≈ ln K"])
    assert by_name["trained model beats chance"].passed is False  # an untrained model does not


def test_progress_bar_loss_is_the_logged_epoch_mean(monkeypatch):
    """The bar's 'mean train_loss' at the end of an epoch is the train_loss of that epoch's record."""
    from minidl import nn, optim
    from minidl.data import DataLoader, TensorDataset
    from minidl.train import Trainer
    images, labels = digits(flatten=True)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2),
                      DataLoader(TensorDataset(images[:300] / 16, labels[:300]), batch_size=32), progress=False)
    shown = []
    original = trainer._run_epoch

    def run_epoch(*args):
        result = original(*args)
        shown.append(trainer._postfix())  # what the bar shows as it closes
        return result
    monkeypatch.setattr(trainer, "_run_epoch", run_epoch)
    trainer.fit(2)
    for text, record in zip(shown, trainer.history):
        assert f"mean train_loss={record['train_loss']:.4f}" in text
    # and it is the mean over the epoch's samples, not the last step's loss
    assert trainer.history[0]["train_loss"] != pytest.approx(trainer.steps["loss"][9], rel=1e-3)


def test_the_bar_says_which_epoch_its_validation_accuracy_comes_from():
    """Epoch 2's bar shows the accuracy measured after epoch 1, and says so; mid-epoch validations say 1.5."""
    from minidl import nn, optim
    from minidl.data import DataLoader, TensorDataset
    from minidl.train import Trainer
    images, labels = digits(flatten=True)
    mdl.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    loader = DataLoader(TensorDataset(images[:320] / 16, labels[:320]), batch_size=32)  # 10 batches an epoch
    val = DataLoader(TensorDataset(images[320:420] / 16, labels[320:420]), batch_size=50)
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), loader, val, progress=False)
    trainer.fit(1)
    assert f"val_accuracy after epoch 1={trainer.history[-1]['val_accuracy']:.4f}" in trainer._postfix()
    trainer = Trainer(model, optim.Adam(model.parameters(), lr=1e-2), loader, val, progress=False, eval_every=15)
    trainer.fit(2)
    assert [r["epoch"] for r in trainer.history] == [1.0, 1.5, 2.0]  # epoch ends and step 15
    assert "val_accuracy after epoch 2=" in trainer._postfix()


def test_a_few_samples_are_scored_on_one_blas_thread(run_folder):
    """Batch-1 inference does not wake BLAS threads it cannot use; a large batch keeps them all."""
    from threadpoolctl import threadpool_limits

    from minidl import backend
    from minidl.train.predict import ONE_THREAD_BATCH
    images, _ = digits()
    run = load_run(run_folder)
    seen = []
    run.model.register_forward_hook(lambda module, inputs, output: seen.append(backend.get_num_threads()))
    with threadpool_limits(2, "blas"):
        few, many = run.scores(images[:1]), run.scores(images[:ONE_THREAD_BATCH + 1])
        assert seen == [1, 2] and backend.get_num_threads() == 2  # and the limit is lifted after
    np.testing.assert_allclose(few, many[:1], rtol=1e-5, atol=1e-6)  # the same scores either way
