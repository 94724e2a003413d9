"""The Trainer's synchronization budget on "cuda" (the CuPy stand-in counts every device-to-host read):
a training step of an MLP or a CNN makes none; the numbers are read once per log interval. Range checks
of GPU indices make none either and report at the next read."""

import functools

import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim
from minidl.data import DataLoader
from minidl.train import Trainer
from tests.train.test_device_resume import _data, _mlp


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 4))


@pytest.mark.parametrize("kind", ["mlp", "cnn", "mlp-accumulate", "mlp-data-parallel"])
def test_a_training_step_makes_no_host_synchronization_between_log_reads(standin, kind):
    """The budget: zero device-to-host reads per step (data to the device, forward, loss with its
    class-index check, backward, clipping, the optimizer's fused kernel, the schedule); one read
    (losses, accuracy counts and gradient norms together) every log_every steps, and one at the end."""
    rng = np.random.default_rng(0)
    options = dict(max_grad_norm=1.0)
    if kind == "cnn":
        x = rng.standard_normal((128, 1, 8, 8)).astype(np.float32)
        y = rng.integers(0, 4, 128)
        model = _cnn()
        opt = optim.Adam(model.parameters(), lr=1e-3)
    else:
        x, y = _data(n=128 if kind == "mlp" else 256)
        model = _mlp(0)
        opt = optim.Adam(model.parameters(), lr=1e-3)
    if kind == "mlp-accumulate":
        opt = optim.SGDM(model.parameters(), lr=0.1, beta=0.9)
        options = dict(accumulation_steps=2, max_grad_value=0.5, label_smoothing=0.1,
                       scheduler=lambda t: 0.1 * 0.99 ** t)
    log_every = 3
    loader = DataLoader((x, y), batch_size=16, shuffle=True)
    model.to("cuda")
    if kind == "mlp-data-parallel":  # gradients all-reduced in buckets each step (a world of one here)
        from minidl import parallel
        model, opt, loader = parallel.prepare_data_parallel(model, opt, loader, comm=parallel.LocalComm())
    trainer = Trainer(model, opt, loader, device="cuda", progress=False, log_every=log_every, **options)
    counts = {}
    original = trainer._optimizer_step

    def step(micro_batches):
        original(micro_batches)
        counts[trainer.step] = standin.syncs.count
    trainer._optimizer_step = step
    standin.syncs.reset()
    trainer.fit(epochs=1, max_steps=7)
    per_step = {s: counts[s] - counts.get(s - 1, 0) for s in range(1, 8)}  # micro-batches and step together
    assert per_step == {s: (1 if s % log_every == 0 else 0) for s in range(1, 8)}, standin.syncs.where
    assert standin.syncs.count == counts[7] + 1  # the steps after the last log read are read as fit ends
    # what was read is what a CPU run logs: one loss per step, in order
    assert trainer.steps["step"] == list(range(1, 8)) and all(np.isfinite(trainer.steps["loss"]))


def test_out_of_range_targets_on_cuda_are_reported_at_the_next_read(standin):
    logits = mdl.randn(4, 3, device="cuda", requires_grad=True)
    target = backend.to_device(np.array([0, 1, 2, 3]), "cuda")
    before = standin.syncs.count
    loss = mdl.functional.cross_entropy(logits, mdl.tensor(target))
    assert standin.syncs.count == before  # no synchronization in the call itself
    with pytest.raises(ValueError, match="class index 3, but the input has 3 classes"):
        loss.item()
    # a target still on the host is checked there, at once, before it is copied
    with pytest.raises(ValueError, match="class index 3"):
        mdl.functional.cross_entropy(logits, np.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="index 9 is out of range for 5 embeddings"):
        mdl.functional.embedding(mdl.tensor(backend.to_device(np.array([1, 9]), "cuda")),
                                 mdl.randn(5, 2, device="cuda")).numpy()


def test_a_nan_loss_on_cuda_stops_at_the_log_read_naming_its_step(standin):
    x, y = _data(n=64)
    x[40:48] = np.nan  # the batch of step 6 without shuffling (batch size 8)
    model = _mlp(0)
    trainer = Trainer(model, optim.SGD(model.parameters(), lr=0.1), DataLoader((x, y), batch_size=8),
                      device="cuda", progress=False, log_every=4)
    with pytest.raises(mdl.train.NonFiniteLossError, match="at step 6.*log read after step 8") as info:
        trainer.fit(epochs=1)
    assert info.value.step == 6


def test_a_pending_check_does_not_outlive_the_stand_in():
    """A check made on the stand-in and never read is dropped with it: CPU work after it is unaffected."""
    from tests import cupy_standin
    previous = backend._use_cupy_module(cupy_standin, cupy_standin.cupyx)
    try:
        mdl.functional.embedding(mdl.tensor(backend.to_device(np.array([9]), "cuda")), mdl.randn(5, 2, device="cuda"))
        assert backend._deferred
    finally:
        backend._use_cupy_module(*previous)
    assert not backend._deferred and mdl.tensor([1.5]).item() == 1.5


PARALLEL_MODES = ["data", "zero1", "zero2", "zero3", "tensor", "pipeline"]


def _parallel_trainer(mode, log_every):
    """A Trainer over ``mode``'s wrappers (``parallel.prepare`` in a world of one) on "cuda", clipping
    to the global norm every step (the norm's squares all-reduced over the ranks that hold parts)."""
    from minidl import parallel
    from minidl.models.gpt import GPT, GPTConfig, tensor_parallel
    from minidl.models.gpt_train import lm_loss
    local = parallel.LocalComm
    options = dict(max_grad_norm=1.0)
    if mode == "tensor":
        mdl.manual_seed(0)
        model = tensor_parallel(GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)), local())
        ids = np.random.default_rng(0).integers(0, 11, size=(128, 9))
        data, groups = (ids[:, :8], ids[:, 1:]), parallel.Layout(local(), tensor=local())
        options.update(loss_fn=lm_loss, metrics=None)
    else:
        data, model = _data(n=128), _mlp(0)
        groups = parallel.Layout(local(), pipeline=local()) if mode == "pipeline" else \
            parallel.Layout(local(), data=local())
    model.to("cuda")
    net, opt, loader = parallel.prepare(model, optim.Adam, DataLoader(data, batch_size=16, shuffle=True), groups,
                                        zero={"zero1": 1, "zero2": 2, "zero3": 3}.get(mode, 0), lr=1e-3,
                                        micro_batches=2 if mode == "pipeline" else None)
    return Trainer(net, opt, loader, device="cuda", progress=False, log_every=log_every, **options)


def _syncs_per_step(standin, trainer, steps):
    """{step: host synchronizations made during it}, and the count after fit."""
    counts = {}
    original = trainer._optimizer_step

    def step(micro_batches):
        original(micro_batches)
        counts[trainer.step] = standin.syncs.count
    trainer._optimizer_step = step
    standin.syncs.reset()
    trainer.fit(epochs=1, max_steps=steps)
    return {s: counts[s] - counts.get(s - 1, 0) for s in range(1, steps + 1)}, counts[steps]


@pytest.mark.parametrize("mode", PARALLEL_MODES)
def test_every_parallel_mode_makes_no_host_synchronization_between_log_reads(standin, mode):
    """The budget of plain training, for every scheme: data parallelism, ZeRO 1-3, a tensor-parallel GPT and
    a pipeline in 2 micro-batches, each clipping to the global norm. Zero reads per step (the norm's
    squares are added over the ranks by an all-reduce on the device, the scale applied there; the
    pipeline's loss stays on the device); one read every log_every steps, and one at the end."""
    log_every = 3
    trainer = _parallel_trainer(mode, log_every)
    per_step, at_last_step = _syncs_per_step(standin, trainer, 7)
    assert per_step == {s: (1 if s % log_every == 0 else 0) for s in range(1, 8)}, standin.syncs.where
    assert standin.syncs.count == at_last_step + 1
    assert trainer.steps["step"] == list(range(1, 8)) and all(np.isfinite(trainer.steps["loss"]))


@pytest.mark.parametrize("stage", [2, 3])
def test_a_host_read_planted_in_the_zero_step_breaks_the_budget(standin, stage):
    """The budget test sees a synchronization hidden in ZeRO-2/3's step: a read of each unit's reduced
    gradient (``float(...)``, as a debugging print would make) costs one read per unit per step."""
    from minidl.parallel import sharded
    trainer = _parallel_trainer(f"zero{stage}", log_every=100)
    original = sharded.FlatShard.reduce_gradients

    def reduce_and_read(unit, weight):
        chunk = original(unit, weight)
        float(chunk.sum())  # the planted host read
        return chunk
    units = [u for _, u in trainer.model.units if u is not None]
    for unit in units:  # on these instances only: the class is left as it is
        unit.reduce_gradients = functools.partial(reduce_and_read, unit)
    per_step, _ = _syncs_per_step(standin, trainer, 3)
    assert per_step == {s: len(units) for s in range(1, 4)}
