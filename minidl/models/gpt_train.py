"""The GPT training recipe, through the Trainer, and the saved run that ``minidl gpt sample`` reads.

    settings = dict(DEFAULTS, steps=200)
    result = train(settings, out="runs/gpt")        # trains, writes the run folder, returns a summary
    model, tok = load_run("runs/gpt")                # the trained model and its tokenizer
    print(tok.decode(model.generate(tok.encode("ROMEO:\\n")[None], 200, temperature=0.8)[0]))

The recipe, each part the textbook's:

- AdamW, with weight decay on the matrices of the Linear layers only: decay pulls
  weights towards 0, which is a prior for the weights that multiply inputs;
  a bias, a LayerNorm gain (whose neutral value is 1, not 0) and an embedding
  row (updated only when its token appears) are not such weights;
- linear warmup, then cosine decay to ``min_lr`` (the early steps' Adam
  statistics are poor, so the first updates are small);
- gradient clipping at global norm 1.0; gradient accumulation over
  ``accumulate`` micro-batches; optional gradient checkpointing per block;
- data parallel under ``mpiexec`` (``--data-parallel``), as ``minidl train``;
- everything in a Trainer checkpoint, so ``--resume`` continues bit for bit.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

import minidl.functional as F
from minidl import backend, nn
from minidl.data.text import CharTokenizer, next_token_windows, shakespeare, split_ids
from minidl.models.gpt import GPT, GPTConfig
from minidl.train.callbacks import Callback

__all__ = ["DEFAULTS", "GPTProgress", "build", "build_run", "decay_groups", "lm_loss", "load_run", "longest_block",
           "lr_schedule", "train", "warmup_steps"]

# Chosen to finish within 10 minutes on 2 CPU cores (measured; see docs/transformer.md).
DEFAULTS = dict(
    n_layer=4, n_head=4, n_embd=128, block_size=64, dropout=0.0,       # the model: 0.8 M parameters
    batch_size=32, accumulate=1, steps=600,                             # 2,048 tokens a step
    lr=3e-3, min_lr=3e-4, warmup=60, weight_decay=0.1, betas=(0.9, 0.99), clip_norm=1.0,
    eval_every=100, val_windows=256, sample_every=200, checkpoint_blocks=False, seed=0,
    amp=None,                                                           # or "bf16", "fp16": mixed precision
)


def lm_loss(logits, targets, label_smoothing: float = 0.0):
    """Mean cross-entropy of every position's next-token prediction: logits (B, T, V), targets (B, T)."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), label_smoothing=label_smoothing)


def decay_groups(model, weight_decay: float) -> list[dict]:
    """Two parameter groups: the Linear weights with ``weight_decay``, everything else without.

    A tensor-parallel model's column- and row-parallel layers are Linear layers split: their weights decay.
    """
    from minidl.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    linear = (nn.Linear, ColumnParallelLinear, RowParallelLinear)
    decay = {id(m.weight) for m in model.modules() if isinstance(m, linear)}
    params = list(model.parameters())
    return [{"params": [p for p in params if id(p) in decay], "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0}]


def warmup_steps(warmup: int, steps: int) -> int:
    """The warmup a run of ``steps`` steps gets: ``warmup``, at most half the run (the cosine needs the rest)."""
    return max(1, min(warmup, steps // 2))


def lr_schedule(lr: float, min_lr: float, warmup: int, steps: int):
    """f(t) for the steps t = 0 … steps − 1: a linear ramp from lr/20 towards lr over the W = ``warmup_steps``
    first steps, then a cosine from lr down to min_lr, reached at the last step:

        f(t) = lr·(1/20 + (19/20)·t/W)                                  t < W
        f(t) = min_lr + (lr − min_lr)·(1 + cos(π·(t − W)/(steps − 1 − W)))/2    W ≤ t ≤ steps − 1

    So a short run (fewer steps than ``warmup``) still ends at min_lr, never below it.
    """
    from minidl.optim import schedules
    w = warmup_steps(warmup, steps)
    return schedules.sequential([schedules.warmup(schedules.constant(lr), steps=w),
                                 schedules.cosine(lr, T_max=max(steps - 1 - w, 1), eta_min=min_lr)], [w])


def build(s: dict, comm=None, tensor=None):
    """(model, optimizer, schedule, train_loader, val_loader, tokenizer) for the settings ``s``."""
    run, tok = build_run(s, comm, tensor=tensor)
    return run.model, run.optimizer, run.schedule, run.train_loader, run.val_loader, tok


def build_run(s: dict, comm=None, device=None, tensor=None):
    """(the :class:`~minidl.train.recipe.Run` of the settings ``s``, the tokenizer): the recipe of
    :func:`minidl.train.recipe.build_run` with AdamW over :func:`decay_groups` and :func:`lr_schedule`.

    ``comm``: the data-parallel group; ``tensor``: the tensor-parallel group, over which the GPT, built
    from the seed as the plain one, is split by :func:`minidl.models.gpt.tensor_parallel` before the
    optimizer sees its parameters (every rank of the group trains on the same batches). The run's model
    and optimizer are then wrapped in :class:`~minidl.parallel.tensor_parallel.TensorParallel` and
    :class:`~minidl.parallel.tensor_parallel.TensorParallelOptimizer` (outside the data-parallel ones):
    checkpoints hold the whole weights and optimizer state, as one process saves them, and the gradients
    are clipped to the unsplit model's norm."""
    from minidl.data import TensorDataset
    from minidl.train import recipe
    text = shakespeare()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = split_ids(tok.encode(text), val_fraction=0.1)
    x, y = next_token_windows(train_ids, s["block_size"])
    vx, vy = next_token_windows(val_ids, s["block_size"], limit=s["val_windows"])
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=s["block_size"], n_layer=s["n_layer"],
                    n_head=s["n_head"], n_embd=s["n_embd"], dropout=s["dropout"])
    run = recipe.build_run(s, TensorDataset(x, y), TensorDataset(vx, vy),
                           model=lambda: _model(cfg, s["checkpoint_blocks"], tensor),
                           params=lambda model: decay_groups(model, s["weight_decay"]), optimizer="adamw",
                           optimizer_options={"betas": tuple(s["betas"])},
                           schedule=lambda lr, steps: lr_schedule(lr, s["min_lr"], s["warmup"], steps),
                           steps=s["steps"], device=device, comm=comm, drop_last=True, val_batch_size=64)
    if tensor is not None:
        from minidl.parallel.tensor_parallel import TensorParallel, TensorParallelOptimizer
        run.model = TensorParallel(run.model)
        run.optimizer = TensorParallelOptimizer(run.optimizer, run.model)
    return run, tok


def _model(cfg: GPTConfig, checkpoint_blocks: bool, tensor):
    model = GPT(cfg, checkpoint_blocks=checkpoint_blocks)
    if tensor is None:
        return model
    from minidl.models.gpt import tensor_parallel
    return tensor_parallel(model, tensor)


def _gpt(model) -> GPT:
    """The GPT inside a run's model (which may wrap it: DataParallel, TensorParallel, both)."""
    while not isinstance(model, GPT) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


class GPTProgress(Callback):
    """A bar over the optimizer steps with tokens/s and loss; validation losses and samples as they come.

    Writes the resumable checkpoint ``last.safetensors`` at every validation (into ``out``, when given).
    ``gather``: the checkpoint is gathered from the ranks (a tensor-parallel run), so this rank joins
    every save, writing only if it has ``out``.
    Samples are drawn with their own generator, so they never change the run.
    """

    def __init__(self, total_steps: int, tokens_per_step: int, tokenizer, out: str | None,
                 sample_every: int = 0, show: bool = True, stream=None, gather: bool = False):
        self.total, self.tokens_per_step, self.tok, self.out = total_steps, tokens_per_step, tokenizer, out
        self.gather = gather
        self.sample_every, self.show, self.stream = sample_every, show, stream or sys.stderr
        self.bar, self.tokens_per_s = None, float("nan")
        self.training_seconds, self.steps_timed, self.last = 0.0, 0, 0.0

    def on_train_begin(self, trainer):
        self.training_seconds, self.steps_timed, self.last = 0.0, 0, time.perf_counter()
        if self.show:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=self.total, initial=trainer.step, unit="step", desc="gpt", file=self.stream,
                            dynamic_ncols=True)

    def on_step_end(self, trainer, step, logs):
        now = time.perf_counter()  # the time since the last step or validation: training only
        self.training_seconds += now - self.last
        self.steps_timed += 1
        self.last = now
        self.tokens_per_s = self.steps_timed * self.tokens_per_step / max(self.training_seconds, 1e-9)
        if self.bar is not None:
            self.bar.update(1)
            val = f", val {trainer.history[-1]['val_loss']:.3f}" if trainer.history else ""
            self.bar.set_postfix_str(f"{self.tokens_per_s:,.0f} tok/s, loss {logs['loss']:.3f}{val}", refresh=False)

    def on_evaluate(self, trainer, logs):
        if self.out is not None:
            trainer.save_checkpoint(os.path.join(self.out, "last.safetensors"))
        elif self.gather:  # a collective: this rank's part of the gathering, written by another
            trainer.save_checkpoint(None, write=False)
        if self.show and self.sample_every and trainer.step % self.sample_every == 0:
            model = getattr(trainer.model, "module", trainer.model)
            ids = model.generate(self.tok.encode("\n")[None], 160, temperature=0.8, top_k=None,
                                 generator=np.random.default_rng(trainer.step))
            self._write(f"--- step {trainer.step}, validation loss {logs['val_loss']:.4f}; a sample:\n"
                        f"{self.tok.decode(ids[0, 1:])}\n---")
        self.last = time.perf_counter()

    def on_train_end(self, trainer):
        if self.bar is not None:
            self.bar.close()

    def _write(self, text):
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream)


def train(s: dict, out: str | None, resume: str | None = None, show: bool = True, comm=None,
          stop_after: int | None = None, device: str | None = None, tensor=None) -> dict:
    """Train with the settings ``s``; write the run folder ``out`` (rank 0 only); return a summary.

    ``stop_after`` stops after that many steps, as if the run were killed
    there (the schedule stays that of ``s["steps"]``); ``resume`` continues it.
    ``device``: where the Trainer runs ("cuda" for the GPU; default the CPU).

    The folder gets ``gpt.safetensors`` (weights, config and tokenizer: what
    ``sample`` needs), ``last.safetensors`` (the resumable checkpoint),
    ``metrics.jsonl`` and ``loss.png``. A run that ends between two
    validations validates once more at its last step, so ``last.safetensors``
    and ``metrics.jsonl`` always hold where it ended.

    ``tensor``: a tensor-parallel group (see :func:`build_run`); every rank of
    it joins the gathers, and rank 0 writes: ``gpt.safetensors`` holds the
    whole (consolidated) weights, and ``last.safetensors`` what one process
    would save (the whole weights and each parameter's AdamW state in its
    whole shape), so ``resume`` continues it in one process or split any other
    way, and a one-process checkpoint resumes split. Such a run draws no
    samples while training (each is a forward pass, a collective of the
    group, and only rank 0 shows it).
    """
    from minidl.train import JSONLLogger, plot_curves

    run, tok = build_run(s, comm, tensor=tensor)
    model, val_loader = run.model, run.val_loader
    root = (comm is None or comm.rank == 0) and (tensor is None or tensor.rank == 0)
    callbacks = [GPTProgress(s["steps"], s["batch_size"] * s["block_size"] * s["accumulate"], tok,
                             out if root else None, s["sample_every"] if tensor is None else 0,
                             show=show and root, gather=tensor is not None)]
    if root and out is not None:
        os.makedirs(out, exist_ok=True)
        callbacks.append(JSONLLogger(os.path.join(out, "metrics.jsonl")))
    elif comm is not None or tensor is not None:
        callbacks.append(Callback())  # in the logger's place: every rank loads the writer's callback states
    trainer = run.trainer(loss_fn=lm_loss, metrics=None, eval_every=s["eval_every"], callbacks=callbacks,
                          progress=False, amp=s["amp"], device=device)
    trainer.extra = {"settings": s}
    if resume:
        trainer.load_checkpoint(resume)
    epochs = math.ceil(s["steps"] * s["accumulate"] / len(run.train_loader))
    started = time.perf_counter()
    trainer.fit(epochs, max_steps=s["steps"] if stop_after is None else min(stop_after, s["steps"]))
    seconds = time.perf_counter() - started
    if trainer.history and trainer.history[-1]["step"] == trainer.step:
        val_loss = trainer.history[-1]["val_loss"]
    elif stop_after is None:  # the run ended between validations: validate, log and checkpoint where it ended
        val_loss = trainer.validate()["val_loss"]
    else:  # stopped as if killed: nothing more is written
        val_loss = trainer.evaluate(val_loader)["loss"]
    net = _gpt(model)
    state = None
    if tensor is not None:  # every rank of the group joins the gather
        state = model.consolidated_state_dict()
    parameters = net.num_parameters() if state is None else sum(int(a.size) for a in state.values())
    summary = {"steps": trainer.step, "val_loss": val_loss, "seconds": seconds,
               "tokens_per_s": callbacks[0].tokens_per_s, "parameters": parameters}
    if root and out is not None:
        save_run(out, net, tok, state)
        plot_curves(trainer.history, os.path.join(out, "loss.png"), steps=trainer.steps,
                    title=f"GPT on Shakespeare ({summary['parameters']:,} parameters)")
    summary["trainer"] = trainer
    return summary


def train_pipeline(s: dict, out: str | None, comm, micro_batches: int, schedule: str = "1f1b",
                   show: bool = True, data=None, tensor=None, resume: str | None = None,
                   stop_after: int | None = None) -> dict:
    """Train with the settings ``s`` on a pipeline of ``comm.size`` stages (a collective: every rank calls
    it); rank 0 writes the run folder ``out``. Returns the summary :func:`train` returns (no trainer).

    Every rank builds the whole run of :func:`build_run` (so the weights, the batches and the schedule
    are one process's), then keeps its stage of :func:`minidl.models.gpt.pipeline_layers` and an AdamW
    over that stage's :func:`decay_groups`. The loop is the Trainer's, written out for a pipeline:

        loss = pipe.train_step(x, y, lm_loss)    # K micro-batches through the stages, gradients accumulated
        sum the tied weight's gradient over the first and the last stage (their 2-rank embedding group)
        clip to the global norm: total² = Σ_stages ‖g_stage‖² (the tied weight counted once)
        AdamW step at the schedule's rate; zero the gradients; next rate

    every ``eval_every`` steps (and at the last) a forward-only pass over the validation set, the
    activations sent stage to stage, the last stage's mean loss shared; then ``last.safetensors``, the
    resumable checkpoint, gathered from the stages (see :func:`pipeline_checkpoint`). ``gpt.safetensors``
    holds the whole model, written by rank 0.
    The summary adds ``bubble``, the idle fraction of the last step's timeline over every stage
    (:func:`minidl.parallel.pipeline.bubble_fraction`; (M − 1)/(K + M − 1) with free messages and equal
    stages), and ``peak_in_flight``, the most micro-batches rank 0's stage held at once.

    ``data``: the data group of a Mesh(data=D, pipeline=M) (``comm`` then its pipeline group): D
    replicas of the pipeline, each walking its 1/D of every batch (:func:`minidl.parallel.sampler.shard_loader`,
    so B must split into D × K micro-batches); after the tied sum, each stage's gradients are averaged
    over the same stage of the other replicas, g ← (1/D) Σ_replicas g, so every replica clips (by its own
    pipeline's global norm, now the same everywhere) and steps as one process would. The train loss is
    averaged the same way; the validation runs whole on every replica; the ranks of the first replica
    gather the weights and its rank 0 (the world's) writes.

    ``tensor``: the tensor group of a Mesh(…, pipeline=M, tensor=N): the GPT is split over it
    (:func:`minidl.models.gpt.tensor_parallel`) before it is cut into stages, so each stage's blocks
    run on N ranks; the clip adds the slices' squares over the group, and the split weights are
    gathered whole for the files.

    ``resume``: a ``last.safetensors`` of a pipeline run (any M, K, D or N): the run continues from it
    as the uninterrupted run would. ``stop_after`` stops after that many steps, as if the run were killed
    there (the schedule stays that of ``s["steps"]``).
    """
    from minidl import optim
    from minidl.models.gpt import check_pipeline, check_tensor_parallel, pipeline_boundaries, pipeline_layers
    from minidl.parallel.pipeline import Pipeline, bubble_fraction
    from minidl.train import plot_curves
    from minidl.train.callbacks import JSONLLogger

    check_pipeline(s["n_layer"], s["dropout"], comm.size)
    if tensor is not None:
        check_tensor_parallel(s["n_head"], s["n_embd"], s["dropout"], tensor.size)
    replicas = 1 if data is None else data.size
    if s["batch_size"] % (micro_batches * replicas):
        raise ValueError(f"a batch of {s['batch_size']} sequences does not split into {micro_batches} equal "
                         f"micro-batches" + (f" on each of {replicas} replicas" if replicas > 1 else ""))
    saved = read_pipeline_checkpoint(resume) if resume else None
    run, tok = build_run(s, tensor=tensor)
    if replicas > 1:
        from minidl.parallel.sampler import shard_loader
        run.train_loader = shard_loader(run.train_loader, data)
    model = _gpt(run.model)
    pipe = Pipeline(pipeline_layers(model), comm, micro_batches, schedule,
                    boundaries=pipeline_boundaries(s["n_layer"], comm.size))
    opt = optim.AdamW(decay_groups(pipe.stage, s["weight_decay"]), lr=run.lr, betas=tuple(s["betas"]))
    rates = optim.ScheduleLR(opt, run.schedule)
    stages = _PipelineParts(model, pipe, opt, comm, tensor, s["weight_decay"])
    step, history = 0, []
    if saved is not None:
        step, history = stages.load(saved, rates, run.train_loader, resume)
    first_step = step
    first_replica = data is None or data.rank == 0
    root = comm.rank == 0 and first_replica and (tensor is None or tensor.rank == 0)
    log = JSONLLogger(os.path.join(out, "metrics.jsonl")) if root and out is not None else None
    if log is not None:
        log.begin(step)
    losses, training_seconds = [], 0.0
    last = s["steps"] if stop_after is None else min(stop_after, s["steps"])
    started = time.perf_counter()
    while step < last:
        for x, y in run.train_loader:
            tick = time.perf_counter()
            lr = opt.param_groups[0]["lr"]
            losses.append(pipe.train_step(_array(x), _array(y), lm_loss))
            stages.sum_tied_grad()
            if replicas > 1:
                losses[-1] = _average_replicas(pipe, data, losses[-1])
            if s["clip_norm"] is not None:
                stages.clip(s["clip_norm"])
            opt.step()
            opt.zero_grad()
            rates.step()
            step += 1
            training_seconds += time.perf_counter() - tick
            if step % s["eval_every"] == 0 or step == s["steps"]:
                record = {"step": step, "train_loss": float(np.mean(losses)), "lr": lr,
                          "val_loss": _pipeline_val_loss(pipe, run.val_loader, comm, s["n_embd"], stages.tied),
                          "time": round(time.perf_counter() - started, 3)}
                losses = []
                history.append(record)
                if log is not None:
                    log.write(record)
                if show and root:
                    print(f"step {step}/{s['steps']}: train loss {record['train_loss']:.4f}, validation loss "
                          f"{record['val_loss']:.4f}", file=sys.stderr, flush=True)
                if first_replica:  # the other replicas hold the same numbers
                    path = os.path.join(out, "last.safetensors") if root and out is not None else None
                    stages.save(path, rates, run.train_loader, {"step": step, "history": history}, s)
            if step == last:
                break
    bubble = bubble_fraction(pipe.gather_timeline())  # the last step's: a collective
    state = stages.gathered() if first_replica and stop_after is None else None
    summary = {"steps": step, "val_loss": history[-1]["val_loss"] if history else float("nan"),
               "seconds": time.perf_counter() - started, "bubble": bubble, "peak_in_flight": pipe.peak_in_flight,
               "tokens_per_s": (step - first_step) * s["batch_size"] * s["block_size"] / max(training_seconds, 1e-9),
               "parameters": sum(int(a.size) for a in state[0].values()) if state is not None else None}
    if root and out is not None and state is not None:
        save_run(out, model, tok, state[0])
        plot_curves(history, os.path.join(out, "loss.png"),
                    title=f"GPT on Shakespeare ({summary['parameters']:,} parameters)")
    return summary


PIPELINE_LOOP = "gpt pipeline"  # the ``trainer`` entry of a pipeline run's checkpoint says so


def read_pipeline_checkpoint(path: str) -> dict:
    """The checkpoint ``path`` of a pipeline run (:func:`train_pipeline`), outline checked; a ValueError
    naming the file when it is not one (a one-process run's checkpoint resumes with the Trainer)."""
    from minidl.train.run_state import read_checkpoint
    state = read_checkpoint(path)
    loop = state.get("trainer") or {}
    if loop.get("loop") != PIPELINE_LOOP or not isinstance(loop.get("step"), int) \
            or not isinstance(loop.get("history"), list) or state.get("optimizer") is None:
        raise ValueError(f"{path} is not a checkpoint of a pipeline run (minidl gpt train --pipeline-parallel); "
                         "resume it without --pipeline-parallel")
    return state


class _PipelineParts:
    """What one rank of a (tensor ×) pipeline run does with its parts of the whole model: the tied
    weight's gradient sum, the clip by the global norm, and the checkpoints that hold what one process
    would save (the whole weights and AdamW's state per parameter, at the positions of AdamW over
    :func:`decay_groups` of the whole GPT), gathered from the stages and cut back into them."""

    def __init__(self, model, pipe, opt, comm, tensor, weight_decay):
        self.model, self.pipe, self.opt, self.comm, self.tensor = model, pipe, opt, comm, tensor
        self.tied = model.tok_emb.weight
        groups = decay_groups(model, weight_decay)  # the one-process AdamW's: its positions are the checkpoint's
        self.order = [p for g in groups for p in g["params"]]
        self.groups = [len(g["params"]) for g in groups]
        self.names = {id(p): name for name, p in model.named_parameters()}
        # The tied weight's two holders, the first and the last stage (Megatron-LM's embedding group); a
        # collective split of the pipeline, in which the middle stages make a group they never use.
        ends = comm.rank in (0, comm.size - 1)
        self.embedding = comm if comm.size == 2 else comm.split(0 if ends else 1, key=comm.rank)

    def sum_tied_grad(self) -> None:
        """Sum the tied embedding/head weight's gradient over the first and the last stage, so both update
        it as one process would (its two uses' gradients, one on each)."""
        if self.pipe.is_first or self.pipe.is_last:
            from minidl.tensor import Tensor
            tied = self.tied
            grad = tied.grad.data.copy() if tied.grad is not None else tied.xp.zeros(tied.shape, tied.dtype)
            self.embedding.allreduce_(grad)
            tied.grad = Tensor(grad)

    def clip(self, max_norm: float) -> float:
        """Scale every stage's gradients by min(1, max_norm / (total + 1e-6)), the rule of
        :func:`minidl.nn.utils.clip_grad_norm_`, with total² = Σ_stages (Σ_whole ‖g‖² + Σ_tensor ranks
        Σ_slices ‖g_r‖²): the tied weight (summed already) counted on the first stage only, the whole
        parameters of a split stage once (equal on every rank of its tensor group)."""
        from minidl.parallel.data_parallel import scale_to_norm_
        counted = [p for p in self.pipe.parameters() if not (p is self.tied and not self.pipe.is_first)]
        if self.tensor is None:
            squares = sum(float((p.grad.data.astype(np.float64) ** 2).sum()) for p in counted if p.grad is not None)
        else:
            from minidl.parallel.tensor_parallel import split_parameters, unsplit_grad_squares
            squares = unsplit_grad_squares(counted, split_parameters(self.pipe.stage), self.tensor)
        total = np.array([squares])
        self.comm.host_allreduce_(total)
        norm = float(np.sqrt(total[0]))
        scale_to_norm_(list(self.pipe.parameters()), norm, max_norm)
        return norm

    def _own(self) -> list:
        """This stage's parameters in the order of its optimizer's positions."""
        return [p for g in self.opt.param_groups for p in g["params"]]

    def _regrouped(self, groups: list, counts: list) -> list:
        """``groups``' hyperparameters with the positions of ``counts`` parameters in each, one after the other."""
        out, start = [], 0
        for group, count in zip(groups, counts):
            out.append({**{k: v for k, v in group.items() if k != "params"}, "params": list(range(start,
                                                                                                 start + count))})
            start += count
        return out

    def gathered(self):
        """(whole state dict, whole optimizer state) on the pipeline's rank 0, None on the others; a
        collective of the stages (and, first, of each stage's tensor group, which gathers its split
        weights and their moments whole: only tensor rank 0's pipeline then sends). The tied weight
        comes from the first stage (the last one's copy is the same)."""
        from minidl.parallel.tensor_parallel import consolidate_optimizer_state, consolidated_state_dict
        own, local = self._own(), self.opt.state_dict()
        if self.tensor is not None:
            weights, local = consolidated_state_dict(self.pipe.stage), \
                consolidate_optimizer_state(self.pipe.stage, local, own)
        else:
            weights = self.pipe.stage.state_dict()
        if self.tensor is not None and self.tensor.rank != 0:
            return None
        key = {id(p): k for k, p in self.pipe.stage.named_parameters()}
        position = {id(p): i for i, p in enumerate(self.order)}
        held = [(i, p) for i, p in enumerate(own) if not (p is self.tied and not self.pipe.is_first)]
        mine = {self.names[id(p)]: backend.to_numpy(weights[key[id(p)]]) for _, p in held}
        moments = {position[id(p)]: {k: backend.to_numpy(v) if np.ndim(v) else v
                                     for k, v in local["state"].get(i, {}).items()} for i, p in held}
        pieces = self.comm.gather_object((mine, moments))
        if pieces is None:
            return None
        weights, moments = {}, {}
        for w, m in pieces:
            weights.update(w)
            moments.update(m)
        state = {name: weights[name] for name in self.model.state_dict()}
        return state, {"state": {pos: moments[pos] for pos in sorted(moments) if moments[pos]},
                       "param_groups": self._regrouped(local["param_groups"], self.groups)}

    def save(self, path, rates, loader, loop: dict, settings: dict) -> None:
        """Write the resumable checkpoint to ``path`` (rank 0 gives a path, the others None; a collective)."""
        from minidl.train.run_state import save_checkpoint
        whole = self.gathered()
        if path is not None:
            save_checkpoint(path, whole[0], whole[1], rates, loader, {"loop": PIPELINE_LOOP, **loop},
                            extra={"settings": settings})

    def load(self, saved: dict, rates, loader, path: str):
        """Cut this stage's weights and optimizer state out of a checkpoint of :meth:`save`; restore the
        schedule, the loader's position and the random states. Everything is checked before anything
        changes. Returns (step, history)."""
        from minidl.train.run_state import CheckpointError, check_rng_states, set_rng_states
        position = {id(p): i for i, p in enumerate(self.order)}
        try:
            weights = self._parts_of_state(saved["model"])
            self.model.check_state_dict(weights)
            counts = [len(g.get("params", ())) for g in saved["optimizer"]["param_groups"]]
            if counts != self.groups:
                raise ValueError(f"its optimizer holds parameter groups of {counts} parameters, this GPT's AdamW "
                                 f"{self.groups}")
            saved_state = {int(k): v for k, v in saved["optimizer"]["state"].items()}
            own = self._own()
            local = {"state": {i: saved_state[position[id(p)]] for i, p in enumerate(own)
                               if saved_state.get(position[id(p)])},
                     "param_groups": self._regrouped(saved["optimizer"]["param_groups"],
                                                     [len(g["params"]) for g in self.opt.param_groups])}
            if self.tensor is not None:
                from minidl.parallel.tensor_parallel import local_optimizer_state
                local = local_optimizer_state(self.pipe.stage, local, own)
            self.opt.check_state_dict(local)
            rates.check_state_dict(saved["scheduler"])
            loader.check_state_dict(saved["loader"])
            check_rng_states(saved["rng"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"cannot resume from {path}: {exc}") from None
        self.opt.load_state_dict(local)
        rates.load_state_dict(saved["scheduler"])
        loader.load_state_dict(saved["loader"])
        set_rng_states(saved["rng"])
        self.model.load_state_dict(weights)
        return saved["trainer"]["step"], [dict(r) for r in saved["trainer"]["history"]]

    def _parts_of_state(self, whole: dict) -> dict:
        """This rank's state dict of the (split) model from the whole one: every split layer takes its
        slices, those of the other stages too (never run here, they stay the one process's)."""
        if self.tensor is None:
            return whole
        from minidl.parallel.tensor_parallel import local_state_dict
        return local_state_dict(self.model, whole)


def _array(t):
    """The array of a loader's Tensor (the pipeline slices it into micro-batches)."""
    return t.data if hasattr(t, "data") else t


def _average_replicas(pipe, data, loss: float) -> float:
    """Average this stage's gradients over its data group (the same stage of every replica), in
    place, and return the replicas' mean of ``loss``: each replica's batch is an equal 1/D of the
    global one, so the mean of their means is the global batch's mean, as in data parallelism."""
    from minidl.tensor import Tensor
    for p in pipe.parameters():
        if p.grad is not None:
            grad = p.grad.data.copy()
            data.allreduce_(grad)
            grad /= grad.dtype.type(data.size)
            p.grad = Tensor(grad)
    shared = np.array([loss])
    data.host_allreduce_(shared)
    return float(shared[0]) / data.size


def _pipeline_val_loss(pipe, loader, comm, width: int, like) -> float:
    """The mean validation loss through the stages, forward only: each stage receives the (B, T, C)
    activations of the one before (the first: the token ids), runs its layers and sends them on; the
    last stage's summed loss is shared by an all-reduce. ``like``: a parameter, whose array module and
    dtype the activations have."""
    from minidl.autograd import no_grad
    from minidl.tensor import Tensor
    xp, total, count = like.xp, 0.0, 0
    pipe.eval()
    try:
        with no_grad():
            for x, y in loader:
                x, y = _array(x), _array(y)
                if pipe.is_first:
                    inp = x
                else:
                    inp = xp.empty((len(x), x.shape[1], width), like.dtype)
                    comm.recv_(inp, pipe.stage_index - 1)
                out = pipe.stage(Tensor(inp))
                if pipe.is_last:
                    total += float(lm_loss(out, y).data) * len(y)
                else:
                    comm.send(xp.ascontiguousarray(out.data), pipe.stage_index + 1)
                count += len(y)
    finally:
        pipe.train()
    shared = np.array([total])
    comm.host_allreduce_(shared)
    return float(shared[0]) / count


def save_run(out: str, model: GPT, tok: CharTokenizer, state: dict | None = None) -> str:
    """Write ``out/gpt.safetensors``: the weights (``state``, default the model's state dict), the config
    and the tokenizer (no pickle), atomically."""
    import minidl as mdl
    path = os.path.join(out, "gpt.safetensors")
    mdl.save({"model": model.state_dict() if state is None else state, "config": model.config.to_dict(),
              "tokenizer": tok.state_dict()}, path)
    return path


def longest_block() -> int:
    """The longest context ``block_size`` the bundled text allows: one window of the validation text."""
    text = shakespeare()
    _, val_ids = split_ids(CharTokenizer.from_text(text).encode(text), val_fraction=0.1)
    return len(val_ids) - 1


def load_run(folder: str):
    """(model, tokenizer) from a run folder (or a ``gpt.safetensors`` file) written by :func:`train`.

    A damaged file (a missing or unknown config key, a value of the wrong type, a tokenizer whose
    characters do not cover the model's vocabulary) raises a one-line ValueError naming the file and the key.
    """
    import minidl as mdl
    path = folder if folder.endswith(".safetensors") else os.path.join(folder, "gpt.safetensors")
    saved = mdl.load(path)
    if not isinstance(saved, dict) or not {"model", "config", "tokenizer"} <= set(saved):
        raise ValueError(f"{path} is not a saved GPT run (expected the keys model, config, tokenizer)")
    config = _checked_config(path, saved["config"])
    try:
        tok = CharTokenizer.from_state_dict(saved["tokenizer"])
    except ValueError as exc:
        raise ValueError(f"{path} is damaged: its tokenizer: {exc}") from None
    if tok.vocab_size != config.vocab_size:
        raise ValueError(f"{path} is damaged: its tokenizer has {tok.vocab_size} characters and its config key "
                         f"vocab_size says {config.vocab_size}")
    try:
        model = GPT(config)
    except ValueError as exc:
        raise ValueError(f"{path} is damaged: its config does not make a GPT ({exc})") from None
    try:
        model.load_state_dict(saved["model"])
    except (ValueError, TypeError) as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ValueError(f"{path} is damaged: its model weights do not fit its config ({text})") from None
    model.eval()
    return model, tok


def _checked_config(path: str, config) -> GPTConfig:
    """The GPTConfig of a run file's ``config`` entry, each key's type and range checked."""
    from dataclasses import fields
    if not isinstance(config, dict):
        raise ValueError(f"{path} is damaged: its config is a {type(config).__name__}, not a dict")
    known = {f.name for f in fields(GPTConfig)}
    for key, value in config.items():
        if key not in known:
            raise ValueError(f"{path} is damaged: unknown config key {key!r} "
                             f"(a GPT config has {', '.join(sorted(known))})")
        if key == "dropout":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1
        elif key == "bias":
            ok = isinstance(value, bool)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not ok:
            raise ValueError(f"{path} is damaged: config key {key!r} holds {value!r:.60}, not "
                             + ("a number in [0, 1)" if key == "dropout" else "true or false" if key == "bias"
                                else "a positive integer"))
    if "vocab_size" not in config:
        raise ValueError(f"{path} is damaged: its config lacks the key 'vocab_size'")
    return GPTConfig(**config)
