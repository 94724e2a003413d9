"""The pipeline driven by the Trainer: the one loop trains a Pipeline as it trains the plain model.

In one process a Pipeline of one stage (LocalComm) runs the Trainer's every part through the protocol
(train_step in micro-batches, synchronize, the global clip, eval_step, whole checkpoints), on the CPU
and on "cuda" (the CuPy stand-in where there is no GPU); on MPI ranks a 2-stage pipeline, and two
replicas of it, run a Trainer callback (early stopping, which gathers the whole weights and puts the
best ones back on every stage) and stop where one process stops, with its weights.
"""
import json
import os

import numpy as np
import pytest

import minidl as mdl
from minidl import optim, parallel
from minidl.data import DataLoader, TensorDataset
from minidl.models.gpt import GPT, GPTConfig, pipeline_layers
from minidl.models.gpt_train import decay_groups, lm_loss
from minidl.parallel import launch
from minidl.train import Trainer
from minidl.train.run_state import consolidated_state, load_checkpoint, save_checkpoint
from tests.parallel import pipeline_trainer_worker as worker

HERE = os.path.dirname(os.path.abspath(__file__))
REASON = launch.mpi_unavailable_reason()


def _data():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 11, size=(33, 9))
    x, y = ids[:, :8], ids[:, 1:]
    return TensorDataset(x[:24], y[:24]), TensorDataset(x[24:], y[24:])


def _gpt():
    mdl.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))


def _fit(model, opt, device):
    train_set, val_set = _data()
    loader = DataLoader(train_set, batch_size=4, shuffle=True, seed=0)
    trainer = Trainer(model, opt, loader, DataLoader(val_set, batch_size=3), loss_fn=lm_loss, metrics=None,
                      max_grad_norm=0.05, accumulation_steps=2, eval_every=2, progress=False, device=device)
    trainer.fit(2)
    return trainer


def _piped():
    """A GPT as a one-stage pipeline in 2 micro-batches, wrapped by prepare as a pipeline layout's."""
    groups = parallel.Layout(parallel.LocalComm(), pipeline=parallel.LocalComm())
    return parallel.prepare(_gpt(), optim.AdamW, None, groups, params=lambda m: decay_groups(m, 0.1),
                            layers=pipeline_layers, micro_batches=2, lr=1e-2)[:2]


def test_the_trainer_trains_a_pipeline_as_it_trains_the_plain_model(device):
    """Accumulation of 2 batches of 4 sequences, each in 2 micro-batches, clipped at a norm the gradients
    exceed (every step clips): the losses, the whole weights and AdamW's moments of the one-stage pipeline
    are the plain GPT's. float32: the micro-batches' gradients add in another order than one batch's
    products (measured below 1e-7 on the weights), while a missed 1/k, 1/m or clip moves them by the
    order of lr = 1e-2 a step."""
    model = _gpt()
    start = {k: np.asarray(mdl.backend.to_numpy(v)) for k, v in model.state_dict().items()}
    plain = _fit(model, optim.AdamW(decay_groups(model, 0.1), lr=1e-2), device)
    net, opt = _piped()
    assert isinstance(opt, parallel.PipelineOptimizer) and net.runs_own_step
    piped = _fit(net, opt, device)
    assert [r["step"] for r in piped.history] == [r["step"] for r in plain.history] == [2, 3, 4, 6]
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose([r[key] for r in piped.history], [r[key] for r in plain.history], rtol=1e-5)
    want, got = plain.model.state_dict(), consolidated_state(net)
    assert list(got) == list(want)  # keyed and ordered as the plain GPT
    for key, value in want.items():
        value = mdl.backend.to_numpy(value)
        np.testing.assert_allclose(mdl.backend.to_numpy(got[key]), value, rtol=1e-4, atol=1e-6, err_msg=key)
        assert np.abs(value - start[key]).max() > 1e-3 or key.startswith(("ln", "blocks.0.ln", "blocks.1.ln"))
    whole, local = consolidated_state(opt), plain.optimizer.state_dict()
    assert [g["params"] for g in whole["param_groups"]] == [g["params"] for g in local["param_groups"]]
    assert sorted(whole["state"]) == sorted(local["state"])
    for pos, entry in local["state"].items():
        for key, value in entry.items():
            np.testing.assert_allclose(np.asarray(mdl.backend.to_numpy(whole["state"][pos][key])),
                                       np.asarray(mdl.backend.to_numpy(value)), rtol=1e-4, atol=1e-9,
                                       err_msg=f"{pos} {key}")


def test_tensorboard_histograms_of_a_pipeline_run_are_the_whole_model_s():
    """TensorBoard's histograms read a pipeline through its whole_module (every stage's weights gathered into
    the whole GPT): the weights, the activations and the gradients on a probe batch, tag for tag and value
    for value those of the plain run (within the float32 tolerance of the equality test above)."""
    from minidl.train.tensorboard import histogram_values
    model = _gpt()
    plain = _fit(model, optim.AdamW(decay_groups(model, 0.1), lr=1e-2), "cpu")
    piped = _fit(*_piped(), "cpu")
    batch = next(iter(DataLoader(_data()[1], batch_size=3)))
    want, got = histogram_values(plain, batch), histogram_values(piped, batch)
    assert [tag for tag, _ in got] == [tag for tag, _ in want]
    assert {tag.split("/")[0] for tag, _ in got} == {"weights", "activations", "gradients"}
    for (tag, values), (_, expected) in zip(got, want):
        np.testing.assert_allclose(values, expected, rtol=1e-3, atol=1e-6, err_msg=tag)


def test_a_checkpoint_of_the_plain_run_resumes_in_a_pipeline_and_the_other_way(tmp_path):
    """One format: the plain run's model and optimizer state load into a pipeline (which then validates
    to the same loss), and the pipeline's, saved, load into a fresh plain GPT and AdamW."""
    model = _gpt()
    plain = _fit(model, optim.AdamW(decay_groups(model, 0.1), lr=1e-2), "cpu")
    save_checkpoint(str(tmp_path / "plain.safetensors"), plain.model, plain.optimizer)
    net, opt = _piped()
    load_checkpoint(str(tmp_path / "plain.safetensors"), net, opt)
    val = DataLoader(_data()[1], batch_size=3)
    again = Trainer(net, opt, val, loss_fn=lm_loss, metrics=None, progress=False)
    assert again.evaluate(val)["loss"] == pytest.approx(plain.history[-1]["val_loss"], rel=1e-6)
    save_checkpoint(str(tmp_path / "piped.safetensors"), net, opt)
    fresh = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    fresh_opt = optim.AdamW(decay_groups(fresh, 0.1), lr=1e-2)
    load_checkpoint(str(tmp_path / "piped.safetensors"), fresh, fresh_opt)
    for (key, got), want in zip(fresh.state_dict().items(), plain.model.state_dict().values()):
        np.testing.assert_array_equal(got, want, err_msg=key)
    for pos, entry in plain.optimizer.state.items():
        for key, value in entry.items():
            np.testing.assert_array_equal(np.asarray(fresh_opt.state[pos][key]), np.asarray(value))


def test_what_a_pipeline_cannot_do_in_the_loop_is_refused_with_its_reason():
    net, _ = _piped()
    hessian = optim.AdaHessian(net.parameters(), lr=0.1)
    train_set, _ = _data()
    with pytest.raises(ValueError, match="differentiates the gradients again .* runs backward stage by stage"):
        Trainer(net, hessian, DataLoader(train_set, batch_size=4), loss_fn=lm_loss, progress=False)
    net, opt = _piped()
    trainer = Trainer(net, opt, DataLoader(train_set, batch_size=4), loss_fn=lm_loss, metrics=None, progress=False)
    with pytest.raises(ValueError, match="Trainer.predict: Pipeline .* outputs exist on its last stage only"):
        trainer.predict(DataLoader(train_set, batch_size=4))


@pytest.mark.skipif(REASON is not None, reason=f"MPI not installed: {REASON}")
@pytest.mark.parametrize("ranks", [2, 4])
def test_early_stopping_stops_a_pipeline_where_one_process_stops_and_restores_its_best_weights(tmp_path, ranks):
    """tests/parallel/pipeline_trainer_worker.py: EarlyStopping (patience 2, min_delta 1 nat) on a 2-stage
    pipeline, and on 2 data-parallel replicas of it. Every stage must take the same decision at the same
    step (else the job hangs or crashes), and on_train_end puts back the best weights through the
    pipeline's whole-state load on every stage: the run ends with the weights of step 1, those of the
    one-process run (float32 tolerance of the pipeline tests), not those of step 3."""
    out = str(tmp_path / "run")
    job = launch.run(ranks, [os.path.join(HERE, "pipeline_trainer_worker.py"), out], timeout=180)
    assert job.returncode == 0, job.stderr[-3000:]
    got = json.loads(open(out + ".json").read())
    trainer, stop, weights = worker.run()
    assert got["replicas"] == ranks // 2
    assert (got["stopped_step"], got["best_step"], got["step"]) == (stop.stopped_step, stop.best_step, trainer.step) \
        == (1 + worker.PATIENCE, 1, 1 + worker.PATIENCE)
    np.testing.assert_allclose([r["val_loss"] for r in got["history"]], [r["val_loss"] for r in trainer.history],
                               rtol=1e-5)
    saved = np.load(out + ".npz")
    assert list(saved) == list(weights)
    for key, value in weights.items():
        np.testing.assert_allclose(saved[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
    last = trainer.history[-1]["val_loss"]  # the restored weights are step 1's: they validate to its loss
    assert Trainer(trainer.model, trainer.optimizer, [], progress=False, loss_fn=lm_loss, metrics=None).evaluate(
        trainer.val_loader)["loss"] == pytest.approx(trainer.history[0]["val_loss"], rel=1e-6) != last
