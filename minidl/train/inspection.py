"""Look at the data: a batch exactly as it enters the model, and the samples the model gets most wrong.

    show_batch(train_loader, n=16)                     # after every transform, as the model sees it
    worst = worst_predictions(model, x_val, y_val, k=16)
    plot_mispredictions(model, x_val, y_val, k=16)     # the k highest losses, true and predicted labels
    Trainer(..., callbacks=[PredictionGallery(x_val[:16], y_val[:16], "runs/exp/gallery")])   # every epoch

Two steps of the book's debugging recipe. Visualizing the samples *after*
all preprocessing catches what reading the code does not: images transposed,
normalized twice, labels shifted by one, augmentation gone too far. The
gallery of the worst predictions shows whether the errors are the model's
(ambiguous samples, one confused pair of classes) or the data's (mislabelled
samples: they top the list, with a confident wrong prediction).

The guide's third (Training Deep Learning Models, §3.2): "visualize model
predictions on a fixed test batch as training progresses to get an intuition
for how the model learns" -- :class:`PredictionGallery` writes that batch's
gallery after every epoch, ``epoch-001.png``, ``epoch-002.png``..., each image
titled with its predicted class (and the true one when they differ), so the
files read as a film of the model learning.
"""
from __future__ import annotations

import math

import numpy as np

from minidl import backend
from minidl.autograd import no_grad
from minidl.tensor import Tensor
from minidl.train.callbacks import Callback


def _as_images(x, image_shape=None):
    """(N, H, W) or (N, H, W, 3) arrays for imshow, from (N, C, H, W), (N, H, W) or flat (N, D) inputs."""
    x = np.asarray(backend.to_numpy(x.array if isinstance(x, Tensor) else x))
    if image_shape is not None:
        return x.reshape((len(x),) + tuple(image_shape))
    if x.ndim == 2:
        side = math.isqrt(x.shape[1])
        if side * side != x.shape[1]:
            raise ValueError(f"show_batch: flat inputs of {x.shape[1]} features are not square images; "
                             "pass image_shape=(H, W)")
        return x.reshape(len(x), side, side)
    if x.ndim == 4:
        if x.shape[1] == 1:
            return x[:, 0]
        if x.shape[1] == 3:
            return x.transpose(0, 2, 3, 1)
        raise ValueError(f"show_batch: (N, C, H, W) inputs need C = 1 or 3 to be drawn, got shape {x.shape}")
    if x.ndim == 3:
        return x
    raise ValueError(f"show_batch: cannot draw inputs of shape {x.shape} as images; pass image_shape=(H, W)")


def _grid(images, titles, columns, cmap="gray_r"):
    import matplotlib.pyplot as plt
    rows = math.ceil(len(images) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(1.3 * columns, 1.5 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, image, title in zip(axes.ravel(), images, titles):
        ax.imshow(image, cmap=cmap if image.ndim == 2 else None)
        ax.set_title(title, fontsize=8)
    figure.tight_layout()
    return figure


def show_batch(loader, n: int = 16, columns: int = 8, image_shape=None, class_names=None):
    """Draw the first ``n`` samples of the loader's first batch, exactly as they enter the model.

    The pixel values are drawn as they are (after every transform and normalization:
    imshow rescales each image to its own range), titled by label. Returns the figure.
    """
    try:
        batch = next(iter(loader))
    except StopIteration:
        raise ValueError("show_batch: the loader gave no batch") from None
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise ValueError(f"show_batch: expected the loader to give (x, y) batches, got {type(batch).__name__}")
    x, y = batch
    images = _as_images(x, image_shape)[:n]
    labels = np.asarray(backend.to_numpy(y.array if isinstance(y, Tensor) else y))[:n]
    titles = [str(class_names[int(v)] if class_names is not None else v) for v in labels]
    return _grid(images, titles, min(columns, len(images)))


def worst_predictions(model, x, y, k: int = 16, batch_size: int = 512) -> dict:
    """The ``k`` samples with the largest cross-entropy, worst first.

    Returns ``{"index", "loss", "predicted", "true", "confidence"}``, arrays of
    length k: the samples' positions in ``x``, their losses −ln p(true), the
    predicted class, the true class and the probability given to the prediction.
    The model runs in eval mode under no_grad and is put back in its mode.
    """
    from minidl import functional as F
    x = np.asarray(backend.to_numpy(x.array if isinstance(x, Tensor) else x))
    y = np.asarray(backend.to_numpy(y.array if isinstance(y, Tensor) else y))
    if len(x) != len(y) or y.ndim != 1:
        raise ValueError(f"worst_predictions: expected x of N samples and N integer labels, got x {x.shape}, "
                         f"y {y.shape}")
    device = next(iter(model.parameters())).device
    training = model.training
    model.eval()
    try:
        losses, predicted, confidence = [], [], []
        with no_grad():
            for start in range(0, len(x), batch_size):
                logits = model(Tensor(backend.to_device(x[start:start + batch_size], device)))
                log_p = backend.to_numpy(F.log_softmax(logits, dim=1).array).astype(np.float64)
                labels = y[start:start + batch_size]
                losses.append(-log_p[np.arange(len(labels)), labels])
                predicted.append(log_p.argmax(axis=1))
                confidence.append(np.exp(log_p.max(axis=1)))
    finally:
        model.train(training)
    losses, predicted, confidence = np.concatenate(losses), np.concatenate(predicted), np.concatenate(confidence)
    order = np.argsort(-losses, kind="stable")[:k]
    return {"index": order, "loss": losses[order], "predicted": predicted[order], "true": y[order],
            "confidence": confidence[order]}


def plot_mispredictions(model, x, y, k: int = 16, columns: int = 8, image_shape=None, class_names=None):
    """A gallery of the ``k`` worst predictions (see :func:`worst_predictions`): each image titled
    "true→predicted" and its loss. Returns the figure."""
    worst = worst_predictions(model, x, y, k)
    x = np.asarray(backend.to_numpy(x.array if isinstance(x, Tensor) else x))
    images = _as_images(x[worst["index"]], image_shape)
    name = (lambda c: str(class_names[int(c)])) if class_names is not None else str  # noqa: E731
    titles = [f"{name(t)}→{name(p)}  {loss:.2g}" for t, p, loss in zip(worst["true"], worst["predicted"],
                                                                    worst["loss"])]
    return _grid(images, titles, min(columns, len(images)))


def predict_classes(model, x) -> np.ndarray:
    """The predicted class of each sample (arg max of the model's scores), in eval mode under no_grad."""
    device = next(iter(model.parameters())).device
    training = model.training
    model.eval()
    try:
        with no_grad():
            logits = model(Tensor(backend.to_device(np.asarray(x), device)))
        return np.asarray(backend.to_numpy(logits.array)).argmax(axis=1)
    finally:
        model.train(training)


class PredictionGallery(Callback):
    """After every ``every`` epochs, draw the predictions on one fixed batch into ``folder/epoch-NNN.png``.

    ``x, y``: the fixed batch (a few samples of the validation split). Each image is
    titled with the prediction, "true→predicted" in red where it is wrong. ``written``
    lists the files; ``accuracy`` the batch's accuracy at each of them.
    """

    def __init__(self, x, y, folder, every: int = 1, columns: int = 8, image_shape=None, class_names=None):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"PredictionGallery: every must be a whole number >= 1, got {every!r}")
        self.x = np.asarray(backend.to_numpy(x.array if isinstance(x, Tensor) else x))
        self.y = np.asarray(backend.to_numpy(y.array if isinstance(y, Tensor) else y))
        if len(self.x) != len(self.y) or len(self.x) == 0:
            raise ValueError(f"PredictionGallery: expected a non-empty batch of samples and as many labels, got "
                             f"{len(self.x)} and {len(self.y)}")
        self.images = _as_images(self.x, image_shape)
        self.folder, self.every, self.columns, self.class_names = str(folder), every, columns, class_names
        self.written, self.accuracy = [], []

    def on_epoch_end(self, trainer, epoch: int, logs: dict):
        if (epoch + 1) % self.every:
            return
        import os

        import matplotlib.pyplot as plt

        from minidl.serialization import atomic_write
        predicted = predict_classes(trainer.model, self.x)
        name = (lambda c: str(self.class_names[int(c)])) if self.class_names is not None else str  # noqa: E731
        titles = [name(p) if p == t else f"{name(t)}→{name(p)}" for t, p in zip(self.y, predicted)]
        figure = _grid(self.images, titles, min(self.columns, len(self.images)))
        for ax, right in zip(figure.axes, predicted == self.y):
            if not right:
                ax.title.set_color("tab:red")
        figure.suptitle(f"epoch {epoch + 1}: {np.mean(predicted == self.y):.0%} of the fixed batch right",
                        fontsize=9)
        figure.tight_layout()
        path = os.path.join(self.folder, f"epoch-{epoch + 1:03d}.png")
        os.makedirs(self.folder, exist_ok=True)
        atomic_write(path, lambda tmp: figure.savefig(tmp, dpi=80, format="png"))
        plt.close(figure)
        self.written.append(path)
        self.accuracy.append(float(np.mean(predicted == self.y)))
