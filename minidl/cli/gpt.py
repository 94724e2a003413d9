"""The ``minidl gpt`` command: train a small GPT on the bundled Shakespeare, then sample from it.

    minidl gpt train                          # the defaults: about 10 minutes on 2 CPU cores
    minidl gpt train --steps 2000 --n-layer 6 --out runs/gpt-big
    minidl gpt train --resume runs/gpt/last.safetensors       # continues bit for bit
    minidl gpt sample --prompt "ROMEO:" --temperature 0.8 --top-k 20
    mpiexec -n 2 python -m mpi4py -m minidl gpt train --data-parallel
    mpiexec -n 2 python -m mpi4py -m minidl gpt train --tensor-parallel 2     # each block split over 2 ranks
    mpiexec -n 2 python -m mpi4py -m minidl gpt train --tensor-parallel 2 --resume runs/gpt/last.safetensors
    mpiexec -n 2 python -m mpi4py -m minidl gpt train --pipeline-parallel 2 --micro-batches 4  # 2 stages
    mpiexec -n 4 python -m mpi4py -m minidl gpt train --pipeline-parallel 2 --data-parallel    # 2 × 2 stages
    mpiexec -n 4 python -m mpi4py -m minidl gpt train --pipeline-parallel 2 --tensor-parallel 2  # stages split

The recipe is :mod:`minidl.models.gpt_train`; the model is :mod:`minidl.models.gpt`.
"""
from __future__ import annotations

import argparse
import os
import sys

from minidl.cli.args import add_command, add_overwrite, interrupted_line, positive_float, positive_int

DEFAULT_OUT = os.path.join("runs", "gpt")   # taken by the first run; then runs/gpt-2, runs/gpt-3...
RUN_FILES = ("gpt.safetensors", "last.safetensors", "loss.png", "metrics.jsonl")
# gpt sample --tokens: one forward pass a character; at the default size measured 0.2 s a character on a busy
# 2-core machine, so the bound is about half an hour there (100,000,000 would run for months).
MAX_TOKENS = 10_000

# command-line option → settings key (and argparse type); None means "keep the default"
_OPTIONS = [
    ("--steps", "steps", positive_int, "optimizer steps in all, counting a resumed run's"),
    ("--batch-size", "batch_size", positive_int, "sequences per micro-batch"),
    ("--block-size", "block_size", positive_int, "context length in characters"),
    ("--n-layer", "n_layer", positive_int, "transformer blocks"),
    ("--n-head", "n_head", positive_int, "attention heads per block"),
    ("--n-embd", "n_embd", positive_int, "width of the residual stream"),
    ("--dropout", "dropout", float, "dropout probability"),
    ("--lr", "lr", positive_float, "peak learning rate (after warmup)"),
    ("--min-lr", "min_lr", float, "learning rate at the end of the cosine"),
    ("--warmup", "warmup", positive_int, "linear warmup steps"),
    ("--weight-decay", "weight_decay", float, "AdamW's decay, on the Linear weights only"),
    ("--clip-norm", "clip_norm", positive_float, "clip the gradients' global norm to this"),
    ("--accumulate", "accumulate", positive_int, "micro-batches per optimizer step"),
    ("--eval-every", "eval_every", positive_int, "validate (and write last.safetensors) every this many steps"),
    ("--sample-every", "sample_every", positive_int, "print a sample every this many steps (a multiple of "
                                                     "--eval-every)"),
    ("--seed", "seed", int, "seed of initialization, data order, dropout"),
]


def _gpu_usable() -> bool:
    from minidl import backend
    try:
        backend.cupy_module()
    except RuntimeError as exc:
        print(f"minidl gpt train: error: --device cuda: {exc}", file=sys.stderr)
        return False
    return True


_FLAGS = {"data": "--data-parallel", "pipeline": "--pipeline-parallel", "tensor": "--tensor-parallel",
          "micro_batches": "--micro-batches", "batch_size": "--batch-size"}
_LAUNCH = "python -m mpi4py -m minidl gpt train"


def train_command(args) -> int:
    from minidl.models.gpt_train import DEFAULTS, check_layout, train
    from minidl.train import TrainingInterrupted
    from minidl.train.run_folder import resume_checkpoint
    from minidl.train.run_state import read_checkpoint

    s = dict(DEFAULTS)
    if args.device == "cuda" and not _gpu_usable():
        return 2
    if args.resume:
        try:
            args.resume = resume_checkpoint(args.resume)  # the run folder or its checkpoint file
            checkpoint = read_checkpoint(args.resume)
        except (OSError, ValueError) as exc:
            print(f"minidl gpt train: error: cannot resume from {args.resume}: {exc}", file=sys.stderr)
            return 1
        saved = (checkpoint.get("extra") or {}).get("settings")
        if not isinstance(saved, dict) or set(saved) != set(DEFAULTS):
            print(f"minidl gpt train: error: {args.resume} is not a checkpoint of minidl gpt train", file=sys.stderr)
            return 1
        s.update(saved)
    for _, key, _, _ in _OPTIONS:
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    if args.checkpoint_blocks:
        s["checkpoint_blocks"] = True
    if args.amp is not None:
        s["amp"] = args.amp
    from minidl.models.gpt_train import longest_block
    if s["block_size"] > longest_block():
        print(f"minidl gpt train: error: --block-size {s['block_size']} is longer than the validation text allows "
              f"(at most {longest_block()} characters of context)", file=sys.stderr)
        return 2
    m, n, k = args.pipeline_parallel, args.tensor_parallel, args.micro_batches
    if m is None and (k is not None or args.schedule is not None):
        print("minidl gpt train: error: --micro-batches and --schedule go with --pipeline-parallel M", file=sys.stderr)
        return 2
    asked = _asked(args)
    try:  # the settings against the layout, before MPI is up
        check_layout(s, pipeline=m, tensor=n, micro_batches=k, names=_FLAGS)
    except ValueError as exc:
        print(f"minidl gpt train: error: {asked}: {exc}", file=sys.stderr)
        return 2
    groups = world = None
    if args.data_parallel or m is not None or n is not None:
        from minidl import parallel
        world = parallel.init(device=args.device)
        try:  # the world against the layout (every rank checks the same numbers)
            groups = parallel.layout(world, data=args.data_parallel, pipeline=m, tensor=n, names=_FLAGS,
                                     launch=_LAUNCH)
            check_layout(s, pipeline=m, tensor=n, micro_batches=k, replicas=groups.size("data"), names=_FLAGS)
        except ValueError as exc:
            if world.rank == 0:
                on = f" on {world.size} ranks" if groups is not None else ""
                print(f"minidl gpt train: error: {asked}{on}: {exc}" if groups is not None
                      else f"minidl gpt train: error: {exc}", file=sys.stderr)
            return 2
    root = groups is None or groups.is_root
    from minidl.train.run_folder import RunFolderError, claim, write_failure
    folder = None
    if root:
        given = args.out or (os.path.dirname(os.path.abspath(args.resume)) if args.resume else None)
        try:
            folder = claim("gpt train", given, default="gpt", resume=bool(args.resume), overwrite=args.overwrite,
                           run_files=RUN_FILES, stamped=False)
        except RunFolderError as exc:  # in use, holding a run, or not writable
            print(f"minidl gpt train: error: {exc}", file=sys.stderr, flush=True)
            if world is not None and world.size > 1:
                world.abort(2)  # the other ranks would wait for this one in a collective
            return 2
    out = folder.path if root else args.out
    schedule = args.schedule or "1f1b"
    try:
        if root:
            print(_describe(s, args, groups, schedule) + f"\nwriting to {out}", flush=True)
        result = train(s, out, resume=args.resume, show=not args.quiet, comm=groups, device=args.device,
                       micro_batches=k, schedule=schedule)
    except TrainingInterrupted as exc:
        if root:
            print(interrupted_line("minidl gpt train", exc, getattr(args, "argv", []), out,
                                   world.size if world is not None else 1), file=sys.stderr)
        return 130
    except ValueError as exc:
        print(f"minidl gpt train: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a write of the run failed (a full disk): one line, the written files are kept
        print(write_failure("gpt train", exc), file=sys.stderr)
        return 2
    finally:
        if folder is not None:
            folder.release()
    if root:
        written = [name for name in RUN_FILES if os.path.exists(os.path.join(out, name))]
        print(f"validation loss {result['val_loss']:.4f} nats after {result['steps']} steps "
              f"({result['seconds']:.0f} s, {result['tokens_per_s']:,.0f} tokens/s)")
        if "bubble" in result:
            k = k or m
            print(f"pipeline bubble of the last step: {result['bubble']:.0%} idle (with free messages and equal "
                  f"stages (M-1)/(K+M-1) = {(m - 1) / (k + m - 1):.0%}); the first stage held "
                  f"{result['peak_in_flight']} of {k} micro-batches' activations at once")
        print(f"wrote {out}/: {', '.join(written)}; try: minidl gpt sample --run {out}")
    return 0


def _asked(args) -> str:
    """The layout's flags as given (the prefix of an error about them)."""
    parts = [f"{_FLAGS[key]} {value}" for key, value in (("pipeline", args.pipeline_parallel),
                                                        ("tensor", args.tensor_parallel),
                                                        ("micro_batches", args.micro_batches)) if value is not None]
    return " ".join(parts + (["--data-parallel"] if args.data_parallel else [])) or "gpt train"


def _describe(s, args, groups, schedule) -> str:
    """The run in one paragraph: the model, the recipe and the layout."""
    from minidl.models.gpt_train import warmup_steps
    text = (f"GPT on Shakespeare: {s['n_layer']} blocks, {s['n_head']} heads, width {s['n_embd']}, context "
            f"{s['block_size']}; {s['steps']} steps of {s['batch_size'] * s['accumulate']}x{s['block_size']} "
            f"tokens; AdamW lr {s['lr']:g} (warmup {warmup_steps(s['warmup'], s['steps'])}, cosine to "
            f"{s['min_lr']:g}), clip "
            f"{s['clip_norm']:g}" + (", checkpointing every block" if s["checkpoint_blocks"] else "")
            + (f", mixed precision {s['amp']}" if s["amp"] else ""))
    size = (lambda axis: groups.size(axis)) if groups is not None else (lambda axis: 1)
    d, m, n = size("data"), args.pipeline_parallel, size("tensor")
    if m is not None:
        k = args.micro_batches or m
        text += (f", pipeline-parallel on {m} ranks ({s['n_layer'] // m} blocks a stage), {k} micro-batches of "
                 f"{s['batch_size'] // (k * d)}, schedule {schedule}"
                 + (f", each stage tensor-parallel on {n} ranks" if n > 1 else "")
                 + (f", data-parallel over {d} such pipelines" if groups.data is not None else ""))
    else:
        text += ((f", data-parallel on {d} ranks" if groups is not None and groups.data is not None else "")
                 + (f", tensor-parallel on {n} ranks" if groups is not None and groups.tensor is not None else ""))
    return text + (f", on {args.device}" if args.device != "cpu" else "")


def sample_command(args) -> int:
    import numpy as np

    from minidl.models.gpt_train import load_run
    try:
        model, tok = load_run(args.run_dir)
        prompt = tok.encode(args.prompt.replace("\\n", "\n"))
    except (OSError, ValueError) as exc:
        print(f"minidl gpt sample: error: {exc}", file=sys.stderr)
        return 1
    if len(prompt) == 0:
        prompt = tok.encode("\n")
    from tqdm.auto import tqdm
    rng, i = np.random.default_rng(args.seed), 0
    try:
        for i in range(args.num_samples):
            with tqdm(total=args.tokens, desc=f"sample {i + 1}/{args.num_samples}", unit="token", file=sys.stderr,
                      leave=False, dynamic_ncols=True, disable=not sys.stderr.isatty()) as bar:  # a terminal only
                ids = model.generate(prompt[None], args.tokens, temperature=args.temperature, top_k=args.top_k,
                                     generator=rng, on_token=lambda n: bar.update(n - bar.n))
            if i:
                print("-" * 40)
            print(tok.decode(ids[0]), flush=True)
    except KeyboardInterrupt:
        print(f"minidl gpt sample: stopped (Ctrl-C) after {i} of {args.num_samples} samples", file=sys.stderr)
        return 130
    return 0


def _tokens(text):
    """argparse type of ``--tokens``: 1 to MAX_TOKENS."""
    value = positive_int(text)
    if value > MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"at most {MAX_TOKENS:,} characters per sample (one forward pass each: "
                                         f"{value:,} would run for days), got {value:,}")
    return value


def add_commands(subparsers) -> None:
    gpt = add_command(subparsers, "gpt", help="train a small GPT on bundled Shakespeare, and sample from it",
                      description="A character-level GPT on the bundled Shakespeare plays: 'minidl gpt train', "
                                  "then 'minidl gpt sample'.")
    sub = gpt.add_subparsers(dest="gpt_command", metavar="{train,sample}", required=True,
                             help="train, or sample from a trained run")
    p = add_command(sub, "train", help="train (defaults: about 10 minutes on 2 CPU cores)",
                    description="Train a character-level GPT on the bundled Shakespeare plays.")
    from minidl.models.gpt_train import DEFAULTS
    for flag, key, kind, text in _OPTIONS:  # None when not given, so a resumed run keeps its own settings
        p.add_argument(flag, dest=key, type=kind, help=f"{text} (default: {DEFAULTS[key]}, or the resumed run's)")
    p.add_argument("--checkpoint-blocks", dest="checkpoint_blocks", action="store_true",
                   help="gradient checkpointing: recompute each block in backward (less memory, ~1/3 more time)")
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="mixed precision: matrix products in bfloat16 (needs ml_dtypes) or float16 with loss "
                        "scaling; LayerNorm, softmax, attention and the loss stay float32 (default: off, float32)")
    p.add_argument("--out", help=f"run folder (default: {DEFAULT_OUT}, or {DEFAULT_OUT}-2, -3... when taken; "
                   "a resumed run: the checkpoint's folder)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu, or cuda (needs CuPy and a GPU)")
    p.add_argument("--resume",
                   help="continue an earlier run: its folder (runs/gpt) or its checkpoint (runs/gpt/last.safetensors; "
                        "default: a new run)")
    add_overwrite(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar and no samples")
    p.add_argument("--data-parallel", dest="data_parallel", action="store_true",
                   help="under mpiexec: one model per rank, each on its slice of every batch")
    p.add_argument("--tensor-parallel", dest="tensor_parallel", type=positive_int, metavar="N", default=None,
                   help="under mpiexec -n N: every block split over the N ranks (its heads and MLP units; "
                        "Megatron-LM), all ranks on the same batches; gpt.safetensors and last.safetensors hold the "
                        "whole weights and optimizer state, so --resume continues on any split or in one "
                        "process (needs n_head and 4·n_embd divisible by N, no dropout); with "
                        "--data-parallel, mpiexec -n D·N: D data-parallel copies of the split model "
                        "(default: not split)")
    p.add_argument("--pipeline-parallel", dest="pipeline_parallel", type=positive_int, metavar="M", default=None,
                   help="under mpiexec -n M: the blocks cut into M stages, one per rank (the embedding with the "
                        "first, the final norm and tied head with the last), each batch sent through in "
                        "micro-batches; gpt.safetensors and the resumable last.safetensors hold the whole "
                        "weights (needs n_layer divisible by M, no dropout); with --tensor-parallel N, "
                        "mpiexec -n M·N: each stage split over N ranks; with --data-parallel, a multiple of "
                        "that: D data-parallel copies of the pipeline, each on its 1/D of every batch "
                        "(default: not cut)")
    p.add_argument("--micro-batches", dest="micro_batches", type=positive_int, metavar="K", default=None,
                   help="with --pipeline-parallel: micro-batches per batch, dividing --batch-size; the idle "
                        "fraction is (M-1)/(K+M-1) (default: M)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default=None,
                   help="with --pipeline-parallel: all forwards then all backwards (gpipe), or one forward, one "
                        "backward in the steady state (1f1b: fewer activations held) (default: 1f1b)")
    p.set_defaults(run=train_command)
    p = add_command(sub, "sample", help="generate text from a trained run",
                    description="Generate text from a run written by minidl gpt train.")
    p.add_argument("--run", dest="run_dir", default=DEFAULT_OUT,
                   help=f"run folder, its gpt.safetensors, or its checkpoint last.safetensors (an interrupted run) "
                        f"(default {DEFAULT_OUT})")
    p.add_argument("--prompt", default="\n", help="text to continue (\\n for a newline)")
    p.add_argument("--temperature", type=positive_float, default=0.8,
                   help="below 1: surer; above 1: wilder; so small that logits/temperature overflows "
                        "(1e-310): the likeliest character every time (greedy)")
    p.add_argument("--top-k", dest="top_k", type=positive_int,
                   help="draw only from the k likeliest characters (default: all)")
    p.add_argument("--tokens", type=_tokens, default=500, help=f"characters to generate, at most {MAX_TOKENS:,}")
    p.add_argument("--num-samples", dest="num_samples", type=positive_int, default=1, help="texts to generate")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    p.set_defaults(run=sample_command)
