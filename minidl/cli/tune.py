"""``minidl tune``: a hyperparameter search of ``minidl train`` runs.

    minidl tune                                              # Hyperband over lr and weight decay, digits MLP
    minidl tune --strategy random --trials 20 --epochs 5 --param lr=log:1e-4:1 --param dropout=uniform:0:0.5
    minidl tune --strategy lr-sweep --optimizer sgd --epochs 3     # the book's sweep 1e-5 ... 1
    minidl tune --strategy tpe --trials 30 --preset lr-wd          # Bayesian optimization (needs Optuna)

Writes ``trials.csv``, ``trials.jsonl`` (one line per trial), ``scores.png``
(the score against each hyperparameter) and ``curves.png`` (the validation
curves of the five best trials) into ``--out``, prints the table, the best
configuration and the ``minidl train`` command that trains it, a warning for
each hyperparameter whose best value sits at an edge of its range, and the
optimism expected of the best of N noisy validation accuracies; then adds a
row for the search to the study registry ``studies.csv`` (beside the run
folder, or ``--registry``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from minidl.cli.args import add_command, add_overwrite, out_folder, positive_int
from minidl.train.recipe import SCHEDULES

STRATEGIES = ("grid", "random", "halving", "hyperband", "tpe", "lr-sweep")
RUN_FILES = ("trials.csv", "trials.jsonl", "scores.png", "curves.png")


def _param(text):
    from minidl.tune.objective import TUNABLE
    from minidl.tune.space import parse_dimension
    name, sep, spec = text.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in TUNABLE:
        raise argparse.ArgumentTypeError(f"expected NAME=RANGE with NAME one of {', '.join(TUNABLE)}, got {text!r}")
    try:
        return name, parse_dimension(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _space(args) -> dict:
    from minidl.tune.presets import PRESETS
    space = dict(PRESETS[args.preset]) if args.preset else {}
    space.update(dict(args.param or ()))
    return space or dict(PRESETS["lr-wd"])


def _train_command(settings: dict, config: dict, epochs: int) -> str:
    s = {**settings, **config, "epochs": epochs}
    flags = [f"--{k.replace('_', '-')} {s[k]:g}" if isinstance(s[k], float) else f"--{k.replace('_', '-')} {s[k]}"
             for k in ("data", "model", "optimizer", "lr", "schedule", "epochs", "batch_size", "weight_decay",
                       "dropout", "label_smoothing", "clip_norm", "accumulate", "seed") if s.get(k) is not None]
    return "minidl train " + " ".join(flags)


def _tune_command(args, space: dict) -> str:
    """The ``minidl tune`` command that repeats this search (every setting spelled out), for the registry."""
    from minidl.tune.space import format_dimension
    flags = [f"--strategy {args.strategy}", f"--epochs {args.epochs}", f"--trials {args.trials}",
             f"--metric {args.metric}", f"--data {args.data}", f"--model {args.model}",
             f"--optimizer {args.optimizer}", f"--batch-size {args.batch_size}", f"--schedule {args.schedule}",
             f"--seed {args.seed}"]
    if args.strategy in ("halving", "hyperband"):
        flags += [f"--min-epochs {args.min_epochs}", f"--eta {args.eta}"]
    if args.strategy == "grid":
        flags.append(f"--points {args.points}")
    flags += [f"--param {name}={format_dimension(dim)}" for name, dim in space.items()]
    return "minidl tune " + " ".join(flags)


def tune_command(args) -> int:
    from minidl.train.run_folder import write_failure
    from minidl.tune import analysis, presets, search
    from minidl.tune.objective import OPTIMIZER_SETTINGS, TrainerObjective, check_space
    from minidl.tune.registry import record_study
    from minidl.tune.results import SearchResult

    started = time.perf_counter()
    space = _space(args)
    try:
        check_space(space)  # every range inside its setting's domain, before the first trial
        objective = TrainerObjective(args.data, args.model, metric=args.metric, device=args.device,
                                     horizon=args.epochs, optimizer=args.optimizer, batch_size=args.batch_size,
                                     schedule=args.schedule, seed=args.seed)
        objective.data  # load now: a bad --data or plan fails before the folder is made
        if args.strategy == "halving":
            search.halving_rungs(args.trials, args.min_epochs, args.epochs, args.eta)
        elif args.strategy == "hyperband":
            search.hyperband_brackets(args.epochs, args.min_epochs, args.eta)
        if args.strategy == "tpe":
            import optuna  # noqa: F401 - fail early with the message below
    except ImportError:
        print("minidl tune: error: --strategy tpe needs Optuna: pip install 'minidl[tune]'", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"minidl tune: error: {exc}", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm
    bar = tqdm(total=args.trials if args.strategy in ("random", "tpe") else None, desc=f"tune ({args.strategy})",
               unit="trial", file=sys.stderr, leave=False, dynamic_ncols=True,
               disable=args.quiet or not sys.stderr.isatty())  # a log file gets the table, not the bar's redraws
    with out_folder("tune", args.out, overwrite=args.overwrite, run_files=RUN_FILES) as folder:
        out = folder.path

        def write_trials(trial, trials):  # as each trial finishes: a later failure keeps the finished ones
            finished = SearchResult(args.strategy, trials, objective.mode, args.metric)
            finished.to_csv(os.path.join(out, "trials.csv"))
            finished.to_jsonl(os.path.join(out, "trials.jsonl"))
            best = finished.best
            bar.update(1)  # then redraw (a trial takes seconds: every one is shown)
            bar.set_postfix_str(f"best {args.metric} {best.score:.4g}" if best else "no finished trial")

        common = {"seed": args.seed, "mode": objective.mode, "on_trial": write_trials}
        try:
            if args.strategy == "lr-sweep":
                fixed = {k: v for k, v in space.items() if k != "lr" and not hasattr(v, "sample")}
                sweep = presets.learning_rate_sweep(objective, args.epochs, config=fixed, on_trial=write_trials)
                result, space = sweep.result, {"lr": presets.Choice(presets.LEARNING_RATES)}
            elif args.strategy == "grid":
                result = search.grid_search(objective, space, args.epochs, points=args.points, mode=objective.mode,
                                            on_trial=write_trials)
            elif args.strategy == "random":
                result = search.random_search(objective, space, args.trials, args.epochs, **common)
            elif args.strategy == "tpe":
                result = search.tpe_search(objective, space, args.trials, args.epochs, **common)
            elif args.strategy == "halving":
                result = search.successive_halving(objective, space, args.trials, args.epochs, args.min_epochs,
                                                   args.eta, **common)
            else:
                result = search.hyperband(objective, space, args.epochs, args.min_epochs, args.eta, **common)
            bar.close()
            result.to_csv(os.path.join(out, "trials.csv"))
            result.to_jsonl(os.path.join(out, "trials.jsonl"))
            result.plot(os.path.join(out, "scores.png"), space, title=f"{args.strategy} on {args.data}: "
                        f"{len(result.trials)} trials, {result.epochs_trained} epochs")
            analysis.plot_top_curves(result, k=5, path=os.path.join(out, "curves.png"))
        except OSError as exc:  # a write failed (a full disk): one line; the files written before are kept
            bar.close()
            print(write_failure("tune", exc), file=sys.stderr)
            return 2
        except ValueError as exc:
            bar.close()
            kept = os.path.exists(os.path.join(out, "trials.csv"))
            print(f"minidl tune: error: {exc}" + ("; the finished trials are in " + os.path.join(out, "trials.csv")
                                                  if kept else ""), file=sys.stderr)
            return 2
    print(result.table(limit=args.show))
    best = result.best
    diverged = sum(t.status != "ok" for t in result.trials)
    print(f"\n{args.strategy}: {len(result.trials)} trials, {result.epochs_trained} epochs trained, "
          f"{diverged} diverged ({time.perf_counter() - started:.1f} s)")
    if best is None:
        print("every trial diverged: try smaller learning rates", file=sys.stderr)
        return 1
    if args.strategy == "lr-sweep":
        print(f"the largest learning rate that did not diverge: {sweep.chosen:g}")
    print(f"best: {', '.join(f'{k}={v:g}' if isinstance(v, float) else f'{k}={v}' for k, v in best.config.items())}"
          f" -> {args.metric} {best.score:.4g} after {best.epochs} epochs")
    print(f"train it: {_train_command(objective.settings, best.config, best.epochs)}")
    tuned_optimizer = {k: v for k, v in best.config.items() if k in OPTIMIZER_SETTINGS}
    if tuned_optimizer:
        print(f"  (minidl train has no flags for {', '.join(tuned_optimizer)}: give them to the optimizer, "
              f"{', '.join(f'{k}={v:g}' for k, v in tuned_optimizer.items())})")
    for warning in analysis.edge_warnings(result, space):
        print(f"warning: {warning}")
    n_val = len(objective.data.y_val)
    if args.metric == "val_accuracy":
        optimism = analysis.best_of_n_optimism(result, n_val=n_val)
        print(f"the best of {optimism.n} validation accuracies on {n_val} samples (noise σ = {optimism.noise_std:.3g}) "
              f"is expected to read {optimism.expected:.3g} above its true value if the configurations were equally "
              "good: a lead smaller than that over the runner-up is not shown to be real")
    written = [name for name in RUN_FILES if os.path.exists(os.path.join(out, name))]
    print(f"wrote {out}/: {', '.join(written)}")
    registry = args.registry or os.path.join(os.path.dirname(os.path.abspath(out)), "studies.csv")
    try:
        record_study(registry, result, study=args.study or os.path.basename(os.path.abspath(out)), goal=args.goal,
                     space=space, folder=out, command=_tune_command(args, space),
                     n_val=n_val if args.metric == "val_accuracy" else None)
        print(f"recorded the study in {registry}")
    except (OSError, ValueError) as exc:
        print(f"minidl tune: could not record the study in {registry}: {exc}", file=sys.stderr)
    return 0


def _add_tune(sub):
    p = add_command(sub, "tune", help="hyperparameter search over minidl train runs",
                    description="Search hyperparameters of 'minidl train' runs: grid, random, successive halving, "
                                "Hyperband,\nTPE (Bayesian, needs Optuna) or the book's learning-rate sweep. Each "
                                "trial is a seeded run;\nthe budget is counted in epochs. Writes trials.csv, "
                                "trials.jsonl and scores.png into --out.\nRanges: --param lr=log:1e-4:1 "
                                "--param dropout=uniform:0:0.5 --param batch_size=int:16:128\n"
                                "--param optimizer=choice:adam,sgd (default: the lr-wd preset).")
    p.add_argument("--strategy", choices=STRATEGIES, default="hyperband",
                   help="how to search; lr-sweep tries 1e-5, 10^-4.5, ..., 1 and keeps the largest that does "
                        "not diverge")
    p.add_argument("--param", action="append", type=_param, metavar="NAME=RANGE",
                   help="a hyperparameter and its range (log:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH, "
                        "logint:LOW:HIGH, choice:A,B or one value); repeat for more (default: the lr-wd preset)")
    p.add_argument("--preset", choices=("lr", "weight-decay", "lr-wd"), default=None,
                   help="the book's ranges: lr 10^-5.0, 10^-4.5, ..., 1; weight decay log-uniform 1e-6..1e-3; "
                        "--param adds to or overrides them (default: lr-wd unless --param is given)")
    p.add_argument("--epochs", type=positive_int, default=9,
                   help="epochs per trial; for halving and hyperband the largest budget of one configuration")
    p.add_argument("--min-epochs", dest="min_epochs", type=positive_int, default=1,
                   help="halving and hyperband: epochs of the first rung")
    p.add_argument("--eta", type=positive_int, default=3,
                   help="halving and hyperband: keep 1/eta of the configurations at each rung (at least 2)")
    p.add_argument("--trials", type=positive_int, default=9,
                   help="configurations for random and tpe, and the first rung of halving")
    p.add_argument("--points", type=positive_int, default=3, help="grid: values per range (every option of a choice)")
    p.add_argument("--metric", choices=("val_accuracy", "val_loss", "val_f1"), default="val_accuracy",
                   help="what a trial scores (loss: lower is better)")
    p.add_argument("--data", default="digits", help="digits, spirals or mnist:PATH, as in minidl train")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the architecture, as in minidl train")
    p.add_argument("--optimizer", default="adam", help="any minidl.optim optimizer by name, as in minidl train")
    p.add_argument("--batch-size", dest="batch_size", type=positive_int, default=32,
                   help="samples per batch, unless tuned")
    p.add_argument("--schedule", choices=SCHEDULES, default="constant",
                   help="learning-rate schedule over --epochs, unless tuned (as in minidl train)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of every trial's run (split, initialization, batches) and of the search's draws")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--show", type=positive_int, default=20, help="rows of the printed table, best first")
    p.add_argument("--out", help="folder for the results (default: runs/tune-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar over the trials")
    p.add_argument("--study", help="the study's name in the registry (default: the run folder's name)")
    p.add_argument("--goal", default="", help="one line on what the study is for, kept in the registry")
    p.add_argument("--registry", help="the study registry to add a row to (default: studies.csv beside the run "
                                      "folder)")
    add_overwrite(p)
    p.set_defaults(run=tune_command)


def add_commands(subparsers) -> None:
    """Register ``tune`` with the ``minidl`` command's subparsers."""
    _add_tune(subparsers)
