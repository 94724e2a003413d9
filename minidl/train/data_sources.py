"""The data sets of ``minidl train --data``: loaded, split, standardized, ready for loaders.

    data = load("digits", seed=0)
    data.x_train, data.y_train, data.x_val, ..., data.num_classes, data.sample_shape

- ``digits``: the bundled UCI digits, images (1, 8, 8);
- ``spirals``: two interleaved spirals, 1,000 points in the plane (2 features);
- ``mnist:PATH``: MNIST-format IDX files in the folder PATH, images (1, 28, 28);
  the official test set is the test split, the last 10% of the training files validate.

The split is stratified and seeded (80/10/10 where the data has no test set of
its own). A :class:`minidl.data.Standardizer` is fitted on the training split
only and applied unchanged to validation and test, as the text insists.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


@dataclass
class Prepared:
    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    standardizer: object

    @property
    def sample_shape(self) -> tuple:
        return tuple(self.x_train.shape[1:])


def load(spec: str, seed: int = 0) -> Prepared:
    """Load the data set named by ``spec`` ("digits", "spirals" or "mnist:PATH")."""
    from minidl import data

    if spec == "digits":
        x, y = data.digits()
        x = x[:, None]  # a channel axis: (N, 1, 8, 8), what a CNN expects; an MLP flattens it
        train, val, test = data.train_val_test_split(x, y, ratios=(0.8, 0.1, 0.1), stratify=True, seed=seed)
        name, axis = "digits", 0
    elif spec == "spirals":
        x, y = data.two_spirals(n=1000, noise=0.02, seed=seed)
        train, val, test = data.train_val_test_split(x, y, ratios=(0.8, 0.1, 0.1), stratify=True, seed=seed)
        name, axis = "spirals", 0
    elif spec.startswith("mnist:"):
        root = os.path.expanduser(spec[len("mnist:"):])
        if not os.path.isdir(root):
            raise FileNotFoundError(f"--data {spec}: the folder {root} does not exist; give the folder that "
                                    "holds train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz), "
                                    "t10k-images-idx3-ubyte(.gz) and t10k-labels-idx1-ubyte(.gz)")
        x, y = data.mnist(root, train=True)
        x_test, y_test = data.mnist(root, train=False)
        train, val, _ = data.train_val_test_split(x[:, None], y, ratios=(0.9, 0.1, 0.0), stratify=True, seed=seed)
        test = (x_test[:, None], y_test)
        name, axis = "mnist", None  # one mean and std for all pixels
    else:
        raise ValueError(f"unknown data {spec!r}: expected digits, spirals or mnist:PATH")
    scaler = data.Standardizer(axis=axis).fit(train[0])
    k = int(max(train[1].max(), val[1].max(initial=0), test[1].max(initial=0))) + 1
    return Prepared(name, scaler.transform(train[0]), train[1], scaler.transform(val[0]), val[1],
                    scaler.transform(test[0]), test[1], k, scaler)
