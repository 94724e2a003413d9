"""Tensor, sharded and pipeline parallelism on the GPU's array code: the same numbers on "cuda" as on the CPU.

In a world of one (LocalComm) every collective is the identity, so what this checks is the layers'
own array code (slicing, flat shards, receive buffers) under CuPy's rules: on the strict stand-in
where there is no GPU. The collectives themselves are checked on MPI ranks and against NCCL's binding.
"""
import numpy as np

import minidl as mdl
import minidl.functional as F
from minidl import nn, optim, parallel
from minidl.models.gpt import GPT, GPTConfig, tensor_parallel


def _gpt_logits(device):
    mdl.manual_seed(0)
    model = tensor_parallel(GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8)),
                            parallel.LocalComm()).to(device)
    idx = np.random.default_rng(0).integers(0, 7, size=(2, 6))
    logits = model(idx)
    F.cross_entropy(logits.reshape(-1, 7), mdl.tensor(idx.reshape(-1), device=device)).backward()
    return logits.numpy(), model.blocks[0].attn.qkv.weight.grad.numpy()


def test_a_split_gpt_on_cuda_computes_what_it_computes_on_the_cpu(device):
    got, want = _gpt_logits(device), _gpt_logits("cpu")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-6)


def _sharded_and_piped(device):
    out = []
    for stage in (2, 3):
        mdl.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(device)
        sharded = parallel.ShardedDataParallel(model, parallel.LocalComm(), stage=stage)
        opt = parallel.DistributedOptimizer(optim.Adam(sharded.parameters(), lr=0.01), sharded)
        x = mdl.tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4), device=device)
        y = mdl.tensor(np.array([0, 1, 2, 0, 1]), device=device)
        for _ in range(2):
            opt.zero_grad()
            F.cross_entropy(sharded(x), y).backward()
            opt.step()
        sharded.gather_parameters()
        out.append(np.concatenate([p.numpy().ravel() for p in model.parameters()]))
    mdl.manual_seed(0)
    pipe = parallel.Pipeline(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(device),
                             parallel.LocalComm(), micro_batches=2)
    x = mdl.tensor(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), device=device)
    loss = pipe.train_step(x, np.array([0, 1, 2, 0]), lambda o, t: F.cross_entropy(o, mdl.tensor(t, device=device)))
    out.append(np.array([float(loss)]))
    out.append(np.concatenate([p.grad.numpy().ravel() for p in pipe.parameters()]))
    return out


def test_sharded_and_pipelined_training_on_cuda_computes_what_it_computes_on_the_cpu(device):
    for got, want in zip(_sharded_and_piped(device), _sharded_and_piped("cpu")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def _two_steps(model, opt, device):
    x = mdl.tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4), device=device)
    y = mdl.tensor(np.array([0, 1, 2, 0, 1]), device=device)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_a_sharded_checkpoint_written_on_cuda_loads_into_one_process_on_the_cpu(device, tmp_path):
    from minidl.train.run_state import load_checkpoint, save_checkpoint
    mdl.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    plain_opt = optim.Adam(plain.parameters(), lr=0.01)
    _two_steps(plain, plain_opt, "cpu")
    for stage in (2, 3):
        mdl.manual_seed(0)
        sharded = parallel.ShardedDataParallel(nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(device),
                                               parallel.LocalComm(), stage=stage)
        opt = parallel.DistributedOptimizer(optim.Adam(sharded.parameters(), lr=0.01), sharded)
        _two_steps(sharded, opt, device)
        path = str(tmp_path / f"stage{stage}.safetensors")
        save_checkpoint(path, sharded, opt)
        mdl.manual_seed(1)
        fresh = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
        fresh_opt = optim.Adam(fresh.parameters(), lr=0.01)
        load_checkpoint(path, fresh, fresh_opt)
        for got, want in zip(fresh.parameters(), plain.parameters()):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-6)
        for pos, entry in plain_opt.state.items():
            for key, value in entry.items():
                np.testing.assert_allclose(np.asarray(mdl.backend.to_numpy(fresh_opt.state[pos][key])),
                                           np.asarray(mdl.backend.to_numpy(value)), rtol=1e-4, atol=1e-7,
                                           err_msg=f"stage {stage}: state {key} of parameter {pos}")
