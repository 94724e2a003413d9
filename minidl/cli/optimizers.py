"""``minidl optimizers`` and ``minidl lr-find``.

    minidl optimizers                       # optimizers.png: every optimizer on three 2-D landscapes
    minidl optimizers --out figs --steps 300
    minidl lr-find                          # lr_find.png: the range test of a small MLP on the digits
    minidl lr-find --optimizer adam --lr-min 1e-6 --lr-max 1 --steps 200

Each writes its PNG into ``--out`` (by default ``runs/optimizers-<time>`` or
``runs/lr-find-<time>``).
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

import minidl.functional as F
from minidl import nn, optim
from minidl.cli.args import add_command, add_overwrite, out_folder, positive_float, positive_int
from minidl.data import digits
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


# ---------------------------------------------------------------- the lr-find demo: a small MLP on the digits
def _mlp(sizes, rng):
    """Linear → ReLU → … → Linear of ``sizes``, He-initialized (Var(w) = 2 / fan_in) from ``rng``, zero biases."""
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        linear = nn.Linear(fan_in, fan_out)
        linear.weight.array[...] = rng.standard_normal((fan_out, fan_in)).astype(np.float32) \
            * np.float32(math.sqrt(2 / fan_in))
        linear.bias.array[...] = 0
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _digits_or_blobs(rng):
    try:
        x, y = digits(flatten=True)
        x = (x / 16.0).astype(np.float32)
    except Exception:  # noqa: BLE001 - no dataset bundled: a synthetic 10-class problem instead
        centers = rng.standard_normal((10, 64)).astype(np.float32)
        y = rng.integers(0, 10, 1797)
        x = centers[y] + 0.8 * rng.standard_normal((1797, 64)).astype(np.float32)
    return x.astype(np.float32), np.asarray(y, np.int64)


def lr_find_command(out_path: str = "lr_find.png", steps: int = 100, lr_min: float = 1e-5, lr_max: float = 1.0,
                    batch_size: int = 64, hidden: int = 64, optimizer: str = "sgd", seed: int = 0) -> str:
    """Run the range test for a small MLP on the digits and save the figure (what `minidl lr-find` does).

    Arguments: ``out_path`` the PNG to write; ``steps`` mini-batches in the sweep;
    ``lr_min``/``lr_max`` its ends; ``batch_size``; ``hidden`` units of the MLP
    (64 → hidden → 10); ``optimizer`` "sgd" (momentum 0.9) or "adam"; ``seed``.
    Prints the suggested rate and returns ``out_path``.
    """
    rng = np.random.default_rng(seed)
    x, y = _digits_or_blobs(rng)
    model = _mlp([x.shape[1], hidden, int(y.max()) + 1], rng)
    if optimizer == "adam":
        opt = optim.Adam(model.parameters(), lr=lr_min)
    elif optimizer == "sgd":
        opt = optim.SGD(model.parameters(), lr=lr_min, momentum=0.9)
    else:
        raise ValueError(f"lr-find: optimizer must be 'sgd' or 'adam', got {optimizer!r}")

    def loader():
        order = rng.permutation(len(x))
        for start in range(0, len(x) - batch_size + 1, batch_size):
            batch = order[start:start + batch_size]
            yield x[batch], y[batch]

    class Batches:
        def __iter__(self):
            return loader()

    result = optim.lr_range_test(model, F.cross_entropy, Batches(), lr_min=lr_min, lr_max=lr_max, steps=steps,
                           optimizer=opt, plot=out_path)
    print(f"learning-rate range test: {len(result.lrs)} steps from {lr_min:g} to {result.lrs[-1]:.3g}; "
          f"suggested lr {result.suggestion:.3g} (figure: {out_path})")
    return out_path


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
