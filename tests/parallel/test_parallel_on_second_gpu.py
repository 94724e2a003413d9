"""Every parallel scheme with its model on "cuda:1" in a process whose current GPU is 0.

CuPy makes every new array, and runs every kernel, on the *current* GPU; an array of another GPU is
refused (without peer access; with it the result lands on the wrong GPU). So a scheme that makes its
buffers (flat shards, receive buffers, norms) with ``xp.zeros`` on whatever GPU is current fails with
"inputs on different devices" as soon as the model lives on a GPU other than 0. The stand-in has two
GPUs and keeps CuPy's rule (views stay on their array's GPU; kernels run on the current one), so each
scheme is trained here on cuda:1 through the Trainer (forward, backward, the global clip, the step)
and must give the CPU's weights, on cuda:1, with GPU 0 still current.
"""
import numpy as np
import pytest

import minidl as mdl
from minidl import backend, nn, optim, parallel
from minidl.data import DataLoader
from minidl.models.gpt import GPT, GPTConfig, tensor_parallel
from minidl.models.gpt_train import lm_loss
from minidl.train import Trainer

MODES = ["data", "zero1", "zero2", "zero3", "pipeline", "tensor"]


def _run(mode, device, max_steps=3):
    """``mode``'s wrappers in a world of one trained on ``device`` by the Trainer: ({name: weight array}, trainer)."""
    rng = np.random.default_rng(0)
    local = parallel.LocalComm
    if mode == "tensor":
        mdl.manual_seed(0)
        model = tensor_parallel(GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)), local())
        ids = rng.integers(0, 11, size=(48, 9))
        data, groups, options = (ids[:, :8], ids[:, 1:]), parallel.Layout(local(), tensor=local()), \
            dict(loss_fn=lm_loss, metrics=None)
    else:
        mdl.manual_seed(0)
        model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 4))
        x = rng.standard_normal((48, 12)).astype(np.float32)
        data, options = (x, x[:, :4].argmax(axis=1)), {}
        groups = parallel.Layout(local(), pipeline=local()) if mode == "pipeline" else \
            parallel.Layout(local(), data=local())
    zero = {"zero1": 1, "zero2": 2, "zero3": 3}.get(mode, 0)
    model.to(device)
    loader = DataLoader(data, batch_size=16)
    net, opt, loader = parallel.prepare(model, optim.Adam, loader, groups, zero=zero, lr=1e-2,
                                        micro_batches=2 if mode == "pipeline" else None)
    # a norm every step's gradient exceeds: the global clip scales every step
    trainer = Trainer(net, opt, loader, device=device, progress=False, max_grad_norm=0.05, **options)
    trainer.fit(epochs=1, max_steps=max_steps)
    with net.whole_module() as whole:
        return {name: p.array for name, p in whole.named_parameters()}, trainer


@pytest.mark.parametrize("mode", MODES)
def test_a_parallel_scheme_trains_on_cuda_1_as_on_the_cpu(standin, mode):
    got, trainer = _run(mode, "cuda:1")
    assert standin.cuda.get_device_id() == 0  # the current GPU is as it was
    want, cpu_trainer = _run(mode, "cpu")
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        assert backend.device_of(value) == "cuda:1", f"{mode}: {name} is on {backend.device_of(value)}"
        np.testing.assert_allclose(backend.to_numpy(value), want[name], rtol=1e-4, atol=1e-6, err_msg=f"{mode}: {name}")
    np.testing.assert_allclose(trainer.steps["loss"], cpu_trainer.steps["loss"], rtol=1e-5)


def _mlp(device):
    mdl.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(device)


def _batch(device, n=4):
    x = mdl.tensor(np.linspace(-1, 1, 4 * n, dtype=np.float32).reshape(n, 4), device=device)
    return x, mdl.tensor(np.arange(n) % 3, device=device)


def _own_loop(mode, device):
    """The schemes driven by a user's own loop, not the Trainer (which makes the model's GPU current):
    ZeRO-2/3's forward, backward, clip and step; a pipeline's train_step; the tensor-parallel clip.
    Returns the arrays each leaves behind (weights, gradients), on ``device``."""
    if mode in ("zero2", "zero3"):
        sharded = parallel.ShardedDataParallel(_mlp(device), parallel.LocalComm(), stage=int(mode[-1]))
        opt = parallel.DistributedOptimizer(optim.Adam(sharded.parameters(), lr=0.01), sharded)
        x, y = _batch(device)
        for _ in range(2):
            opt.zero_grad()
            mdl.functional.cross_entropy(sharded(x), y).backward()
            opt.clip_grad_norm_(0.05)
            opt.step()
        sharded.gather_parameters()
        return [p.array for p in sharded.module.parameters()]
    if mode == "pipeline":
        pipe = parallel.Pipeline(_mlp(device), parallel.LocalComm(), micro_batches=2)
        x, y = _batch(device)
        pipe.train_step(x, y, mdl.functional.cross_entropy)
        return [p.grad.array for p in pipe.parameters()]
    mdl.manual_seed(0)
    model = tensor_parallel(GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8)),
                            parallel.LocalComm()).to(device)
    idx = np.random.default_rng(0).integers(0, 7, size=(2, 6))
    mdl.functional.cross_entropy(model(idx).reshape(-1, 7), mdl.tensor(idx.reshape(-1), device=device)).backward()
    from minidl.parallel.tensor_parallel import clip_grad_norm_
    clip_grad_norm_(model, 0.05)
    return [p.grad.array for p in model.parameters()]


@pytest.mark.parametrize("mode", ["zero2", "zero3", "pipeline", "tensor"])
def test_a_scheme_called_by_its_own_loop_on_cuda_1_makes_its_arrays_there(standin, mode):
    got = _own_loop(mode, "cuda:1")
    assert standin.cuda.get_device_id() == 0
    want = _own_loop(mode, "cpu")
    assert len(got) == len(want)
    for index, (value, expected) in enumerate(zip(got, want)):
        assert backend.device_of(value) == "cuda:1", f"{mode}: array {index} is on {backend.device_of(value)}"
        np.testing.assert_allclose(backend.to_numpy(value), expected, rtol=1e-4, atol=1e-6, err_msg=f"{mode}: {index}")
