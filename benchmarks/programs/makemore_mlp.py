"""makemore's ``--type mlp`` (Bengio et al. 2003, after karpathy/makemore, makemore.py: MLP), written
afresh at makemore's default sizes: a 16-character context, each character embedded in 64
dimensions, one hidden tanh layer of 64, 27 symbols, batch 32, AdamW."""
import torch
import torch.nn as nn
from torch.nn import functional as F

VOCAB, BLOCK, N_EMBD, N_EMBD2, BATCH = 27, 16, 64, 64, 32


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB + 1, N_EMBD)  # one more for the <BLANK> before the start
        self.mlp = nn.Sequential(nn.Linear(BLOCK * N_EMBD, N_EMBD2), nn.Tanh(), nn.Linear(N_EMBD2, VOCAB))

    def forward(self, idx, targets=None):
        embs = []
        for k in range(BLOCK):
            tok_emb = self.wte(idx)
            idx = torch.roll(idx, 1, 1)
            idx[:, 0] = VOCAB
            embs.append(tok_emb)
        x = torch.cat(embs, -1)
        logits = self.mlp(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def make_step(seed=0):
    torch.manual_seed(seed)
    model = MLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.01, betas=(0.9, 0.99), eps=1e-8)
    batches = [(torch.randint(0, VOCAB, (BATCH, BLOCK)), torch.randint(0, VOCAB, (BATCH, BLOCK))) for _ in range(8)]
    state = {"i": 0}

    def step():
        X, Y = batches[state["i"] % len(batches)]
        state["i"] += 1
        logits, loss = model(X, Y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step
