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
- data parallel under ``mpiexec`` (``--data-parallel``), as ``minidl train``; tensor and pipeline
  parallel too, alone or together (``--tensor-parallel N``, ``--pipeline-parallel M``), every layout
  through the one Trainer;
- everything in a Trainer checkpoint, so ``--resume`` continues bit for bit, on any layout.
"""
from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

import minidl.functional as F
from minidl import nn
from minidl.data.text import CharTokenizer, next_token_windows, shakespeare, split_ids
from minidl.models.gpt import GPT, GPTConfig
from minidl.train.callbacks import Callback
from minidl.train.run_state import FORMAT as CHECKPOINT_FORMAT

__all__ = ["DEFAULTS", "GPTProgress", "build", "build_run", "check_layout", "decay_groups", "lm_loss", "load_run",
           "longest_block", "lr_schedule", "train", "warmup_steps"]

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


def build_run(s: dict, comm=None, device=None, tensor=None, pipeline=None, micro_batches: int | None = None,
              schedule: str = "1f1b"):
    """(the :class:`~minidl.train.recipe.Run` of the settings ``s``, the tokenizer): the recipe of
    :func:`minidl.train.recipe.build_run` with AdamW over :func:`decay_groups` and :func:`lr_schedule`.

    ``comm``: the run's layout, a :class:`~minidl.parallel.layout.Layout` of data, pipeline and tensor
    groups (:func:`minidl.parallel.layout`), or the data-parallel group alone, with ``tensor`` and
    ``pipeline`` its other groups. Every rank builds the one-process run from the seed (the weights,
    the batches, the schedule); the GPT is split over the tensor group by
    :func:`minidl.models.gpt.tensor_parallel`, then cut into the pipeline's stages by
    :func:`~minidl.models.gpt.pipeline_layers` at :func:`~minidl.models.gpt.pipeline_boundaries`, in
    ``micro_batches`` micro-batches (default: the stages) on ``schedule``, and model, optimizer and
    loader are wrapped for the layout by :func:`minidl.parallel.prepare`. Whatever the layout,
    checkpoints hold what one process saves (the whole weights and each parameter's AdamW state at
    the one-process optimizer's position), and the gradients are clipped to the whole model's norm.
    """
    from minidl.data import TensorDataset
    from minidl.models.gpt import pipeline_boundaries, pipeline_layers
    from minidl.train import recipe
    groups = _layout(comm, tensor, pipeline)
    check_layout(s, pipeline=groups.size("pipeline") if groups.pipeline is not None else None,
                 tensor=groups.size("tensor") if groups.tensor is not None else None,
                 micro_batches=micro_batches, replicas=groups.size("data"))
    text = shakespeare()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = split_ids(tok.encode(text), val_fraction=0.1)
    x, y = next_token_windows(train_ids, s["block_size"])
    vx, vy = next_token_windows(val_ids, s["block_size"], limit=s["val_windows"])
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=s["block_size"], n_layer=s["n_layer"],
                    n_head=s["n_head"], n_embd=s["n_embd"], dropout=s["dropout"])
    cut = None
    if groups.pipeline is not None:
        cut = dict(layers=pipeline_layers, boundaries=pipeline_boundaries(s["n_layer"], groups.pipeline.size),
                   micro_batches=micro_batches, schedule=schedule)
    run = recipe.build_run(s, TensorDataset(x, y), TensorDataset(vx, vy),
                           model=lambda: _model(cfg, s["checkpoint_blocks"], groups.tensor),
                           params=lambda model: decay_groups(model, s["weight_decay"]), optimizer="adamw",
                           optimizer_options={"betas": tuple(s["betas"])},
                           schedule=lambda lr, steps: lr_schedule(lr, s["min_lr"], s["warmup"], steps),
                           steps=s["steps"], device=device, comm=groups if groups.is_parallel else None,
                           drop_last=True, val_batch_size=64, pipeline=cut)
    return run, tok


def _layout(comm, tensor, pipeline):
    from minidl.parallel.layout import Layout
    if isinstance(comm, Layout):
        return comm
    return Layout(None, data=comm, pipeline=pipeline, tensor=tensor)


def check_layout(s: dict, pipeline: int | None = None, tensor: int | None = None, micro_batches: int | None = None,
                 replicas: int = 1, names: dict | None = None) -> None:
    """Raise ValueError unless the GPT of the settings ``s`` runs on ``pipeline`` stages of ``tensor`` ranks
    each in ``micro_batches`` micro-batches (default: the stages), ``replicas`` copies on the slices of a
    batch: its blocks divide into the stages (:func:`~minidl.models.gpt.check_pipeline`), its heads and
    MLP over the tensor group (:func:`~minidl.models.gpt.check_tensor_parallel`), the batch into
    replicas × micro-batches; no dropout. Checked before anything is built. ``names`` spell the options
    in the messages as the caller's user gives them (``{"micro_batches": "--micro-batches",
    "batch_size": "--batch-size"}``)."""
    from minidl.models.gpt import check_pipeline, check_tensor_parallel
    names = {"micro_batches": "micro_batches", "batch_size": "batch_size", **(names or {})}
    if pipeline is not None:
        check_pipeline(s["n_layer"], s["dropout"], pipeline)
    if tensor is not None:
        check_tensor_parallel(s["n_head"], s["n_embd"], s["dropout"], tensor)
    if pipeline is None:
        return
    k, batch = micro_batches or pipeline, s["batch_size"]
    if replicas == 1 and batch % k:
        valid = ", ".join(str(d) for d in range(1, batch + 1) if batch % d == 0)
        raise ValueError(f"a batch of {batch} sequences does not split into {k} equal micro-batches; choose "
                         f"{names['micro_batches']} among {valid}")
    if batch % (replicas * k):
        raise ValueError(f"a batch of {batch} sequences does not split into {replicas} replicas' {k} equal "
                         f"micro-batches; choose {names['batch_size']} a multiple of {replicas * k}")


def _model(cfg: GPTConfig, checkpoint_blocks: bool, tensor):
    model = GPT(cfg, checkpoint_blocks=checkpoint_blocks)
    if tensor is None:
        return model
    from minidl.models.gpt import tensor_parallel
    return tensor_parallel(model, tensor)


def _gpt(model) -> GPT:
    """The GPT inside a run's model (which may wrap it: DataParallel, TensorParallel, a Pipeline of its layers)."""
    pipe = _pipeline(model)
    if pipe is not None:
        return pipe.whole
    while not isinstance(model, GPT) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _pipeline(model):
    """The Pipeline inside a run's model (perhaps inside a DataParallel), or None."""
    from minidl.parallel.pipeline import Pipeline
    while not isinstance(model, Pipeline) and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model if isinstance(model, Pipeline) else None


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
          stop_after: int | None = None, device: str | None = None, tensor=None, pipeline=None,
          micro_batches: int | None = None, schedule: str = "1f1b") -> dict:
    """Train with the settings ``s``; write the run folder ``out`` (rank 0 only); return a summary.

    ``stop_after`` stops after that many steps, as if the run were killed
    there (the schedule stays that of ``s["steps"]``); ``resume`` continues it.
    ``device``: where the Trainer runs ("cuda" for the GPU; default the CPU).

    The folder gets ``gpt.safetensors`` (weights, config and tokenizer: what
    ``sample`` needs), ``last.safetensors`` (the resumable checkpoint),
    ``metrics.jsonl`` and ``loss.png``. A run that ends between two
    validations validates once more at its last step, so ``last.safetensors``
    and ``metrics.jsonl`` always hold where it ended.

    ``comm``, ``tensor``, ``pipeline``, ``micro_batches``, ``schedule``: the layout, as
    :func:`build_run` takes it (a collective: every rank calls this). Whatever the layout, the loop is
    the Trainer's and ``last.safetensors`` holds what one process would save (the whole weights and
    each parameter's AdamW state in its whole shape, at the one-process optimizer's position), so
    ``resume`` continues a run written by any layout in one process or on any other layout. The
    ranks that hold parts join every gather, and the layout's rank 0 writes. A split or pipelined
    run draws no samples while training (each is a forward pass through every rank, and only rank 0
    shows it). A pipeline's summary adds ``bubble``, the idle fraction of the last step's timeline
    over every stage (:func:`minidl.parallel.pipeline.bubble_fraction`; (M − 1)/(K + M − 1) with free
    messages and equal stages), and ``peak_in_flight``, the most micro-batches rank 0's stage held.
    """
    from minidl.train import JSONLLogger, plot_curves

    run, tok = build_run(s, comm, tensor=tensor, pipeline=pipeline, micro_batches=micro_batches, schedule=schedule)
    groups = _layout(comm, tensor, pipeline)
    model, val_loader = run.model, run.val_loader
    root = groups.is_root
    gathers = groups.tensor is not None or groups.pipeline is not None  # checkpoints gather parts from ranks
    callbacks = [GPTProgress(s["steps"], s["batch_size"] * s["block_size"] * s["accumulate"], tok,
                             out if root else None, 0 if gathers else s["sample_every"],
                             show=show and root, gather=gathers)]
    if root and out is not None:
        os.makedirs(out, exist_ok=True)
        callbacks.append(JSONLLogger(os.path.join(out, "metrics.jsonl")))
    elif groups.is_parallel:
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
    state = model.consolidated_state_dict() if gathers else None  # every rank joins the gather
    parameters = net.num_parameters() if state is None else sum(int(a.size) for a in state.values())
    summary = {"steps": trainer.step, "val_loss": val_loss, "seconds": seconds,
               "tokens_per_s": callbacks[0].tokens_per_s, "parameters": parameters}
    pipe = _pipeline(model)
    if pipe is not None:
        from minidl.parallel.pipeline import bubble_fraction
        lines = pipe.gather_timeline()  # the last step's, every stage's: a collective
        summary["bubble"] = bubble_fraction(lines) if all(lines) else float("nan")
        summary["peak_in_flight"] = pipe.peak_in_flight
    if root and out is not None:
        save_run(out, net, tok, state)
        plot_curves(trainer.history, os.path.join(out, "loss.png"), steps=trainer.steps,
                    title=f"GPT on Shakespeare ({summary['parameters']:,} parameters)")
    summary["trainer"] = trainer
    return summary


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
    """(model, tokenizer) from a run folder, its ``gpt.safetensors``, or its checkpoint ``last.safetensors``.

    ``gpt.safetensors`` is written when a run ends; a run stopped before (Ctrl-C, a crash) has only
    ``last.safetensors``, the checkpoint of its last validation: a folder without the first is read from
    the second, whose run settings rebuild the config (the tokenizer is the bundled text's, as training
    made it). A folder with neither is a FileNotFoundError naming both files and why. A damaged file (a
    missing or unknown config key, a value of the wrong type, a tokenizer whose characters do not cover
    the model's vocabulary) raises a one-line ValueError naming the file and the key.
    """
    import minidl as mdl
    path = folder if folder.endswith(".safetensors") else os.path.join(folder, "gpt.safetensors")
    if not folder.endswith(".safetensors") and not os.path.exists(path):
        last = os.path.join(folder, "last.safetensors")
        if not os.path.exists(last):
            raise FileNotFoundError(
                f"{folder} has neither gpt.safetensors (the weights, config and tokenizer, written when a run ends) "
                f"nor last.safetensors (the checkpoint written at each validation): sampling needs one of them; "
                f"train first (minidl gpt train --out {folder}) or pass --run with a run folder or either file")
        path = last
    saved = mdl.load(path)
    if isinstance(saved, dict) and saved.get("format") == CHECKPOINT_FORMAT:  # a Trainer checkpoint
        return _run_from_checkpoint(path)
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
    _load_weights(model, saved["model"], path, "its config")
    return model, tok


def _run_from_checkpoint(path: str):
    """(model, tokenizer) from a training checkpoint of :func:`train`: the settings it carries rebuild the config."""
    from minidl.train.run_state import read_checkpoint
    checkpoint = read_checkpoint(path)
    settings = (checkpoint.get("extra") or {}).get("settings") if isinstance(checkpoint.get("extra"), dict) else None
    if not isinstance(settings, dict) or not set(DEFAULTS) <= set(settings):
        raise ValueError(f"{path} is a training checkpoint but not one of minidl gpt train (its run settings are "
                         "missing), so it does not say which GPT it holds; sample from a gpt train run's folder")
    tok = CharTokenizer.from_text(shakespeare())  # what build_run trains on
    config = {"vocab_size": tok.vocab_size, "block_size": settings["block_size"], "n_layer": settings["n_layer"],
              "n_head": settings["n_head"], "n_embd": settings["n_embd"], "dropout": settings["dropout"]}
    model = GPT(_checked_config(path, config))
    _load_weights(model, checkpoint["model"], path, "its run settings")
    return model, tok


def _load_weights(model, state, path: str, source: str) -> None:
    """Load ``state`` into ``model`` (built from ``source`` in the file at ``path``) and put it in eval mode; a
    mismatch is the file's damage, said in one line."""
    try:
        model.load_state_dict(state)
    except (ValueError, TypeError) as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ValueError(f"{path} is damaged: its model weights do not fit {source} ({text})") from None
    model.eval()


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
