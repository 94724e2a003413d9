"""``minidl optimizers`` and ``minidl lr-find``.

    minidl optimizers                       # optimizers.png: every optimizer on three 2-D landscapes
    minidl optimizers --out figs --steps 300
    minidl lr-find                          # lr_find.png: the range test of a small MLP on the digits
    minidl lr-find --optimizer adam --lr-min 1e-6 --lr-max 1 --steps 200

Each writes its PNG into ``--out`` (by default ``runs/optimizers-<time>`` or
``runs/lr-find-<time>``).
"""
from __future__ import annotations

import os
import sys

from minidl.cli.args import add_command, add_overwrite, out_folder, positive_float, positive_int
from minidl.train.run_folder import write_failure


def optimizers(args) -> int:
    from minidl.optim.trajectories import optimizers_command
    with out_folder("optimizers", args.out, overwrite=args.overwrite, run_files=("optimizers.png",)) as out:
        try:
            path = optimizers_command(os.path.join(out.path, "optimizers.png"), steps=args.steps,
                                      progress=not args.quiet)
        except OSError as exc:  # a full disk: one line
            print(write_failure("optimizers", exc), file=sys.stderr)
            return 2
    print(f"wrote {path}")
    return 0


def lr_find(args) -> int:
    from minidl.optim.lr_finder import lr_find_command
    if not args.lr_min < args.lr_max:
        print(f"minidl lr-find: --lr-min ({args.lr_min:g}) must be below --lr-max ({args.lr_max:g})")
        return 2
    with out_folder("lr-find", args.out, overwrite=args.overwrite, run_files=("lr_find.png",)) as out:
        try:
            lr_find_command(os.path.join(out.path, "lr_find.png"), steps=args.steps, lr_min=args.lr_min,
                            lr_max=args.lr_max, batch_size=args.batch_size, hidden=args.hidden,
                            optimizer=args.optimizer, seed=args.seed)
        except OSError as exc:  # a full disk: one line
            print(write_failure("lr-find", exc), file=sys.stderr)
            return 2
    return 0


def add_commands(subparsers) -> None:
    p = add_command(subparsers, "optimizers", help="every optimizer's trajectory on 2-D test functions (a PNG)",
                    description="Run every minidl optimizer on three 2-D landscapes (a ravine, Rosenbrock's "
                                "banana, a saddle)\nand draw the paths, one panel per landscape and family, "
                                "into optimizers.png.")
    p.add_argument("--out", help="folder for optimizers.png (default: runs/optimizers-<time>)")
    add_overwrite(p)
    p.add_argument("--steps", type=positive_int, default=200, help="optimizer steps per trajectory")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=optimizers)

    p = add_command(subparsers, "lr-find", help="the learning-rate range test on the digits (a PNG)",
                    description="The learning-rate range test: train a small MLP on the digits while the rate "
                                "grows\ngeometrically from --lr-min to --lr-max, print a suggested rate and draw "
                                "loss against rate into lr_find.png.")
    p.add_argument("--out", help="folder for lr_find.png (default: runs/lr-find-<time>)")
    add_overwrite(p)
    p.add_argument("--steps", type=positive_int, default=100, help="mini-batches in the sweep")
    p.add_argument("--lr-min", type=positive_float, default=1e-5, help="first learning rate")
    p.add_argument("--lr-max", type=positive_float, default=1.0, help="last learning rate")
    p.add_argument("--batch-size", type=positive_int, default=64, help="samples per mini-batch")
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden units of the MLP 64 → hidden → 10")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="sgd (momentum 0.9) or adam")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialization and the batch order")
    p.set_defaults(run=lr_find)
