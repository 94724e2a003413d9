"""``minidl gpt train --tensor-parallel 2`` under mpiexec trains the GPT the one-process command trains.

A tiny GPT (2 blocks, 2 heads, width 16, context 16), 6 AdamW steps of 8 sequences, clipped to a global
norm of 0.05 (so every step clips, and the clipping must see the whole model's norm). The tolerances,
1e-5 on weights of order 0.02 and on losses relative, allow for float32: each block's row-parallel
products are summed by an all-reduce in another order than one process's matrix product (a few
roundings of 6e-8 per step, measured at 3e-8 on the weights); a wrong slice, a missing all-reduce or
a clip by one rank's norm moves the weights by more (one AdamW step moves a weight by about lr = 3e-3;
clipping by the local norm was measured at 8e-6 after 6 steps — the exact check of the clipping is
test_model_parallel.py's, in float64).
"""
import json

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch

REASON = launch.mpi_unavailable_reason()
TINY = ["--steps", "6", "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--eval-every", "3", "--clip-norm", "0.05", "--quiet"]


def _weights_equal(got_folder, want_folder):
    want = mdl.load(str(want_folder / "gpt.safetensors"))
    got = mdl.load(str(got_folder / "gpt.safetensors"))      # consolidated: the plain model's keys
    assert got["config"] == want["config"]
    assert list(got["model"]) == list(want["model"])
    for key, value in want["model"].items():
        assert np.shape(got["model"][key]) == np.shape(value), key
        np.testing.assert_allclose(np.asarray(got["model"][key]), np.asarray(value), rtol=0, atol=1e-5,
                                   err_msg=key)


def _losses(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["train_loss"], row["val_loss"]) for row in rows]


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_tensor_parallel_gpt_equals_one_process_and_samples_in_one(tmp_path, capsys):
    assert main(["gpt", "train", *TINY, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "gpt", "train", "--tensor-parallel", "2", *TINY,
                         "--out", str(tmp_path / "two")], timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1                      # only rank 0 speaks...
    assert "tensor-parallel on 2 ranks" in job.stdout
    assert (tmp_path / "two" / "loss.png").exists()                 # ...and writes
    assert (tmp_path / "two" / "last.safetensors").exists()         # a resumable checkpoint: see below
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert [r[0] for r in two] == [r[0] for r in one] == [3, 6]
    np.testing.assert_allclose([r[1:] for r in two], [r[1:] for r in one], rtol=1e-5)
    _weights_equal(tmp_path / "two", tmp_path / "one")
    # the consolidated run loads into one process and samples there
    from minidl.models.gpt_train import load_run
    model_one, tok = load_run(str(tmp_path / "one"))
    model_two, _ = load_run(str(tmp_path / "two"))
    prompt = tok.encode("ROMEO:\n")[None]
    np.testing.assert_allclose(model_two(prompt).numpy(), model_one(prompt).numpy(), rtol=0, atol=1e-4)
    assert main(["gpt", "sample", "--run", str(tmp_path / "two"), "--tokens", "20", "--prompt", "ROMEO:"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_data_times_tensor_parallel_gpt_equals_one_process(tmp_path, capsys):
    """4 ranks: 2 data-parallel copies (4 of the 8 sequences each) of the GPT split over 2 ranks. The
    training and validation losses and the weights are the one-process run's (the logged training loss
    summed over the replicas, not one replica's half-batch)."""
    assert main(["gpt", "train", *TINY, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(4, ["-m", "minidl", "gpt", "train", "--tensor-parallel", "2", "--data-parallel", *TINY,
                         "--out", str(tmp_path / "four")], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "data-parallel on 2 ranks, tensor-parallel on 2 ranks" in job.stdout
    assert job.stdout.count("writing to") == 1
    np.testing.assert_allclose([r[1:] for r in _losses(tmp_path / "four")],
                               [r[1:] for r in _losses(tmp_path / "one")], rtol=1e-5)
    _weights_equal(tmp_path / "four", tmp_path / "one")


@pytest.mark.parametrize("extra, message", [
    (["--tensor-parallel", "3"], "n_head (2) does not divide among the 3 ranks of the tensor group; choose a "
                                 "tensor-parallel size among 1, 2"),
    (["--tensor-parallel", "2", "--dropout", "0.1"], "dropout=0.1 would draw a different mask on each rank"),
    (["--tensor-parallel", "2", "--data-parallel"], "--tensor-parallel 2 --data-parallel needs a world of a "
                                                      "multiple of 2 ranks (data groups × tensor groups of 2), "
                                                      "got 1"),
    (["--tensor-parallel", "2"], "--tensor-parallel 2 needs a world of 2 ranks"),   # one process: a world of 1
])
def test_bad_tensor_parallel_input_is_refused_before_any_work(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert main(["gpt", "train", *TINY, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("minidl gpt train: error:")
    assert not out.exists()                                         # no run folder claimed, nothing trained


# ---------------------------------------------------------------- resumable, consolidated checkpoints
# A schedule that is the same whatever the run's length (warmup 1, then the cosine from lr to min_lr = lr:
# constant), so a run of 3 steps resumed to 6 follows the very rates of the 6-step run, as the ZeRO
# checkpoint tests do with a constant schedule. 4 heads, so the model splits 2 and 4 ways. The tolerance
# is the tensor-parallel one above (1e-5 on weights of order 0.02); a checkpoint that lost the AdamW
# moments or cut them in the wrong order moves the weights by about lr = 3e-3 in the next steps.
STEADY = ["--n-layer", "2", "--n-head", "4", "--n-embd", "16", "--block-size", "16", "--batch-size", "8",
          "--eval-every", "3", "--clip-norm", "0.05", "--warmup", "1", "--min-lr", "0.003", "--quiet"]


def _job(ranks, args):
    job = launch.run(ranks, ["-m", "minidl", "gpt", "train", *args], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    return job


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The uninterrupted 6-step run and the same run stopped after 3 steps, both in one process."""
    root = tmp_path_factory.mktemp("one_process")
    assert main(["gpt", "train", "--steps", "6", *STEADY, "--out", str(root / "straight")]) == 0
    assert main(["gpt", "train", "--steps", "3", *STEADY, "--out", str(root / "half")]) == 0
    return root


@pytest.fixture(scope="module")
def split_half(tmp_path_factory):
    """The run stopped after 3 steps, split over 2 ranks."""
    if REASON is not None:
        pytest.skip(f"MPI not installed: {REASON}")
    out = tmp_path_factory.mktemp("split") / "half"
    _job(2, ["--tensor-parallel", "2", "--steps", "3", *STEADY, "--out", str(out)])
    return out


def test_a_tensor_parallel_checkpoint_holds_what_one_process_saves(split_half, one_process):
    """At step 3: the whole weights, each parameter's AdamW m and v in its whole shape, equal to the
    one-process run's (float32 roundings: measured at 2e-7 on the weights and 2e-6 of the largest value on
    m and v; gathered slices in a wrong order are off by the values themselves)."""
    from minidl.train.run_state import read_checkpoint
    got = read_checkpoint(str(split_half / "last.safetensors"))
    want = read_checkpoint(str(one_process / "half" / "last.safetensors"))
    assert list(got["model"]) == list(want["model"])
    for key, value in want["model"].items():
        np.testing.assert_allclose(got["model"][key], value, rtol=0, atol=1e-5, err_msg=key)
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    count = sum(len(group["params"]) for group in want["optimizer"]["param_groups"])   # every parameter, once
    assert list(got["optimizer"]["state"]) == list(want["optimizer"]["state"]) == list(range(count))
    for position, entry in want["optimizer"]["state"].items():
        for key, value in entry.items():
            mine = got["optimizer"]["state"][position][key]
            assert np.shape(mine) == np.shape(value), (position, key)
            np.testing.assert_allclose(mine, value, rtol=0, atol=1e-4 * float(np.abs(value).max()),
                                       err_msg=f"{position} {key}")
    assert got["trainer"]["step"] == 3 and got["loader"] == want["loader"]


@pytest.mark.parametrize("where", [[], ["--tensor-parallel", "4"], ["--tensor-parallel", "2", "--data-parallel"]],
                         ids=["one-process", "4-way", "2x2-mesh"])
def test_a_tensor_parallel_checkpoint_resumes_in_one_process_or_split_another_way(tmp_path, split_half,
                                                                                  one_process, where):
    import shutil
    shutil.copytree(split_half, tmp_path / "run")
    resume = ["--resume", str(tmp_path / "run" / "last.safetensors"), "--steps", "6"]
    if where:
        job = _job(4, [*where, *resume])
        assert job.stdout.count("writing to") == 1
    else:
        assert main(["gpt", "train", *resume, "--quiet"]) == 0
    _weights_equal(tmp_path / "run", one_process / "straight")
    got, want = _losses(tmp_path / "run"), _losses(one_process / "straight")
    assert [r[0] for r in got] == [r[0] for r in want] == [3, 6]
    np.testing.assert_allclose([r[1:] for r in got], [r[1:] for r in want], rtol=1e-5)  # train and validation


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("how, said", [(["--tensor-parallel", "2"], "tensor-parallel on 2 ranks"),
                                       (["--data-parallel"], "data-parallel on 2 ranks")],
                         ids=["tensor", "data"])
def test_a_one_process_checkpoint_resumes_on_two_ranks(tmp_path, one_process, how, said):
    """Split over 2 ranks, or on 2 data-parallel ranks (whose rank 1 holds a callback in the place of
    rank 0's metrics logger, so that it loads the writer's callback states)."""
    import shutil
    shutil.copytree(one_process / "half", tmp_path / "run")
    job = _job(2, [*how, "--resume", str(tmp_path / "run" / "last.safetensors"), "--steps", "6"])
    assert said in job.stdout
    _weights_equal(tmp_path / "run", one_process / "straight")
    np.testing.assert_allclose([r[1:] for r in _losses(tmp_path / "run")],
                               [r[1:] for r in _losses(one_process / "straight")], rtol=1e-5)
