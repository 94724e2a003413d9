"""``minidl optimizers`` and ``minidl lr-find``.

    minidl optimizers                       # optimizers.png: every optimizer on three 2-D landscapes
    minidl optimizers --out fig.png --steps 300
    minidl lr-find                          # lr_find.png: the range test of a small MLP on the digits
    minidl lr-find --optimizer adam --lr-min 1e-6 --lr-max 1 --steps 200
"""
from __future__ import annotations

from minidl.cli import positive_float, positive_int


def optimizers(args) -> int:
    from minidl.optim.trajectories import optimizers_command
    print("wrote", optimizers_command(args.out, steps=args.steps))
    return 0


def lr_find(args) -> int:
    from minidl.optim.lr_finder import lr_find_command
    if not args.lr_min < args.lr_max:
        print(f"minidl lr-find: --lr-min ({args.lr_min:g}) must be below --lr-max ({args.lr_max:g})")
        return 2
    lr_find_command(args.out, steps=args.steps, lr_min=args.lr_min, lr_max=args.lr_max,
                    batch_size=args.batch_size, hidden=args.hidden, optimizer=args.optimizer, seed=args.seed)
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser("optimizers", help="every optimizer's trajectory on 2-D test functions (a PNG)")
    p.add_argument("--out", default="optimizers.png", help="the PNG to write (default optimizers.png)")
    p.add_argument("--steps", type=positive_int, default=200, help="steps per trajectory (default 200)")
    p.set_defaults(run=optimizers)

    p = subparsers.add_parser("lr-find", help="the learning-rate range test on the digits (a PNG)")
    p.add_argument("--out", default="lr_find.png", help="the PNG to write (default lr_find.png)")
    p.add_argument("--steps", type=positive_int, default=100, help="mini-batches in the sweep (default 100)")
    p.add_argument("--lr-min", type=positive_float, default=1e-5, help="first learning rate (default 1e-5)")
    p.add_argument("--lr-max", type=positive_float, default=1.0, help="last learning rate (default 1)")
    p.add_argument("--batch-size", type=positive_int, default=64)
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden units of the MLP (default 64)")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="sgd (momentum 0.9) or adam")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=lr_find)
