"""``minidl predict``: apply a trained run (model and standardizer) to new inputs.

    minidl predict RUN                     # the run's own test split: accuracy
    minidl predict RUN --inputs x.npy      # new inputs (.npy or .csv, one sample per row); predictions
    minidl predict RUN --inputs x.csv --labels y.csv   # ... and their accuracy

The library side, :func:`minidl.train.load_run`, is :mod:`minidl.train.predict`.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from minidl.cli.args import add_command, add_overwrite, out_folder
from minidl.train.metrics import accuracy_interval, bootstrap_interval, format_interval, macro_f1
from minidl.train.predict import check_inputs, check_labels, load_run


def _read_array(path: str, option: str) -> np.ndarray:
    """The array of the .npy or .csv file ``path`` given as ``option`` (``--inputs``, ``--labels``)."""
    if not path.endswith((".npy", ".csv")):
        raise ValueError(f"predict: {option} {path} must be a .npy or a .csv file")
    if not os.path.isfile(path):
        what = "a folder, not a file" if os.path.isdir(path) else "no such file"
        raise ValueError(f"predict: {option} {path}: {what} (looked in {os.path.abspath(path)}); give the path "
                         f"of an existing .npy or .csv file, one sample per row (write one with "
                         f"np.save('x.npy', x) or np.savetxt('x.csv', x, delimiter=','))")
    if path.endswith(".npy"):
        return np.load(path, allow_pickle=False)
    return np.loadtxt(path, delimiter=",", ndmin=2, comments="#")


def predict_command(args) -> int:
    from minidl.serialization import atomic_write
    from minidl.train.run_folder import write_failure
    try:
        run = load_run(args.folder)
        if args.inputs:
            x = _read_array(args.inputs, "--inputs")
            check_inputs(x, args.inputs)
            y = (check_labels(_read_array(args.labels, "--labels"), run.num_classes, args.labels)
                 if args.labels else None)
            source = args.inputs
        else:
            from minidl.train import data_sources
            data = data_sources.load(run.settings["data"], seed=int(run.settings.get("seed", 0)))
            x, y = data.standardizer.inverse_transform(data.x_test), data.y_test  # raw, as a new file would be
            source = f"the test split of {data.name} (seed {run.settings.get('seed', 0)})"
        if y is not None and len(y) != len(x):
            raise ValueError(f"predict: {len(x)} inputs but {len(y)} labels")
        predictions = run.predict(x)
    except (OSError, ValueError) as exc:  # minidl.load's LoadError is both
        print(f"minidl predict: error: {exc}", file=sys.stderr)
        return 2
    with out_folder("predict", args.out, overwrite=args.overwrite, run_files=("predictions.csv",)) as folder:
        path = os.path.join(folder.path, "predictions.csv")
        try:
            atomic_write(path, lambda tmp: np.savetxt(tmp, predictions, fmt="%d", header="predicted class",
                                                      comments=""))
        except OSError as exc:
            print(write_failure("predict", exc), file=sys.stderr)
            return 2
    shown = " ".join(map(str, predictions[:args.show]))
    print(f"{run.settings['model']} of {run.folder} on {len(predictions)} samples of {source}")
    print(f"predicted classes: {shown}{' ...' if len(predictions) > args.show else ''}")
    if y is not None:
        print(f"accuracy: {float((predictions == y).mean()):.2%} ({int((predictions == y).sum())} of {len(y)})")
        print(f"with 95 % intervals: accuracy {format_interval(*accuracy_interval(y, predictions))}, macro F1 "
              f"{format_interval(*bootstrap_interval(macro_f1, y, predictions, seed=0))} (bootstrap)")
    print(f"wrote {path}")
    return 0


def add_commands(subparsers) -> None:
    """Register ``predict`` with the ``minidl`` command's subparsers."""
    p = add_command(subparsers, "predict", help="apply a trained run (model and standardizer) to new inputs",
                    description="Apply the model of a minidl train run folder, with its standardizer, to raw "
                                "inputs from a .npy or .csv file\n(one sample per row), or to the run's own "
                                "test split; print the predicted classes, and the accuracy\nwhen labels are "
                                "known; write predictions.csv into --out.")
    p.add_argument("folder", metavar="RUN", help="the run folder that minidl train wrote (model.safetensors, "
                               "standardizer.safetensors, last.safetensors)")
    p.add_argument("--inputs", help="a .npy or .csv file of raw inputs, one sample per row "
                                    "(default: the run's test split)")
    p.add_argument("--labels", help="a .npy or .csv file of the true classes of --inputs, for the accuracy "
                                    "(default: none)")
    p.add_argument("--show", type=int, default=20, help="how many predictions to print")
    p.add_argument("--out", help="folder for predictions.csv (default: runs/predict-<time>)")
    add_overwrite(p)
    p.set_defaults(run=predict_command)
