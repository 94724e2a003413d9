"""``minidl train --data-parallel`` under mpiexec trains the same model as ``minidl train`` in one process,
with every ZeRO stage (``--zero 1/2/3``) too.

One epoch on the bundled digits: 1437 samples in batches of 32, so the last batch (29) splits
unevenly (15 + 14) and is weighted by sample counts. The tolerance, 1e-5 on weights of order 0.1
after 45 Adam steps in float32, allows for the all-reduce adding the ranks' gradients in another
order than one process's batch sum (a few float32 roundings per step), and is far below any real
difference: one step of Adam moves a weight by about lr = 1e-3.
"""
import json

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch

REASON = launch.mpi_unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_train_cli_on_two_ranks_equals_one_process(tmp_path, capsys):
    settings = ["--epochs", "1", "--quiet", "--batch-size", "32"]
    assert main(["train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "train", "--data-parallel", *settings, "--out", str(tmp_path / "two")],
                     timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1          # only rank 0 speaks...
    assert "data-parallel on 2 ranks (mpi)" in job.stdout
    for name in ("model.safetensors", "last.safetensors", "metrics.jsonl", "curves.png"):  # ...and writes
        assert (tmp_path / "two" / name).exists()
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    two = mdl.load(str(tmp_path / "two" / "model.safetensors"))
    assert list(one) == list(two)
    for key in one:
        np.testing.assert_allclose(np.asarray(two[key]), np.asarray(one[key]), rtol=0, atol=1e-5, err_msg=key)
    # the logged training loss and accuracy are the whole batches', summed over the two ranks (rank 0's
    # own halves differ by 2.7e-3 relative; the uneven last batch is weighted by its 15 + 14 samples)
    records = [[r for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())
                if "split" not in r] for run in ("one", "two")]  # the training records (not the test set's)
    assert [r["step"] for r in records[1]] == [r["step"] for r in records[0]] == [45]
    for key in ("train_loss", "train_accuracy", "val_loss"):
        np.testing.assert_allclose([r[key] for r in records[1]], [r[key] for r in records[0]], rtol=1e-5,
                                   err_msg=key)


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_train_cli_with_each_zero_stage_equals_one_process(tmp_path, capsys):
    settings = ["--epochs", "1", "--quiet", "--batch-size", "32"]
    assert main(["train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    total = sum(np.asarray(value).size for value in one.values())
    # on 4 ranks the last layer's 64·10 + 10 = 650 weights do not split evenly: stage 3 pads its shards
    for ranks, zero in ((2, "1"), (2, "2"), (2, "3"), (4, "3")):
        out = tmp_path / f"zero{zero}-{ranks}"
        job = launch.run(ranks, ["-m", "minidl", "train", "--data-parallel", "--zero", zero, *settings,
                                 "--out", str(out)], timeout=120)
        assert job.returncode == 0, job.stderr[-3000:]
        assert f"{total:,} parameters" in job.stdout             # the model's, not one rank's shard
        assert f"data-parallel on {ranks} ranks (mpi), ZeRO stage {zero}" in job.stdout
        assert (out / "metrics.jsonl").exists() and (out / "best.safetensors").exists()
        sharded = mdl.load(str(out / "model.safetensors"))       # whole weights, gathered from the shards
        assert list(sharded) == list(one)
        for key in one:
            np.testing.assert_allclose(np.asarray(sharded[key]), np.asarray(one[key]), rtol=0, atol=1e-5,
                                       err_msg=f"--zero {zero} on {ranks} ranks: {key}")
    # the run's last.safetensors holds the whole weights and settings: minidl predict reads the folder
    # (resuming from it is tested in test_cli_zero_checkpoints.py)
    assert main(["predict", str(out)]) == 0
    assert f"mlp of {out} on 180 samples" in capsys.readouterr().out


@pytest.mark.parametrize("options, refused", [
    (["--zero", "2"], "--zero 2 shards the training state across the ranks of a data-parallel job; add"),
    (["--zero", "3", "--amp", "fp16", "--patience", "2", "--tensorboard"],
     "--zero 3 shards the training state across the ranks of a data-parallel job; add --data-parallel"),
])
def test_train_cli_refuses_zero_without_data_parallel(tmp_path, capsys, options, refused):
    assert main(["train", "--epochs", "1", "--quiet", *options, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minidl train: error: ") and refused in err, err
    assert not (tmp_path / "run").exists()  # refused before any folder, data or model


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_train_cli_with_adahessian_on_two_ranks_equals_one_process(tmp_path, capsys):
    """Each rank probes its own graph with the same z, and the Hz are all-reduced with the gradients' weights
    before |z ⊙ Hz| (plain data parallelism; ZeRO stage 1, whose ranks draw z for every parameter; stages 2
    and 3, where D of the whole parameters is cut into the shards).

    The tolerance is not the module's 1e-5: AdaHessian's step lr·m̂/(|D| + 1e-4) magnifies the rounding of
    D wherever |D| ≪ |g|, so a float32 run is far more sensitive to the order of its sums than Adam's. At
    lr 0.05 (weights up to 5.6 after the epoch) one process in float32 ends 1.5e-3 from the same run in
    float64, and the two-rank run 1.0e-3 from one process (in float64 the same runs agree to 2e-12); with
    each rank's own Hz (no all-reduce) they end 1.2e3 away. 2e-2 is 13 times float32's own error and
    refuses the second by five orders."""
    settings = ["--epochs", "1", "--quiet", "--batch-size", "32", "--optimizer", "adahessian", "--lr", "0.05"]
    assert main(["train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    for zero in ([], ["--zero", "1"], ["--zero", "3"]):  # stage 2: in float64 in test_model_parallel.py
        out = tmp_path / f"two{''.join(zero)}"
        job = launch.run(2, ["-m", "minidl", "train", "--data-parallel", *zero, *settings, "--out", str(out)],
                         timeout=120)
        assert job.returncode == 0, job.stderr[-3000:]   # it failed: "the gradients carry no graph"
        two = mdl.load(str(out / "model.safetensors"))
        assert list(one) == list(two)
        for key in one:
            np.testing.assert_allclose(np.asarray(two[key]), np.asarray(one[key]), rtol=0, atol=2e-2,
                                       err_msg=f"{zero}: {key}")
    # and it trained: the validation loss well under chance's ln 10 = 2.30 (measured: 0.31)
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["val_loss"] for r in records if "val_loss" in r) < 1.6


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("optimizer, zero", [("lamb", "3"), ("novograd", "2")])
def test_train_cli_with_a_layerwise_optimizer_on_shards_equals_one_process(tmp_path, capsys, optimizer, zero):
    # each parameter's norm is added over the two ranks' pieces of it (float32: the tolerance of the module)
    settings = ["--epochs", "1", "--quiet", "--batch-size", "32", "--optimizer", optimizer, "--lr", "0.01"]
    assert main(["train", *settings, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "train", "--data-parallel", "--zero", zero, *settings,
                         "--out", str(tmp_path / "two")], timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    two = mdl.load(str(tmp_path / "two" / "model.safetensors"))
    assert list(one) == list(two)
    for key in one:
        np.testing.assert_allclose(np.asarray(two[key]), np.asarray(one[key]), rtol=0, atol=1e-5, err_msg=key)
    # and it trained: the validation loss well under chance's ln 10 = 2.30 (measured: 0.71 LAMB, 1.09 NovoGrad)
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["val_loss"] for r in records if "val_loss" in r) < 1.6
