"""``minidl diagnose``: the textbook's debugging recipe on a model of ``minidl train``.

    minidl diagnose --data digits --model mlp      # the checks on a fresh model
    minidl diagnose --weights runs/train-.../model.safetensors
"""
from __future__ import annotations

import sys

from minidl.cli.args import add_command, data_spec, nonnegative_float, positive_int
from minidl.train import data_sources


def diagnose_command(args) -> int:
    import minidl as mdl
    from minidl.train.classifiers import build_model
    from minidl.train.diagnostics import diagnose, format_report
    from minidl.train.trainer import seed_everything

    seed_everything(args.seed)
    try:
        data = data_sources.load(args.data, seed=args.seed)
        model = build_model(args.model, data.sample_shape, data.num_classes, dropout=args.dropout)
        fresh = None
        if args.weights:
            fresh = model  # the seeded fresh model: the initialization checks run on it
            model = build_model(args.model, data.sample_shape, data.num_classes, dropout=args.dropout)
            model.load_state_dict(mdl.load(args.weights))
        if args.device:
            for m in (model, fresh):
                if m is not None:
                    m.to(args.device)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"minidl diagnose: error: {exc}", file=sys.stderr)
        return 2
    if args.weights:
        print(f"diagnosing {args.model} on {data.name} ({model.num_parameters():,} parameters) with the trained "
              f"weights of {args.weights};\nthe checks meant for an untrained model run on a fresh {args.model} of "
              f"the same architecture (seed {args.seed})\n")
    else:
        print(f"diagnosing a freshly initialized {args.model} on {data.name} ({model.num_parameters():,} "
              f"parameters, seed {args.seed})\n")
    report = diagnose(model, data.x_train, data.y_train, data.x_val, data.y_val, num_classes=data.num_classes,
                      overfit_steps=args.steps, baseline_steps=args.steps, seed=args.seed,
                      fresh_model=fresh, trained=bool(args.weights))
    print(format_report(report))
    failed = [c.name for c in report["checks"] if c.passed is False]
    print(f"\n{len(report['checks']) - len(failed)} of {len(report['checks'])} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def add_commands(subparsers) -> None:
    """Register ``diagnose`` with the ``minidl`` command's subparsers."""
    p = add_command(subparsers, "diagnose", help="the textbook's debugging recipe on a model",
                    description="The debugging recipe: initial loss vs ln K, overfitting two samples, real vs "
                                "zeroed inputs,\nper-layer statistics, the dropout-with-BatchNorm warning. With "
                                "--weights, the checks meant for an\nuntrained model run on a fresh model of the "
                                "same architecture, and the trained weights are\nchecked against chance on the "
                                "validation split and get the per-layer statistics.\nExits 1 if a check fails.")
    p.add_argument("--data", type=data_spec, default="digits", help="digits, spirals, or mnist:PATH")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the architecture, as in minidl train")
    p.add_argument("--dropout", type=nonnegative_float, default=0.0, help="dropout after each hidden layer")
    p.add_argument("--weights", help="a trained model.safetensors to check (default: fresh weights only)")
    p.add_argument("--steps", type=positive_int, default=150, help="steps of the overfit and baseline runs")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the fresh model")
    p.set_defaults(run=diagnose_command)
