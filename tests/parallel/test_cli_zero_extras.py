"""Loss scaling, early stopping and TensorBoard histograms of a ZeRO run (stages 1, 2, 3) give what one process gives.

zero_extras_worker.py runs on 2 MPI ranks (one job for every check below); the same functions, without a
communicator, give the one-process references here. Then ``minidl train --data-parallel --zero S`` with
``--patience`` (resumed on another number of ranks), ``--amp`` and ``--tensorboard``.

Tolerances. Adam in float32 (early stopping, histograms): 1e-5, as the data-parallel tests: the
all-reduce adds the ranks' gradients in another order than one process's batch sum (a few float32
roundings per step). fp16 loss scaling: 2e-4. Each rank backpropagates its own 8 samples through
float16 matrix products, whose results are rounded to float16 (relative error 2⁻¹¹) on partial sums
that differ from one process's 16-sample sums. Every step is clipped to a gradient norm of 0.5, so
an SGD step (lr 0.1) moves a weight by at most 0.05, and its error is at most about 0.05 · 2⁻¹⁰ =
5e-5; three steps: 1.5e-4 (measured: 5e-6). A step taken that should have been skipped, or the
reverse, moves the weights by about 1e-2, and a gradient left scaled by 2¹⁶ is farther still.
"""
import json
import os

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch
from minidl.train.run_state import read_checkpoint

from . import zero_extras_worker as worker

REASON = launch.mpi_unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
HERE = os.path.dirname(os.path.abspath(__file__))
STAGES = [1, 2, 3]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """What each of the 2 ranks saved: ``[rank 0's arrays, rank 1's arrays]``."""
    out = tmp_path_factory.mktemp("zero_extras")
    job = launch.run(2, [os.path.join(HERE, "zero_extras_worker.py"), str(out)], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    return [dict(np.load(out / f"rank{r}.npz")) for r in (0, 1)]


def _facts(arrays, stage):
    prefix = f"facts{stage}/"
    return {key[len(prefix):]: float(value) for key, value in arrays.items() if key.startswith(prefix)}


def _close(got, want, atol, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=0, atol=atol, err_msg=f"{what}: parameter {i}")


def _largest_difference(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def amp_reference():
    with np.errstate(over="ignore", invalid="ignore"):  # the first step overflows float16, on purpose
        return worker.amp_run(stage=0)


@pytest.mark.parametrize("stage", STAGES)
def test_loss_scaling_skips_the_overflowing_step_on_every_rank_and_equals_one_process(ranks, amp_reference, stage):
    want, facts = amp_reference
    assert facts == {"scale": 2.0 ** 16, "skipped_steps": 1, "steps": 4}  # step 1 overflowed, then 2**40 · 2**-24
    for rank, arrays in enumerate(ranks):
        got = [arrays[f"amp{stage}/{i}"] for i in range(len(want))]
        assert {k: v for k, v in _facts(arrays, stage).items() if k in facts} == facts, f"rank {rank}"
        _close(got, want, 2e-4, f"ZeRO-{stage} fp16 on rank {rank} against one process")
    for i in range(len(want)):  # the ranks hold the same weights, bit for bit
        np.testing.assert_array_equal(ranks[0][f"amp{stage}/{i}"], ranks[1][f"amp{stage}/{i}"])


@pytest.mark.parametrize("stage", STAGES)
def test_an_overflow_in_one_rank_part_of_the_gradient_makes_every_rank_skip(ranks, stage):
    # rank 1 alone finds an inf (in its shard; at stage 1 in a parameter only it owns, so only it unscales
    # it): every rank skips the step, keeps its weights and halves its scale, 2**8 -> 2**7
    for rank, arrays in enumerate(ranks):
        facts = _facts(arrays, stage)
        assert (facts["rank1_overflow_skipped"], facts["rank1_overflow_scale"]) == (1, 128.0), f"rank {rank}"
        assert facts["rank1_overflow_unchanged"] == 1.0, f"rank {rank} changed its weights"


@pytest.mark.parametrize("stage", STAGES)
def test_early_stopping_restores_the_whole_best_weights_as_one_process(ranks, stage):
    want, facts = worker.early_run(stage=0)
    last, _ = worker.early_run(stage=0, restore=False)
    assert facts["best_step"] < facts["stopped_step"] == facts["steps"]  # stopped, after a worse stretch
    assert _largest_difference(want, last) > 1e-2  # restoring changes the weights a lot
    for rank, arrays in enumerate(ranks):
        got = [arrays[f"early{stage}/{i}"] for i in range(len(want))]
        assert {k: _facts(arrays, stage)[f"early_{k}"] for k in facts} == facts, f"rank {rank}"
        _close(got, want, 1e-5, f"ZeRO-{stage} early stopping on rank {rank} against one process")


@pytest.mark.parametrize("stage", STAGES)
def test_histograms_of_a_sharded_model_are_of_the_whole_weights_and_gradients(ranks, stage):
    # read without tensorboardX: what TensorBoardLogger would write, gathered from the shards at stage 3
    want = worker.histogram_run(stage=0)
    assert sorted(want) == ["gradients/0.bias", "gradients/0.weight", "gradients/2.bias", "gradients/2.weight",
                            "weights/0.bias", "weights/0.weight", "weights/2.bias", "weights/2.weight"]
    for rank, arrays in enumerate(ranks):
        got = {key.split("/", 1)[1]: value for key, value in arrays.items() if key.startswith(f"histogram{stage}/")}
        assert sorted(got) == sorted(want), f"rank {rank}"
        for tag in want:
            assert got[tag].shape == want[tag].shape, tag  # whole tensors, not a rank's shard
            np.testing.assert_allclose(got[tag], want[tag], rtol=0, atol=1e-5, err_msg=f"rank {rank}: {tag}")


# ---------------------------------------------------------------- the command line
SETTINGS = ["--quiet", "--batch-size", "64", "--schedule", "constant"]
# Adam at lr 0.01: validation accuracy 97.2, 97.8, 97.2, 98.9 (step 92), 98.3, 97.8 %, each a sample or more
# apart (the order of a sum, a BLAS's threads or the ranks' all-reduce, does not change these; at lr 0.05 it does)
EARLY = [*SETTINGS, "--lr", "0.01", "--patience", "2"]


def _zero_job(ranks, zero, args, timeout=180):
    job = launch.run(ranks, ["-m", "minidl", "train", "--data-parallel", "--zero", str(zero), *args],
                     timeout=timeout)
    assert job.returncode == 0, job.stderr[-3000:]
    return job


def test_cli_early_stopping_with_zero_resumes_on_another_number_of_ranks_and_restores_one_process(tmp_path, capsys):
    one = tmp_path / "one"
    assert main(["train", *EARLY, "--epochs", "6", "--out", str(one)]) == 0
    assert "best weights (step 92, restored by early stopping)" in capsys.readouterr().out
    # 5 epochs on 2 ranks at stage 3: the checkpoint after epoch 5 holds early stopping's best weights (step
    # 92), gathered whole; resumed at stage 2 on 3 ranks, epoch 6 is not better and they are put back
    out = tmp_path / "run"
    _zero_job(2, 3, [*EARLY, "--epochs", "5", "--out", str(out)])
    saved = read_checkpoint(str(out / "last.safetensors"))["trainer"]["callbacks"][0]
    assert saved["best_step"] == 92 and sorted(saved["best_state"]) == sorted(mdl.load(str(one / "model.safetensors")))
    job = _zero_job(3, 2, ["--quiet", "--patience", "2", "--epochs", "6", "--resume", str(out / "last.safetensors")])
    assert "ZeRO stage 2, resuming at step 115" in job.stdout
    assert "best weights (step 92, restored by early stopping)" in job.stdout
    got, want = mdl.load(str(out / "model.safetensors")), mdl.load(str(one / "model.safetensors"))
    final = read_checkpoint(str(out / "last.safetensors"))["model"]  # the weights of step 138, before the restore
    assert max(float(np.abs(np.asarray(final[k]) - np.asarray(want[k])).max()) for k in want) > 1e-2
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=0, atol=1e-5, err_msg=key)


def test_cli_zero_3_with_amp_and_tensorboard_equals_plain_data_parallel(tmp_path):
    # Both runs on 2 ranks: each rank's float16 forward and backward are the same computations, the two
    # gradients are added in one order, and an elementwise update of a shard is that of the whole weight,
    # so the weights, the skipped steps and every histogram must agree to the bit (up to 1e-7).
    pytest.importorskip("tensorboardX")
    from ..train.test_tensorboard import _read_events, _values
    args = [*SETTINGS, "--epochs", "1", "--amp", "fp16", "--tensorboard"]
    plain = launch.run(2, ["-m", "minidl", "train", "--data-parallel", *args, "--out", str(tmp_path / "dp")],
                       timeout=180)
    assert plain.returncode == 0, plain.stderr[-3000:]
    _zero_job(2, 3, [*args, "--out", str(tmp_path / "zero3")])
    got = mdl.load(str(tmp_path / "zero3" / "model.safetensors"))
    want = mdl.load(str(tmp_path / "dp" / "model.safetensors"))
    for key in want:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(want[key]), rtol=0, atol=1e-7, err_msg=key)
    scales = [[(r["step"], r["amp_scale"], r["skipped_steps"]) for r in map(json.loads, open(tmp_path / run /
               "metrics.jsonl")) if "amp_scale" in r] for run in ("dp", "zero3")]
    assert scales[0] == scales[1] and scales[0]
    (_, dp), (_, zero) = (_values(_read_events(tmp_path / run / "tensorboard")) for run in ("dp", "zero3"))
    # ZeRO-3's layers are those of the plain model, as one process names them; DataParallel's are its attribute's
    dp = {tag.replace("activations/module.", "activations/"): h for tag, h in dp.items()}
    assert sorted(zero) == sorted(dp) and any(tag.startswith("gradients/") for tag in dp)
    assert "activations/0" in zero and any(tag.startswith("weights/") for tag in zero)
    for tag in dp:  # the whole tensors' histograms (a shard's would count fewer values)
        for step, h in dp[tag].items():
            z = zero[tag][step]
            assert z.num == h.num, tag
            np.testing.assert_allclose([z.min, z.max, z.sum], [h.min, h.max, h.sum], rtol=1e-6, atol=1e-7,
                                       err_msg=f"{tag} at step {step}")
