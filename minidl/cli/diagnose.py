"""``minidl diagnose``: the textbook's debugging recipe on a model of ``minidl train``.

    minidl diagnose --data digits --model mlp      # the checks on a fresh model
    minidl diagnose --weights runs/train-.../model.safetensors
    minidl diagnose --augment hflip --capacity     # and two of the silent failures' detectors

After the recipe's checks, the detectors of the silent failures
(:mod:`minidl.train.silent_failures`) that apply to this run: every example
gets a gradient from the loss (the loss not clipped), the augmentation named by
``--augment`` keeps the labels (two runs of twice ``--steps`` steps from the fresh
weights, without and with it, compared class by class on the validation split), and, with ``--capacity``,
the training error does not rise from the narrowest of three widths (×1, ×3,
×9) to the widest; then the inference budget (weights, activations and latency at batch 1).
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
    detectors = silent_failure_checks(args, data, model, fresh)
    if detectors:
        print("\nsilent failures:\n" + "\n".join(str(c) for c in detectors))
    from minidl.train.inference_budget import format_inference_report, inference_report
    print("\ninference budget (eval mode, batch 1):\n" + format_inference_report(inference_report(model,
                                                                                                data.x_val[:1])))
    failed = [c.name for c in report["checks"] if c.passed is False]
    print(f"\n{len(report['checks']) - len(failed)} of {len(report['checks'])} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    missed = [c.name for c in detectors if c.passed is False]
    print(f"{len(detectors) - len(missed)} of {len(detectors)} silent-failure detectors passed"
          + (f"; failed: {', '.join(missed)}" if missed else ""))
    return 1 if failed or missed else 0


AUGMENTATIONS = {  # --augment NAME: the transform, applied to each training batch of the augmented run
    "hflip": lambda: _transforms().RandomHorizontalFlip(p=0.5, rng=0),
    "rotate": lambda: _transforms().RandomRotation(15, rng=0),
    "noise": lambda: _transforms().GaussianNoise(0.1, rng=0),
}


def _transforms():
    from minidl.data import transforms
    return transforms


def silent_failure_checks(args, data, model, fresh) -> list:
    """The detectors of minidl.train.silent_failures that apply to this run (see the module docstring)."""
    from minidl.train.classifiers import build_model
    from minidl.train.diagnostics import cross_entropy_loss
    from minidl.train.silent_failures import check_augmentation, check_capacity, check_loss_gradient

    untrained = fresh if args.weights else model
    checks = [check_loss_gradient(untrained, data.x_train[:256], data.y_train[:256], cross_entropy_loss)]
    if args.augment:
        checks.append(check_augmentation(untrained, data.x_val, data.y_val, (data.x_train, data.y_train),
                                         transform=AUGMENTATIONS[args.augment](), steps=args.steps * 2,
                                         seed=args.seed))
        checks[-1].name += f" ({args.augment})"
    if args.capacity:
        widths = {"mlp": lambda f: {"hidden": (32 * f, 16 * f)}, "cnn": lambda f: {"channels": (4 * f, 8 * f)}}

        def make(factor):
            return build_model(args.model, data.sample_shape, data.num_classes, **widths[args.model](factor))

        checks.append(check_capacity(make, [1, 3, 9], data.x_train, data.y_train, steps=args.steps,
                                     seed=args.seed))
    return checks


def add_commands(subparsers) -> None:
    """Register ``diagnose`` with the ``minidl`` command's subparsers."""
    p = add_command(subparsers, "diagnose", help="the textbook's debugging recipe on a model",
                    description="The debugging recipe: initial loss vs ln K, overfitting two samples, real vs "
                                "zeroed inputs,\nper-layer statistics, the dropout-with-BatchNorm warning; then the "
                                "detectors of silent failures\n(--augment, --capacity) and the inference budget. With "
                                "--weights, the checks meant for an\nuntrained model run on a fresh model of the "
                                "same architecture, and the trained weights are\nchecked against chance on the "
                                "validation split and get the per-layer statistics.\nExits 1 if a check fails.")
    p.add_argument("--data", type=data_spec, default="digits", help="digits, spirals, or mnist:PATH")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp", help="the architecture, as in minidl train")
    p.add_argument("--dropout", type=nonnegative_float, default=0.0, help="dropout after each hidden layer")
    p.add_argument("--weights", help="a trained model.safetensors to check (default: fresh weights only)")
    p.add_argument("--steps", type=positive_int, default=150, help="steps of the overfit and baseline runs")
    p.add_argument("--augment", choices=tuple(AUGMENTATIONS),
                   help="check that this augmentation keeps the labels (default: no augmentation checked)")
    p.add_argument("--capacity", action="store_true",
                   help="check that the training error falls as the model grows (three widths, x1, x3, x9)")
    p.add_argument("--device", help="cpu or cuda (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split and the fresh model")
    p.set_defaults(run=diagnose_command)
