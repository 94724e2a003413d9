"""The same GPT in PyTorch, for comparisons only (tests, benchmarks, the notebook).

Its parameters have the names and shapes of :class:`minidl.models.GPT`, so
``torch_model.load_state_dict(from_minidl(model.state_dict()))`` makes the two
compute the same function. PyTorch is imported when :func:`torch_gpt` is
called; minidl never depends on it.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["from_minidl", "torch_gpt"]


def torch_gpt(cfg):
    """A ``torch.nn.Module`` with :class:`minidl.models.GPT`'s architecture, names and initialization."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
            self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
            self.resid_dropout = nn.Dropout(cfg.dropout)

        def forward(self, x):
            B, T, C = x.shape  # noqa: N806
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (t.view(B, T, cfg.n_head, C // cfg.n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=cfg.dropout if self.training else 0.0)
            return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(B, T, C)))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
            self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
            self.dropout = nn.Dropout(cfg.dropout)

        def forward(self, x):
            return self.dropout(self.proj(F.gelu(self.fc(x))))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), CausalSelfAttention()
            self.ln2, self.mlp = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
            self.drop = nn.Dropout(cfg.dropout)
            self.blocks = nn.ModuleList([Block() for _ in range(cfg.n_layer)])
            self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
            residual_std = 0.02 / math.sqrt(2 * max(cfg.n_layer, 1))
            for name, p in self.named_parameters():
                if name.endswith("proj.weight"):
                    nn.init.normal_(p, 0.0, residual_std)
                elif name.startswith("ln") or ".ln" in name:
                    continue
                elif name.endswith("bias"):
                    nn.init.zeros_(p)
                else:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx):
            x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1])))
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.tok_emb.weight)

    return GPT()


def from_minidl(state_dict) -> dict:
    """A minidl state dict as torch tensors (for ``torch_model.load_state_dict``)."""
    import torch
    return {k: torch.from_numpy(np.array(v.numpy() if hasattr(v, "numpy") else v)) for k, v in state_dict.items()}
