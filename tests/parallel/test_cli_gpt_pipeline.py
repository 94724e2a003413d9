"""``minidl gpt train --pipeline-parallel M`` under mpiexec trains the GPT the one-process command trains.

The tiny GPT of test_cli_gpt_parallel.py (2 blocks, 2 heads, width 16, context 16), 6 AdamW steps of 8
sequences in 4 micro-batches of 2, clipped to a global norm of 0.05 (every step clips, so the clipping
must see every stage's gradients), cut into 2 stages: [embedding, block 0] and [block 1, final norm,
tied head]; and with 3 blocks into 3 stages. The tied embedding/head weight lives on the first and the
last rank, each with its part of the gradient; a missed sum leaves the two copies apart and the loss
off (measured: 1.1e-3 on the losses). The tolerances are the tensor-parallel test's, for float32: the
micro-batches' gradients are summed in another order than one batch's matrix products (a few roundings
of 6e-8 per step; measured at 1.2e-7 on the weights), while a missing tied sum, a wrong micro-batch
scale or a clip by one stage's norm moves the weights by the order of lr = 3e-3 a step.
"""
import json

import numpy as np
import pytest

import minidl as mdl
from minidl.cli import main
from minidl.parallel import launch
from minidl.train.run_state import read_checkpoint

REASON = launch.mpi_unavailable_reason()
TINY = ["--steps", "6", "--n-layer", "2", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "8", "--eval-every", "3", "--clip-norm", "0.05", "--quiet"]


def _losses(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["train_loss"], row["val_loss"]) for row in rows]


def _assert_same_run(got_folder, want_folder):
    """The two runs logged the same losses at steps 3 and 6 and wrote the same whole weights (float32:
    rtol and atol 1e-5, see the module docstring), keyed and ordered as the plain model's."""
    got, want = _losses(got_folder), _losses(want_folder)
    assert [r[0] for r in got] == [r[0] for r in want] == [3, 6]
    np.testing.assert_allclose([r[1:] for r in got], [r[1:] for r in want], rtol=1e-5)
    want = mdl.load(str(want_folder / "gpt.safetensors"))["model"]
    got = mdl.load(str(got_folder / "gpt.safetensors"))["model"]
    assert list(got) == list(want)
    for key, value in want.items():
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(value), rtol=1e-5, atol=1e-5, err_msg=key)


def _assert_same_checkpoint(got_folder, want_folder):
    """``last.safetensors`` of a pipeline run holds what the one-process run's holds: the whole weights
    and AdamW's moments and step per parameter, at the one-process optimizer's positions (so the
    moments of every stage, gathered, sit where AdamW over the whole GPT keeps them)."""
    got, want = (read_checkpoint(str(f / "last.safetensors")) for f in (got_folder, want_folder))
    assert list(got["model"]) == list(want["model"])
    for key, value in want["model"].items():
        np.testing.assert_allclose(got["model"][key], value, rtol=1e-5, atol=1e-5, err_msg=key)
    assert [g["params"] for g in got["optimizer"]["param_groups"]] == \
        [g["params"] for g in want["optimizer"]["param_groups"]]
    assert sorted(got["optimizer"]["state"]) == sorted(want["optimizer"]["state"])
    for position, entry in want["optimizer"]["state"].items():
        assert sorted(got["optimizer"]["state"][position]) == sorted(entry)
        for key, value in entry.items():  # the moments are of the order of the gradients: 1e-2 .. 1e-6
            np.testing.assert_allclose(got["optimizer"]["state"][position][key], value, rtol=1e-4, atol=1e-9,
                                       err_msg=f"{position} {key}")
    assert got["scheduler"] == want["scheduler"] and got["loader"] == want["loader"]


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("stages, schedule", [(2, "1f1b"), (2, "gpipe"), (3, "1f1b")])
def test_pipeline_gpt_equals_one_process_and_samples_in_one(tmp_path, capsys, stages, schedule):
    """3 stages (3 blocks): a middle stage, which holds no tied weight and adds zeros to its sum."""
    tiny = [*TINY[:2], "--n-layer", str(stages), *TINY[4:]]
    assert main(["gpt", "train", *tiny, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(stages, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", str(stages),
                              "--micro-batches", "4", "--schedule", schedule, *tiny, "--out", str(tmp_path / "two")],
                     timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1                      # only rank 0 speaks...
    assert f"pipeline-parallel on {stages} ranks (1 blocks a stage), 4 micro-batches of 2, schedule {schedule}" \
        in job.stdout
    ideal = {2: "20%", 3: "33%"}[stages]                            # (p − 1)/(m + p − 1): 1/5, 2/6
    assert f"(M-1)/(K+M-1) = {ideal}" in job.stdout
    held = stages if schedule == "1f1b" else 4                      # 1F1B: at most p − s on stage s = 0
    assert f"the first stage held {held} of 4 micro-batches' activations at once" in job.stdout
    assert (tmp_path / "two" / "loss.png").exists()                 # ...and writes
    _assert_same_checkpoint(tmp_path / "two", tmp_path / "one")
    one, two = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert [r[0] for r in two] == [r[0] for r in one] == [3, 6]
    np.testing.assert_allclose([r[1:] for r in two], [r[1:] for r in one], rtol=1e-5)
    want = mdl.load(str(tmp_path / "one" / "gpt.safetensors"))
    got = mdl.load(str(tmp_path / "two" / "gpt.safetensors"))     # gathered: the plain model's keys, in order
    assert got["config"] == want["config"] and got["tokenizer"] == want["tokenizer"]
    assert list(got["model"]) == list(want["model"])
    for key, value in want["model"].items():
        np.testing.assert_allclose(np.asarray(got["model"][key]), np.asarray(value), rtol=1e-5, atol=1e-5,
                                   err_msg=key)
    # the training moved the weights by far more than the tolerance: equal runs, not two untrained ones
    from minidl.models.gpt import GPT, GPTConfig
    from minidl.train.trainer import seed_everything
    seed_everything(0)                                              # the recipe's seeding, then the model
    start = GPT(GPTConfig(**want["config"])).state_dict()
    for key in ("tok_emb.weight", "blocks.0.attn.qkv.weight", f"blocks.{stages - 1}.mlp.proj.weight"):
        assert np.abs(np.asarray(want["model"][key]) - np.asarray(start[key])).max() > 1e-3, key
    assert main(["gpt", "sample", "--run", str(tmp_path / "two"), "--tokens", "20", "--prompt", "ROMEO:"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_pipeline_with_data_parallel_equals_one_process(tmp_path, capsys):
    """mpiexec -n 4 on a Mesh(data=2, pipeline=2): two replicas of a 2-stage pipeline, each on 4 of the
    8 sequences of a batch in 2 micro-batches of 2. Every step clips (norm 0.05): replicas stepping on
    their own halves' gradients (no average), or clipping before the average (each replica by its own
    norm), end off by the order of lr = 3e-3 a step, far off the 1e-5. (A sum for the mean would pass:
    the clip and AdamW do not see the gradients' scale; the test of losses covers the loss's mean.)"""
    assert main(["gpt", "train", *TINY, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(4, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--micro-batches", "2",
                         "--data-parallel", *TINY, "--out", str(tmp_path / "four")], timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1                      # only the world's rank 0 speaks
    assert "2 micro-batches of 2, schedule 1f1b, data-parallel over 2 such pipelines" in job.stdout
    _assert_same_run(tmp_path / "four", tmp_path / "one")


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_a_pipeline_takes_mixed_precision_block_checkpointing_and_accumulation_as_one_process_does(tmp_path, capsys):
    """--amp fp16 --checkpoint-blocks --accumulate 2 on 2 stages in 4 micro-batches: each micro-batch's
    forward under autocast, its blocks recomputed in backward, two batches' micro-batches added before
    each step, the loss scaled by the scaler's S: the logged losses, scales and skipped steps are the
    one-process run's with the same flags, and so are the weights. The tolerance on the weights is 5e-5
    (measured 5.6e-6): float16 products round to 2⁻¹¹ of their size, so adding the micro-batches' gradients
    in another order moves more than float32's 1e-7; a lost 1/2 of the accumulation, a loss scale not
    divided out on one stage or a clip by one stage's norm moves them by the order of lr = 3e-3."""
    flags = ["--amp", "fp16", "--checkpoint-blocks", "--accumulate", "2"]
    assert main(["gpt", "train", *TINY, *flags, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    job = launch.run(2, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--micro-batches", "4", *flags,
                         *TINY, "--out", str(tmp_path / "two")], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "checkpointing every block, mixed precision fp16, pipeline-parallel on 2 ranks" in job.stdout
    rows = [[json.loads(line) for line in (f / "metrics.jsonl").read_text().splitlines()]
            for f in (tmp_path / "two", tmp_path / "one")]
    assert [(r["step"], r["amp_scale"], r["skipped_steps"]) for r in rows[0]] == \
        [(r["step"], r["amp_scale"], r["skipped_steps"]) for r in rows[1]]
    np.testing.assert_allclose([(r["train_loss"], r["val_loss"]) for r in rows[0]],
                               [(r["train_loss"], r["val_loss"]) for r in rows[1]], rtol=1e-5)
    want = mdl.load(str(tmp_path / "one" / "gpt.safetensors"))["model"]
    got = mdl.load(str(tmp_path / "two" / "gpt.safetensors"))["model"]
    assert list(got) == list(want)
    for key, value in want.items():
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(value), rtol=0, atol=5e-5, err_msg=key)


# A constant rate (warmup of 1 step, then a cosine from lr to min_lr = lr): a run of 3 steps follows the
# rates of the 6-step run, so one stopped at step 3 and resumed with --steps 6 must end where it ends.
CONSTANT = [*TINY, "--warmup", "1", "--min-lr", "3e-3", "--lr", "3e-3"]


def _with(args, flag, value):
    i = args.index(flag)
    return [*args[:i + 1], value, *args[i + 2:]]


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("ranks", [4, 8])
def test_tensor_times_pipeline_gpt_equals_one_process(tmp_path, capsys, ranks):
    """mpiexec -n 4 on a Mesh(pipeline=2, tensor=2): each of the 2 stages split over 2 ranks; mpiexec -n 8
    on Mesh(data=2, pipeline=2, tensor=2), two replicas of that. Every step clips (norm 0.05), so a clip
    that counts a stage's whole parameters twice or one rank's slices only ends off by the order of
    lr = 3e-3 a step; the checkpoint holds the whole weights and moments."""
    assert main(["gpt", "train", *TINY, "--out", str(tmp_path / "one")]) == 0
    capsys.readouterr()
    replicated = ["--data-parallel"] if ranks == 8 else []
    job = launch.run(ranks, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--tensor-parallel", "2",
                             *replicated, "--micro-batches", "2", *TINY, "--out", str(tmp_path / "four")],
                     timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("writing to") == 1
    assert (f"2 micro-batches of {8 // (ranks // 2)}, schedule 1f1b, each stage tensor-parallel on 2 ranks"
            + (", data-parallel over 2 such pipelines" if replicated else "")) in job.stdout
    _assert_same_run(tmp_path / "four", tmp_path / "one")
    _assert_same_checkpoint(tmp_path / "four", tmp_path / "one")


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
def test_a_pipeline_checkpoint_resumes_on_another_layout_and_ends_where_one_process_ends(tmp_path, capsys):
    """Stopped after 3 of 6 steps on 2 stages in 4 micro-batches, each stage split over 2 ranks (tensor ×
    pipeline); resumed on 4 ranks as 2 replicas of an unsplit 2-stage pipeline in 2 micro-batches each.
    A resume that lost the optimizer's moments (Adam restarting with its bias correction), the schedule's
    step or the loader's position ends off by about lr = 3e-3 on the weights; the tolerance is the
    equality tests' (1e-5)."""
    straight = tmp_path / "one"
    assert main(["gpt", "train", *_with(CONSTANT, "--eval-every", "3"), "--out", str(straight)]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    job = launch.run(4, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--micro-batches", "4",
                         "--tensor-parallel", "2", *_with(CONSTANT, "--steps", "3"), "--out", str(run)], timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    job = launch.run(4, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--micro-batches", "2",
                         "--data-parallel", "--resume", str(run / "last.safetensors"), "--steps", "6", "--quiet"],
                     timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    _assert_same_run(run, straight)                                   # rows 3 and 6, each once
    _assert_same_checkpoint(run, straight)


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("first, then", [
    (["--data-parallel"], ["--pipeline-parallel", "2", "--micro-batches", "2"]),
    (["--pipeline-parallel", "2", "--micro-batches", "4"], ["--data-parallel"]),
])
def test_a_run_resumes_across_pipeline_and_data_parallel_layouts_and_ends_where_one_process_ends(
        tmp_path, capsys, first, then):
    """One checkpoint format for every layout: a run of 2 data-parallel ranks stopped after 3 of 6 steps
    resumes as a 2-stage pipeline, and a pipeline's as 2 data-parallel ranks; either ends with the
    uninterrupted one-process run's losses (rows 3 and 6), whole weights and AdamW moments. A resume
    that lost the moments, the schedule's step or the loader's position ends about lr = 3e-3 off; the
    tolerances are the equality tests' (1e-5 on weights, 1e-4 on moments)."""
    straight = tmp_path / "one"
    assert main(["gpt", "train", *CONSTANT, "--out", str(straight)]) == 0
    capsys.readouterr()
    run = tmp_path / "run"
    job = launch.run(2, ["-m", "minidl", "gpt", "train", *first, *_with(CONSTANT, "--steps", "3"), "--out", str(run)],
                     timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    job = launch.run(2, ["-m", "minidl", "gpt", "train", *then, "--resume", str(run / "last.safetensors"),
                         "--steps", "6", "--quiet"], timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    _assert_same_run(run, straight)
    _assert_same_checkpoint(run, straight)


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("ranks, extra, message", [
    (3, [], "--pipeline-parallel 2 --data-parallel needs a world of a multiple of 2 ranks (data groups × "
            "pipelines of 2 stages), got 3"),
    (4, ["--micro-batches", "8"], "a batch of 8 sequences does not split into 2 replicas' 8 equal micro-batches"),
])
def test_pipeline_with_data_parallel_refuses_a_world_or_batch_that_does_not_split(tmp_path, ranks, extra, message):
    job = launch.run(ranks, ["-m", "minidl", "gpt", "train", "--pipeline-parallel", "2", "--data-parallel", *extra,
                             *TINY, "--out", str(tmp_path / "run")], timeout=60)
    assert job.returncode != 0
    assert message in job.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize("extra, message", [
    (["--pipeline-parallel", "3"], "n_layer (2) blocks do not divide into 3 stages of equal length; choose a "
                                   "number of stages among 2"),
    (["--pipeline-parallel", "2", "--micro-batches", "3"], "a batch of 8 sequences does not split into 3 equal "
                                                          "micro-batches; choose --micro-batches among 1, 2, 4, 8"),
    (["--pipeline-parallel", "2", "--dropout", "0.1"], "dropout=0.1 would draw each stage's masks"),
    (["--pipeline-parallel", "2", "--tensor-parallel", "2"], "--pipeline-parallel 2 --tensor-parallel 2 needs a "
                                                            "world of 4 ranks (one per slice of a stage"),
    (["--pipeline-parallel", "2", "--tensor-parallel", "3"], "n_head (2) does not divide among the 3 ranks"),
    (["--pipeline-parallel", "2", "--data-parallel"], "--pipeline-parallel 2 --data-parallel needs a world of a "
                                                      "multiple of 2 ranks"),  # one process: a world of 1
    (["--micro-batches", "4"], "--micro-batches and --schedule go with --pipeline-parallel M"),
    (["--pipeline-parallel", "2"], "--pipeline-parallel 2 needs a world of 2 ranks"),  # one process: a world of 1
])
def test_bad_pipeline_input_is_refused_before_any_work(tmp_path, capsys, extra, message):
    out = tmp_path / "run"
    assert main(["gpt", "train", *TINY, *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("minidl gpt train: error:")
    assert not out.exists()                                         # no run folder claimed, nothing trained
