"""A sharded run (``minidl train --data-parallel --zero S``) writes consolidated checkpoints: they resume in
one process, a one-process checkpoint resumes on 2 ranks, and a sharded one on 4 ranks with another stage,
each ending where the uninterrupted run ends.

The runs use a constant schedule, so a run stopped after 2 epochs and resumed with ``--epochs 3`` follows the
very rates of the 3-epoch run. The tolerance, 1e-5 on weights of order 0.1 after 3 epochs of Adam in float32
(23 steps each), is that of the data-parallel tests: the all-reduce adds the ranks' gradients in another order
than one process's batch sum (a few float32 roundings per step); one Adam step moves a weight by about
lr = 1e-3, so a checkpoint that lost or scrambled the optimizer's moments is far outside it.
"""
import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch
from minidl.train.run_state import read_checkpoint

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
SETTINGS = ["--quiet", "--batch-size", "64", "--schedule", "constant"]


def _zero_job(ranks, zero, args):
    job = launch.run(ranks, ["-m", "minidl", "train", "--data-parallel", "--zero", str(zero), *args], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    return job


def _assert_same_weights(got, want, what):
    got, want = mdl.load(str(got)), mdl.load(str(want))
    assert list(got) == list(want)
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=0, atol=1e-5,
                                   err_msg=f"{what}: {key}")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted 3-epoch run in one process."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(["train", *SETTINGS, "--epochs", "3", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_sharded_checkpoint_resumes_in_one_process(tmp_path, capsys, straight, zero):
    out = tmp_path / "run"
    _zero_job(2, zero, [*SETTINGS, "--epochs", "2", "--out", str(out)])
    state = read_checkpoint(str(out / "last.safetensors"))
    one_process = mdl.load(str(straight / "model.safetensors"))
    # consolidated: the whole weights, and the optimizer state of every parameter in its own shape
    assert sorted(state["model"]) == sorted(one_process)
    shapes = [np.asarray(v).shape for v in one_process.values()]
    moments = state["optimizer"]["state"]
    assert len(moments) == len(shapes)
    for position, shape in enumerate(shapes):
        arrays = [np.asarray(v) for v in moments[position].values() if np.ndim(v) > 0]
        assert arrays and all(a.shape == shape for a in arrays), (position, shape)
    assert (out / "best.safetensors").exists()
    capsys.readouterr()
    assert main(["train", "--quiet", "--epochs", "3", "--resume", str(out / "last.safetensors")]) == 0
    assert "resuming at step 46" in capsys.readouterr().out
    _assert_same_weights(out / "model.safetensors", straight / "model.safetensors",
                         f"--zero {zero} on 2 ranks, resumed in one process")


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_a_one_process_checkpoint_resumes_sharded_on_two_ranks(tmp_path, capsys, straight, zero):
    out = tmp_path / "run"
    assert main(["train", *SETTINGS, "--epochs", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    job = _zero_job(2, zero, ["--quiet", "--epochs", "3", "--resume", str(out / "last.safetensors")])
    assert "resuming at step 46" in job.stdout and job.stdout.count("writing to") == 1
    _assert_same_weights(out / "model.safetensors", straight / "model.safetensors",
                         f"one process resumed with --zero {zero} on 2 ranks")


def test_a_sharded_checkpoint_resumes_on_more_ranks_and_another_stage(tmp_path, straight):
    # nothing in a consolidated checkpoint depends on the ranks or the stage that wrote it
    out = tmp_path / "run"
    _zero_job(2, 2, [*SETTINGS, "--epochs", "2", "--out", str(out)])
    job = _zero_job(4, 3, ["--quiet", "--epochs", "3", "--resume", str(out / "last.safetensors")])
    assert "data-parallel on 4 ranks (mpi), ZeRO stage 3, resuming at step 46" in job.stdout
    _assert_same_weights(out / "model.safetensors", straight / "model.safetensors",
                         "--zero 2 on 2 ranks resumed with --zero 3 on 4 ranks")


def test_clipping_by_the_global_norm_with_each_zero_stage_equals_one_process(tmp_path, capsys):
    # 0.5 is below the gradient norm of most steps of this run, so clipping changes the weights
    # (checked against the unclipped run): each rank must add every rank's part of the norm
    settings = [*SETTINGS, "--epochs", "1"]
    assert main(["train", *settings, "--out", str(tmp_path / "plain")]) == 0
    assert main(["train", *settings, "--clip-norm", "0.5", "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    plain = mdl.load(str(tmp_path / "plain" / "model.safetensors"))
    one = mdl.load(str(tmp_path / "one" / "model.safetensors"))
    assert max(float(np.abs(np.asarray(one[k]) - np.asarray(plain[k])).max()) for k in one) > 1e-3
    for zero in (1, 2, 3):
        out = tmp_path / f"zero{zero}"
        _zero_job(2, zero, [*settings, "--clip-norm", "0.5", "--out", str(out)])
        _assert_same_weights(out / "model.safetensors", tmp_path / "one" / "model.safetensors",
                             f"--zero {zero} --clip-norm 0.5 on 2 ranks")
