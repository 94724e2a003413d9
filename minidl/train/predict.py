"""Apply a trained run to new inputs: :func:`load_run` (the ``minidl predict`` command is :mod:`minidl.cli.predict`).

A run folder of ``minidl train`` holds everything a prediction needs: the
weights (``model.safetensors``), the input statistics of the training split
(``standardizer.safetensors``) and the run's settings (in ``last.safetensors``:
which model, on which data). In Python, three lines:

    from minidl.train import load_run
    run = load_run("runs/train-digits-mlp-20260101-120000")
    classes = run.predict(images)          # raw inputs, as the data set gives them: (N, 64), (N, 8, 8) ...

On the command line:

    minidl predict RUN                     # the run's own test split: accuracy
    minidl predict RUN --inputs x.npy      # new inputs (.npy or .csv, one sample per row); predictions
    minidl predict RUN --inputs x.csv --labels y.csv   # ... and their accuracy

Inputs are raw, in the units of the data set (digits: pixel values 0 to 16);
the run's standardizer is applied to them, as in training.
"""
from __future__ import annotations

import os

import numpy as np

# one sample's shape for each data set of ``minidl train --data``
SAMPLE_SHAPES = {"digits": (1, 8, 8), "spirals": (2,), "mnist": (1, 28, 28)}
ONE_THREAD_BATCH = 64  # at most this many samples are scored on one BLAS thread (see Run.scores)


class Run:
    """A trained model with its standardizer and settings; :meth:`predict` takes raw inputs."""

    def __init__(self, folder, model, standardizer, settings: dict, sample_shape: tuple, num_classes: int):
        self.folder, self.model, self.standardizer = folder, model, standardizer
        self.settings, self.sample_shape, self.num_classes = settings, tuple(sample_shape), int(num_classes)

    def _samples(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        size = int(np.prod(self.sample_shape))
        if x.ndim >= 1 and x.shape[1:] == self.sample_shape:
            return x
        if self.sample_shape[0] == 1 and x.shape[1:] == self.sample_shape[1:]:  # images without a channel axis
            return x[:, None]
        if x.ndim == 2 and x.shape[1] == size:  # one flattened sample per row (a CSV file)
            return x.reshape((len(x),) + self.sample_shape)
        raise ValueError(f"predict: the run's model takes samples of shape {self.sample_shape} "
                         f"({size} values each), got an array of shape {x.shape}; give one sample per row")

    def scores(self, x) -> np.ndarray:
        """The class scores (logits), (N, classes), of raw inputs ``x``.

        A few samples (at most ``ONE_THREAD_BATCH``) are scored on one BLAS thread: their products
        are too small to share out, and on a busy machine a second thread waits for the cores.
        Measured on a 2-core VM at load 4-7 (median of one call, default 2 threads against 1):
        the digits CNN, 16 samples 5.5 ms against 1.0 ms, 64 samples 58 ms against 6.4 ms; one
        sample 0.76 against 0.73 ms (its products are under OpenBLAS's own threading threshold).
        """
        from contextlib import nullcontext

        from minidl import backend
        from minidl.autograd import no_grad
        from minidl.tensor import Tensor
        z = self.standardizer.transform(self._samples(x)).astype(np.float32)
        self.model.eval()
        limit = backend.blas_threads(1) if len(z) <= ONE_THREAD_BATCH else nullcontext()
        with no_grad(), limit:
            return np.concatenate([backend.to_numpy(self.model(Tensor(z[i:i + 512])).array)
                                   for i in range(0, len(z), 512)]) if len(z) else np.zeros((0, 0), np.float32)

    def predict(self, x) -> np.ndarray:
        """The predicted class of each raw input in ``x``."""
        return self.scores(x).argmax(axis=1)

    def accuracy(self, x, y) -> float:
        """The fraction of ``x`` whose predicted class is ``y``."""
        return float((self.predict(x) == np.asarray(y)).mean())


def load_run(folder) -> Run:
    """The trained run in ``folder`` (a ``minidl train`` run folder), ready to predict."""
    import minidl as mdl
    from minidl.data import Standardizer
    from minidl.train.classifiers import build_model
    from minidl.train.run_state import read_checkpoint

    folder = os.fspath(folder)
    files = {name: os.path.join(folder, name)
             for name in ("model.safetensors", "standardizer.safetensors", "last.safetensors")}
    missing = [name for name, path in files.items() if not os.path.lexists(path)]  # a broken link: load says why
    if missing:
        raise FileNotFoundError(f"predict: {folder} is not a finished minidl train run folder: it lacks "
                                f"{', '.join(missing)}")
    extra = read_checkpoint(files["last.safetensors"]).get("extra") or {}
    settings = extra.get("settings") if isinstance(extra, dict) else None
    if not isinstance(settings, dict) or "model" not in settings or "data" not in settings:
        raise ValueError(f"predict: {files['last.safetensors']} does not say which model and data the run used")
    data = str(settings["data"]).split(":")[0]
    if data not in SAMPLE_SHAPES:
        raise ValueError(f"predict: the run trained on unknown data {settings['data']!r}")
    weights = mdl.load(files["model.safetensors"])
    biases = [k for k in weights if k.endswith(".bias")]
    if not biases:
        raise ValueError(f"predict: {files['model.safetensors']} holds no layer of a minidl train model")
    num_classes = int(weights[biases[-1]].shape[0])
    model = build_model(settings["model"], SAMPLE_SHAPES[data], num_classes, dropout=settings.get("dropout", 0.0))
    from minidl.nn.prune import Pruning
    Pruning.for_state_dict(model, weights)  # a pruned run's masks (``<name>_mask``) have their buffers again
    model.load_state_dict(weights)
    standardizer = Standardizer().load_state_dict(mdl.load(files["standardizer.safetensors"]))
    return Run(folder, model, standardizer, settings, SAMPLE_SHAPES[data], num_classes)


def check_inputs(x: np.ndarray, source: str) -> None:
    """Refuse inputs with NaN or infinite values, naming the first such rows (counted from 1)."""
    if x.dtype.kind not in "biuf":
        raise ValueError(f"predict: {source} holds {x.dtype} values, not numbers")
    rows = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1)) if x.ndim and len(x) else []
    if len(rows):
        first = ", ".join(str(r + 1) for r in rows[:5])
        raise ValueError(f"predict: {source} has NaN or infinite values in {len(rows)} of its {len(x)} rows "
                         f"(rows {first}{', ...' if len(rows) > 5 else ''}, counting from 1); a model cannot "
                         "classify a missing value: fill or drop those rows")


def check_labels(y: np.ndarray, num_classes: int, source: str) -> np.ndarray:
    """The labels as int64 when every one is an integer class in [0, num_classes); else a ValueError."""
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind not in "biuf":
        raise ValueError(f"predict: {source} holds {y.dtype} values, not class numbers")
    bad = ~np.isfinite(y) | (y != np.round(y)) | (y < 0) | (y >= num_classes) if y.dtype.kind == "f" \
        else (y < 0) | (y >= num_classes)
    rows = np.flatnonzero(bad)
    if len(rows):
        first = ", ".join(f"row {r + 1}: {y[r]:g}" for r in rows[:3])
        raise ValueError(f"predict: {source} has {len(rows)} labels that are not classes of the run (integers "
                         f"0 to {num_classes - 1}): {first}{', ...' if len(rows) > 3 else ''} (rows counted from 1)")
    return y.astype(np.int64)
