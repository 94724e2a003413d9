"""``minidl train``: a run built by :func:`minidl.train.recipe.build_run`, trained, written to its folder.

    minidl train                                   # an MLP on the bundled digits, about 10 seconds
    minidl train --data spirals --epochs 200 --lr 0.01
    minidl train --data mnist:~/data/mnist --model cnn --device cuda
    minidl train --resume runs/train-digits-mlp-.../last.safetensors --epochs 40

A run writes into its folder (``--out``, by default ``runs/train-<data>-<model>-<time>``):
``metrics.jsonl`` (one line per validation, then the test result),
``curves.png``, ``model.safetensors`` (the final weights, a plain state dict),
``standardizer.safetensors`` (the input statistics of the training split),
and the resumable checkpoints ``last.safetensors`` and ``best.safetensors``.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

from minidl.cli.args import (
    add_command,
    add_overwrite,
    data_spec,
    interrupted_line,
    nonnegative_float,
    positive_float,
    positive_int,
)
from minidl.train import data_sources
from minidl.train.metrics import interval_note
from minidl.train.recipe import RUN_DEFAULTS, RUN_SETTINGS, SCHEDULES, build_run


# ---------------------------------------------------------------- minidl train
def _settings(args, saved: dict | None) -> dict:
    """Each run setting: given on the command line, else from the resumed checkpoint, else the default."""
    out = {}
    for key in RUN_SETTINGS:
        given = getattr(args, key)
        if given is not None:
            out[key] = given
        elif saved and key in saved:
            out[key] = saved[key]
        else:
            out[key] = RUN_DEFAULTS[key]
    return out


def _saved_settings(extra) -> dict:
    """The run settings a checkpoint carries (its ``extra["settings"]``), each checked as the command line would."""
    settings = extra.get("settings") if isinstance(extra, dict) else extra
    if settings is None:
        return {}
    if not isinstance(settings, dict):
        raise ValueError(f"its run settings are damaged (a {type(settings).__name__}, not a dict)")

    def number(value, low=0.0, allow_none=False, positive=False):
        if value is None:
            return allow_none
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and (value > low if positive else value >= low))

    def whole(value, low):
        return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**63

    checks = {"data": lambda v: isinstance(v, str) and _valid(data_spec, v),
              "model": lambda v: v in ("mlp", "cnn"), "optimizer": lambda v: isinstance(v, str),
              "lr": lambda v: number(v, allow_none=True, positive=True), "schedule": lambda v: v in SCHEDULES,
              "epochs": lambda v: whole(v, 1), "batch_size": lambda v: whole(v, 1), "seed": lambda v: whole(v, 0),
              "weight_decay": number, "label_smoothing": number, "dropout": number,
              "clip_norm": lambda v: number(v, allow_none=True, positive=True), "accumulate": lambda v: whole(v, 1),
              "device": lambda v: isinstance(v, str) and _valid_device(v)}
    out = {}
    for key, value in settings.items():
        if key in checks:
            if not checks[key](value):
                raise ValueError(f"its run setting {key} is damaged: {repr(value)[:60]}")
            out[key] = value
    return out


def _valid_device(text: str) -> bool:
    from minidl.backend import parse_device
    try:
        parse_device(text)
    except ValueError:
        return False
    return True


def _valid(check, value) -> bool:
    try:
        check(value)
    except argparse.ArgumentTypeError:
        return False
    return True


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _claim_folder(args, settings):
    """This run's folder, claimed (see :mod:`minidl.train.run_folder`): ``--out``, a resumed run's own
    folder, or a new ``runs/train-<data>-<model>-<time>``."""
    from minidl.train.run_folder import claim
    given = args.out or (os.path.dirname(os.path.abspath(args.resume)) if args.resume else None)
    return claim("train", given, default=f"train-{settings['data'].split(':')[0]}-{settings['model']}",
                 resume=bool(args.resume), overwrite=args.overwrite, run_files=RUN_FILES)


def _fail(message: str, code: int = 2) -> int:
    print(f"minidl train: error: {_one_line(message)}", file=sys.stderr)
    return code


def _refused_with_zero(args, zero: int) -> str | None:
    """Why ``--zero`` cannot run with the other options given, or None.

    A sharded run's optimizer state (and from stage 2 its gradients, from stage 3 its weights) is
    spread over the ranks, so whatever reads the whole training state gathers it from every rank:
    checkpoints are consolidated (they resume in one process or on any number of ranks), clipping
    and loss scaling's inf check add every rank's part, early stopping keeps the whole best weights
    and TensorBoard's histograms read the whole model. All it needs is the data-parallel job.
    """
    if not getattr(args, "data_parallel", False):
        return (f"--zero {zero} shards the training state across the ranks of a data-parallel job; add "
                f"--data-parallel and start it with mpiexec (mpiexec -n 2 python -m mpi4py -m minidl train "
                f"--data-parallel --zero {zero})")
    return None


def _end(comm, code: int) -> int:
    """With --data-parallel a failing rank ends the whole job: the others would wait in a collective."""
    if code and comm is not None and comm.size > 1:
        sys.stderr.flush()
        comm.abort(code)
    return code


def train_command(args) -> int:
    from minidl.data import DataLoader, TensorDataset
    from minidl.train.classifiers import build_model
    from minidl.train.run_folder import resume_checkpoint
    from minidl.train.run_state import read_checkpoint
    from minidl.train.trainer import seed_everything

    started = time.perf_counter()
    saved, checkpoint, tensorboard = None, None, getattr(args, "tensorboard", False)
    zero = getattr(args, "zero", None) or 0
    if zero:
        refused = _refused_with_zero(args, zero)
        if refused:
            return _fail(refused)
    if args.resume:
        try:
            args.resume = resume_checkpoint(args.resume)  # the run folder or its checkpoint file
            checkpoint = read_checkpoint(args.resume)
            extra = checkpoint.get("extra")
            saved = _saved_settings(extra)
            tensorboard = tensorboard or (isinstance(extra, dict) and extra.get("tensorboard") is True)
        except (OSError, ValueError) as exc:  # FileNotFoundError, CheckpointError and damaged settings
            return _fail(f"cannot resume from {args.resume}: {exc}")
    s = _settings(args, saved)
    comm = None
    try:
        seed_everything(s["seed"])  # a bad seed is refused before any data is read (build_run seeds again)
        if getattr(args, "data_parallel", False):  # one replica per MPI rank, each on its slice of every batch
            from minidl import parallel
            comm = parallel.init(device=s["device"])
        data = data_sources.load(s["data"], seed=s["seed"])
        run = build_run(s, TensorDataset(data.x_train, data.y_train), TensorDataset(data.x_val, data.y_val),
                        model=lambda: build_model(s["model"], data.sample_shape, data.num_classes,
                                                  dropout=s["dropout"]),
                        device=comm.device if comm is not None and comm.name == "nccl" else s["device"], comm=comm,
                        zero=zero)
        if checkpoint is not None:  # a pruned run: its masks (<name>_mask) are in the checkpoint; keep them
            from minidl.nn.prune import Pruning
            pruning = Pruning.for_state_dict(run.model, checkpoint["model"])
            if pruning is not None:
                pruning.attach(run.optimizer)
        test_loader = DataLoader(TensorDataset(data.x_test, data.y_test), batch_size=512)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        message = str(exc)
        if isinstance(exc, RuntimeError) and args.device is None and s["device"] != "cpu":  # no GPU here?
            message += f" (device {s['device']!r} is the resumed run's; --device cpu resumes it on the CPU)"
        return _end(comm, _fail(message))

    root = comm is None or comm.rank == 0  # only rank 0 logs, draws progress bars and writes files
    from minidl.train.run_folder import RunFolderError, write_failure
    try:
        folder = _claim_folder(args, s) if root else None
    except RunFolderError as exc:
        return _end(comm, _fail(str(exc)))
    try:
        return _train(args, s, comm, root, folder.path if root else None, data, run, test_loader, tensorboard,
                      started)
    except OSError as exc:  # a write of the run failed (a full disk): one line, the written files are kept
        print(write_failure("train", exc), file=sys.stderr)
        return _end(comm, 2)
    finally:
        if root:
            folder.release()


def _train(args, s, comm, root, out, data, run, test_loader, tensorboard, started) -> int:
    """Train in the claimed folder ``out`` (None on ranks other than 0) and write the run's files."""
    import minidl as mdl
    from minidl.train import JSONLLogger, ModelCheckpoint, NonFiniteLossError, TrainingInterrupted, plot_curves
    from minidl.train.callbacks import Callback, EarlyStopping

    callbacks, zero = [], getattr(args, "zero", None) or 0
    # Every rank takes part in each checkpoint and each histogram (a sharded run's state is gathered from
    # all of them; rank 0 writes), and the other ranks keep a silent callback in each logger's place, so
    # that the loop's state has one layout on every rank and a checkpoint resumes on any number of them.
    if root:
        callbacks = [ModelCheckpoint(out, monitor="val_accuracy"), JSONLLogger(os.path.join(out, "metrics.jsonl"))]
        if tensorboard:  # event files next to metrics.jsonl; the logger's state is in the checkpoint
            from minidl.train.tensorboard import TensorBoardLogger
            try:
                callbacks.append(TensorBoardLogger(os.path.join(out, "tensorboard")))
            except ImportError as exc:
                return _end(comm, _fail(str(exc)))
    else:
        callbacks = [ModelCheckpoint(out or "", monitor="val_accuracy", write=False), Callback()]
        if tensorboard:  # counts validations and, under ZeRO-3, gathers the weights for each histogram
            from minidl.train.tensorboard import TensorBoardLogger
            callbacks.append(TensorBoardLogger("", write=False))
    if args.patience:
        callbacks.insert(0, EarlyStopping(monitor="val_accuracy", patience=args.patience, restore_best=True))
    trainer = run.trainer(callbacks=callbacks, progress=not args.quiet and root, metrics=("accuracy", "f1"),
                          amp=args.amp)
    model, lr, train_loader = run.model, run.lr, run.train_loader
    trainer.extra = {"settings": s, "tensorboard": bool(tensorboard)}
    if args.resume:
        try:
            trainer.load_checkpoint(args.resume)
        except (ValueError, OSError) as exc:  # CheckpointError names the damaged part; nothing was changed
            return _end(comm, _fail(f"cannot resume: {exc}"))
    if root:
        count = model.memory_report()["elements"] if zero >= 2 else model.num_parameters()  # not the shard's
        print(f"{s['model']} on {data.name}: {count:,} parameters, {len(data.x_train)} training / "
              f"{len(data.x_val)} validation / {len(data.x_test)} test samples, {s['optimizer']} lr={lr:g} "
              f"({s['schedule']}), {s['epochs']} epochs of {len(train_loader)} batches"
              + (f", data-parallel on {comm.size} ranks ({comm.name})" if comm is not None else "")
              + (f", ZeRO stage {zero}" if zero else "")
              + (f", resuming at step {trainer.step}" if args.resume else "") + f"\nwriting to {out}")
    try:
        trainer.fit(s["epochs"])
    except NonFiniteLossError as exc:
        print(f"minidl train: {exc}", file=sys.stderr)
        return _end(comm, 1)
    except TrainingInterrupted as exc:
        if root:
            print(interrupted_line("minidl train", exc, getattr(args, "argv", []), out,
                                   comm.size if comm is not None else 1), file=sys.stderr)
        return 130

    test = trainer.evaluate(test_loader)
    if zero >= 2:  # the whole weights on every rank (a collective), for model.safetensors
        model.gather_parameters()
    if not root:
        return 0
    JSONLLogger(os.path.join(out, "metrics.jsonl")).write({"split": "test", "step": trainer.step, **test})
    mdl.save(model.state_dict(), os.path.join(out, "model.safetensors"))
    mdl.save(data.standardizer.state_dict(), os.path.join(out, "standardizer.safetensors"))
    plot_curves(trainer.history, os.path.join(out, "curves.png"), steps=trainer.steps,
                title=f"{s['model']} on {data.name}", test=test)
    best = next((cb for cb in callbacks if isinstance(cb, ModelCheckpoint)), None)
    best_value, best_step = (best.best, best.best_step) if best is not None else _best_validation(trainer.history)
    restored = any(isinstance(cb, EarlyStopping) and cb.best_state is not None for cb in callbacks)
    weights = (f"the best weights (step {best_step}, restored by early stopping)" if restored
               else f"the final weights (step {trainer.step})")
    print(f"test accuracy of {weights}: {test['accuracy']:.2%}  (loss {test['loss']:.4f}, "
          f"macro F1 {test['f1']:.3f}); best validation accuracy {best_value:.2%} at step {best_step}")
    print(f"with 95 % intervals: {interval_note(test['accuracy'], len(data.x_test), best_value, len(data.x_val))}")
    print(f"wrote {out}/: {', '.join(written_files(out))} ({time.perf_counter() - started:.1f} s)")
    print(f"predict with: minidl predict {out}")
    return 0


def _best_validation(history) -> tuple:
    """The highest validation accuracy of ``history`` and its step (the first, as ModelCheckpoint keeps it)."""
    records = [r for r in history if "val_accuracy" in r]
    top = max(records, key=lambda r: r["val_accuracy"])  # max keeps the first of equal values
    return top["val_accuracy"], top["step"]


RUN_FILES = ("model.safetensors", "standardizer.safetensors", "curves.png", "metrics.jsonl", "last.safetensors",
             "best.safetensors", "tensorboard")


def written_files(folder: str) -> list:
    """The run files present in ``folder``, in the order the docs describe them."""
    return [name for name in RUN_FILES if os.path.exists(os.path.join(folder, name))]


def _add_train(sub):
    p = add_command(sub, "train", help="train a model on bundled or local data",
                    description="Train a model; with no options an MLP on the bundled digits (about 10 s).\n"
                                "Writes model.safetensors, standardizer.safetensors, curves.png, metrics.jsonl and "
                                "the checkpoints\nlast.safetensors and best.safetensors into --out. A resumed run "
                                "takes every setting not given\nagain from its checkpoint.")
    p.add_argument("--data", type=data_spec, help="digits (bundled), spirals, or mnist:PATH (default: digits)")
    p.add_argument("--model", choices=("mlp", "cnn"), help="mlp, or cnn for images (default: mlp)")
    p.add_argument("--optimizer", help="any minidl.optim optimizer by name: adam, sgd, adamw, ... (default: adam)")
    p.add_argument("--lr", type=positive_float, help="learning rate (default: the optimizer's own, 0.05 for SGD)")
    p.add_argument("--schedule", choices=SCHEDULES, help="learning-rate schedule over the whole run "
                   "(default: cosine, from lr to 0)")
    p.add_argument("--epochs", type=positive_int, help="total epochs, counting a resumed run's (default: 20)")
    p.add_argument("--batch-size", dest="batch_size", type=positive_int, help="samples per batch (default: 32)")
    p.add_argument("--weight-decay", dest="weight_decay", type=nonnegative_float,
                   help="L2 weight decay (default: 0)")
    p.add_argument("--label-smoothing", dest="label_smoothing", type=nonnegative_float,
                   help="weight of the uniform distribution mixed into the targets (default: 0)")
    p.add_argument("--dropout", type=nonnegative_float, help="dropout after each hidden layer (default: 0)")
    p.add_argument("--clip-norm", dest="clip_norm", type=positive_float,
                   help="clip gradients to this global norm (default: no clipping)")
    p.add_argument("--accumulate", type=positive_int, help="micro-batches per optimizer step (default: 1)")
    p.add_argument("--patience", type=positive_int, help="early stopping after this many epochs without "
                   "a better validation accuracy, restoring the best weights (default: no early stopping)")
    p.add_argument("--device", help="cpu or cuda (default: cpu; a resumed run: the checkpoint's)")
    p.add_argument("--amp", choices=("fp16", "bf16"), default=None,
                   help="mixed precision: fp16 (float16 with loss scaling) or bf16 (bfloat16, needs ml_dtypes; "
                        "CPU only); on the CPU a numerics and memory lesson, not a speed-up (default: off, float32)")
    p.add_argument("--seed", type=int, help="seed of everything: split, initialization, shuffling (default: 0)")
    p.add_argument("--out", help="run folder (default: runs/train-<data>-<model>-<time>; "
                   "a resumed run: the checkpoint's folder)")
    p.add_argument("--resume", help="continue an earlier run: its folder (runs/X) or its checkpoint file "
                   "(runs/X/last.safetensors, or best.safetensors) (default: a fresh run)")
    add_overwrite(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar (the bar shows the mean training loss "
                   "of the epoch so far; metrics.jsonl records it at the end of each epoch)")
    p.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard event files into OUT/tensorboard: scalars, and histograms of weights, "
                        "activations and gradients at each validation (needs tensorboardX: pip install "
                        "minidl[tensorboard]; a resumed run keeps its checkpoint's choice; default: off, "
                        "metrics.jsonl only)")
    p.add_argument("--data-parallel", dest="data_parallel", action="store_true",
                   help="under mpiexec: one model per rank, each on 1/N of every batch, gradients all-reduced "
                        "(mpiexec -n 4 python -m mpi4py -m minidl train --data-parallel; see docs/data_parallel.md)")
    p.add_argument("--zero", type=int, choices=(1, 2, 3), default=None,
                   help="with --data-parallel, ZeRO: 1 shards the optimizer state across the ranks, 2 the "
                        "gradients too, 3 the weights too (stage 2 and 3 run every optimizer: lamb, lars and novograd "
                        "take each parameter's norm over the ranks, switchoptimizer its sums, adahessian its "
                        "Hessian probe of the whole weights); "
                        "its checkpoints are consolidated: --resume continues it in one "
                        "process or on any number of ranks; --clip-norm, --amp, --patience and --tensorboard "
                        "see the whole model, as in one process (see docs/parallelism.md; default: off, every "
                        "rank holds everything)")
    p.set_defaults(run=train_command)


def add_commands(subparsers) -> None:
    """Register ``train`` with the ``minidl`` command's subparsers."""
    _add_train(subparsers)
