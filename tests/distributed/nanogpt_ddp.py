"""nanoGPT's train.py loop (its DDP path), with the torch imports changed to minidl's.

    python nanogpt_ddp.py OUT.json                                          # one process
    mpiexec -n 2 python -m minidl.distributed.run nanogpt_ddp.py OUT.json   # two ranks, torchrun-style

The lines that follow nanoGPT are kept as they are there (`ddp = int(os.environ.get('RANK', -1)) != -1`,
`gradient_accumulation_steps //= ddp_world_size`, `model.require_backward_grad_sync = ...`, the
`estimate_loss` of fixed batches, `raw_model = model.module`, `destroy_process_group()`). One change makes
the comparison exact: nanoGPT draws each rank's batches at random (seed 1337 + rank); here micro-batch m
of iteration i on rank r is the fixed batch number i·A + r·(A/N) + m (A the global accumulation steps),
so N ranks together see the batches one process sees.
"""
import json
import os
import sys
from contextlib import nullcontext

import numpy as np

import minidl as torch  # import torch
import minidl.functional as F  # from torch.nn import functional as F
import minidl.nn as nn  # import torch.nn as nn
from minidl.distributed import destroy_process_group, init_process_group  # from torch.distributed import ...
from minidl.models.gpt import GPT as _Body
from minidl.models.gpt import GPTConfig
from minidl.parallel import DistributedDataParallel as DDP  # from torch.nn.parallel import ...

out_path = sys.argv[1]
# -----------------------------------------------------------------------------
batch_size, block_size, vocab_size = 4, 16, 32
gradient_accumulation_steps = 4   # used to simulate larger batch sizes (divides by the world size)
max_iters, eval_interval, eval_iters = 6, 2, 2
learning_rate, weight_decay, beta1, beta2, grad_clip = 3e-3, 0.1, 0.9, 0.95, 1.0
backend = 'gloo'
device = 'cpu'
# -----------------------------------------------------------------------------


class GPT(nn.Module):
    """nanoGPT's model interface: forward(idx, targets) returns (logits, loss)."""

    def __init__(self, config):
        super().__init__()
        self.body = _Body(config)

    def forward(self, idx, targets=None):
        logits = self.body(idx)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


ddp = int(os.environ.get('RANK', -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process = True
    seed_offset = 0
    ddp_world_size, ddp_rank, ddp_local_rank = 1, 0, 0
global_accumulation = gradient_accumulation_steps * ddp_world_size

torch.manual_seed(1337 + seed_offset)  # ranks start from different weights: DDP broadcasts rank 0's
data = np.random.default_rng(0).integers(0, vocab_size, size=4000)
ctx = nullcontext()


def get_batch(number):
    """Fixed batch `number` (nanoGPT draws them at random; fixed, N ranks share one process's batches)."""
    ix = np.random.default_rng(1000 + number).integers(0, len(data) - block_size, size=batch_size)
    x = torch.tensor(np.stack([data[i:i + block_size] for i in ix]))
    y = torch.tensor(np.stack([data[i + 1:i + 1 + block_size] for i in ix]))
    return x, y


model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=32))
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2), weight_decay=weight_decay)
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split, base in (('train', 10_000), ('val', 20_000)):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(base + k)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean().item()
    model.train()
    return out


raw_model = model.module if ddp else model  # unwrap DDP container if needed
record = {"eval": [], "world_size": ddp_world_size}
first = lambda it: it * global_accumulation + ddp_rank * gradient_accumulation_steps  # noqa: E731
X, Y = get_batch(first(0))
for iter_num in range(max_iters + 1):
    if iter_num % eval_interval == 0 and master_process:
        record["eval"].append(estimate_loss())
    if iter_num == max_iters:
        break
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # in DDP training we only need to sync gradients at the last micro step.
            model.require_backward_grad_sync = (micro_step == gradient_accumulation_steps - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        nxt = micro_step + 1
        X, Y = get_batch(first(iter_num) + nxt if nxt < gradient_accumulation_steps else first(iter_num + 1))
        loss.backward()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

if master_process:
    record["weights"] = {k: np.asarray(v).tolist() for k, v in raw_model.state_dict().items()
                         if k in ("body.tok_emb.weight", "body.ln_f.weight")}
    with open(out_path, "w") as f:
        json.dump(record, f)
if ddp:
    destroy_process_group()
