"""TensorBoard logs: a Trainer callback that writes event files through tensorboardX.

    from minidl.train.tensorboard import TensorBoardLogger
    trainer = Trainer(model, opt, train_loader, val_loader, callbacks=[TensorBoardLogger("runs/exp/tb")])
    trainer.fit(epochs=10)          # then: tensorboard --logdir runs/exp/tb

What it writes (the debugging recipe's "visualize the activations of each layer"):

- scalars: every number of every history record (``train_loss``, ``val_loss``,
  ``val_accuracy``, ``lr``, ...) at the record's step, and the loss and learning
  rate of every optimizer step under ``step/loss`` and ``step/lr``;
- histograms, at every ``histogram_every``-th validation: per parameter,
  ``weights/<name>`` and ``gradients/<name>``; per leaf layer,
  ``activations/<layer>`` (the layer's output, through a forward hook).

Gradients and activations come from one fixed *probe batch* (the first batch of
the validation loader unless ``probe=(x, y)`` is given), in eval mode and with
``minidl.grad``, so the probe changes nothing in the run: no dropout draw, no
batch-norm statistic, no ``.grad``. The same input at every validation makes the
histograms comparable over time. The writer is tensorboardX (``pip install
minidl[tensorboard]``); JSONL (``JSONLLogger``) stays the default log.

A data-parallel run with ZeRO stage 2 or 3 (``parallel.ShardedDataParallel``) is read
whole, through its ``whole_module()``: the histograms are of the whole weights, and the
probe's activations and gradients those of the whole model on the whole probe batch, the
very histograms one process writes (with the plain model's parameter names). At stage 3
the weights are gathered from every rank at each histogram validation (a collective, and
the only one): give every rank a logger, with ``write=False`` on all but rank 0; those
take part in the gathering, compute and write nothing, and need no tensorboardX.
"""
from __future__ import annotations

import contextlib

import numpy as np

from minidl import backend
from minidl.autograd import grad, no_grad
from minidl.parallel.protocol import ParallelModule
from minidl.tensor import Tensor
from minidl.train.callbacks import Callback

__all__ = ["TensorBoardLogger", "histogram_values"]

_NOT_SCALARS = ("step", "epoch", "time")
_KINDS = ("weights", "gradients", "activations")


def _summary_writer():
    from minidl.utils import tensorboard  # the one place that imports tensorboardX, with its error
    return tensorboard.SummaryWriter


class TensorBoardLogger(Callback):
    """Write scalars and per-layer histograms of a Trainer run to TensorBoard event files in ``log_dir``.

    Args:
        log_dir: the folder of the event files (``tensorboard --logdir`` it).
        histogram_every: histograms at every this many validations (0: none).
        histograms: which of "weights", "gradients", "activations" to write.
        probe: an ``(x, y)`` batch of arrays for the gradients and activations
            (default: the first batch of the trainer's validation loader).
        step_scalars: also write the loss and lr of every optimizer step.
        flush_secs: how often the writer flushes to disk (it always does at the end).
        write: False on the ranks other than 0 of a sharded run: count the validations and take
            part in gathering the weights for each histogram, write nothing (see the module notes).
    """

    KINDS = _KINDS

    def __init__(self, log_dir, histogram_every: int = 1, histograms=KINDS, probe=None,
                 step_scalars: bool = True, flush_secs: int = 30, write: bool = True):
        unknown = set(histograms) - set(self.KINDS)
        if unknown:
            raise ValueError(f"TensorBoardLogger: histograms must be among {self.KINDS}, got {sorted(unknown)}")
        if not (isinstance(histogram_every, int) and histogram_every >= 0):
            raise ValueError(f"TensorBoardLogger: histogram_every must be a whole number >= 0, "
                             f"got {histogram_every!r}")
        self.log_dir, self.histogram_every = str(log_dir), histogram_every
        self.histograms, self.probe = tuple(histograms), probe
        self.step_scalars, self.flush_secs, self.write = step_scalars, flush_secs, bool(write)
        self.writer = None
        self._validations = 0
        self._writer_class = _summary_writer() if self.write else None  # fail now, not after the first epoch

    # ------------------------------------------------------------ hooks
    def on_train_begin(self, trainer):
        if self.writer is None and self.write:
            # Event files are named by the second they were opened: a resumed run opened within the
            # same second as its first run would overwrite it, so the suffix says where the run starts.
            self.writer = self._writer_class(logdir=self.log_dir, flush_secs=self.flush_secs,
                                             filename_suffix=f".from-validation-{self._validations}")

    def on_step_end(self, trainer, step: int, logs: dict):
        if self.step_scalars and self.writer is not None:
            self.writer.add_scalar("step/loss", logs["loss"], step)
            self.writer.add_scalar("step/lr", logs["lr"], step)

    def on_evaluate(self, trainer, logs: dict):
        if self.writer is None:
            self.on_train_begin(trainer)
        step = int(logs["step"])
        for key, value in logs.items():
            if key not in _NOT_SCALARS and self.write:
                self.writer.add_scalar(key, float(value), step)
        self._validations += 1
        if self.histogram_every and self._validations % self.histogram_every == 0:
            self.write_histograms(trainer, step)

    def on_train_end(self, trainer):
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file (a later run opens a new one in the same folder)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def state_dict(self) -> dict:
        return {"validations": self._validations}

    def check_state_dict(self, state, trainer=None) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("validations"), (int, np.integer)):
            raise ValueError(f"TensorBoardLogger: expected {{'validations': int}}, got {state!r}")

    def load_state_dict(self, state: dict) -> None:
        self.check_state_dict(state)
        self._validations = int(state["validations"])

    # ------------------------------------------------------------ histograms
    def write_histograms(self, trainer, step: int) -> None:
        """Write the chosen histograms of ``trainer.model`` at ``step`` (``write=False``: take part only)."""
        probing = self.write and any(k in self.histograms for k in ("gradients", "activations"))
        batch = self._probe_batch(trainer) if probing else None
        for tag, values in histogram_values(trainer, batch, self.histograms, compute=self.write):
            self.writer.add_histogram(tag, values, step)

    def _probe_batch(self, trainer):
        if self.probe is None and trainer.val_loader is not None:
            self.probe = next(iter(trainer.val_loader))
        return self.probe


def histogram_values(trainer, batch=None, kinds=_KINDS, compute: bool = True) -> list:
    """What the histograms of ``trainer.model`` show: ``[(tag, float64 NumPy array), ...]``.

    Tags ``weights/<parameter>`` (each of ``kinds`` present), then, when ``batch`` is given,
    ``activations/<layer>`` and ``gradients/<parameter>`` of :func:`probe_layers` on it.
    A parallel wrapper (:class:`~minidl.parallel.protocol.ParallelModule`) is read through its
    ``whole_module()`` (ZeRO stage 2 or 3 gathers there): the whole weights,
    the probe run on the whole module in this process. At stage 3 that gathers from every rank
    (a collective): every rank calls this, and ``compute=False`` takes part and returns [].
    """
    model = trainer.model
    with (model.whole_module() if isinstance(model, ParallelModule) else contextlib.nullcontext(model)) as module:
        if not compute:
            return []
        named = list(module.named_parameters())
        out = []
        if "weights" in kinds:
            out += [(f"weights/{name}", backend.to_numpy(p.array).astype(np.float64)) for name, p in named]
        if batch is None or not any(k in kinds for k in ("gradients", "activations")):
            return out
        activations, gradients = probe_layers(module, trainer, batch, named)
    if "activations" in kinds:
        out += [(f"activations/{name}", values) for name, values in activations]
    if "gradients" in kinds:
        out += [(f"gradients/{name}", values) for name, values in gradients]
    return out


def probe_layers(model, trainer, batch, named=None):
    """Activations of every leaf layer and gradients of every parameter on one batch, as NumPy arrays.

    Eval mode, gradients through ``minidl.grad`` (``.grad`` untouched): returns
    ``([(layer, output), ...], [(parameter, gradient), ...])``.
    """
    named = list(model.named_parameters()) if named is None else named
    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    activations, handles = [], []

    def hook_for(name):
        def hook(module, inputs, output):
            if isinstance(output, Tensor):
                activations.append((name, backend.to_numpy(output.array).astype(np.float64)))
        return hook

    was_training = model.training
    model.eval()
    try:
        for name, module in leaves:
            handles.append(module.register_forward_hook(hook_for(name)))
        x, y = trainer._to_device(batch)
        params = [p for _, p in named]
        if params:
            loss = trainer._loss(model(x), y, smoothing=0.0)
            grads = grad(loss, params, allow_unused=True)
        else:
            with no_grad():
                model(x)
            grads = []
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    gradients = [(n, backend.to_numpy(g.array).astype(np.float64)) for (n, _), g in zip(named, grads)
                 if g is not None]
    return activations, gradients
