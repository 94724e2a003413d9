"""A GPT trained as nanoGPT's train.py trains it (after karpathy/nanoGPT, model.py and train.py: the
LayerNorm with an optional bias, attention through scaled_dot_product_attention, GELU, weight tying,
AdamW with decayed and undecayed groups, gradient clipping at 1.0), written afresh at a tiny
configuration of the character-level Shakespeare run: 4 layers, 4 heads, width 128, block 64,
65 symbols, batch 12, no dropout, no biases."""
import math

import torch
import torch.nn as nn
from torch.nn import functional as F

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD, BATCH = 65, 64, 4, 4, 128, 12


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's takes no bias=False)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD, bias=False)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD, bias=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        k = k.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        q = q.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        v = v.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD, bias=False)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD, bias=False)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = LayerNorm(N_EMBD, bias=False)
        self.attn = CausalSelfAttention()
        self.ln_2 = LayerNorm(N_EMBD, bias=False)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK, N_EMBD),
                                              h=nn.ModuleList([Block() for _ in range(N_LAYER)]),
                                              ln_f=LayerNorm(N_EMBD, bias=False)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        no_decay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def _setup(seed):
    """The model, its AdamW groups and eight batches of random tokens, drawn from ``seed`` in this order."""
    torch.manual_seed(seed)
    model = GPT()
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99))
    batches = []
    for _ in range(8):
        data = torch.randint(0, VOCAB, (BATCH, BLOCK + 1))
        batches.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    return model, optimizer, batches


def make_step(seed=0):
    model, optimizer, batches = _setup(seed)
    state = {"i": 0}

    def step():
        X, Y = batches[state["i"] % len(batches)]
        state["i"] += 1
        logits, loss = model(X, Y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step


def make_traced_step(seed=0, compile=lambda f: f):  # noqa: A002 - the tracer to apply, e.g. minidl.compile
    """``make_step``'s training in the form a tracer takes: the update as a function of the batch
    (drawn outside it), returning the loss. Without the gradient clipping: clip_grad_norm_ scales
    ``.grad`` in place outside any op, which a traced replay would skip (minidl.compile refuses it)."""
    model, optimizer, batches = _setup(seed)
    state = {"i": 0}

    @compile
    def train(X, Y):
        logits, loss = model(X, Y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def step():
        X, Y = batches[state["i"] % len(batches)]
        state["i"] += 1
        return train(X, Y)
    return step
