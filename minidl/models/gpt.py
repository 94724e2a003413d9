"""A small GPT: a decoder-only transformer that predicts the next token, in minidl's own ops.

    model = GPT(GPTConfig(vocab_size=66, block_size=128, n_layer=4, n_head=4, n_embd=128))
    logits = model(idx)                          # idx (B, T) token ids → logits (B, T, vocab_size)
    loss = F.cross_entropy(logits.reshape(-1, 66), targets.reshape(-1))
    text_ids = model.generate(prompt_ids, max_new_tokens=200, temperature=0.8, top_k=20)

The architecture of GPT-2 (Radford et al. 2019), read top to bottom:

    x = token_embedding[idx] + position_embedding[0..T−1]         (B, T, C)
    N times:  x = x + Attention(LayerNorm(x))                     causal: position t sees 0..t
              x = x + MLP(LayerNorm(x))                           C → 4C → GELU → C
    logits = LayerNorm(x) · token_embeddingᵀ                      the output layer tied to the input one

Every line below is a minidl op with a backward; the attention is one op
(:func:`minidl.functional.scaled_dot_product_attention`) whose hand-written
backward keeps only the probabilities.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.autograd import no_grad
from minidl.checkpoint import checkpoint
from minidl.tensor import Tensor

__all__ = ["GPT", "GPTConfig", "check_pipeline", "check_tensor_parallel", "composed_attention", "pipeline_boundaries",
           "pipeline_layers", "tensor_parallel"]


def composed_attention(q, k, v, bias=None, scale=None):
    """The teaching version of attention: softmax(s·Q Kᵀ + B) V in five recorded ops.

    The same numbers as ``F.scaled_dot_product_attention`` (whose backward is
    written by hand and keeps only the probabilities); ``bias`` is the mask
    as an additive array, −∞ where a key takes no part.
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.mT) * scale               # (…, L, S): how well each query matches each key
    if bias is not None:
        scores = scores + bias                # −∞ where masked: those keys get probability 0
    return F.softmax(scores, dim=-1) @ v      # each output: a weighted mean of the values


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 128       # the longest context, in tokens
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True           # biases in the Linear layers and LayerNorms

    def to_dict(self) -> dict:
        return asdict(self)


class CausalSelfAttention(nn.Module):
    """n_head heads of causal attention over the sequence, then one projection mixing the heads."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"GPT: n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)   # Q, K and V in one product
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)      # a residual projection
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, T):  # noqa: N803 - x holds B·T positions, T per sequence
        BT, C = x.shape  # noqa: N806
        q, k, v = self.qkv(x).split(C, dim=1)
        # (B·T, C) → (B, n_head, T, C/n_head): each head attends in its own subspace.
        q, k, v = (t.reshape(BT // T, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(BT, C)  # the heads side by side again
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    """Position-wise: C → 4C → GELU → C."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)  # a residual projection
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm: the residual stream x is only ever added to, never normalized in place.

    Only attention looks across positions; everything else works on each
    position alone, so the stream is kept as a (B·T, C) matrix: every Linear
    is then one plain matrix product (BLAS runs a 2-D product several times
    faster than the same product batched over B).
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), CausalSelfAttention(cfg)
        self.ln2, self.mlp = nn.LayerNorm(cfg.n_embd, bias=cfg.bias), MLP(cfg)

    def forward(self, x, T):  # noqa: N803
        x = x + self.attn(self.ln1(x), T)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``n_layer`` blocks, a final LayerNorm, the tied output layer.

    ``checkpoint_blocks=True`` keeps only each block's input during the forward
    pass and recomputes the block during backward (one segment per block: the
    blocks are identical, so the segments are balanced), trading one more
    forward pass for the memory of every activation inside the blocks.
    """

    def __init__(self, cfg: GPTConfig, checkpoint_blocks: bool = False):
        super().__init__()
        self.config, self.checkpoint_blocks = cfg, checkpoint_blocks
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        # Weight tying (Press & Wolf 2017): the output layer is the token embedding itself, so a token's
        # input vector and the direction that predicts it are one parameter, (vocab_size, n_embd).
        self.init_weights()

    def init_weights(self):
        """GPT-2's initialization: N(0, 0.02) weights, zero biases, residual projections N(0, 0.02/√(2N)).

        Why the extra factor: each of the N blocks adds two branches (attention
        and MLP) to the residual stream, x_L = x_0 + Σ_{i=1..2N} f_i(x). Sums of
        2N roughly independent terms grow in variance like 2N, so the stream's
        scale would grow with depth; scaling the last layer of every branch by
        1/√(2N) keeps Var(x_L) about that of x_0, whatever the depth.
        """
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * max(self.config.n_layer, 1))
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):  # attn.proj and mlp.proj: the two residual projections
                nn.init.normal_(p, 0.0, residual_std)
            elif name.startswith("ln") or ".ln" in name:
                continue  # LayerNorm: γ = 1, β = 0 as constructed
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            else:  # embeddings and the other Linear weights
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx):
        B, T = idx.shape  # noqa: N806
        if T > self.config.block_size:
            raise ValueError(f"GPT: a sequence of {T} tokens is longer than block_size={self.config.block_size}")
        x = self.drop(self.tok_emb(idx) + self.pos_emb(np.arange(T)))    # (B, T, C)
        x = x.reshape(B * T, self.config.n_embd)                         # the residual stream, one row a position
        for block in self.blocks:
            x = checkpoint(block, x, T) if self.checkpoint_blocks and self.training else block(x, T)
        logits = F.linear(self.ln_f(x), self.tok_emb.weight)             # tied: (B·T, C) · (C, vocab_size)
        return logits.reshape(B, T, self.config.vocab_size)

    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: np.random.Generator | None = None, on_token=None) -> np.ndarray:
        """Extend each row of ``idx`` (B, T) by ``max_new_tokens`` tokens drawn one at a time.

        ``on_token(n)``, when given, is called after each drawn token with the number drawn so far
        (a progress bar's hook).

        The next token is drawn from softmax(logits / temperature) over the last
        position's logits, restricted to the ``top_k`` most likely when given.
        Lower temperature: surer, more repetitive text; higher: more surprising.
        A temperature so small that logits / temperature overflows float64 (such
        as 1e-310) takes softmax's limit as the temperature goes to 0: the
        likeliest token, always (greedy decoding). The CPU's BLAS runs on one thread
        meanwhile (``backend.blas_threads``): a one-token step's products are too small to
        share out, and spare threads only spin.
        """
        if not temperature > 0:
            raise ValueError(f"GPT.generate: temperature must be > 0, got {temperature}")
        rng = generator if generator is not None else np.random.default_rng()
        idx = np.array(idx.array if isinstance(idx, Tensor) else idx, dtype=np.int64, ndmin=2)
        was_training = self.training
        self.eval()
        try:
            with no_grad(), backend.blas_threads(1):  # one token at a time: products too small to share out
                for drawn in range(1, max_new_tokens + 1):
                    context = idx[:, -self.config.block_size:]                 # the model sees at most block_size
                    raw = self(context).numpy()[:, -1, :].astype(np.float64)
                    with np.errstate(over="ignore", invalid="ignore"):
                        logits = raw / temperature
                        if top_k is not None and top_k < logits.shape[-1]:
                            kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
                            logits = np.where(logits < kth, -np.inf, logits)
                        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
                        probs /= probs.sum(axis=-1, keepdims=True)
                    overflowed = ~np.isfinite(probs).all(axis=-1)
                    if overflowed.any():  # logits / temperature beyond float64: the T → 0 limit, greedy
                        probs[overflowed] = np.eye(probs.shape[-1])[raw[overflowed].argmax(axis=-1)]
                    nxt = [rng.choice(probs.shape[-1], p=p) for p in probs]
                    idx = np.concatenate([idx, np.array(nxt, dtype=np.int64)[:, None]], axis=1)
                    if on_token is not None:
                        on_token(drawn)
        finally:
            self.train(was_training)
        return idx


def check_tensor_parallel(n_head: int, n_embd: int, dropout: float, ranks: int) -> None:
    """Raise ValueError unless a GPT of ``n_head`` heads, width ``n_embd`` and ``dropout`` splits over
    ``ranks`` ranks: the heads and the MLP's 4·n_embd hidden units divide among them, and no dropout
    (each rank would draw its own mask). What :func:`tensor_parallel` checks, callable before any model."""
    from minidl.parallel.tensor_parallel import check_divides
    check_divides(f"GPT(n_head={n_head}, n_embd={n_embd})", "n_head", n_head, ranks)
    check_divides(f"GPT(n_head={n_head}, n_embd={n_embd})", "4·n_embd", 4 * n_embd, ranks)
    if dropout and ranks > 1:
        raise ValueError(f"GPT tensor parallelism: dropout={dropout} would draw a different mask on each rank "
                         "of the tensor group, where one replicated activation needs one mask; use dropout=0")


def tensor_parallel(model: GPT, comm) -> GPT:
    """Split every block of ``model`` over the ranks of ``comm`` (Megatron-LM), in place; returns it.

    Each block's attention keeps n_head/N heads per rank (QKV column-parallel,
    the projection row-parallel) and its MLP a slice of 4C/N hidden units (fc
    column-parallel, proj row-parallel): two all-reduces per block forward, two
    backward. Embeddings, LayerNorms and the tied output layer stay whole on
    every rank. The weights are this model's, sliced: a model built after
    ``manual_seed(s)`` on every rank, then split, computes what the unsplit
    one computes. Everything is checked before anything changes.
    """
    from minidl.parallel.tensor_parallel import ParallelCausalSelfAttention, ParallelMLP

    cfg = model.config
    check_tensor_parallel(cfg.n_head, cfg.n_embd, cfg.dropout, comm.size)
    if any(not isinstance(b.attn, CausalSelfAttention) for b in model.blocks):
        raise ValueError("GPT tensor parallelism: this model is already split (its blocks hold parallel layers)")
    for block in model.blocks:
        attn = ParallelCausalSelfAttention.from_layers(block.attn.qkv, block.attn.proj, cfg.n_head, comm)
        mlp = ParallelMLP.from_layers(block.mlp.fc, block.mlp.proj, comm, activation=F.gelu)
        # Assigned in the block's own order (a Module registers an assigned attribute last), so the
        # parameters keep the plain model's order: ln1, attn, ln2, mlp.
        block.attn, block.ln2, block.mlp = attn, block.ln2, mlp
    return model



# ---------------------------------------------------------------- the GPT as a pipeline of layers
class SequenceEmbedding(nn.Module):
    """The GPT's input layer as a pipeline stage: token ids (B, T) → tok_emb[idx] + pos_emb[0..T−1], (B, T, C).

    Holds the model's own embeddings (the token one is also the tied output layer's weight)."""

    def __init__(self, model: GPT):
        super().__init__()
        self.tok_emb, self.pos_emb, self.drop = model.tok_emb, model.pos_emb, model.drop

    def forward(self, idx):
        return self.drop(self.tok_emb(idx) + self.pos_emb(np.arange(idx.shape[1])))


class SequenceBlock(nn.Module):
    """One of the model's blocks on a (B, T, C) activation, the shape that travels between stages (a block
    needs T, the sequence length, to know which positions attend to which). ``checkpointed``: in training,
    the block is recomputed in backward, as the GPT's ``checkpoint_blocks`` does it."""

    def __init__(self, block: Block, checkpointed: bool = False):
        super().__init__()
        self.block, self.checkpointed = block, checkpointed

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806
        rows = x.reshape(B * T, C)
        y = checkpoint(self.block, rows, T) if self.checkpointed and self.training else self.block(rows, T)
        return y.reshape(B, T, C)


class TiedHead(nn.Module):
    """The final LayerNorm and the output layer, whose weight is the token embedding's (the same Parameter):
    (B, T, C) → logits (B, T, vocab_size)."""

    def __init__(self, model: GPT):
        super().__init__()
        self.ln_f, self.weight = model.ln_f, model.tok_emb.weight

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806
        return F.linear(self.ln_f(x.reshape(B * T, C)), self.weight).reshape(B, T, self.weight.shape[0])


def pipeline_layers(model: GPT) -> nn.Sequential:
    """``model`` as n_layer + 2 layers in a row, for :class:`minidl.parallel.Pipeline`:
    [embedding, block 0, …, block N−1, final norm + tied head], holding the model's own parameters (so
    training them trains ``model``, whose ``state_dict`` keeps its names). The token embedding's weight is
    in the first layer and the last: cut into stages, both the first and the last stage hold it, and the
    two gradients must be summed before each step (what one process's backward does through the tie).

    A model split by :func:`tensor_parallel` pipelines as it is (tensor × pipeline): each block keeps its
    parallel layers, whose all-reduces run within the stage's tensor group, and the (B, T, C) activation
    that travels between stages is whole on every rank of that group. A model with ``checkpoint_blocks``
    recomputes each block in backward here too (a stage then keeps each micro-batch's block inputs only,
    as GPipe's rematerialization)."""
    return nn.Sequential(SequenceEmbedding(model), *[SequenceBlock(b, model.checkpoint_blocks) for b in model.blocks],
                         TiedHead(model))


def check_pipeline(n_layer: int, dropout: float, stages: int) -> None:
    """Raise ValueError unless a GPT of ``n_layer`` blocks and ``dropout`` cuts into ``stages`` pipeline
    stages of equal block counts (the embedding goes with the first, the head with the last), without
    dropout (each rank would draw its masks from its own generator, not one process's). Callable before
    any model is built."""
    if stages < 2:
        raise ValueError(f"GPT pipeline: {stages} stage is one process; use 2 stages or more")
    if n_layer < stages or n_layer % stages:
        valid = ", ".join(str(d) for d in range(2, n_layer + 1) if n_layer % d == 0) or "none (n_layer=1)"
        raise ValueError(f"GPT pipeline: n_layer ({n_layer}) blocks do not divide into {stages} stages of equal "
                         f"length; choose a number of stages among {valid}, or n_layer a multiple of {stages}")
    if dropout:
        raise ValueError(f"GPT pipeline: dropout={dropout} would draw each stage's masks from that rank's own "
                         "generator, not the one process's; use dropout=0")


def pipeline_boundaries(n_layer: int, stages: int) -> list[int]:
    """The cut of :func:`pipeline_layers` into ``stages`` stages of n_layer/stages blocks each: the
    embedding before the first stage's blocks, the head after the last stage's."""
    check_pipeline(n_layer, 0.0, stages)
    per = n_layer // stages
    return [0] + [1 + s * per for s in range(1, stages)] + [n_layer + 2]
